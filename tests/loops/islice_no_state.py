"""A DDP loop wired as the README once showed: ``lab.UnevenGuard(itertools.islice(loader, start, None))`` with no
``state=`` (the loop skips what a resume trained by itself), a ``RunState`` that records each step's ids. Rank 1
holds three times rank 0's data (12 batches of 4 against 4), so the guard stops rank 1 at rank 0's end with two
thirds of its data untrained. 2 gloo ranks under torchrun; ``python islice_no_state.py EXP``."""

import itertools
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from asrlab import lab


class Clips(torch.utils.data.Dataset):
    def __init__(self, rank: int):
        self.keys = [f"r{rank}-{i:03d}" for i in range(16 if rank == 0 else 48)]

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"keys": self.keys[i], "x": torch.randn(5, generator=g), "y": torch.randn(1, generator=g)}


def collate(items):
    return {
        "keys": [b["keys"] for b in items],
        "x": torch.stack([b["x"] for b in items]),
        "y": torch.stack([b["y"] for b in items]),
    }


def main(exp: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(5, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watch = lab.StallWatch(exp, timeout_s=20).start()
    state = lab.RunState(exp, model, opt)
    r = state.load() or {"step": 0, "epoch": 0}
    step, start = r["step"], r["step"]  # one epoch: the batches trained before a resume are its first steps
    loader = torch.utils.data.DataLoader(Clips(rank), batch_size=4, collate_fn=collate)
    for batch in watch.data(lab.UnevenGuard(itertools.islice(loader, start, None))):
        loss = (model(batch["x"]) - batch["y"]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        state.record(step, 0, batch["keys"])
    print(f"rank {rank} trained {step} steps", flush=True)
    state.close()
    watch.stop()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

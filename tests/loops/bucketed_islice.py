"""A Hugging-Face-style DDP loop with asrlab's uneven guard, for the tests: dict batches whose utterance ids
are under ``audio_name``, a ``DistributedSampler`` under a batch sampler that packs utterances up to 40
frames (rank 0's are short, so it gets 5 batches and rank 1 20), and gradients accumulated over two
micro-batches with ``no_sync``, synced on the second and on the last of the epoch. Epoch 0 reads
``itertools.islice(loader, start, None)`` (how a loop resumes itself; no ``len``) and finds its last batch
with ``guard.last``; epoch 1 reads the loader, agreeing once per two batches, and finds it with
``i + 1 == len(guard)``. fp32, no scaler.
Prints one JSON line per rank and epoch."""

import contextlib
import itertools
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from asrlab import lab


class Speech(Dataset):
    def __len__(self):
        return 40

    def frames(self, i):
        return 10 if i % 2 == 0 else 30  # without shuffling, rank 0 gets the even (short) ones

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"audio_name": f"spk{i % 4}-utt{i:03d}", "input_values": torch.randn(self.frames(i), 3, generator=g)}


class ByFrames:
    """Batches of indices holding up to ``max_frames`` frames."""

    def __init__(self, sampler, data, max_frames):
        self.sampler, self.data, self.max_frames = sampler, data, max_frames

    def __iter__(self):
        batch, total = [], 0
        for i in self.sampler:
            if batch and total + self.data.frames(i) > self.max_frames:
                yield batch
                batch, total = [], 0
            batch.append(i)
            total += self.data.frames(i)
        if batch:
            yield batch

    def __len__(self):
        return sum(1 for _ in self)


def collate(items):
    return {
        "audio_name": [x["audio_name"] for x in items],
        "input_values": torch.stack([x["input_values"].mean(0) for x in items]),
    }


def main(exp):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Speech()
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_sampler=ByFrames(sampler, data, 40), collate_fn=collate)
    state = lab.RunState(exp, model, opt)
    step, start = 0, 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        source = itertools.islice(loader, start, None) if epoch == 0 else loader
        guard = lab.UnevenGuard(source, every=1 if epoch == 0 else 2, state=state, keys="audio_name")
        names = []
        for i, batch in enumerate(guard):
            last = guard.last if epoch == 0 else i + 1 == len(guard)
            sync = (i + 1) % 2 == 0 or last
            with contextlib.nullcontext() if sync else model.no_sync():
                model(batch["input_values"]).pow(2).mean().backward()
            names += batch["audio_name"]
            if sync:
                opt.step()
                opt.zero_grad()
                step += 1
                state.record(step, epoch, names)
                names = []
        line = {
            "rank": rank,
            "epoch": epoch,
            "batches": guard.batches,
            "steps": step,
            "len": len(guard) if epoch else None,
        }
        sys.stdout.write(json.dumps(line) + "\n")  # one write: the two ranks share the launcher's stdout
        sys.stdout.flush()
        guard.close()
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

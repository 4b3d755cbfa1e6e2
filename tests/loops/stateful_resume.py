"""A DDP loop over torchdata's ``StatefulDataLoader`` with asrlab's uneven guard and ``RunState``, wired as
docs/guide.md says: the state first (no loader), one guard for all epochs given the state, then
``state.load()``. Each rank reads a shard of its own (rank 0: 7 batches of 2, rank 1: 10), shuffled by the
loader's own generator; batches carry their ids under ``uid``; gradients are accumulated over two micro-batches
with ``no_sync`` and synced on the second and on ``guard.last``. A checkpoint every 2 optimizer steps; argv
``EXP DIE_AT``: rank 1 kills itself (SIGKILL) after optimizer step DIE_AT (0: never). Prints the last step."""

import contextlib
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torchdata.stateful_dataloader import StatefulDataLoader

from asrlab import lab


def main(exp, die_at):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    shard = [
        {"uid": f"r{rank}-{i:02d}", "feats": torch.randn(4, generator=torch.Generator().manual_seed(100 * rank + i))}
        for i in range(14 if rank == 0 else 20)
    ]
    loader = StatefulDataLoader(shard, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(rank))
    state = lab.RunState(exp, model, opt)
    guard = lab.UnevenGuard(loader, state=state, keys="uid")
    r = state.load() or {"step": 0, "epoch": 0}
    step = r["step"]
    for epoch in range(r["epoch"], 2):
        uids = []
        for i, batch in enumerate(guard):
            sync = (i + 1) % 2 == 0 or guard.last
            with contextlib.nullcontext() if sync else model.no_sync():
                model(batch["feats"]).pow(2).mean().backward()
            uids += batch["uid"]
            if not sync:
                continue
            opt.step()
            opt.zero_grad()
            step += 1
            if step == die_at and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            state.record(step, epoch, uids)
            uids = []
            if step % 2 == 0:
                state.save(step, epoch)
    print(f"rank {rank} last step {step}", flush=True)
    guard.close()
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

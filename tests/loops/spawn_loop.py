"""A DDP loop started by ``torch.multiprocessing.spawn`` (no launcher: its ranks carry no RANK, LOCAL_RANK or
WORLD_SIZE), 2 CPU ranks on gloo, a DataLoader worker per rank. ``python spawn_loop.py`` runs it; with
``START=process`` the script starts each rank itself as a ``multiprocessing`` spawn ``Process``, RANK set by hand.

Environment: ``FAULT=hang:R:S`` (rank R's worker hangs making step S's batch), ``raise:R:S`` (rank R raises in
step S), ``kill:R:S`` (rank R SIGKILLs itself in step S); ``STEPS`` (default 12)."""

import multiprocessing
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

FAULT = os.environ.get("FAULT", "").split(":")
STEPS = int(os.environ.get("STEPS", "12"))


class Items(torch.utils.data.Dataset):
    def __init__(self, rank: int):
        self.rank = rank

    def __len__(self):
        return 4 * STEPS

    def __getitem__(self, i):
        if FAULT[0] == "hang" and self.rank == int(FAULT[1]) and i // 4 + 1 == int(FAULT[2]):
            while True:
                time.sleep(1)
        g = torch.Generator().manual_seed(i)
        return torch.randn(6, generator=g), torch.randn(1, generator=g)


def run(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(Items(rank), batch_size=4, num_workers=1)
    for step, (x, y) in enumerate(data, 1):
        if FAULT[0] == "raise" and rank == int(FAULT[1]) and step == int(FAULT[2]):
            raise RuntimeError(f"a bad batch on rank {rank} at step {step}")
        if FAULT[0] == "kill" and rank == int(FAULT[1]) and step == int(FAULT[2]):
            os.kill(os.getpid(), signal.SIGKILL)
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if os.environ.get("START") != "process":
        mp.spawn(run, args=(2, port), nprocs=2, join=True)
        sys.exit(0)
    # START=process: the script starts each rank itself, a spawn Process with RANK set in its own environment first
    # (left set after, as such scripts do); the first non-zero exit code is its own
    ctx, ranks = multiprocessing.get_context("spawn"), []
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    for r in range(2):
        os.environ["RANK"] = str(r)
        ranks.append(ctx.Process(target=run, args=(r, 2, port)))
        ranks[-1].start()
    for p in ranks:
        p.join()
    sys.exit(next((p.exitcode for p in ranks if p.exitcode), 0))

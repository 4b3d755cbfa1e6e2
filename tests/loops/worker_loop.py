"""A plain DDP loop with a DataLoader worker per rank, for the tests of how a watched job ends. Each rank and
each worker writes its pid into ``$PIDS/`` (``rank-PID``, ``worker-PID``) so a test knows every process of
the job. Under torchrun it is one rank; run alone (``python -m worker_loop``) it starts two ranks itself
with ``torch.multiprocessing.spawn``, as some recipes do, or (``python -m worker_loop torchrun``) runs
torchrun on itself as a subprocess. Prints ``step S rank R`` at steps 3, 1003, ...; STEPS steps
(default: for ever)."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def mark(kind: str) -> None:
    folder = os.environ.get("PIDS")
    if folder:
        open(os.path.join(folder, f"{kind}-{os.getpid()}"), "w").close()


def mark_worker(_: int) -> None:
    mark("worker")


class Frames(torch.utils.data.IterableDataset):
    def __iter__(self):
        while True:
            yield torch.randn(20)


def rank_main(rank: int = -1, world: int = 2) -> None:
    if rank >= 0:  # spawned here, not by a launcher
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mark("rank")
    torch.manual_seed(0)
    net = DistributedDataParallel(torch.nn.Linear(20, 5))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Frames(), batch_size=8, num_workers=1, worker_init_fn=mark_worker)
    steps = int(os.environ.get("STEPS", "0")) or None
    for step, x in enumerate(loader):
        if step == steps:
            break
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 1000 == 3:  # a loop that logs now and then: its output alone would not end it
            print(f"step {step} rank {rank}", flush=True)
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:
        rank_main()
    elif sys.argv[1:] == ["torchrun"]:  # a Python wrapper that launches torchrun, as some recipes' launchers do
        import subprocess

        sys.exit(
            subprocess.call(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__]
            )
        )
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
        torch.multiprocessing.spawn(rank_main, args=(2,), nprocs=2)
    sys.exit(0)

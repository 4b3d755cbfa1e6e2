"""A stranger's DDP loop for the watched-run tests: a linear model on random frames, its own progress line
each step ("epoch E step S loss=X"), nothing of asrlab. FAULT breaks it: ``nan:S`` (the loss is NaN from step
S on, printed as such, training goes on), ``kill:R:S`` / ``abort:R:S`` (rank R ends itself with SIGKILL /
SIGABRT at step S), ``raise:R:S`` (rank R raises a ValueError at step S), ``hang:R:S`` (rank R sleeps for good at
step S, in its own code: its peer waits in DDP's all-reduce). Runs STEPS steps (default 40), SLEEP seconds each (default 0.05)."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fault = os.environ.get("FAULT", "").split(":")
    torch.manual_seed(0)
    net = DistributedDataParallel(torch.nn.Linear(20, 5))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for step in range(int(os.environ.get("STEPS", "40"))):
        x = torch.randn(8, 20)
        loss = net(x).pow(2).mean()
        if fault[0] == "nan" and step >= int(fault[1]):
            loss = loss * float("nan")
        if fault[0] in ("kill", "abort") and rank == int(fault[1]) and step == int(fault[2]):
            os.kill(os.getpid(), signal.SIGKILL if fault[0] == "kill" else signal.SIGABRT)
        if fault[0] == "hang" and rank == int(fault[1]) and step == int(fault[2]):
            time.sleep(3600)
        if fault[0] == "raise" and rank == int(fault[1]) and step == int(fault[2]):
            raise ValueError(f"a batch of shape {tuple(x.shape)} has no labels")
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch 0 step {step} loss={loss.item():.4f} rank {rank}", flush=True)
        time.sleep(float(os.environ.get("SLEEP", "0.05")))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

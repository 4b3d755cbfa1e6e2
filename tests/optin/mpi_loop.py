"""A loop of one's own under Open MPI's ``mpirun -np 2`` (its ranks from OMPI_COMM_WORLD_RANK, gloo over TCP on
127.0.0.1), broken by ``FAULT``: ``hang`` (rank 1's reader never returns at step 5), ``raise`` (rank 1 raises at
step 5), ``kill`` (rank 1 SIGKILLs itself at step 5), ``slow_start`` (rank 1 takes 15 s before joining the group), ``hang_start`` (rank 1 never joins),
none (40 steps, then the end). For ``tests/optin/test_mpirun.py``."""

import os
import signal
import time

import torch
import torch.distributed as dist

rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
fault = os.environ.get("FAULT", "")
if fault == "slow_start" and rank == 1:
    time.sleep(15)  # a rank still importing its toolkit while its peer waits in the rendezvous
if fault == "hang_start" and rank == 1:
    time.sleep(3600)  # a rank that never joins: its manifest's read hung before the group
port = os.environ.get("PORT", "29561")
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 41):
    if rank == 1 and step == 5:
        if fault == "hang":
            time.sleep(3600)  # a reader that never returns
        elif fault == "raise":
            raise RuntimeError("bad utterance utt-0042: empty feature matrix")
        elif fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    loss = model(torch.randn(32, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(0.1)
dist.destroy_process_group()

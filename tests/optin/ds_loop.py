#!/usr/bin/env python3
"""A small loop written the way DeepSpeed's own examples are (``deepspeed.initialize`` with a config dict,
``engine.backward``, ``engine.step``, the launcher's ``--local_rank`` argument), launched by DeepSpeed's own
launcher on the CPU with gloo:

    deepspeed --num_gpus 2 ds_loop.py [--fault hang|raise|kill] [--steps 30]

Each rank prints ``rank R step S loss L`` after each optimizer step (from 1). Faults, on rank 1 at step 10:
``hang``: its DataLoader worker blocks reading that step's batch; ``raise``: the rank raises in its step;
``kill``: the rank sends itself SIGKILL. Kept for ``tests/optin/test_deepspeed.py`` and the fixtures under
``tests/fixtures/toolkit_runs/deepspeed/``.
"""

import argparse
import os
import signal
import time

import deepspeed
import torch
import torch.distributed as dist

FAULT_RANK, FAULT_STEP, BATCH = 1, 10, 4


class Frames(torch.utils.data.Dataset):
    def __init__(self, fault: str):
        self.fault = fault

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        if self.fault == "hang" and info is not None and int(os.environ["RANK"]) == FAULT_RANK:
            # the items of step FAULT_STEP on this rank (its sampler's FAULT_STEP-th batch)
            if i in self.step_items:
                while True:
                    time.sleep(1)
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), torch.randn(1, generator=g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--fault", default="")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    data = Frames(args.fault)
    sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
    order = list(iter(sampler))
    data.step_items = set(order[(FAULT_STEP - 1) * BATCH : FAULT_STEP * BATCH])
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=1)
    for step, (x, y) in enumerate(loader, start=1):
        if step > args.steps:
            break
        if args.fault == "raise" and rank == FAULT_RANK and step == FAULT_STEP:
            raise RuntimeError(f"a bad batch on rank {rank} at step {step}")
        if args.fault == "kill" and rank == FAULT_RANK and step == FAULT_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = (engine(x) - y).pow(2).mean()
        engine.backward(loss)
        engine.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    main()

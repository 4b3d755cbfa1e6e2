"""A plain PyTorch DDP training loop (``torchrun --nproc-per-node 2 bare_loop.py EXP``): gloo on CPU, NCCL on GPUs."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import toy


def main(exp: str, epochs: int = 2, precision: str = "fp32") -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(toy.Model().to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    data = toy.Utterances()
    sampler = toy.Batches(data, rank, world)
    step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(
            data,
            batch_sampler=sampler,
            num_workers=2,
            collate_fn=toy.collate,
            generator=torch.Generator().manual_seed(epoch),
        )  # not the global RNG
        for batch in loader:
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            with torch.autocast(device.type, dtype=dtype, enabled=precision != "fp32"):
                loss = toy.loss_fn(model, batch)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            step += 1
            if rank == 0 and step % 20 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) if a.isdigit() else a for a in sys.argv[2:]))

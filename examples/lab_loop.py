"""bare_loop.py with asrlab's parts: the lines marked ``# +lab`` are added, ``# ~lab`` changed."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import toy
from asrlab import lab  # +lab


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
    watch = lab.StallWatch(exp, timeout_s=20).start()  # +lab: hangs and errors, on every rank
    guard = lab.NumericsGuard(model.module, exp, every=25, watch=watch)  # +lab: non-finite steps located, skipped
    state = lab.RunState(exp, model, opt, scaler)  # +lab: exact resume, and the ledger of keys
    r = state.load() or {"step": 0, "epoch": 0}  # +lab: the newest good checkpoint
    step = r["step"]  # ~lab
    for epoch in range(r["epoch"], epochs):  # ~lab
        sampler.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(
            data,
            batch_sampler=sampler,
            num_workers=2,
            collate_fn=toy.collate,
            generator=torch.Generator().manual_seed(epoch),
        )  # not the global RNG
        for batch in watch.data(lab.UnevenGuard(loader, state=state)):  # ~lab: the state keeps its place
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            with guard.step(step + 1, batch):  # +lab: sampled statistics; the step kept for a replay
                with torch.autocast(device.type, dtype=dtype, enabled=precision != "fp32"):  # ~lab (indented)
                    loss = toy.loss_fn(model, batch)  # ~lab (indented)
                scaler.scale(loss).backward()  # ~lab (indented)
            guard.optimizer_step(opt, loss, scaler, replay=lambda: toy.loss_fn(model.module, batch))  # ~lab
            step += 1
            state.record(step, epoch, batch["keys"])  # +lab
            if step % 10 == 0:  # +lab
                state.save(step, epoch)  # +lab
            if rank == 0 and step % 20 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) if a.isdigit() else a for a in sys.argv[2:]))

"""A Hugging-Face-style DDP loop with gradient accumulation and asrlab's parts, for the tests and the guide's
example: dict batches (``input_values``, ``labels``, ``id``), a DistributedSampler, ACCUM micro-batches per
optimizer step with DDP's ``no_sync()`` on all but the last, a loss per utterance. ``BAD_UTT`` names an
utterance whose features are NaN (a corrupt file, say): it breaks one step in every epoch.

    python -m torch.distributed.run --standalone --nproc-per-node 2 accum_loop.py EXP
"""

import contextlib
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from asrlab import lab

ACCUM, BATCH, UTTS, EPOCHS, FRAMES, DIM, VOCAB = 2, 4, 104, 2, 20, 16, 8


class Speech(torch.utils.data.Dataset):
    def __len__(self):
        return UTTS

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(FRAMES, DIM, generator=g)
        if f"utt-{i:04d}" == os.environ.get("BAD_UTT"):
            x[3] = float("nan")
        return {"input_values": x, "labels": torch.randint(1, VOCAB, (4,), generator=g), "id": f"utt-{i:04d}"}


def collate(items):
    return {
        "input_values": torch.stack([x["input_values"] for x in items]),
        "labels": torch.stack([x["labels"] for x in items]),
        "id": [x["id"] for x in items],
    }


def utterance_losses(model, batch):
    """CTC loss per utterance (reduction none)."""
    log_probs = model(batch["input_values"]).log_softmax(-1).transpose(0, 1)
    n = batch["labels"].shape[0]
    return torch.nn.functional.ctc_loss(
        log_probs, batch["labels"], torch.full((n,), FRAMES), torch.full((n,), 4), reduction="none"
    )


def main(exp):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.ReLU(), torch.nn.Linear(32, VOCAB)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = torch.utils.data.DistributedSampler(Speech(), shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(Speech(), batch_size=BATCH, sampler=sampler, collate_fn=collate)
    watch = lab.StallWatch(exp, timeout_s=30).start()
    guard = lab.NumericsGuard(model.module, exp, keys="id", watch=watch)
    state = lab.RunState(exp, model, opt)
    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        losses, keys = [], []
        for i, batch in enumerate(watch.data(loader, accumulate=ACCUM)):
            last = (i + 1) % ACCUM == 0 or i + 1 == len(loader)  # the epoch's last step may be shorter
            with contextlib.nullcontext() if last else model.no_sync():
                with guard.step(step + 1, batch):  # each micro-batch, with the optimizer step's number
                    per_utt = utterance_losses(model, batch)
                    guard.utterance_losses(per_utt)  # names the utterance(s) of a non-finite step
                    loss = per_utt.mean() / ACCUM
                    loss.backward()
            losses.append(loss.detach())
            keys.append(batch["id"])
            if last:
                guard.optimizer_step(opt, losses, replay=lambda b: utterance_losses(model.module, b).mean() / ACCUM)
                step += 1
                state.record(step, epoch, keys)  # every micro-batch's keys
                losses, keys = [], []
    watch.stop()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

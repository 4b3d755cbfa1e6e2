#!/usr/bin/env python3
"""A small CTC training loop written the way Hugging Face Accelerate's own examples are (``Accelerator``,
``accelerator.prepare``, ``accelerator.accumulate``, ``accelerate.logging.get_logger``, ``save_state`` to
``step_N`` folders, ``load_state`` + ``skip_first_batches`` to resume), on asrlab's embedded corpus in WeNet's
raw mode (``asrlab synth DIR --raw``: ``raw.list`` of ``{"key", "wav", "txt"}``). The job of
``tests/optin/toolkit_runs.py`` (the fixtures under ``tests/fixtures/toolkit_runs/accelerate``):

    torchrun --nproc-per-node 2 accel_loop.py --data train/raw.list --out OUT
    accelerate launch --multi_gpu --cpu --num_processes 2 accel_loop.py --data train/raw.list --out OUT

Steps are optimizer steps (``gradient_accumulation_steps=2``: two micro-batches each), counted from 1 over the
whole run; each rank logs its loss at every step. Faults, from the environment, on rank ``FAULT_RANK`` (1)
at optimizer step ``FAULT_STEP``:

* ``FAULT=nan``: that step's loss is multiplied by ``float('nan')`` (nothing in the loop checks it);
* ``FAULT=kill``: the rank SIGKILLs itself right after logging that step.

The data's faults need no code: a ``raw.list`` whose line points at a missing WAV, or at a FIFO that nobody
writes, breaks the rank that reads it (``toolkit_runs.py`` writes such lists).
``TIMEOUT_S`` sets the process group's timeout (``InitProcessGroupKwargs``; default: torch's 30 minutes).
"""

import argparse
import datetime
import json
import logging
import math
import os
import re
import signal
import time
from pathlib import Path

import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi
from accelerate import Accelerator, InitProcessGroupKwargs
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from torch import nn

logger = get_logger(__name__)

FAULT = os.environ.get("FAULT", "")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "0"))


class RawList(torch.utils.data.Dataset):
    """WeNet's raw.list: one JSON line per utterance; the WAV is read when the item is asked for."""

    def __init__(self, path, vocab):
        self.items = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        self.vocab = vocab

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        item = self.items[i]
        wav, sr = sf.read(item["wav"], dtype="float32")
        feats = kaldi.fbank(torch.from_numpy(wav).unsqueeze(0) * 32768, num_mel_bins=40, sample_frequency=sr)
        tokens = torch.tensor([self.vocab[c] for c in item["txt"]])
        return item["key"], feats, tokens


def collate(batch):
    keys, feats, tokens = zip(*batch)
    return {
        "keys": list(keys),
        "feats": nn.utils.rnn.pad_sequence(feats, batch_first=True),
        "feat_lens": torch.tensor([len(f) for f in feats]),
        "tokens": nn.utils.rnn.pad_sequence(tokens, batch_first=True),
        "token_lens": torch.tensor([len(t) for t in tokens]),
    }


class TinyCTC(nn.Module):
    def __init__(self, n_feats, n_tokens, hidden=64):
        super().__init__()
        self.sub = nn.Conv1d(n_feats, hidden, kernel_size=3, stride=2, padding=1)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, n_tokens)

    def forward(self, feats, feat_lens):
        h = torch.relu(self.sub(feats.transpose(1, 2))).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.out(h).log_softmax(-1), (feat_lens + 1) // 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--save-every", type=int, default=5, help="save_state every N optimizer steps")
    ap.add_argument("--resume", action="store_true", help="from the newest OUT/step_N")
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="Accelerator(cpu=True): needed under a bare torchrun on a "
        "machine without GPUs (else every rank trains alone, DistributedType.NO)",
    )
    args = ap.parse_args()

    kwargs = []
    if os.environ.get("TIMEOUT_S"):
        kwargs.append(InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=float(os.environ["TIMEOUT_S"]))))
    accelerator = Accelerator(cpu=args.cpu, gradient_accumulation_steps=2, project_dir=args.out, kwargs_handlers=kwargs)
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%m/%d/%Y %H:%M:%S", level=logging.INFO
    )
    logger.info(accelerator.state, main_process_only=False)
    set_seed(1234)

    texts = [json.loads(line)["txt"] for line in Path(args.data).read_text().splitlines() if line.strip()]
    vocab = {c: i + 1 for i, c in enumerate(sorted({c for t in texts for c in t}))}  # 0: CTC blank
    data = RawList(args.data, vocab)
    loader = torch.utils.data.DataLoader(
        data, batch_size=args.batch_size, shuffle=False, collate_fn=collate, num_workers=1
    )
    model = TinyCTC(40, len(vocab) + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / accelerator.gradient_accumulation_steps)
    logger.info(
        f"{len(data)} utterances, {len(loader)} batches per rank and epoch, {steps_per_epoch} steps per epoch, "
        f"{args.epochs} epochs"
    )

    step, start_epoch, skip = 0, 0, 0
    if args.resume:
        done = sorted((p for p in Path(args.out).glob("step_*") if p.is_dir()), key=lambda p: int(p.name[5:]))
        if done:
            accelerator.print(f"Resumed from checkpoint: {done[-1]}")
            accelerator.load_state(str(done[-1]))
            step = int(re.fullmatch(r"step_(\d+)", done[-1].name).group(1))
            start_epoch = step // steps_per_epoch
            skip = (step % steps_per_epoch) * accelerator.gradient_accumulation_steps

    for epoch in range(start_epoch, args.epochs):
        model.train()
        t0, total, n = time.time(), 0.0, 0
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        skip = 0
        for batch in batches:
            with accelerator.accumulate(model):
                logp, lens = model(batch["feats"], batch["feat_lens"])
                loss = nn.functional.ctc_loss(
                    logp.transpose(0, 1), batch["tokens"], lens, batch["token_lens"], zero_infinity=False
                )
                if FAULT == "nan" and accelerator.process_index == FAULT_RANK and step + 1 == FAULT_STEP:
                    loss = loss * float("nan")
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            total, n = total + loss.item(), n + 1
            if accelerator.sync_gradients:
                step += 1
                logger.info(
                    f"rank {accelerator.process_index} epoch {epoch} step {step} loss {loss.item():.4f}",
                    main_process_only=False,
                )
                if FAULT == "kill" and accelerator.process_index == FAULT_RANK and step == FAULT_STEP:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step % args.save_every == 0:
                    accelerator.save_state(os.path.join(args.out, f"step_{step}"))
        accelerator.print(f"epoch {epoch}: mean loss {total / max(n, 1):.4f}, {time.time() - t0:.1f} s")
    accelerator.wait_for_everyone()
    accelerator.save_state(os.path.join(args.out, "final"))
    accelerator.print("training finished")
    accelerator.end_training()


if __name__ == "__main__":
    main()

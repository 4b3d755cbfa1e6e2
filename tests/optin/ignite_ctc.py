#!/usr/bin/env python3
"""A tiny CTC speech model trained by a PyTorch-Ignite ``Engine`` on the CPU, on asrlab's embedded corpus in WeNet's
raw mode (``asrlab synth DIR --raw``: ``raw.list`` of ``{"key", "wav", "txt"}``), its ranks started by Ignite's own
launcher, ``idist.Parallel(backend="gloo", nproc_per_node=2)`` (``torch.multiprocessing`` spawn: the launched
process is no rank, it spawns ranks 0 and 1 and waits for them), or one process (``--nproc 1``: backend None). The
job of ``tests/optin/ignite_cases.py`` (the fixtures under ``tests/fixtures/toolkit_runs/ignite``):

    python ignite_ctc.py --data train/raw.list --out OUT [--nproc 2|1] [--port P] [--terminate-on-nan]

The data is real audio: a map-style dataset reads each item's WAV with soundfile when the DataLoader asks for it
(``num_workers=0``: in the rank's own process, no read-ahead) and turns it into 40 log-mel filterbanks
(``torchaudio.compliance.kaldi.fbank``, 25/10 ms), padded to the batch's longest; the labels are the characters of
``txt`` (1..V, 0 is CTC's blank). ``idist.auto_dataloader(batch_size=8)``: a DistributedSampler and 8 / world size
a rank (4 under 2 ranks, 8 in one process): 12 iterations an epoch on every rank, 3 epochs. The model: Conv1d
(stride 2) + bidirectional GRU + Linear(V + 1), ``nn.CTCLoss``, Adam; ``idist.auto_model`` (DDP under 2 ranks),
``idist.auto_optim``.

Ignite's own logging: ``ignite.utils.setup_logger`` (rank 0 only: it gives the other ranks a NullHandler) for the
trainer's engine and a handler that logs ``Epoch[e] Iteration[i/n] Loss: x`` every iteration (i within the epoch);
``ProgressBar`` (tqdm, carriage returns) on rank 0; ``ModelCheckpoint`` every epoch into OUT/ckpt (rank 0 saves);
``TerminateOnNan`` with ``--terminate-on-nan``; a TensorBoard logger into OUT/tb on rank 0 where tensorboard is
importable.

Ignite counts epochs from 1 and ``engine.state.iteration`` from 1 over the whole run (12 an epoch); the faults are
named by epoch (from 1) and iteration within the epoch (from 1), from the environment (Ignite unchanged), on rank
``FAULT_RANK`` (default 1):

* ``FAULT=nan``: the loss is multiplied by ``float('nan')`` from that iteration on;
* ``FAULT=wav``: the dataset reads ``FAULT_WAV`` (a missing file, a FIFO nobody writes) in place of the first item
  of that iteration's batch (the batch is fetched before the iteration starts: ``GET_BATCH_STARTED``);
* ``FAULT=kill``: the rank SIGKILLs itself at ``ITERATION_STARTED`` of that iteration (before it is trained).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
from pathlib import Path

from job_audio import fbank, raw_items, vocab_of
import torch
from torch import nn

import ignite
import ignite.distributed as idist
from ignite.engine import Engine, Events
from ignite.handlers import ModelCheckpoint, TerminateOnNan
from ignite.utils import setup_logger

FAULT = os.environ.get("FAULT", "")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_EPOCH = int(os.environ.get("FAULT_EPOCH", "0"))
FAULT_ITER = int(os.environ.get("FAULT_ITER", "0"))
FAULT_WAV = os.environ.get("FAULT_WAV", "")

NOW = {"epoch": 0, "iter": 0}  # the batch being fetched or trained: epoch and iteration within it, from 1


def _faulty(kind: str) -> bool:
    return (
        FAULT == kind and idist.get_rank() == FAULT_RANK and NOW["epoch"] == FAULT_EPOCH and NOW["iter"] == FAULT_ITER
    )


class RawList(torch.utils.data.Dataset):
    def __init__(self, path, vocab):
        self.items = raw_items(path)
        self.vocab = vocab

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        item = self.items[idx]
        wav_path = item["wav"]
        if _faulty("wav") and not NOW.get("read"):
            NOW["read"] = True  # the first item of the batch only
            wav_path = FAULT_WAV
        return fbank(wav_path), torch.tensor([self.vocab[c] for c in item["txt"]], dtype=torch.long)


def collate(batch):
    feats, labels = zip(*batch)
    x = nn.utils.rnn.pad_sequence(feats, batch_first=True)
    y = torch.cat(labels)
    return x, torch.tensor([len(f) for f in feats]), y, torch.tensor([len(t) for t in labels])


class TinyCTC(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.conv = nn.Conv1d(40, 64, 5, stride=2, padding=2)
        self.gru = nn.GRU(64, 48, batch_first=True, bidirectional=True)
        self.out = nn.Linear(96, vocab_size + 1)  # + 1: index 0, the blank

    def forward(self, x):
        h = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        h, _ = self.gru(h)
        return self.out(h).log_softmax(-1)


def training(local_rank, args):
    rank = idist.get_rank()
    torch.manual_seed(0)
    out = Path(args.out)
    logger = setup_logger("trainer")  # rank 0 logs; the others get a NullHandler
    vocab = vocab_of(args.data)
    data = RawList(args.data, vocab)
    loader = idist.auto_dataloader(data, batch_size=args.batch_size, shuffle=False, num_workers=0, collate_fn=collate)
    model = idist.auto_model(TinyCTC(len(vocab)))
    optimizer = idist.auto_optim(torch.optim.Adam(model.parameters(), lr=1e-3))
    ctc = nn.CTCLoss(blank=0)

    def update(engine, batch):
        model.train()
        x, xlen, y, ylen = batch
        logp = model(x)
        loss = ctc(logp.transpose(0, 1), y, (xlen + 1) // 2, ylen)
        if FAULT == "nan" and rank == FAULT_RANK and (NOW["epoch"], NOW["iter"]) >= (FAULT_EPOCH, FAULT_ITER):
            loss = loss * float("nan")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    trainer = Engine(update)
    trainer.logger = setup_logger("ignite.engine.Engine")
    n = len(loader)

    @trainer.on(Events.GET_BATCH_STARTED)
    def where_fetching(engine):
        NOW.update(epoch=engine.state.epoch, iter=engine.state.iteration - (engine.state.epoch - 1) * n + 1)
        NOW.pop("read", None)

    @trainer.on(Events.ITERATION_STARTED)
    def where_training(engine):
        NOW.update(epoch=engine.state.epoch, iter=(engine.state.iteration - 1) % n + 1)
        if _faulty("kill"):
            os.kill(os.getpid(), signal.SIGKILL)

    @trainer.on(Events.ITERATION_COMPLETED)
    def log_loss(engine):
        i = (engine.state.iteration - 1) % n + 1
        logger.info(f"Epoch[{engine.state.epoch}] Iteration[{i}/{n}] Loss: {engine.state.output:.4f}")

    if args.terminate_on_nan:
        trainer.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan())

    ckpt = ModelCheckpoint(str(out / "ckpt"), filename_prefix="ctc", n_saved=None, require_empty=False)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, ckpt, {"model": model, "optimizer": optimizer})

    tb = None
    if rank == 0:
        from ignite.contrib.handlers import ProgressBar

        ProgressBar(persist=True).attach(trainer, output_transform=lambda loss: {"loss": loss})
        try:
            import tensorboard  # noqa: F401

            from ignite.contrib.handlers.tensorboard_logger import TensorboardLogger
        except ImportError:
            TensorboardLogger = None
        if TensorboardLogger is not None:
            tb = TensorboardLogger(log_dir=str(out / "tb"))
            tb.attach_output_handler(
                trainer, event_name=Events.ITERATION_COMPLETED, tag="training", output_transform=lambda v: {"loss": v}
            )
        logger.info(
            f"ignite {ignite.__version__}, torch {torch.__version__}, backend {idist.backend()}, world size "
            f"{idist.get_world_size()}, {len(data)} utterances, {n} iterations an epoch a rank"
        )
    state = trainer.run(loader, max_epochs=args.epochs)
    if tb is not None:
        tb.close()
    loss = state.output if state.output is not None else math.nan
    logger.info(f"training finished: {state.epoch} epochs, iteration {state.iteration}, loss {loss:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8, help="in all: divided by the world size a rank")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--terminate-on-nan", action="store_true")
    args = ap.parse_args()
    (Path(args.out) / "ckpt").mkdir(parents=True, exist_ok=True)
    if args.nproc > 1:
        with idist.Parallel(backend="gloo", nproc_per_node=args.nproc, master_port=args.port) as parallel:
            parallel.run(training, args)
    else:
        with idist.Parallel(backend=None) as parallel:
            parallel.run(training, args)


if __name__ == "__main__":
    main()

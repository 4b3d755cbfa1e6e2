#!/usr/bin/env python3
"""A tiny CTC speech model trained by a fastai ``Learner`` (``fit_one_cycle``), on the CPU, in one process, on
asrlab's embedded corpus in WeNet's raw mode (``asrlab synth DIR --raw``: ``raw.list`` of ``{"key", "wav",
"txt"}``). The job of ``tests/optin/fastai_cases.py`` (the fixtures under ``tests/fixtures/toolkit_runs/fastai``):

    python fastai_fit.py --data train/raw.list --valid dev/raw.list --out OUT [--terminate-on-nan]

The data is real audio: a plain PyTorch ``Dataset`` reads each utterance's WAV with soundfile when the plain
PyTorch ``DataLoader`` asks for it (``num_workers=0``: in the training process, no read-ahead) and turns it into
40 log-mel filterbanks (``torchaudio.compliance.kaldi.fbank``, 25/10 ms), padded to the batch's longest; the
labels are the characters of ``txt`` (1..V, 0 is CTC's blank). The two loaders go into fastai as they are:
``DataLoaders(train_dl, valid_dl)`` (``n_inp = 2``: the batch is ``(feats, feat_lens, labels, label_lens)``).
96 training utterances, batch 8, ``shuffle=False``: 12 batches an epoch; 16 dev utterances for fastai's validation;
3 epochs of ``fit_one_cycle``. The model: Conv1d (stride 2) + bidirectional GRU + Linear(V + 1), ``nn.CTCLoss``.
Callbacks: fastai's ``CSVLogger`` (OUT/history.csv), ``SaveModelCallback(every_epoch=True)`` (OUT/models/
model_E.pth) and, with ``--terminate-on-nan``, ``TerminateOnNaNCallback``. The console is fastprogress's, not in a
notebook: its table (``epoch  train_loss  valid_loss  time``, one row an epoch, the epoch from 0) and its bars
(``\\r``-redrawn ``|████----| 50.00% [6/12 00:01<00:01 3.2]``, written even into a file).

fastai counts epochs from 0 (``Learner.epoch``, the table, history.csv, model_E.pth) and batches from 0
(``Learner.iter``). The faults are named as people count (and as the other toolkits' cases do): epoch
``FAULT_EPOCH`` from 1 (= ``Learner.epoch + 1``) and batch ``FAULT_BATCH`` from 1 (= ``Learner.iter + 1``), from
the environment (fastai unchanged), training batches only:

* ``FAULT=nan``: the loss is multiplied by ``float('nan')`` in that batch (the weights go NaN after its step);
* ``FAULT=wav``: the dataset reads ``FAULT_WAV`` (a missing file, a FIFO nobody writes) in place of that batch's
  first WAV;
* ``FAULT=kill``: a callback SIGKILLs the process in ``before_batch`` of that batch (before it is trained).

``--distrib``: under torchrun, ``with learn.distrib_ctx(cpu=True)`` (fastai's Accelerate-based DDP).
"""

import argparse
import os
import signal
from pathlib import Path

from job_audio import fbank, raw_items, vocab_of
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import fastai
from fastai.callback.progress import CSVLogger
from fastai.callback.tracker import SaveModelCallback, TerminateOnNaNCallback
from fastai.data.core import DataLoaders
from fastai.learner import Learner
from fastai.callback.core import Callback
from fastai.callback.schedule import fit_one_cycle  # noqa: F401  (patches Learner.fit_one_cycle)
from fastai.optimizer import Adam
import fastai.distributed  # noqa: F401,E402  (patches Learner.distrib_ctx)

FAULT = os.environ.get("FAULT", "")
FAULT_EPOCH = int(os.environ.get("FAULT_EPOCH", "0"))
FAULT_BATCH = int(os.environ.get("FAULT_BATCH", "0"))
FAULT_WAV = os.environ.get("FAULT_WAV", "")

NOW = {"epoch": 0, "batch": 0, "training": False}  # counted from 1, set by the Where callback


def _hit() -> bool:
    return NOW["training"] and NOW["epoch"] == FAULT_EPOCH and NOW["batch"] == FAULT_BATCH


class RawList(Dataset):
    """WeNet's raw.list, one utterance an item: its WAV is read when the DataLoader asks for it."""

    def __init__(self, path, vocab, batch_size, faulty=False):
        self.items = raw_items(path)
        self.vocab, self.batch_size, self.faulty = vocab, batch_size, faulty

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        item = self.items[idx]
        wav_path = item["wav"]
        if (
            self.faulty
            and FAULT == "wav"
            and NOW["epoch"] == FAULT_EPOCH
            and idx // self.batch_size + 1 == FAULT_BATCH
            and idx % self.batch_size == 0
        ):
            wav_path = FAULT_WAV
        return fbank(wav_path), torch.tensor([self.vocab[c] for c in item["txt"]], dtype=torch.long)


def collate(batch):
    feats = nn.utils.rnn.pad_sequence([f for f, _ in batch], batch_first=True)
    feat_lens = torch.tensor([len(f) for f, _ in batch])
    labels = nn.utils.rnn.pad_sequence([y for _, y in batch], batch_first=True)
    label_lens = torch.tensor([len(y) for _, y in batch])
    return feats, feat_lens, labels, label_lens


class TinyCTC(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.conv = nn.Conv1d(40, 64, 5, stride=2, padding=2)
        self.rnn = nn.GRU(64, 48, batch_first=True, bidirectional=True)
        self.out = nn.Linear(96, vocab_size + 1)  # + 1: index 0, the blank

    def forward(self, feats, feat_lens):
        x = torch.relu(self.conv(feats.transpose(1, 2))).transpose(1, 2)
        x, _ = self.rnn(x)
        return self.out(x).log_softmax(-1), (feat_lens + 1) // 2


class FaultyCTC(nn.Module):
    """nn.CTCLoss over (log_probs, out_lens), times NaN in batch FAULT_BATCH of epoch FAULT_EPOCH when FAULT=nan."""

    def __init__(self):
        super().__init__()
        self.ctc = nn.CTCLoss(blank=0, zero_infinity=True)

    def forward(self, pred, labels, label_lens):
        log_probs, out_lens = pred
        loss = self.ctc(log_probs.transpose(0, 1), labels, out_lens, label_lens)
        if FAULT == "nan" and _hit():
            loss = loss * float("nan")
        return loss


class Where(Callback):
    """Keeps the epoch and batch being trained, counted from 1; FAULT=kill: SIGKILL there."""

    order = -20

    def before_epoch(self):
        NOW["epoch"] = self.epoch + 1

    def before_train(self):
        NOW["training"] = True

    def before_validate(self):
        NOW["training"] = False

    def before_batch(self):
        NOW["batch"] = self.iter + 1
        if FAULT == "kill" and _hit():
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--valid", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--terminate-on-nan", action="store_true")
    ap.add_argument("--distrib", action="store_true")
    args = ap.parse_args()

    torch.manual_seed(1234)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = vocab_of(args.data, args.valid)
    train = RawList(args.data, vocab, args.batch_size, faulty=True)
    valid = RawList(args.valid, vocab, args.batch_size)
    dls = DataLoaders(
        DataLoader(train, batch_size=args.batch_size, shuffle=False, num_workers=0, collate_fn=collate),
        DataLoader(valid, batch_size=args.batch_size, shuffle=False, num_workers=0, collate_fn=collate),
        path=out,
        device="cpu",
    )
    dls.n_inp = 2  # (feats, feat_lens) to the model, (labels, label_lens) to the loss
    cbs = [Where(), CSVLogger(fname="history.csv"), SaveModelCallback(every_epoch=True)]
    if args.terminate_on_nan:
        cbs.append(TerminateOnNaNCallback())
    learn = Learner(
        dls, TinyCTC(len(vocab)), loss_func=FaultyCTC(), opt_func=Adam, path=out, model_dir="models", cbs=cbs
    )
    print(
        f"fastai {fastai.__version__}, torch {torch.__version__}, {len(train)} utterances, "
        f"{len(dls.train)} batches an epoch",
        flush=True,
    )
    if args.distrib:
        with learn.distrib_ctx(cpu=True):
            learn.fit_one_cycle(args.epochs, 3e-3)
    else:
        learn.fit_one_cycle(args.epochs, 3e-3)
    rows = learn.recorder.values
    last = rows[-1][0] if rows else float("nan")
    print(f"training finished: {len(rows)} epochs, train_loss {last:.4f}", flush=True)


if __name__ == "__main__":
    main()

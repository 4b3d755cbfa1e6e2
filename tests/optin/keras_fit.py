#!/usr/bin/env python3
"""A tiny CTC speech model trained by Keras 3 ``model.fit`` on the PyTorch backend (``KERAS_BACKEND=torch``, set
here before keras is imported), on the CPU, in one process, on asrlab's embedded corpus in WeNet's raw mode
(``asrlab synth DIR --raw``: ``raw.list`` of ``{"key", "wav", "txt"}``). The job of
``tests/optin/keras_cases.py`` (the fixtures under ``tests/fixtures/toolkit_runs/keras``):

    python keras_fit.py --data train/raw.list --out OUT [--verbose 1|2]

The data is real audio: a ``keras.utils.PyDataset`` reads each batch's WAVs with soundfile when Keras asks
for it (``workers=1``, no multiprocessing: in the training thread, no read-ahead) and turns them into 40
log-mel filterbanks (``torchaudio.compliance.kaldi.fbank``, 25/10 ms), padded to the batch's longest; the
labels are the characters of ``txt`` (1..V, padded with 0, CTC's blank). 96 utterances, batch 8: 12 batches
an epoch, 3 epochs, ``shuffle=False``. The model: Conv1D (stride 2) + Bidirectional GRU + Dense(V + 1),
``keras.losses.CTC`` (``keras.ops.ctc_loss``), Adam. Callbacks: ``CSVLogger(OUT/training.csv)``,
``ModelCheckpoint(OUT/ckpt/epoch_{epoch:02d}.keras)`` and, with ``--terminate-on-nan``, ``TerminateOnNaN``.

Keras counts epochs from 1 in its console (``Epoch 2/3``) and batches from 1 in its progress bar (``5/12``);
its callbacks get both from 0. The faults are named as the console counts: epoch ``FAULT_EPOCH`` (from 1),
batch ``FAULT_BATCH`` (from 1), from the environment (Keras unchanged):

* ``FAULT=nan``: the loss (a ``keras.losses.CTC`` subclass) is multiplied by ``float('nan')`` in that batch;
* ``FAULT=wav``: the PyDataset reads ``FAULT_WAV`` (a missing file, a FIFO nobody writes) in place of that
  batch's first WAV (the epoch is the callbacks' one: the PyDataset's own ``on_epoch_begin`` is called once
  more than there are epochs, by the symbolic build that reads batch 0 before the first epoch);
* ``FAULT=kill``: a callback SIGKILLs the process in ``on_train_batch_begin`` of that batch (before it is
  trained: the progress bar shows the batch before it last).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import argparse  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from job_audio import fbank, raw_items, vocab_of  # noqa: E402
import torch  # noqa: E402

import keras  # noqa: E402

FAULT = os.environ.get("FAULT", "")
FAULT_EPOCH = int(os.environ.get("FAULT_EPOCH", "0"))
FAULT_BATCH = int(os.environ.get("FAULT_BATCH", "0"))
FAULT_WAV = os.environ.get("FAULT_WAV", "")

NOW = {"epoch": 0, "batch": 0}  # as the console counts them (from 1), set by the Where callback


class RawListDataset(keras.utils.PyDataset):
    """WeNet's raw.list, batch by batch: the WAVs are read when Keras asks for the batch."""

    def __init__(self, path, vocab, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.items = raw_items(path)
        self.vocab = vocab
        self.batch_size = batch_size

    def __len__(self):
        return (len(self.items) + self.batch_size - 1) // self.batch_size

    def __getitem__(self, idx):
        batch = self.items[idx * self.batch_size : (idx + 1) * self.batch_size]
        feats, labels = [], []
        for j, item in enumerate(batch):
            wav_path = item["wav"]
            if FAULT == "wav" and NOW["epoch"] == FAULT_EPOCH and idx + 1 == FAULT_BATCH and j == 0:
                wav_path = FAULT_WAV
            feats.append(fbank(wav_path).numpy())
            labels.append([self.vocab[c] for c in item["txt"]])
        t = max(len(f) for f in feats)
        x = np.zeros((len(feats), t, 40), dtype="float32")
        for j, f in enumerate(feats):
            x[j, : len(f)] = f
        n = max(len(y) for y in labels)
        y = np.zeros((len(labels), n), dtype="int32")
        for j, lab in enumerate(labels):
            y[j, : len(lab)] = lab
        return x, y


class FaultyCTC(keras.losses.CTC):
    """keras.losses.CTC, times NaN in batch FAULT_BATCH of epoch FAULT_EPOCH when FAULT=nan."""

    def call(self, y_true, y_pred):
        loss = super().call(y_true, y_pred)
        if FAULT == "nan" and NOW["epoch"] == FAULT_EPOCH and NOW["batch"] == FAULT_BATCH:
            loss = loss * float("nan")
        return loss


class Where(keras.callbacks.Callback):
    """Keeps the epoch and batch being trained, as the console counts them; FAULT=kill: SIGKILL there."""

    def on_epoch_begin(self, epoch, logs=None):
        NOW["epoch"] = epoch + 1

    def on_train_batch_begin(self, batch, logs=None):
        NOW["batch"] = batch + 1
        if FAULT == "kill" and NOW["epoch"] == FAULT_EPOCH and NOW["batch"] == FAULT_BATCH:
            os.kill(os.getpid(), signal.SIGKILL)


def build(vocab_size):
    inp = keras.Input(shape=(None, 40), name="fbank")
    x = keras.layers.Conv1D(64, 5, strides=2, padding="same", activation="relu")(inp)
    x = keras.layers.Bidirectional(keras.layers.GRU(48, return_sequences=True))(x)
    out = keras.layers.Dense(vocab_size + 1, name="logits")(x)  # + 1: index 0, the blank
    return keras.Model(inp, out, name="tiny_ctc")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--verbose", type=int, default=1)
    ap.add_argument("--terminate-on-nan", action="store_true")
    args = ap.parse_args()

    keras.utils.set_random_seed(1234)
    out = Path(args.out)
    (out / "ckpt").mkdir(parents=True, exist_ok=True)
    vocab = vocab_of(args.data)
    train = RawListDataset(args.data, vocab, args.batch_size)
    model = build(len(vocab))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=FaultyCTC())
    callbacks = [
        Where(),
        keras.callbacks.CSVLogger(str(out / "training.csv")),
        keras.callbacks.ModelCheckpoint(str(out / "ckpt" / "epoch_{epoch:02d}.keras")),
    ]
    if args.terminate_on_nan:
        callbacks.append(keras.callbacks.TerminateOnNaN())
    print(
        f"keras {keras.__version__}, backend {keras.backend.backend()}, torch {torch.__version__}, "
        f"{len(train.items)} utterances, {len(train)} batches an epoch",
        flush=True,
    )
    history = model.fit(train, epochs=args.epochs, shuffle=False, verbose=args.verbose, callbacks=callbacks)
    print(f"training finished: {len(history.epoch)} epochs, loss {history.history['loss'][-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()

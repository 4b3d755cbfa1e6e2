"""asrlab's loader side by side with lhotse and WebDataset on the same 1,000 WAV files, at 1 and 2 workers.

* asrlab: ``AsrLoader`` over the raw list of the WAV files (``raw.list``), and over the same audio in 10 tar
  shards (``data.list``); its own Kaldi fbank (``asrlab.data.features``), 80 bins, dynamic batches.
* lhotse: ``DynamicBucketingSampler`` + ``K2SpeechRecognitionDataset`` with
  ``OnTheFlyFeatures(Fbank(FbankConfig(num_mel_bins=80)))`` over the WAV files (its usual recipe).
* WebDataset: the 10 shards, decoded as asrlab decodes, fbank by ``torchaudio.compliance.kaldi.fbank``
  (as WeNet's own pipeline makes it), static batches of 20 (``asrlab.measure.loader_bench.webdataset_loader``).

Each runs a whole epoch in a ``DataLoader`` with N workers; utterances per second over the epoch, start-up
included. Rounds interleave the loaders (the order rotating), and each ratio is of the medians. Run from the
repository root (lhotse and webdataset are benchmark dependencies: ``pip install -e ".[bench]"``)::

    .venv/bin/python benchmarks/loader_peers.py [--rounds 9] [--utts 1000] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from asrlab.data import synth
from asrlab.data.config import DataConfig
from asrlab.data.features import torchaudio_fbank
from asrlab.data.loader import AsrLoader
from asrlab.data.shards import write_split
from asrlab.data.sources import load_sources
from asrlab.data.tokenizer import CharTokenizer
from asrlab.measure.loader_bench import webdataset_loader


def epoch(batches) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = sum(len(b["feat_lens"]) if "feat_lens" in b else len(b["supervisions"]["text"]) for b in batches)
    return n, time.perf_counter() - t0


def asrlab_loader(data_list: Path, tok: CharTokenizer, workers: int):
    cfg = DataConfig(num_workers=workers, max_frames_in_batch=6000, shuffle_size=200)
    return AsrLoader(load_sources(data_list), tok, cfg)


def lhotse_loader(root: Path, workers: int):
    from lhotse import CutSet, Fbank, FbankConfig, RecordingSet, SupervisionSegment, SupervisionSet
    from lhotse.dataset import DynamicBucketingSampler, K2SpeechRecognitionDataset, OnTheFlyFeatures

    recordings = RecordingSet.from_dir(root / "wavs", pattern="*.wav")
    texts = dict(line.split("\t", 1) for line in (root / "texts.tsv").read_text().splitlines())
    sups = SupervisionSet.from_segments(
        SupervisionSegment(id=r.id, recording_id=r.id, start=0.0, duration=r.duration, text=texts[r.id])
        for r in recordings
    )
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=sups)
    sampler = DynamicBucketingSampler(cuts, max_duration=60.0, shuffle=True, num_buckets=10, seed=0)
    ds = K2SpeechRecognitionDataset(input_strategy=OnTheFlyFeatures(Fbank(FbankConfig(num_mel_bins=80))))
    return torch.utils.data.DataLoader(
        ds, sampler=sampler, batch_size=None, num_workers=workers, persistent_workers=False
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--utts", type=int, default=1000)
    ap.add_argument("--workers", default="1,2")
    a = ap.parse_args()
    torch.set_num_threads(1)  # each loader's workers compute on one thread, as in training
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "train"
        utts = list(synth.iter_split("train", a.utts, seed=0, workers=2))
        write_split(((u.key, u.text, u.wav) for u in utts), root, "train", shard_size=a.utts // 10, raw=True)
        (root / "texts.tsv").write_text("".join(f"{u.key}\t{u.text}\n" for u in utts))
        hours = sum(u.seconds for u in utts) / 3600
        tok = CharTokenizer.build([u.text for u in utts])
        print(
            f"{a.utts} utterances, {hours:.2f} h of audio, torch threads 1, python {sys.version.split()[0]}", flush=True
        )
        makers = {
            "asrlab raw": lambda w: asrlab_loader(root / "raw.list", tok, w),
            "asrlab shards": lambda w: asrlab_loader(root / "data.list", tok, w),
            "lhotse": lambda w: lhotse_loader(root, w),
            "webdataset": lambda w: webdataset_loader(
                load_sources(root / "data.list"),
                tok,
                DataConfig(num_workers=w, batch_type="static", batch_size=20, shuffle_size=200),
                fbank=torchaudio_fbank,
            ),
        }
        names = list(makers)
        for workers in [int(x) for x in a.workers.split(",")]:
            rows: dict[str, list[float]] = {n: [] for n in names}
            for r in range(a.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]  # rotate: no loader always first
                for name in order:
                    n, dt = epoch(iter(makers[name](workers)))
                    rows[name].append(n / dt)
                print(
                    f"workers {workers} round {r + 1}: " + ", ".join(f"{n} {rows[n][-1]:.0f}" for n in names),
                    flush=True,
                )
            med = {n: statistics.median(v) for n, v in rows.items()}
            print(
                f"workers {workers}: median utterances/s over {a.rounds} rounds: "
                + ", ".join(f"{n} {v:.1f}" for n, v in med.items())
            )
            for ours, peer in itertools.product(("asrlab raw", "asrlab shards"), ("lhotse", "webdataset")):
                print(f"workers {workers}: {ours} / {peer}: {med[ours] / med[peer]:.2f}x")


if __name__ == "__main__":
    main()

"""How fast the doctor reads TensorBoard event files: a file of N steps of three scalars (loss, grad norm, lr),
written by torch's SummaryWriter, read by ``asrlab.doctor.sources.tensorboard`` and, beside it, by tensorboard's
own loader (``RawEventFileLoader``, which checks each record's CRC in pure Python) parsing the same records.
``--mix``: a run's folder as it usually is, the scalars beside a histogram of a weight every 10 steps and an
image (a 256x256 spectrogram-sized picture of noise, PNG) every 100 steps: most of the bytes in few records.

    .venv/bin/python benchmarks/tb_read.py [--steps 200000] [--mix]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--mix", action="store_true")
    a = ap.parse_args()
    import torch
    from torch.utils.tensorboard import SummaryWriter

    g = torch.Generator().manual_seed(0)

    folder = Path(tempfile.mkdtemp(prefix="asrlab-tb-"))
    w = SummaryWriter(str(folder))
    for i in range(a.steps):
        w.add_scalar("train/loss", 1.0 / (i + 1), i)
        w.add_scalar("train/grad_norm", 1.0, i)
        w.add_scalar("train/lr", 1e-3, i)
        if a.mix and i % 10 == 0:
            w.add_histogram("weights/encoder.0", torch.randn(20_000, generator=g), i)
        if a.mix and i % 100 == 0:
            w.add_image("spectrogram", torch.rand(1, 256, 256, generator=g), i)
    w.close()
    files = list(folder.glob("events*"))
    mb = sum(f.stat().st_size for f in files) / 1e6

    from asrlab.doctor.sources import tensorboard

    t = time.perf_counter()
    r = tensorboard.read(files)
    ours = time.perf_counter() - t
    points = sum(len(p) for p in r.series.values())

    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    t = time.perf_counter()
    n = sum(
        len(event_pb2.Event.FromString(raw).summary.value) for f in files for raw in RawEventFileLoader(str(f)).Load()
    )
    theirs = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{mb:.1f} MB of event files, {points} points ({n} by tensorboard's loader)")
    print(f"asrlab's reader:      {ours:6.2f} s  {mb / ours:6.1f} MB/s")
    print(f"tensorboard's loader: {theirs:6.2f} s  {mb / theirs:6.1f} MB/s (records parsed, nothing kept)")
    print(f"peak RSS of this process: {rss:.0f} MB; 1 GB at asrlab's rate: {1000 / (mb / ours):.0f} s")


if __name__ == "__main__":
    main()

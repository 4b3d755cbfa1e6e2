"""What speed perturbation costs the loader: CPU seconds per hour of audio delivered, with and without
``data.speed_perturb=[0.9, 1.0, 1.1]``, the loader in this process (one thread, as a worker computes),
alternating rounds.

    .venv/bin/python benchmarks/speed_perturb.py LIST [--rounds 3] [--max-batches 60]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import torch

from asrlab.data.index import transcripts
from asrlab.data.loader import AsrLoader
from asrlab.data.config import DataConfig
from asrlab.data.sources import load_sources
from asrlab.data.tokenizer import CharTokenizer


def cpu_s_per_audio_h(sources, tok, cfg, max_batches: int) -> float:
    t0, frames = time.process_time(), 0
    for b in itertools.islice(AsrLoader(sources, tok, cfg), max_batches):
        frames += int(b["feat_lens"].sum())
    return (time.process_time() - t0) / (frames * cfg.frame_shift_ms / 1000 / 3600)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-batches", type=int, default=60)
    a = ap.parse_args()
    torch.set_num_threads(1)
    sources = load_sources(a.data)
    tok = CharTokenizer.build(transcripts(sources))
    plain, perturbed = DataConfig(), DataConfig(speed_perturb=(0.9, 1.0, 1.1))
    rows = {"off": [], "0.9/1.0/1.1": []}
    for r in range(a.rounds):
        for name, cfg in (("off", plain), ("0.9/1.0/1.1", perturbed))[:: 1 if r % 2 == 0 else -1]:
            rows[name].append(cpu_s_per_audio_h(sources, tok, cfg, a.max_batches))
        print(
            f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items()) + " CPU s per hour of audio",
            flush=True,
        )
    off, on = statistics.median(rows["off"]), statistics.median(rows["0.9/1.0/1.1"])
    print(
        f"median: off {off:.1f}, speed perturbation {on:.1f} CPU s per hour of audio (+{on - off:.1f} s, "
        f"{on / off:.2f}x): a loader worker's core delivers {3600 / on:.0f} h of audio per hour with it, "
        f"{3600 / off:.0f} without"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

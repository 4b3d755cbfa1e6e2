"""How busy the device is while asrlab trains, side by side in one run: random batches against duration
buckets (``--compare batching``), or the features (``--compare features``: duration buckets with the loader's
fbank, asrlab's then torchaudio's, and fbank made on the device after the copy), each at the same loader
setting; per variant the device's busy share (NVML, on a GPU), hours of audio trained per hour, data wait and
where the wall clock went (data wait, host overhead, compute, communication).

    python benchmarks/busy_gpu.py [LIST] --config base --workers 4 --max-frames 12000 --steps 40 [--compare features]

Without LIST it synthesizes the embedded corpus (``--utts``) under ``--work``. On a GPU the busy share
is NVML's; on CPU there is none, and the split comes from the step's timed parts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from asrlab.config import load_config, replace_section
from asrlab.lab.timing import format_split
from asrlab.measure.tune import measure


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", help="a data.list; default: synthesize the embedded corpus")
    ap.add_argument("--config", default="base")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--max-frames", type=int, default=12000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--utts", type=int, default=4000)
    ap.add_argument("--work", default="runs/busy_gpu")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--compare", choices=("batching", "features"), default="batching")
    ap.add_argument("overrides", nargs="*", default=[], help="config overrides, e.g. data.dither=0 (a LIST first)")
    a = ap.parse_intermixed_args(argv)  # LIST and overrides before or after the options
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = a.data
    if not data:
        from asrlab.data.synth import synthesize_corpus

        synthesize_corpus(work / "corpus", utts=a.utts)
        data = str(work / "corpus" / "train" / "data.list")
    base = load_config(a.config, a.overrides)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(f"{a.config} on {device}; {a.workers} workers, max_frames_in_batch={a.max_frames}, {a.steps} steps each")
    rows = []
    variants = {
        "batching": (("random batches", {"bucketing": False}), ("duration buckets", {"bucketing": True})),
        "features": (
            ("asrlab fbank", {"bucketing": True, "fbank": "asrlab"}),
            ("torchaudio fbank", {"bucketing": True, "fbank": "torchaudio"}),
            ("fbank on device", {"bucketing": True, "features": "device"}),
        ),
    }[a.compare]
    for name, setting in variants:
        cfg = replace_section(base, "data", num_workers=a.workers, max_frames_in_batch=a.max_frames, **setting)
        r = measure(cfg, data, steps=a.steps, workdir=work)
        util = "-" if r["gpu_util_pct"] is None else f"{r['gpu_util_pct']:.0f}%"
        print(
            f"{name:17s} busy (NVML) {util:>4s}  {r['audio_h_per_h']:7.0f} h of audio per hour  data wait "
            f"{100 * r['data_wait']:4.1f}%  {1000 * r['step_s']:6.1f} ms/step"
        )
        print(f"{'':17s} wall clock: {format_split(r['split'])} ({r['split']['basis']})")
        rows.append({"variant": name, **{k: v for k, v in r.items() if k != "samples"}})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

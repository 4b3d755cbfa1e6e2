"""Time to the first training step against corpus size: without the index, and with it (first start: the
index built; second start: the index read).

    .venv/bin/python benchmarks/startup.py [--sizes 3000,30000,100000] [--work /tmp/asrlab_startup]

Each corpus is written once (tone utterances of 0.3-1.0 s, 16 kHz, uncompressed shards of 1,000, words
of a 40-word vocabulary; the same layout a synthesized corpus has, made in seconds). Each start runs in
a fresh process and times, after the imports, the trainer's construction (tokenizer, LR horizon, which
with ``optim.decay_by_clock`` plans an epoch) and its first step (the loader's first batch included).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORDS = [f"{a}{b}" for a in ("ka", "to", "mi", "re", "su") for b in ("n", "la", "ro", "ve", "d", "p", "s", "u")]
ONE = """
import json, sys, tempfile, time
t0 = time.perf_counter()
import torch
from asrlab.config import load_config
from asrlab.lab.dist import DistInfo
from asrlab.train.trainer import Trainer
imported = time.perf_counter()
data, index = sys.argv[1], sys.argv[2] == "1"
cfg = load_config("tiny", ["optim.decay_by_clock=true", "train.max_minutes=60", "train.progress=false",
                           "train.stall_timeout_s=0", f"data.index={str(index).lower()}"])
tr = Trainer(cfg, data, None, tempfile.mkdtemp(), DistInfo(0, 1, 0, torch.device("cpu"), None))
built = time.perf_counter()
tr.train_step([next(iter(tr.loader))])
tr.settle()
done = time.perf_counter()
tr.close()
print(json.dumps({"construct_s": built - imported, "first_step_s": done - imported, "imports_s": imported - t0}))
"""


def corpus(
    n: int, out: Path, low_s: float = 0.3, high_s: float = 1.0, seed: int | None = None, shard_size: int = 1000
) -> Path:
    """``n`` tone utterances of ``low_s``-``high_s`` seconds in uncompressed shards under ``out``."""
    from asrlab.data.audio import encode_wav
    from asrlab.data.shards import write_split

    lst = out / "train" / "data.list"
    if lst.exists():
        return lst
    rng = np.random.default_rng(n if seed is None else seed)

    def utts():
        for i in range(n):
            samples = int(16000 * rng.uniform(low_s, high_s))
            wav = (0.2 * np.sin(np.arange(samples) * rng.uniform(0.02, 0.2)) * 32767).astype(np.int16)
            yield f"utt{i:07d}", " ".join(rng.choice(WORDS, size=rng.integers(1, 4))), encode_wav(wav, 16000)

    write_split(utts(), out / "train", "train", shard_size=shard_size)
    return lst


def start(lst: Path, index: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", ONE, str(lst), "1" if index else "0"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="3000,30000,100000")
    ap.add_argument("--work", default="/tmp/asrlab_startup")
    a = ap.parse_args()
    rows = []
    print(
        f"{'utterances':>10} {'no index':>10} {'first start':>12} {'second start':>13}   (s to the first step; "
        "construction in brackets)"
    )
    for n in (int(x) for x in a.sizes.split(",")):
        lst = corpus(n, Path(a.work) / str(n))
        sidecar = lst.with_name(lst.name + ".index.json")
        sidecar.unlink(missing_ok=True)
        plain = start(lst, False)
        first = start(lst, True)
        second = start(lst, True)
        rows.append({"utterances": n, "no_index": plain, "first": first, "second": second})
        cell = lambda r: f"{r['first_step_s']:.2f} ({r['construct_s']:.2f})"  # noqa: E731
        print(f"{n:>10} {cell(plain):>10} {cell(first):>12} {cell(second):>13}", flush=True)
    a0, a1 = rows[0]["second"]["first_step_s"], rows[-1]["second"]["first_step_s"]
    print(f"second start, {rows[-1]['utterances']} against {rows[0]['utterances']} utterances: {a1 / a0:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The trainer's steps/s in this tree against another git revision, alternating, each run in its own process.

    .venv/bin/python benchmarks/trainer_ab.py REV LIST [--steps 40] [--rounds 8]

REV is checked out once into a temporary git worktree; every round runs the trainer (tiny config, the
in-memory batches of LIST, the first step untimed) in both trees, which goes first alternating, and the
median of the per-round ratios is reported. A 2-core machine drifts by several percent between runs, so
read the spread of the rounds, not one of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE = """
import sys, tempfile, time, torch
from asrlab.config import load_config
from asrlab.lab.dist import DistInfo
from asrlab.train.trainer import Trainer
data, steps = sys.argv[1], int(sys.argv[2])
cfg = load_config("tiny", ["train.stall_timeout_s=0", "train.progress=false", "data.num_workers=0",
                           "train.max_epochs=1000"])
tr = Trainer(cfg, data, None, tempfile.mkdtemp(), DistInfo(0, 1, 0, torch.device("cpu"), None))
it = iter(tr.loader)
batches = [next(it) for _ in range(steps + 1)]
tr.train_epoch(iter(batches[:1]))
t0 = time.perf_counter()
tr.train_epoch(iter(batches[1:]))
print(steps / (time.perf_counter() - t0))
"""


def rate(tree: Path, data: str, steps: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", ONE, data, str(steps)],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=True,
    )
    return float(out.stdout.split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev")
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="asrlab-ab-") as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(other), a.rev], cwd=ROOT, check=True)
        try:
            ratios = []
            for r in range(a.rounds):
                order = [("this", ROOT), (a.rev, other)][:: 1 if r % 2 == 0 else -1]
                got = {name: rate(tree, a.data, a.steps) for name, tree in order}
                ratios.append(got["this"] / got[a.rev])
                print(
                    f"round {r + 1}: this tree {got['this']:.3f} steps/s, {a.rev} {got[a.rev]:.3f} steps/s "
                    f"({order[0][0]} first)",
                    flush=True,
                )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, check=False)
    print(
        f"median over {a.rounds} rounds of {a.steps} steps: this tree / {a.rev} = {statistics.median(ratios):.3f} "
        f"(rounds {min(ratios):.3f} to {max(ratios):.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

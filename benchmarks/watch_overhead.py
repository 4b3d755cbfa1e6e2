"""What ``asrlab watch`` costs the job it watches: steps per second of examples/bare_loop.py (2 gloo ranks under
torchrun, 2 DataLoader workers each) with and without the watch, in interleaved rounds.

Steps per second come from the loop's own output (rank 0 prints every 20th step): the arrival times of those
lines, first to last, so start-up is not counted and the loop is not changed. Beside them, the CPU the watch
took (the watcher and its py-spy dumps, from the watch's lab.json) as a share of all the CPU the watched run
took (job and watch): what the watch would cost a job that keeps every core busy. Run from the repository root::

    .venv/bin/python benchmarks/watch_overhead.py [--rounds 5] [--epochs 10] [--sample-hz 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STEP = re.compile(r"^step (\d+) loss")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def steps_per_s(cmd: list[str], env: dict) -> float:
    proc = subprocess.Popen(cmd, cwd=EXAMPLES, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen = []
    for line in proc.stdout:
        m = STEP.match(line)
        if m:
            seen.append((int(m.group(1)), time.perf_counter()))
    if proc.wait() != 0 or len(seen) < 3:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}, {len(seen)} step lines")
    (s0, t0), (s1, t1) = seen[0], seen[-1]
    return (s1 - s0) / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--sample-hz", type=float, default=2.0)
    a = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        job = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "bare_loop.py",
            f"{tmp}/out",
            str(a.epochs),
        ]
        watched = [
            sys.executable,
            "-m",
            "asrlab.cli",
            "watch",
            "--exp",
            f"{tmp}/exp",
            "--sample-hz",
            str(a.sample_hz),
            "--stall-timeout",
            "120",
            "--",
            *job,
        ]
        rows = {"bare": [], "watched": []}
        shares, dumps = [], []
        for r in range(a.rounds):
            for name in ("bare", "watched") if r % 2 == 0 else ("watched", "bare"):  # interleaved, alternating
                cpu0 = children_cpu()
                rows[name].append(steps_per_s(job if name == "bare" else watched, env))
                extra = ""
                if name == "watched":
                    lab = json.loads(Path(f"{tmp}/exp/lab.json").read_text())
                    cost = lab["watch_cost"]["watcher_cpu_s"] + lab["watch_cost"]["sampler_cpu_s"]
                    shares.append(cost / (children_cpu() - cpu0))
                    dumps.append(lab["watch_cost"]["dumps"] / (lab["ended"] - lab["started"]))
                    extra = f"  (watch CPU {100 * shares[-1]:.2f}% of the run's, {dumps[-1]:.1f} py-spy dumps/s)"
                print(f"round {r + 1} {name:8s} {rows[name][-1]:.2f} steps/s{extra}", flush=True)
    bare, watched_s = statistics.median(rows["bare"]), statistics.median(rows["watched"])
    # each round's own ratio too: the two runs of a round are neighbours, so the machine's slow drift cancels
    paired = statistics.median(w / b for w, b in zip(rows["watched"], rows["bare"]))
    print(
        f"median over {a.rounds} rounds: bare {bare:.2f} steps/s, under asrlab watch ({a.sample_hz:g} Hz) "
        f"{watched_s:.2f} steps/s: {watched_s / bare:.3f}x; median of the rounds' own ratios {paired:.3f}x"
    )
    print(
        f"the watch's CPU, median share of the watched run's: {100 * statistics.median(shares):.2f}% "
        f"({statistics.median(dumps):.1f} py-spy dumps/s)"
    )


if __name__ == "__main__":
    main()

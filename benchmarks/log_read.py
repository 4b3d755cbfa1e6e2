"""How fast ``asrlab doctor LOG`` reads a large log, against ``grep -c`` and a plain Python loop over the
same file's lines, and how much memory it takes.

Writes a log of SIZE_MB (default 1024) the way an 8-rank WeNet run writes one (train_utils' step line per
rank, an INFO line now and then, one non-finite step near the middle, a rank's traceback and torchrun's
summary at the end), then times each reader on it, one core each (run it with nothing else busy).

    .venv/bin/python benchmarks/log_read.py [--size-mb 1024] [--keep PATH]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TAIL = """[rank1]:Traceback (most recent call last):
[rank1]:  File "wenet/bin/train.py", line 290, in main
[rank1]:    executor.train(model, optimizer, scheduler, train_data_loader, cv_data_loader, writer, configs, scaler, group_join)
[rank1]:  File "wenet/dataset/processor.py", line 82, in parse_url
[rank1]:    assert 'src' in sample
[rank1]:AssertionError
E1125 10:00:05.000000 100 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 1 (pid: 1235) of binary: /usr/bin/python
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_10:00:05
  host      : node0
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 1235)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def write_log(path: Path, size_mb: int) -> int:
    rng = random.Random(0)
    target, batch, lines = size_mb << 20, 0, 0
    nan_at = target // 2
    with open(path, "w") as f:
        while f.tell() < target:
            batch += 1
            for rank in range(8):
                loss = rng.uniform(20, 90)
                ctc = "inf" if nan_at and f.tell() > nan_at and rank == 3 else f"{loss * 1.2:.6f}"
                if ctc == "inf":
                    nan_at = 0
                f.write(
                    f"2026-11-25 09:{batch // 60000 % 60:02d}:{batch // 1000 % 60:02d},{batch % 1000:03d} DEBUG "
                    f"TRAIN | steps/sec 1.734| Batch 3/{batch} loss {loss:.6f} loss_att {loss * 0.9:.6f} "
                    f"loss_ctc {ctc} th_accuracy {rng.random():.6f} lr 0.00100000 grad_norm {rng.uniform(1, 9):.6f} "
                    f"rank {rank}\n"
                )
                lines += 1
            if batch % 500 == 0:
                f.write(f"2026-11-25 09:00:00,000 INFO Checkpoint: save to checkpoint exp/{batch}.pt\n")
                lines += 1
        f.write(TAIL)
    return lines + TAIL.count("\n")


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, its output's last line)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip().splitlines()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out[-1] if out else ""


DOCTOR = """
import resource, sys, time
from asrlab.doctor.logs import diagnose_logs
t0 = time.perf_counter()
d = diagnose_logs([sys.argv[1]])
print(f"{time.perf_counter() - t0:.2f} s reading; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB;"
      f" {d['verdict']}: {d['summary'][:150]}")
"""
LOOP = """
import sys
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        if b"loss" in line:
            n += 1
print(n)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--keep", help="write the log here and keep it")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    path = Path(a.keep) if a.keep else Path(tempfile.mkdtemp()) / "train.log"
    t0 = time.perf_counter()
    lines = write_log(path, a.size_mb)
    size = path.stat().st_size
    print(f"log: {size / 2**20:.0f} MiB, {lines} lines, written in {time.perf_counter() - t0:.0f} s")
    py = sys.executable
    for name, cmd in (
        ("grep -c loss", ["grep", "-c", "loss", str(path)]),
        ("python loop over lines", [py, "-c", LOOP, str(path)]),
        ("asrlab doctor (read + verdict)", [py, "-c", DOCTOR, str(path)]),
    ):
        runs = [
            timed(["taskset", "-c", "0", *cmd] if os.path.exists("/usr/bin/taskset") else cmd) for _ in range(a.rounds)
        ]
        best = min(runs, key=lambda r: r[0])
        print(
            f"{name:32s} wall {best[0]:6.2f} s (best of {a.rounds}), CPU {best[1]:6.2f} s, "
            f"{size / 2**20 / best[0]:7.0f} MiB/s  | {best[2][:170]}"
        )
    if not a.keep:
        path.unlink()


if __name__ == "__main__":
    main()

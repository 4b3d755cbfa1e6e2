"""Where a command's CPU time goes, by the kind of process that spent it: the test suite's question.

    .venv/bin/python benchmarks/suite_cpu.py -- .venv/bin/python -m pytest      # run it and sample
    .venv/bin/python benchmarks/suite_cpu.py --report samples.json               # the table again

Every 0.3 s every process's CPU time so far (utime + stime from ``/proc/PID/stat``) is read; each process
(pid and start time) keeps the most seen and its first command line. Processes that were running before
the command started are left out. A process that lives under 0.3 s may be missed: its CPU is too small to
matter here. Linux only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

# (what a command line contains, the kind it is counted as), first match wins
KINDS = [
    ("chromium", "chromium (browser test)"),
    ("ipykernel", "notebook kernels"),
    ("jupyter", "JupyterLab server"),
    ("exec(eval(sys.stdin", "pytest workers (tests run in-process)"),
    ("asrlab.train.launch", "asrlab train's torchrun agent"),
    ("torch.distributed.run", "torchrun agents (tests' and notebooks' loops)"),
    ("asrlab.cli train", "asrlab train ranks and launchers"),
    ("asrlab.cli watch", "asrlab watch"),
    ("asrlab.cli doctor", "asrlab doctor"),
    ("from multiprocessing", "spawned workers"),
    ("_loop.py", "the examples' and tests' own loops (ranks, forked workers)"),
    ("from asrlab.cli import main", "ranks forked by the tests (the halts)"),
    ("py-spy", "py-spy"),
    ("python", "other Python"),
]


def kind(cmd: str) -> str:
    return next((k for pattern, k in KINDS if pattern in cmd), "other")


def _processes():
    """(key, /proc/PID/stat's fields after the name, command line) of every process now."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = open(f"/proc/{pid}/stat").read()
                cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:300]
            except OSError:
                continue
            f = stat[stat.rfind(")") + 2 :].split()
            yield f"{pid}:{f[19]}", f, cmd  # pid and start time: a pid used again is another process


def sample(cmd: list[str], every_s: float = 0.3) -> tuple[int, dict]:
    """Run ``cmd`` and sample until it ends: (its exit code, {process: [CPU s, command line]})."""
    hz, seen = os.sysconf("SC_CLK_TCK"), {}
    before = {key for key, _, _ in _processes()}
    proc = subprocess.Popen(cmd)
    while proc.poll() is None:
        for key, f, cmd_line in _processes():
            if key not in before:
                cpu, old = (int(f[11]) + int(f[12])) / hz, seen.get(key, (0.0, ""))
                seen[key] = (max(cpu, old[0]), old[1] or cmd_line)
        time.sleep(every_s)
    return proc.returncode, {k: list(v) for k, v in seen.items()}


def report(samples: dict) -> str:
    cpu, n = collections.Counter(), collections.Counter()
    for seconds, cmd in samples.values():
        cpu[kind(cmd)] += seconds
        n[kind(cmd)] += 1
    total = sum(cpu.values())
    lines = [
        f"{'CPU s':>8} {'share':>6} {'procs':>6}  kind",
        *(f"{s:8.1f} {s / total:6.1%} {n[k]:6d}  {k}" for k, s in cpu.most_common()),
    ]
    return "\n".join(lines + [f"{total:8.1f} {1:6.0%} {sum(n.values()):6d}  all"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", help="a samples file written before: print its table")
    p.add_argument("--out", default="suite_cpu_samples.json", help="where the samples go")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.report:
        print(report(json.load(open(a.report))))
        return
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("give a command after --, or --report FILE")
    t0 = time.time()
    code, samples = sample(cmd)
    json.dump(samples, open(a.out, "w"))
    print(f"{' '.join(cmd)}: exit {code} after {time.time() - t0:.0f} s; samples in {a.out}")
    print(report(samples))
    sys.exit(code)


if __name__ == "__main__":
    main()

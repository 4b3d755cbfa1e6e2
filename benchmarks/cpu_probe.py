"""Where the test suite's time and CPU go, test by test: a pytest plugin and its report.

    PYTHONPATH=benchmarks CPU_PROBE=DIR .venv/bin/python -m pytest -p cpu_probe      # record (any -n)
    .venv/bin/python benchmarks/cpu_probe.py DIR                                       # the tables

For each test (setup, call and teardown together) it records the wall time, the worker's own CPU and the CPU
of the processes the worker waited for while the test ran (``getrusage(RUSAGE_CHILDREN)``: a test's
subprocesses and everything they in turn waited for: torchrun's agents, the ranks, their loader workers, a
notebook's kernel). A process nobody waits for (one left to init) is not counted. One JSON line per test,
into ``DIR/<worker>.jsonl``.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from pathlib import Path


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def pytest_runtest_logfinish(nodeid, location):
    out = os.environ.get("CPU_PROBE")
    if not out:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    state = _STATE.pop(nodeid, None)
    if state is None:
        return
    t0, own0, kids0 = state
    rec = {
        "test": nodeid,
        "worker": worker,
        "start": t0,
        "wall": time.time() - t0,
        "own_cpu": _cpu(resource.RUSAGE_SELF) - own0,
        "children_cpu": _cpu(resource.RUSAGE_CHILDREN) - kids0,
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


_STATE: dict[str, tuple[float, float, float]] = {}
_CONTROLLER = False  # pytest-xdist's controller sees every worker's tests go by: only the workers measure


def pytest_configure(config):
    global _CONTROLLER
    _CONTROLLER = not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def pytest_runtest_logstart(nodeid, location):
    if os.environ.get("CPU_PROBE") and not _CONTROLLER:
        _STATE[nodeid] = (time.time(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN))


def report(folder: Path, top: int = 25) -> str:
    recs = [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]
    if not recs:
        return f"{folder}: no records"
    t0, t1 = min(r["start"] for r in recs), max(r["start"] + r["wall"] for r in recs)
    cpu = lambda r: r["own_cpu"] + r["children_cpu"]  # noqa: E731
    total = sum(cpu(r) for r in recs)
    lines = [
        f"{len(recs)} tests, {t1 - t0:.0f} s from the first test's start to the last one's end, "
        f"{total:.0f} CPU s counted ({sum(r['children_cpu'] for r in recs):.0f} of them in the tests' subprocesses)",
        "",
        "by file: CPU s (share), wall s on its worker, tests",
    ]
    files = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in recs:
        f = files[r["test"].split("::")[0]]
        f[0] += cpu(r)
        f[1] += r["wall"]
        f[2] += 1
    for name, (c, w, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {c:7.0f} ({100 * c / total:4.1f}%) {w:7.0f}  {n:4d}  {name}")
    lines += ["", f"the {top} tests with most CPU: CPU s, wall s"]
    for r in sorted(recs, key=lambda r: -cpu(r))[:top]:
        lines.append(f"  {cpu(r):7.1f} {r['wall']:7.1f}  {r['test']}")
    lines += ["", "workers: busy s, last test's end (s after the first start)"]
    for w in sorted({r["worker"] for r in recs}):
        mine = [r for r in recs if r["worker"] == w]
        lines.append(
            f"  {w}: {sum(r['wall'] for r in mine):.0f} busy, ends at {max(r['start'] + r['wall'] for r in mine) - t0:.0f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1])))

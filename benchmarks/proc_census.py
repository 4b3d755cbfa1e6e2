"""Every Python process a run of the suite starts, and what each cost: a census for finding the suite's CPU.

``install VENV`` puts a ``.pth`` file into the virtual environment's site-packages that makes every Python
started from it append a line to ``$PROC_CENSUS`` (default ``/tmp/proc_census.jsonl``) when it starts and when
it exits: its pid, command line, the test it ran under (``PYTEST_CURRENT_TEST``, inherited from the pytest
worker), whether it imported torch, and its own CPU seconds. A process that never exits normally (a SIGKILLed
rank) has a start line only; a rank forked from a process that had imported torch (``asrlab train``'s
forkserver) is not a new Python and is not counted. ``uninstall VENV`` removes it; ``report LOG`` sums it up.

    python benchmarks/proc_census.py install /tmp/ci/asrlab/.venv
    cd /tmp/ci/asrlab && .venv/bin/python -m pytest -p no:cacheprovider
    python benchmarks/proc_census.py report /tmp/proc_census.jsonl
"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

PROBE = """import atexit, json, os, sys, time
_t0, _pid = time.time(), os.getpid()
def _asrlab_census(kind):
    if os.getpid() != _pid:
        return
    try:
        t = os.times()
        rec = {"k": kind, "pid": _pid, "argv": sys.argv[:4], "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
               "torch": "torch" in sys.modules, "cpu": round(t.user + t.system, 2), "wall": round(time.time() - _t0, 2)}
        with open(os.environ.get("PROC_CENSUS", "/tmp/proc_census.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\\n")
    except Exception:
        pass
_asrlab_census("start")
atexit.register(_asrlab_census, "end")
"""


def _site(venv: str) -> Path:
    return next(Path(venv).glob("lib/python3*/site-packages"))


def _kind(argv: list[str]) -> str:
    name = os.path.basename(argv[0]) if argv else "?"
    if name == "__main__.py" and len(argv) > 1:  # asrlab's CLI, pytest's
        return f"{os.path.basename(os.path.dirname(argv[0]))} {argv[1] if not argv[1].startswith('-') else ''}".strip()
    return name


def report(log: str) -> None:
    recs = [json.loads(line) for line in open(log)]
    ends = {r["pid"]: r for r in recs if r["k"] == "end"}
    starts = [r for r in recs if r["k"] == "start"]
    torch_cpu = sum(r["cpu"] for r in ends.values() if r["torch"])
    print(
        f"{len(starts)} Python processes started, {len(ends)} exited normally ({len(starts) - len(ends)} killed "
        f"or ended without exit handlers); of those that exited, {sum(r['torch'] for r in ends.values())} "
        f"imported torch ({torch_cpu:.0f} of their {sum(r['cpu'] for r in ends.values()):.0f} CPU s)"
    )
    by = collections.defaultdict(lambda: [0, 0, 0.0])
    for s in starts:
        e = ends.get(s["pid"])
        # pytest-xdist's workers are "python -c" started outside any test: their CPU is mostly the in-process tests'
        worker = (e or s)["argv"] == ["-c"] and not s["test"]
        row = by["-c outside a test (xdist workers)" if worker else _kind((e or s)["argv"])]
        row[0] += 1
        row[1] += e is None
        row[2] += e["cpu"] if e else 0.0
    print("\nby program: started (of them without an end line), CPU s of those that ended")
    for k, (n, lost, cpu) in sorted(by.items(), key=lambda x: -x[1][2])[:20]:
        print(f"  {n:4d} ({lost:3d}) {cpu:7.1f}  {k}")
    files = collections.defaultdict(lambda: [0, 0.0])
    for s in starts:
        f = files[s["test"].split("::")[0] or "(pytest itself)"]
        f[0] += 1
        f[1] += ends[s["pid"]]["cpu"] if s["pid"] in ends else 0.0
    print("\nby test file: processes started, CPU s of those that ended")
    for k, (n, cpu) in sorted(files.items(), key=lambda x: -x[1][1])[:20]:
        print(f"  {n:4d} {cpu:7.1f}  {k}")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("install", "uninstall", "report"):
        print(__doc__)
        return 2
    if argv[0] == "report":
        report(argv[1])
        return 0
    site = _site(argv[1])
    for p in (site / "_asrlab_census.py", site / "zz_asrlab_census.pth"):
        p.unlink(missing_ok=True)
    if argv[0] == "install":
        (site / "_asrlab_census.py").write_text(PROBE)
        (site / "zz_asrlab_census.pth").write_text("import _asrlab_census\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

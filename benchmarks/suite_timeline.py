"""When each test file ran on which pytest-xdist worker: are the workers balanced, and which files hold them.

    PYTHONPATH=benchmarks .venv/bin/python -m pytest -p suite_timeline    # records /tmp/suite_timeline.jsonl
    .venv/bin/python benchmarks/suite_timeline.py                         # per worker: its files, their span

As a pytest plugin it appends each test's start and end (worker, node id, wall time) to ``TIMELINE``; run as a
script it prints, per worker, the files that held it over 15 s and when the worker ended.
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

TIMELINE = os.environ.get("SUITE_TIMELINE", "/tmp/suite_timeline.jsonl")


def _record(nodeid: str, event: str) -> None:
    with open(TIMELINE, "a") as f:
        f.write(json.dumps({"w": os.environ.get("PYTEST_XDIST_WORKER", "main"), "id": nodeid, "ev": event,
                            "t": time.time()}) + "\n")  # fmt: skip


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Where the test runs (a worker, or the one process): xdist's controller also reports its workers' tests."""
    _record(item.nodeid, "start")
    try:
        return (yield)
    finally:
        _record(item.nodeid, "end")


def main() -> None:
    events = [json.loads(line) for line in open(TIMELINE)]
    t0 = min(e["t"] for e in events)
    started, spans = {}, collections.defaultdict(list)
    for e in events:
        key = (e["w"], e["id"])
        if e["ev"] == "start":
            started[key] = e["t"]
        elif key in started:
            spans[e["w"]].append((started[key] - t0, e["t"] - t0, e["id"].split("::")[0]))
    for worker, s in sorted(spans.items()):
        files: dict[str, list[float]] = {}
        for a, b, f in sorted(s):
            span = files.setdefault(f, [a, b])
            span[1] = max(span[1], b)
        print(f"{worker}: ended at {max(b for _, b, _ in s):.0f} s")
        for f, (a, b) in files.items():
            if b - a > 15:
                print(f"  {a:5.0f} to {b:5.0f} s  {b - a:4.0f} s  {f}")


if __name__ == "__main__":
    main()

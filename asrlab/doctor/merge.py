"""Several nodes' run folders read as one run (``asrlab doctor EXP_node0 EXP_node1 ...``): every node's per-rank
files side by side (``asrlab watch`` names them by global rank); ``lab.json`` and the stall report made again over
every node's ranks, so that the report names the rank that held the others up whichever node it ran on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..lab import layout
from ..errors import UsageError
from ..files import atomic_write
from ..lab.stall.classify import held_phase
from ..lab.stall.flight import last_collectives
from ..lab.stall.heartbeat import phase_at, read_timeline
from ..lab.stall.report import write_report

PER_RANK = (layout.HEARTBEAT, layout.ERRORS, layout.STALL, layout.LEDGER, layout.METRICS, layout.NONFINITE)
PER_RANK += (layout.DIAGNOSTICS, layout.FLIGHT)


def merge_runs(exps: list[str | Path], into: str | Path) -> Path:
    """Every folder of ``exps`` (one per node) into ``into``, as one run (see the module docstring)."""
    into = Path(into)
    exps = [Path(e) for e in exps]
    for e in exps:
        if not e.is_dir():
            raise UsageError(f"{e}: not a directory")
        for sub in PER_RANK:
            for path in (p for p in (e / sub).rglob("*") if p.is_file()):  # (nothing where the node has no such folder)
                dest = into / sub / path.relative_to(e / sub)
                if dest.exists() and dest.stat().st_mtime >= path.stat().st_mtime:
                    continue  # the newest copy of a file two nodes both hold (relayed ones)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)
    labs = [json.loads((e / layout.LAB).read_text()) for e in exps if (e / layout.LAB).exists()]
    ranks = {int(p.stem[4:]) for p in (into / layout.HEARTBEAT).glob("rank*.json") if p.stem[4:].isdigit()}
    lab: dict = {}
    if labs:
        world = max(len(ranks), max((x.get("world_size") or 0) for x in labs))
        started = min(x.get("started", 0) for x in labs)
        lab = {**labs[0], "world_size": world, "started": started, "nodes": list(map(str, exps))}
        stops = [x for x in labs if x.get("status") == "stopped" and x.get("stop_time")]
        if stops:  # a node's watch told to end the job: the others' ranks failed after it, on its doing
            first = min(stops, key=lambda x: x["stop_time"])
            lab.update(status="stopped", stop_time=first["stop_time"], stopped_by=first.get("stopped_by"))
        elif any(x.get("status") == "failed" for x in labs):
            lab["status"] = "failed"
        elif all(x.get("status") == "finished" for x in labs):
            lab["status"] = "finished"
        if ended := [x["ended"] for x in labs if x.get("ended")]:
            lab["ended"] = max(ended)
        (into / layout.LAB).write_text(json.dumps(lab))
    reports = [json.loads((e / layout.STALL_REPORT).read_text()) for e in exps if (e / layout.STALL_REPORT).exists()]
    if reports:  # every node's dumps together: the verdict over every rank
        first = min(reports, key=lambda r: r.get("time", 0))
        world = lab.get("world_size") or first.get("world_size") or 1
        _as_at(into, first.get("time", 0.0), world)
        failure = next((r["failure"] for r in reports if r.get("failure")), None)
        since, timeout = lab.get("started", 0.0), first.get("timeout_s", 0.0)
        collectives = last_collectives(into)
        write_report(into, world, timeout, since=since, now=first.get("time"), failure=failure, collectives=collectives)
    return into


def _as_at(into: Path, when: float, world: int) -> None:
    """A rank whose node's watch saw no stall (another node's ended the job first; this rank moved again, to a lost
    peer's error) described as it was when the stall was seen: its phase then, from its timeline."""
    stall = Path(into) / layout.STALL
    timelines = read_timeline(into)
    for path in sorted((Path(into) / layout.HEARTBEAT).glob("rank*.json")):
        if not path.stem[4:].isdigit():
            continue
        rank = int(path.stem[4:])
        dump = stall / f"rank{rank}.json"
        beat = json.loads(path.read_text())
        if dump.exists() or beat.get("time", 0.0) <= when:
            continue
        then = phase_at(timelines.get(rank, []), when)
        if then is None:
            continue
        stall.mkdir(parents=True, exist_ok=True)
        was = {"phase": held_phase(then["phase"], world), "since": then["t"], "time": when}
        atomic_write(dump, json.dumps({**beat, **was, "detail": "as the stall was seen, from its timeline"}))


__all__ = ["merge_runs"]

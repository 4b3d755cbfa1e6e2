"""The files a stall leaves, and the reading of them.

``EXP/stall/rank{R}.json``: one rank's heartbeat and the Python stacks of all its threads, written by
that rank when the stall was seen; ``EXP/stall_report.json`` and ``EXP/stall_report.txt``: every
rank's dump gathered under the verdict (the text's first line); ``EXP/lab.json``: how a loop using the
parts says its run went (for ``asrlab doctor``).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from pathlib import Path

from .. import layout
from ..layout import STALL
from ...files import atomic_write, read_json
from .classify import own_tail
from .errors import error_line
from .heartbeat import read_heartbeats
from .flight import behind_text, last_collectives, mismatch_text
from .verdict import ENDED, failure_verdict, rank_line, ranks_named, verdict


def thread_stacks() -> dict[str, list[str]]:
    """The Python stack of every thread of this process, innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {
        f"{names.get(ident, 'thread')} ({ident})": [line.rstrip() for line in traceback.format_stack(frame)]
        for ident, frame in sys._current_frames().items()
    }


def write_dump(exp: Path, snap: dict) -> Path:
    return atomic_write(Path(exp) / STALL / f"rank{snap['rank']}.json", json.dumps({**snap, "stacks": thread_stacks()}))


def write_report(
    exp: Path,
    world_size: int,
    timeout_s: float,
    rid: str | None = None,
    wait_s: float = 0.0,
    since: float = 0.0,
    now: float | None = None,
    failure: dict | None = None,
    collectives: dict | None = None,
    elsewhere: tuple = (),
) -> dict:
    """Gather the ranks' dumps (waiting up to ``wait_s`` for all of them) into the report files.

    Only files of run ``rid`` (when given) written after ``since`` (wall clock) count. Ranks
    without a dump are described from their last heartbeat file; their stacks may be in
    ``EXP/stall/rank{R}.faulthandler.txt``. ``failure``: a rank's recorded error (:mod:`.errors`),
    which the others were left waiting for: the verdict names it first. ``collectives``: the Flight
    Recorder's summary (:func:`.flight.last_collectives`): ranks that called different collectives are named first.
    ``elsewhere``: the ranks of other nodes, which this node's watch cannot see.
    """
    exp = Path(exp)
    deadline = time.time() + wait_s
    while True:
        dumps = {}
        for path in (Path(exp) / STALL).glob("rank*.json"):
            try:
                d = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if (rid is None or d.get("run") == rid) and d.get("time", 0) >= since:
                dumps[int(d["rank"])] = d
        if len(dumps) >= world_size - len(elsewhere) - (failure is not None) or time.time() >= deadline:
            break
        time.sleep(0.2)
    beats = {r: b for r, b in read_heartbeats(exp, rid).items() if b.get("time", 0) >= since}
    snaps = {**beats, **dumps}
    if now is None:  # when the stall was seen: the first dump, else now
        now = min([s.get("time", 0.0) for s in dumps.values()] or [time.time()])
    said = verdict(snaps, world_size, now, elsewhere) if failure is None else failure_verdict(failure, snaps)
    # a rank whose data ran out calls what follows the loop while the others still train: the same collective
    # number with two calls, read as uneven data (the verdict above), not as a branch on the rank
    uneven = 0 < sum(s.get("phase") in ENDED for s in snaps.values()) < len(snaps)
    if (
        failure is None
        and not uneven
        and (lead := mismatch_text(collectives, snaps) or behind_text(collectives, snaps))
    ):
        said = f"{lead}. {said[0].upper()}{said[1:]}"
    report = {
        "verdict": said,
        "time": now,
        "timeout_s": timeout_s,
        "world_size": world_size,
        "ranks": [],
        "failure": failure,
    }
    for r in range(world_size):
        s = snaps.get(r)
        if s is None:
            report["ranks"].append({"rank": r, "phase": None, "note": "no heartbeat"})
            continue
        entry = {k: s.get(k) for k in ("rank", "phase", "step", "since", "detail", "host", "pid", "rank_known")}
        entry["in_phase_s"] = round(now - s["since"], 1)
        entry["stacks"] = s.get("stacks")
        fh = Path(exp) / STALL / f"rank{r}.faulthandler.txt"
        if entry["stacks"] is None and fh.exists() and fh.stat().st_size:
            entry["faulthandler"] = fh.read_text()
        workers = Path(exp) / STALL / f"rank{r}.workers.txt"
        if s.get("phase") == "data" and workers.exists() and workers.stat().st_size:
            entry["workers"] = workers.read_text()
        report["ranks"].append(entry)
    for name, text in ((layout.STALL_TEXT, format_report(report)), (layout.STALL_REPORT, json.dumps(report, indent=1))):
        atomic_write(exp / name, text)  # the failing rank and a survivor may both write it
    return report


def format_report(report: dict) -> str:
    failure = report.get("failure")
    why = (
        f"{error_line(failure)}. The other ranks were left waiting for it (their state and stacks below)."
        if failure
        # what was done about it (reported, the job ended) is the watcher's to say: this is written first
        else f"No rank made progress for {report['timeout_s']:g} s."
    )
    lines = [report["verdict"], "", why, ""]
    lines += [rank_line(e) for e in report["ranks"]]
    for e in report["ranks"]:
        if e.get("stacks"):
            lines += ["", f"--- {ranks_named([e])}: Python stacks ---"]
            for name, frames in sorted(e["stacks"].items(), key=lambda kv: "MainThread" not in kv[0]):
                lines.append(f"[{name}]")
                lines += own_tail(frames)  # from the loop's own line down to the blocking call
        elif e.get("faulthandler"):
            lines += ["", f"--- rank {e['rank']}: faulthandler dump ---", e["faulthandler"]]
        if e.get("workers"):
            lines += ["", f"--- {ranks_named([e])}: its data-loader workers' stacks ---", e["workers"].rstrip()]
    if failure:
        lines += ["", f"--- rank {failure['rank']}: the error ---", failure["traceback"].rstrip()]
    return "\n".join(lines) + "\n"


def rank_states(exp: str | Path) -> tuple[str, list[dict]]:
    """``(verdict, [per-rank entry])`` from the stall report, or from the heartbeats of a run without one."""
    exp = Path(exp)
    report = Path(exp) / layout.STALL_REPORT
    if report.exists():
        r = json.loads(report.read_text())
        return r["verdict"], r["ranks"]
    beats = read_heartbeats(exp)
    if not beats:
        return "no heartbeat: the run has not started, or this is not an experiment folder", []
    now = max(b.get("time", 0.0) for b in beats.values()) or time.time()
    ranks = [
        {
            **{k: b.get(k) for k in ("rank", "phase", "step", "since", "detail", "host", "pid", "rank_known")},
            "in_phase_s": round(now - b.get("since", now), 1),
            "stacks": None,
        }
        for _, b in sorted(beats.items())
    ]
    phases = {e["phase"] for e in ranks}
    said = (
        "no stall: every rank finished"
        if phases == {"done"}
        else "no stall report: the watchdog did not fire (the run is going, or ended another way)"
    )
    return said, ranks


EARLIER_KEYS = ("started", "ended", "status", "exit_code", "stopped_by")


def write_lab_status(exp: Path, update: dict) -> None:
    """``EXP/lab.json``: what a loop using the parts (or the watch) says about its run (for ``asrlab doctor``);
    ``started`` begins a new record, with the earlier launches' ends under ``earlier``."""
    path = Path(exp) / layout.LAB
    state = read_json(path) or {}
    if "started" in update:  # a new launch into this EXP: how each earlier one ended is kept, briefly
        done = {k: state[k] for k in EARLIER_KEYS if k in state}
        state = {"earlier": state.get("earlier", []) + ([done] if "started" in done else [])}
    state.update(update)
    atomic_write(path, json.dumps(state, indent=1))


def stall_summary(exp: str | Path, report: dict) -> dict:
    """The stall ``report`` as the doctor says it: its verdict, each rank's state and the last collectives."""
    _, ranks = rank_states(exp)  # the report's ranks, as the notebook's stall view reads them
    return {
        "verdict": report.get("verdict"),
        "time": report.get("time"),
        "timeout_s": report.get("timeout_s"),
        "failure": report.get("failure"),
        "report": str(Path(exp) / layout.STALL_TEXT),
        "collectives": last_collectives(exp),
        "ranks": [
            {
                k: r.get(k)
                for k in ("rank", "rank_known", "phase", "step", "in_phase_s", "detail", "host", "pid", "note")
            }
            for r in ranks
        ],
    }


__all__ = [
    "format_report",
    "rank_states",
    "thread_stacks",
    "write_dump",
    "write_lab_status",
    "write_report",
    "stall_summary",
]

"""Logs of one job (files, a folder of them, several nodes' logs, standard input) read once into one
model: each rank's step series, the events, the formats seen.

Lines are read in order within a file; a line without a stamp takes its file's last one, so every
event has a time where its file has any. A line's rank is its own mark, else its file's (``rank3.log``,
icefall's ``log-train-...-3``), else unknown (None).
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from pathlib import Path

from . import stream
from .events import Events
from .marks import Clock, rank_of, split_prefix, world_of
from .toolkits import READERS, step_of

_READER = dict(READERS)
KEEP = 4096  # step records kept per rank: beyond, every other one goes (the stride doubles), never a non-finite one
_FILE_RANK = re.compile(r"(?:rank|node)[_-]?(\d+)|^log-train-.*-(\d+)$|^log-.*\.(\d+)$")
_LOGGISH = re.compile(r"\.(?:log|txt|out|err|stdout|stderr)(?:\.(?:gz|bz2|xz|zst))?$|^log-|^train|^rank|^stdout|^stderr", re.I)


class Series:
    """A rank's step records, bounded: when full, every other one goes and later ones are kept at twice
    the stride; the non-finite ones and the last one are always kept."""

    def __init__(self, keep: int = KEEP):
        self.keep, self.stride, self.seen, self.records = keep, 1, 0, []
        self.last: dict | None = None

    def add(self, r: dict) -> None:
        self.seen += 1
        self.last = r
        if r["nonfinite"] or self.seen % self.stride == 0:
            self.records.append(r)
            if len(self.records) > self.keep:
                self.records = [x for i, x in enumerate(self.records) if i % 2 == 0 or x["nonfinite"]]
                self.stride *= 2

    def all(self) -> list[dict]:
        return self.records + ([self.last] if self.last is not None and (not self.records or self.records[-1] is not self.last) else [])


def finite(r: dict) -> bool:
    vals = [*r["losses"].values(), *r["averages"].values(), r["grad_norm"]]
    return all(v is None or math.isfinite(v) for v in vals)


def position(r: dict) -> tuple:
    """Where a step record is in training: its global step where the toolkit prints one, else (epoch, batch)."""
    if r["step"] is not None:
        return (r["step"],)
    return (r["epoch"] if r["epoch"] is not None else -1, r["batch"] if r["batch"] is not None else -1)


def log_files(paths: list[str]) -> list[str]:
    """The files to read: each path given, a folder's log files (not its checkpoints), ``-`` for stdin."""
    out = []
    for p in paths:
        if p == "-":
            out.append(p)
            continue
        path = Path(p)
        if path.is_dir():
            found = sorted(f for f in path.rglob("*") if f.is_file() and _LOGGISH.search(f.name)
                           and not f.name.startswith(".") and stream.is_text(f))
            out.extend(str(f) for f in found)
        else:
            out.append(str(path))
    return out


def file_rank(name: str) -> int | None:
    m = _FILE_RANK.search(Path(name).name)
    return int(next(g for g in m.groups() if g is not None)) if m else None


class LogRun:
    def __init__(self):
        self.files: list[str] = []
        self.lines = 0
        self.formats: Counter = Counter()
        self.series: dict[int | None, Series] = {}
        self.world: int | None = None
        self.events: list[dict] = []
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.nonfinite: list[dict] = []  # every non-finite step record, in order
        self.resumes: list[dict] = []    # where a rank's steps went back: {"rank", "before", "after"}
        self.epoch_start: dict = {}      # (rank, epoch) -> the first batch logged of it

    def ranks(self) -> list[int]:
        seen = {r for r in self.series if r is not None}
        seen |= {e["rank"] for e in self.events if e.get("rank") is not None}
        return sorted(seen)

    def last_steps(self) -> dict:
        """Each rank's last step record."""
        return {r: s.last for r, s in self.series.items() if s.last is not None}


def read_logs(paths: list[str]) -> LogRun:
    run = LogRun()
    events = Events()
    for path in log_files(paths):
        run.files.append(path)
        _read_file(run, events, path)
    events.finish()
    run.events = sorted(events.events, key=lambda e: (e["time"] is None, e["time"] or 0))
    return run


def _lines(path: str):
    if path == "-":
        data = sys.stdin.buffer
        for raw in iter(lambda: data.readline(), b""):
            yield from stream.clean(raw.rstrip(b"\n"))
    else:
        yield from stream.lines(path)


def _read_file(run: LogRun, events: Events, path: str) -> None:
    clock, now, reader = Clock(), None, None
    default_rank = file_rank(path)
    for line in _lines(path):
        run.lines += 1
        rank, text = split_prefix(line)
        t = clock.of(text)
        if t is not None:
            now = t
            run.first_time = t if run.first_time is None else min(run.first_time, t)
            run.last_time = t if run.last_time is None else max(run.last_time, t)
        rec = step_of(text, reader)
        if rec is not None:
            reader = _READER[rec["toolkit"]]
            run.formats[rec["toolkit"]] += 1
            if rec["rank"] is None:
                rec["rank"] = rank if rank is not None else rank_of(text) if rec["toolkit"] != "plain" else None
            if rec["rank"] is None:
                rec["rank"] = default_rank
            if run.world is None:
                run.world = world_of(text)
            rec["time"], rec["file"], rec["order"] = now, path, run.lines
            rec["nonfinite"] = not finite(rec)
            series = run.series.setdefault(rec["rank"], Series())
            if series.last is not None and position(rec) < position(series.last):
                run.resumes.append({"rank": rec["rank"], "before": series.last, "after": rec})
            if rec["batch"] is not None:
                run.epoch_start.setdefault((rec["rank"], rec["epoch"]), rec["batch"])
            series.add(rec)
            if rec["nonfinite"]:
                run.nonfinite.append(rec)
            continue
        if rank is None:
            rank = _event_rank(text, default_rank)
        events.order = run.lines
        events.feed(path, rank, now, text)


def _event_rank(text: str, default: int | None) -> int | None:
    r = rank_of(text)
    return r if r is not None else default


__all__ = ["LogRun", "Series", "log_files", "read_logs"]

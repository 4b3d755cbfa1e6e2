"""Logs of one job (files, a folder of them, several nodes' logs, standard input) read once into one model: each
rank's step series, the events, the formats seen. A line without a stamp takes its file's last one; a line's rank is
its own mark, else its file's (``rank3.log``, icefall's ``log-train-...-3``), else unknown (None)."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

from . import stream

KEEP = 4096  # step records kept per rank: beyond, every other one goes (the stride doubles), never a non-finite one
_FILE_RANK = re.compile(
    r"(?:rank|node)[_-]?(\d+)|^log-train-.*-(\d+)$|^log-.*\.(\d+)$|^(?:w|worker)[_-]?(\d+)\.(?:log|txt)$"
)
_LOGGISH = re.compile(
    r"\.(?:log|txt|out|err|stdout|stderr)(?:\.(?:gz|bz2|xz|zst))?$|\.ipynb$|^log-|^train|^rank|^stdout|^stderr", re.I
)


class Series:
    """A rank's step records, bounded (:data:`KEEP`); the non-finite ones, the last one and those pinned as an
    event's place are always kept."""

    def __init__(self, keep: int = KEEP):
        self.keep, self.stride, self.seen, self.records = keep, 1, 0, []
        self.pinned: set[int] = set()  # ids of the records kept as the place of an event
        self.last: dict | None = None
        # each format's last record that trained a step (not a bar redrawn at 0): a bar that lags the logger's lines
        # (Ignite's, redrawn after its "Iteration[6/12]" at 5/12) goes back only against bars
        self.moved: dict[tuple, dict] = {}  # (format, a bar or not) -> its last record

    def add(self, r: dict) -> None:
        self.seen += 1
        self.last = r
        if r["nonfinite"] or self.seen % self.stride == 0:
            self.records.append(r)
            if len(self.records) > self.keep:
                self.records = [
                    x for i, x in enumerate(self.records) if i % 2 == 0 or x["nonfinite"] or id(x) in self.pinned
                ]
                self.stride *= 2

    def pin(self) -> None:
        """Keep the last record: an event came after it (the step a failure happened at)."""
        if self.last is None:
            return
        if not self.records or self.records[-1] is not self.last:
            self.records.append(self.last)
        self.pinned.add(id(self.last))  # (a pinned record is never thinned: its id stays its own)

    def all(self) -> list[dict]:
        unkept = self.last is not None and (not self.records or self.records[-1] is not self.last)
        return self.records + [self.last] if unkept else self.records[:]


def finite(r: dict) -> bool:
    vals = [*r["losses"].values(), *r["averages"].values(), r["grad_norm"]]
    return all(v is None or math.isfinite(v) for v in vals)


def position(r: dict) -> tuple:
    """Where a step record is in training: its global step where the toolkit prints one, else (epoch, batch)."""
    if r["step"] is not None:
        return (r["step"],)
    if r["batch"] is None and r["epoch"] is not None:  # an epoch's summary line: after every batch of it
        return (r["epoch"], float("inf"))
    return (r["epoch"] if r["epoch"] is not None else -1, r["batch"] if r["batch"] is not None else -1)


def log_files(paths: list[str]) -> list[str]:
    """The files to read: each path given, a folder's log files (not its checkpoints), ``-`` for stdin."""
    out = []
    for p in paths:
        path = Path(p)
        if p == "-":
            out.append(p)
        elif path.is_dir():
            # a JSON document (Trainer's train_results.json) is a table, not a log; JSON lines (.jsonl) are lines
            found = [f for f in path.rglob("*") if f.is_file() and _LOGGISH.search(f.name) and f.suffix != ".json"]
            # none under a hidden folder (.ipynb_checkpoints/ too)
            found = [f for f in found if not any(x.startswith(".") for x in f.relative_to(path).parts)]
            out.extend(str(f) for f in sorted(found) if stream.is_text(f))
        elif not path.is_file() or stream.is_text(path):  # a checkpoint or a program given by name: no log
            out.append(str(path))
    return out


def file_rank(name: str) -> int | None:
    m = _FILE_RANK.search(Path(name).name)
    return int(next(g for g in m.groups() if g is not None)) if m else None


class Records(list):
    """Records in the order read, and how many the log holds: ``len`` counts as well those a fast read
    counted without keeping (lines of a kind already read in full a few times)."""

    def __init__(self):
        super().__init__()
        self.more = 0

    def __len__(self) -> int:
        return list.__len__(self) + self.more


class LogRun:
    def __init__(self):
        self.files: list[str] = []
        self.lines = 0
        self.formats: Counter = Counter()
        self.series: dict[int | None, Series] = {}
        self.world: int | None = None
        self.events: list[dict] = []
        self.nonfinite: Records = Records()  # the non-finite step records read, in order; len: all the log has
        self.event_counts: dict[str, int] = {}  # every event of each kind, kept or not
        self.unread = 0  # lines a reader choked on: counted, never a traceback of the doctor's
        self.resumes: list[dict] = []  # where a rank's steps went back: {"rank", "before", "after"}
        self.epoch_start: dict = {}  # (rank, epoch) -> the first batch logged of it
        self.first_steps: dict = {}  # file -> its first step record
        self.clock = None  # a watched job's clock (job.times): a line's time by its order, where the watch kept one

    def ranks(self) -> list[int]:
        seen = {r for r in self.series if r is not None}
        # a line that only looks wrong says where a rank printed, not that it took part in what failed
        seen |= {e["rank"] for e in self.events if e.get("rank") is not None and e["kind"] != "suspect"}
        return sorted(seen)

    def last_steps(self) -> dict:
        return {r: s.last for r, s in self.series.items() if s.last is not None}


__all__ = ["KEEP", "LogRun", "Series", "file_rank", "finite", "log_files", "position"]

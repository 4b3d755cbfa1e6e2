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
# what in a step line is a message of its own besides the step (a progress bar with a message glued on)
_MESSAGE = re.compile(r"OVERFLOW|[Oo]verflow|Watchdog|Traceback|[Ee]rror|[Kk]illed|[Ss]kipping|exitcode")
KEEP = 4096  # step records kept per rank: beyond, every other one goes (the stride doubles), never a non-finite one
_FILE_RANK = re.compile(r"(?:rank|node)[_-]?(\d+)|^log-train-.*-(\d+)$|^log-.*\.(\d+)$")
_LOGGISH = re.compile(
    r"\.(?:log|txt|out|err|stdout|stderr)(?:\.(?:gz|bz2|xz|zst))?$|^log-|^train|^rank|^stdout|^stderr", re.I
)


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
        return self.records + (
            [self.last] if self.last is not None and (not self.records or self.records[-1] is not self.last) else []
        )


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
            found = sorted(
                f
                for f in path.rglob("*")
                if f.is_file() and _LOGGISH.search(f.name) and not f.name.startswith(".") and stream.is_text(f)
            )
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
        self.event_counts: dict[str, int] = {}  # every event of each kind, kept or not
        self.unread = 0  # lines a reader choked on: counted, never a traceback of the doctor's
        self.resumes: list[dict] = []  # where a rank's steps went back: {"rank", "before", "after"}
        self.epoch_start: dict = {}  # (rank, epoch) -> the first batch logged of it

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
    for i, path in enumerate(log_files(paths)):
        run.files.append(path)
        _File(run, events, path, i).read()
    events.finish()
    run.events = sorted(events.events, key=lambda e: (e["time"] is None, e["time"] or 0))
    run.event_counts = events.counts
    return run


def _blocks(path: str):
    if path == "-":
        yield from stream.chunks(sys.stdin.buffer)
    else:
        yield from stream.chunks(path)


# Bytes that a line must hold to say anything but "a step went by": what a failure, a non-finite value, a
# resume or a torchrun summary prints. A line of the log's step format without them is only sampled.
KEYS = (
    b"nan",
    b"inf",
    b"NaN",
    b"Inf",
    b"NAN",
    b"INF",
    b"rror",
    b"xception",
    b"raceback",
    b"atchdog",
    b"imed out",
    b"imeout",
    b"xitcode",
    b"ignal",
    b"illed",
    b"OVERFLOW",
    b"verflow",
    b"kipping",
    b"scale is",
    b"finite",
    b"not correct",
    b"invalid",
    b"onitoredBarrier",
    b"store based",
    b"NCCL work",
    b"emory",
    b"Root Cause",
    b"Failures:",
    b"esum",
    b"estor",
    b"heckpoint",
    b"oading",
    b"DataLoader",
    b"worker",
    b"Abort",
    b"abort",
    b"Segmentation",
    b"core dumped",
    b"FAILED",
    b"failed",
)
ANCHORS = {
    "wenet": b"Batch ",
    "icefall": b"tot_loss[",
    "espnet": b"epoch:train:",
    "lightning": b"%|",
    "speechbrain": b"train loss:",
    "megatron": b"iteration",
    "epoch_batch": b"poch",
    "plain": b"loss",
    "kv": b"loss",
}
SAMPLE = 32  # step lines read of each block's lines that say nothing else (a block: stream.CHUNK bytes)
EDGE = 1 << 18  # bytes at a file's start and end read line by line: its format, and each rank's last steps
SUB = 1 << 16  # bytes of a stretch whose lines are counted in C: step lines only, or some others


class _File:
    """One file's reading: its clock, its rank, the step format it settled on."""

    def __init__(self, run: LogRun, events: Events, path: str, index: int):
        self.run, self.events, self.path = run, events, path
        self.clock, self.now, self.reader, self.toolkit = Clock(), None, None, None
        self.rank = file_rank(path)
        self.base = index << 40  # a line's order in the whole read: its file, then its byte offset

    def read(self) -> None:
        offset, pending = 0, None
        for block in _blocks(self.path):
            if b"\r" in block:  # a progress bar's drawings, each a line of its own
                block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if pending is not None:
                self.block(pending[0], pending[1], last=False)
            pending = (block, offset)
            offset += len(block)
        if pending is not None:
            self.block(pending[0], pending[1], last=True)

    def block(self, block: bytes, offset: int, last: bool) -> None:
        self.run.lines += block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        slow_head = EDGE - offset if offset < EDGE else 0
        slow_tail = EDGE if last else 0
        if len(block) <= slow_head + slow_tail:
            return self.lines(block, offset)
        head = block.rfind(b"\n", 0, slow_head) + 1 if slow_head else 0
        tail = block.rfind(b"\n", 0, len(block) - slow_tail) + 1 if slow_tail else len(block)
        if head:
            self.lines(block[:head], offset)
        if self.toolkit is None or self.events.busy():  # no step format yet, or inside a traceback
            self.lines(block[head:tail], offset + head)
        else:
            self.fast(block, offset, head, tail)
        if tail < len(block):
            self.lines(block[tail:], offset + tail)

    def lines(self, block: bytes, offset: int) -> None:
        start = 0
        for raw in block.split(b"\n"):
            if raw:
                self.line(raw, offset + start)
            start += len(raw) + 1

    def fast(self, block: bytes, offset: int, start: int, end: int) -> None:
        """The lines of block[start:end] that can say something, and a sample of the rest. The byte searches
        run in C: a stretch of :data:`SUB` bytes where every line is a step line (most of a long log) is never
        cut into lines; only the step lines with nan or inf in them, the sample, and the other lines of the
        stretches that have some, are read in Python."""
        anchor = ANCHORS[self.toolkit]
        at: dict[int, bool] = {}  # line start -> whether it is a step line already counted
        for i in range(start, end, max(1, (end - start) // SAMPLE)):
            at[block.rfind(b"\n", start, i) + 1 or start] = True
        for word in (b"nan", b"inf"):
            i = block.find(word, start, end)
            while i >= 0:
                at[block.rfind(b"\n", start, i) + 1 or start] = True
                i = block.find(word, block.find(b"\n", i, end) + 1 or end, end)
        a = start
        while a < end:
            b = block.find(b"\n", min(a + SUB, end) - 1, end) + 1 or end
            steps = block.count(anchor, a, b)
            self.run.formats[self.toolkit] += steps  # the step lines read below are not counted again
            if steps != block.count(b"\n", a, b):  # other lines among them: those that say something
                pos = a
                for raw in block[a:b].split(b"\n"):
                    if raw and anchor not in raw and any(k in raw for k in KEYS):
                        if b"raceback" in raw or b"Root Cause" in raw or b"Failures:" in raw:
                            self.run.formats[self.toolkit] -= block.count(anchor, pos, end)
                            self._read(block, offset, at, start, pos)
                            return self.lines(block[pos:end], offset + pos)  # lines that belong together
                        at[pos] = False
                    pos += len(raw) + 1
            a = b
        self._read(block, offset, at, start, end)

    def _read(self, block: bytes, offset: int, at: dict[int, bool], start: int, end: int) -> None:
        for i in sorted(k for k in at if start <= k < end):
            j = block.find(b"\n", i, end)
            raw = block[i : j if j >= 0 else end]
            if raw:
                self.line(raw, offset + i, counted=at[i] and ANCHORS[self.toolkit] in raw)

    def line(self, raw: bytes, at: int, counted: bool = False) -> None:
        for text in stream.clean(raw):
            try:
                self.text(text, self.base + at, counted)
            except (ValueError, TypeError, IndexError, OverflowError, KeyError):  # a line no reader foresaw
                self.run.unread += 1

    def text(self, line: str, order: int, counted: bool = False) -> None:
        run = self.run
        rank, text = split_prefix(line)
        t = self.clock.of(line)  # a collector's stamp, taken off with its prefix, is the line's time
        if t is not None:
            self.now = t
            run.first_time = t if run.first_time is None else min(run.first_time, t)
            run.last_time = t if run.last_time is None else max(run.last_time, t)
        rec = step_of(text, self.reader)
        if rec is None or _MESSAGE.search(text):
            self.events.order = order
            self.events.feed(self.path, rank if rank is not None else _event_rank(text, self.rank), self.now, text)
            if rec is None:
                return
        if rec["toolkit"] != self.toolkit:
            self.reader, self.toolkit = _READER[rec["toolkit"]], rec["toolkit"]
        run.formats[rec["toolkit"]] += 0 if counted else 1
        if rec["rank"] is None:
            rec["rank"] = rank if rank is not None else rank_of(text) if rec["toolkit"] != "plain" else None
        if rec["rank"] is None:
            rec["rank"] = self.rank
        if run.world is None:
            run.world = world_of(text)
        rec["time"], rec["file"], rec["order"], rec["stamped"] = self.now, self.path, order, t is not None
        rec["nonfinite"] = not finite(rec)
        series = run.series.setdefault(rec["rank"], Series())
        # a counter without an epoch (a bare progress bar) starts again at 0 each epoch: not a resume
        if (
            series.last is not None
            and position(rec) < position(series.last)
            and (rec["step"] is not None or rec["epoch"] is not None)
        ):
            run.resumes.append({"rank": rec["rank"], "before": series.last, "after": rec})
        if rec["batch"] is not None:
            run.epoch_start.setdefault((rec["rank"], rec["epoch"]), rec["batch"])
        series.add(rec)
        if rec["nonfinite"]:
            run.nonfinite.append(rec)


def _event_rank(text: str, default: int | None) -> int | None:
    r = rank_of(text)
    return r if r is not None else default


__all__ = ["LogRun", "Series", "log_files", "read_logs"]

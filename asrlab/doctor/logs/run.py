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
from itertools import repeat
from pathlib import Path

from . import events as _events
from . import stream
from .events import Events
from .marks import Clock, marked_rank, rank_of, split_prefix, world_of
from .toolkits import READERS, step_of

_READER = dict(READERS)
# what in a step line is a message of its own besides the step (a progress bar with a message glued on)
_MESSAGE = re.compile(
    r"OVERFLOW|[Oo]verflow|Watchdog|Traceback|[Ee]rror|[Kk]illed|[Ss]kipping|exitcode|death signal|got signal|"
    r"out of memory|[Pp]atience|not finite"
)
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
    if r["batch"] is None and r["epoch"] is not None:  # an epoch's summary line: after every batch of it
        return (r["epoch"], float("inf"))
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
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.nonfinite: Records = Records()  # the non-finite step records read, in order; len: all the log has
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


def read_logs(paths: list[str], fast: bool = True) -> LogRun:
    """The files' model. ``fast=False`` reads every line in Python (what the fast read is checked against)."""
    run = LogRun()
    events = Events()
    for i, path in enumerate(log_files(paths)):
        run.files.append(path)
        _File(run, events, path, i, fast).read()
    events.finish()
    run.events = sorted(events.events, key=lambda e: (e["time"] is None, e["time"] or 0))
    run.event_counts = events.counts
    return run


def _blocks(path: str):
    yield from stream.pieces(sys.stdin.buffer if path == "-" else path, stream.CHUNK)


# Bytes that a line must hold to say anything but "a step went by": what a failure, a non-finite value, a
# resume or a torchrun summary prints. A line of one of the log's step formats without them is only sampled.
# The one list of trigger words: the fast read's fingerprint (_KEPT) is built from it.
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

# The fast read (_File.fast). A line's fingerprint is what is left of it when digits, spaces, most
# punctuation and most lower-case letters go (_KEPT). Every line of a step format whose numbers are all finite leaves
# the same fingerprint, a template, whatever its numbers; a line that holds a word of KEYS, a nan or an inf
# (each leaves a byte), or anything but a finite step, leaves another. One C pass (bytes.translate)
# fingerprints a block, and each line becomes one byte: its template's format, or the code of a fingerprint
# seen before in a run read in full, or "?". The step lines are counted (one in SAMPLE bytes is read); the
# other lines come in runs (the lines between two step lines: a traceback, torchrun's summary, a warning),
# and a run whose fingerprints this file has read in full FEW times, with the same outcome, is counted as
# those were (events by kind, step lines by format, non-finite step lines) instead of being read; while the
# events of its kinds are still kept (the first events.KEEP of each) a run of ranks not yet read is read.
_RARE_FIRST = b"zqxjkvbpygfwmucldrhsnioate"  # lower-case letters, the rarest in log text first


def _kept(keys) -> bytes:
    # upper-case letters and brackets; not the punctuation every line has plenty of (,:;=_/), for speed
    kept = set(b"\nABCDEFGHIJKLMNOPQRSTUVWXYZ!\"#$%&'()*<>?@[\\]^`{|}~")
    for k in keys:  # each word of KEYS leaves at least one byte: the line that holds it is not a template's
        if not any(c in kept for c in k):
            kept.add(min((c for c in k if c in _RARE_FIRST), key=_RARE_FIRST.index, default=k[0]))
    return bytes(sorted(kept))


_KEPT = _kept(KEYS)
_DROP = bytes(c for c in range(256) if c not in _KEPT)
_CODE = {name: 97 + i for i, (name, _) in enumerate(READERS)}  # a template's format: a, b, c, ...
_FORMAT = {c: name for name, c in _CODE.items()}
_STEP = bytes(_CODE.values())
_UNKNOWN = 63  # "?": a line not seen in a run read in full, or like lines that read differently
_NOT_STEP = bytes(c for c in range(256) if c not in _STEP)
_RUN = re.compile(b"[^" + re.escape(_STEP) + b"]+")
_CODES = range(128, 256)  # the codes a run's fingerprints get once read in full
# a run's ranks, from its bytes: [rank3]:, [Rank 3], rank : 3, local_rank: 3, rank 3 (ank), icefall's (3/8),
# ESPnet's [host:3/8]
_RANK_MARKS = (re.compile(rb"ank\D{0,6}?(\d+)"), re.compile(rb"\((\d+)/\d+\)"), re.compile(rb":(\d+)/\d+\]"))
EDGE = 1 << 16  # bytes at a file's start and end read line by line: its formats, and each rank's last steps
SAMPLE = 1 << 21  # one step line read in Python for each this many bytes of the rest
LOOK = 8  # step lines read before a run read in full that has events or a non-finite step (each rank's step
# a failure happened at, the values that led to it), and after one that has a resume (where each rank went on)
FEW = 3  # a run's fingerprints read in full this many times before its like are counted
LONG = 512  # a run of more lines (no template yet: a format first seen) is read line by line, the rest re-cut
SIGS = 1 << 24  # bytes of runs' fingerprints remembered per file (memory bounded whatever the log)
CODES = 1 << 14  # fingerprints given a byte per file (templates, and lines of runs read in full)


class _Sig:
    """A run's fingerprints: what reading it in full gave (events by kind, step lines by format,
    non-finite step lines), how often, for which ranks."""

    __slots__ = ("n", "kinds", "formats", "nonfinite", "fixed", "ranks", "blind")

    def __init__(self, got: tuple, ranks: frozenset):
        self.n, self.ranks, self.blind = 1, {ranks}, False
        self.kinds, self.formats, self.nonfinite, self.fixed = got

    def same(self, got: tuple) -> None:
        self.n += 1
        if got != (self.kinds, self.formats, self.nonfinite, self.fixed):
            self.fixed = False  # its like differ in what they say (a number in it decides): always read

    def got(self) -> tuple:
        return self.kinds, self.formats, self.nonfinite, self.fixed

    def countable(self, counts: dict) -> bool:
        """Counted without a look at its ranks: read FEW times, and every kind of its events past those kept
        (a rank's first of them would not be kept by a line-by-line read either)."""
        if not self.blind and self.n >= FEW and self.fixed:
            self.blind = all(counts.get(k, 0) >= _events.KEEP for k, _ in self.kinds)
        return self.blind


def _rank_marks(raw: bytes) -> frozenset:
    return frozenset(int(x) for p in _RANK_MARKS for x in p.findall(raw))


class _File:
    """One file's reading: its clock, its rank, the step format it settled on."""

    def __init__(self, run: LogRun, events: Events, path: str, index: int, fast: bool = True):
        self.run, self.events, self.path, self.index, self.quick = run, events, path, index, fast
        self.clock, self.now, self.reader, self.toolkit = Clock(), None, None, None
        self.epoch = None  # the epoch a line said is starting (SpeechBrain's "Going into epoch 2"), for bars
        self.rank = file_rank(path)
        self.base = index << 40  # a line's order in the whole read: its file, then its byte offset
        self.code: dict[bytes, int] = {}  # a fingerprint -> its line's byte (a template's format, a run's code)
        self.codes = iter(_CODES)
        self.sigs: dict[bytes, _Sig] = {}  # a run's fingerprints (its lines' bytes, else joined) -> what it gave
        self.kept = 0  # bytes of sigs' keys
        self.singles: dict[bytes, _Sig] = {}  # the fingerprint of a run of one line -> its sig
        self.done = 0  # in the block read now: the bytes before this are read (a run, a step line near one)
        self.pure, self.wait = 0, 4  # > 0: the last blocks held step lines only (see steps_only)

    def read(self) -> None:
        # a piece is read once EDGE bytes after it are in: the file's last EDGE bytes are read line by line
        ahead, after, offset = [], 0, 0  # pieces not read yet; their bytes but the first one's
        for data, lo, hi in _blocks(self.path):
            if data.find(b"\r", lo, hi) >= 0:  # a progress bar's drawings
                data = data[lo:hi].replace(b"\r\n", b"\n").replace(b"\r", b"\n")  # each a line of its own
                lo, hi = 0, len(data)
            ahead.append((data, lo, hi, offset - lo))  # offset - lo: data[p] is the file's byte offset + p
            offset += hi - lo
            after += hi - lo if len(ahead) > 1 else 0
            while len(ahead) > 1 and after >= EDGE:
                self.block(*ahead.pop(0), tail=0)
                after -= ahead[0][2] - ahead[0][1]
        rest = sum(hi - lo for _, lo, hi, _ in ahead)
        for data, lo, hi, base in ahead:
            rest -= hi - lo  # the bytes after this piece
            self.block(data, lo, hi, base, tail=max(0, EDGE - rest))

    def block(self, block: bytes, lo: int, hi: int, offset: int, tail: int) -> None:
        """block[lo:hi], at the file's offset + lo: its first bytes within the file's first EDGE and its
        last ``tail`` are read line by line."""
        slow_head = EDGE - (offset + lo) if offset + lo < EDGE else 0
        if not self.quick or hi - lo <= slow_head + tail:
            return self.lines(block[lo:hi] if lo or hi < len(block) else block, offset + lo)
        head = block.rfind(b"\n", lo, lo + slow_head) + 1 if slow_head else lo
        end = block.rfind(b"\n", lo, hi - tail) + 1 if tail else hi
        head, end = max(head, lo), max(end, lo)
        if head > lo:
            self.lines(block[lo:head], offset + lo)
        if end > head:
            self.fast(block, offset, head, end)
        if end < hi:
            self.lines(block[end:hi], offset + end)

    def lines(self, block: bytes, offset: int) -> None:
        self.run.lines += block.count(b"\n") + (0 if block.endswith(b"\n") else 1 if block else 0)
        self.lines_in(block, offset, 0, len(block))

    def lines_in(self, block: bytes, offset: int, a: int, b: int) -> None:
        """The lines of block[a:b], read in full (counted already)."""
        pos = a
        for raw in block[a:b].split(b"\n"):
            if raw:
                self.line(raw, offset + pos)
            pos += len(raw) + 1

    def line(self, raw: bytes, at: int, counted: bool = False) -> None:
        step = None
        for text in stream.clean(raw):
            try:
                r = self.text(text, self.base + at, counted)
            except (ValueError, TypeError, IndexError, OverflowError, KeyError):  # a line no reader foresaw
                self.run.unread += 1
                r = False
            step = r if step is None else False
        if step and self.quick and len(self.code) < CODES:  # a finite step and nothing else: a template
            fp = raw.translate(None, _DROP)
            if self.code.setdefault(fp, _CODE[self.toolkit]) != _CODE[self.toolkit]:
                self.code[fp] = _UNKNOWN  # lines of two formats, or a step and a run's line, alike: read each

    def fast(self, block: bytes, offset: int, start: int, end: int) -> None:
        """The lines of block[start:end] (whole lines), fingerprinted in C (see _KEPT): the step lines
        counted (a sample read), each run of other lines read in full or counted as its like were."""
        if not self.code:  # no step format seen yet: nothing to count
            return self.lines(block[start:end], offset + start)
        # the whole read's fingerprints (no copy of it), and where those of block[start:end] begin and end
        prints, run = block.translate(None, _DROP), self.run
        c0 = len(block[:start].translate(None, _DROP)) if start else 0
        c1 = len(prints) - len(block[end:].translate(None, _DROP)) if end < len(block) else len(prints)
        self.done, self.at, self.end = start, (0, start), end
        self.samples = iter(range(start + SAMPLE // 2, end, SAMPLE))
        self.sample = next(self.samples, end)
        if self.steps_only(prints, c0, c1):  # step lines only (most blocks of most logs): no line cut out
            return self.samples_before(block, offset, end)
        fps = (prints if c0 == 0 and c1 == len(prints) else prints[c0:c1]).split(b"\n")
        if block.endswith(b"\n", start, end):
            fps.pop()
        last = len(fps)
        run.lines += last
        codes = bytes(map(self.code.get, fps, repeat(_UNKNOWN)))
        for c in _STEP:
            n = codes.count(c)
            if n:
                run.formats[_FORMAT[c]] += n
        self.avg = max(1.0, (end - start) / max(1, last))
        lead = last - len(codes.lstrip(_NOT_STEP))  # a run the range begins with, the lines before it cut
        trail = len(codes.rstrip(_NOT_STEP))  # a run it ends with
        fresh = lead == last and last > LONG  # no step line: a format not yet seen, its first lines read
        if fresh:
            lead = trail = LONG
        if lead:
            self.read_run(block, offset, start, self.seek(block, lead), ((), (), 0, True) if fresh else None)
        if lead < trail:
            counts, todo = self.events.counts, Counter(_RUN.findall(codes, lead, trail))
            if all(s is not None and s.countable(counts) for s in map(self.sigs.get, todo)):
                for sig, n in todo.items():  # the bulk of a long log: each run counted as its like were
                    self.count(self.sigs[sig], n)
            else:
                self.runs(block, offset, fps, codes, lead, trail)
        if fresh:  # fingerprint the rest again, with what those lines taught
            run.lines -= last - LONG
            return self.fast(block, offset, self.seek(block, LONG), end)
        if lead <= trail < last:
            b = end
            for _ in range(last - trail):
                b = max(block.rfind(b"\n", start, b - 1) + 1, start)
            self.read_run(block, offset, max(b, self.done), end)
        self.samples_before(block, offset, end)

    def steps_only(self, prints: bytes, c0: int, c1: int) -> bool:
        """Whether the fingerprints prints[c0:c1] (whole lines) are all templates or lines that, alone between
        step lines, are counted (a warning at every checkpoint), and if so count them: one count of each in
        C, no line cut out. Tried while it holds, else once in a few blocks."""
        self.pure += 1
        if self.pure <= 0 or not prints.endswith(b"\n", c0, c1):
            return False
        counts = self.events.counts
        tiles = [(fp + b"\n", c) for fp, c in self.code.items() if c in _STEP]
        tiles += [(fp + b"\n", s) for fp, s in self.singles.items() if s.countable(counts)]
        if not tiles or len(tiles) > 6 or any(a[0] != b[0] and a[0].endswith(b[0]) for a in tiles for b in tiles):
            return False  # many, or one the end of another (their counts could then tile the block wrongly)
        n = [prints.count(t, c0, c1) for t, _ in tiles]
        lines = prints.count(b"\n", c0, c1)
        if sum(n) != lines or sum(k * len(t) for k, (t, _) in zip(n, tiles)) != c1 - c0:
            self.wait = min(2 * self.wait, 256)
            self.pure = -self.wait  # not again for a while: longer each time it fails
            return False
        self.wait = 4
        self.run.lines += lines
        for k, (_, c) in zip(n, tiles):
            if k and isinstance(c, _Sig):
                self.count(c, k)
            elif k:
                self.run.formats[_FORMAT[c]] += k
        return True

    def runs(self, block: bytes, offset: int, fps: list, codes: bytes, lead: int, trail: int) -> None:
        """Runs of codes[lead:trail], one by one, in order."""
        counts = self.events.counts
        for m in _RUN.finditer(codes, lead, trail):
            i, j = m.span()
            sig = m.group()
            if _UNKNOWN in sig:
                sig = b"\n".join(fps[i:j])
            s = self.sigs.get(sig)
            if s is not None and s.countable(counts):
                self.count(s)
                continue
            a, b = self.seek(block, i), self.seek(block, j)
            if s is not None and not s.fixed:
                self.read_run(block, offset, a, b, s.got())
                continue
            ranks = _rank_marks(block[a:b])
            if s is not None and s.n >= FEW:
                if ranks in s.ranks:
                    self.count(s)
                else:  # a rank new to runs like this one: read it, its first failure may be this one
                    s.ranks.add(ranks)
                    self.read_run(block, offset, a, b, s.got())
                continue
            got = self.alone(block, offset, a, b)
            self.read_run(block, offset, a, b, got)
            if s is not None:
                s.same(got)
                s.ranks.add(ranks)
                continue
            if self.kept + len(sig) > SIGS:
                continue
            s = self.sigs[sig] = _Sig(got, ranks)
            self.kept += len(sig)
            if j - i == 1:
                self.singles[fps[i]] = s
            coded = []  # its lines' codes from now on: the next blocks see the run by its codes
            for fp in fps[i:j]:
                coded.append(self.code.get(fp) or self.code.setdefault(fp, next(self.codes, _UNKNOWN)))
            coded = bytes(coded)
            if _UNKNOWN not in coded and coded not in self.sigs:
                self.sigs[coded] = s
                self.kept += len(coded)

    def count(self, s: _Sig, n: int = 1) -> None:
        counts = self.events.counts
        for k, v in s.kinds:
            counts[k] = counts.get(k, 0) + n * v
        for k, v in s.formats:
            self.run.formats[k] += n * v
        self.run.nonfinite.more += n * s.nonfinite

    def read_run(self, block: bytes, offset: int, a: int, b: int, got: tuple | None = None) -> None:
        """The run block[a:b] read in full; the step lines around it as ``got`` (what it gave read alone)
        asks: before it where it has events or a non-finite step, after it where it has a resume; both where
        it is not known."""
        kinds = dict(got[0]) if got is not None else {"": 1, "resume": 1}
        self.samples_before(block, offset, a)
        if kinds or got[2]:
            self.before(block, offset, a)
        self.lines_in(block, offset, a, b)
        self.done = max(self.done, b)
        if "resume" in kinds:
            self.after(block, offset, b)

    def alone(self, block: bytes, offset: int, a: int, b: int) -> tuple:
        """What the run block[a:b] gives read alone, from the file's state now: (events by kind, step lines
        by format, non-finite step lines, whether a run like it can be counted)."""
        alone = _File(LogRun(), Events(), self.path, self.index, fast=False)
        alone.clock.year, alone.now, alone.reader, alone.toolkit = self.clock.year, self.now, self.reader, self.toolkit
        alone.rank = self.rank
        alone.lines_in(block, offset, a, b)
        alone.events.finish()
        # a loss scale's value decides a verdict (it collapsed): a run that gives one is always read
        fixed = not any(e.get("to") is not None for e in alone.events.events)
        return (
            tuple(sorted(alone.events.counts.items())),
            tuple(sorted(alone.run.formats.items())),
            len(alone.run.nonfinite),
            fixed,
        )

    def seek(self, block: bytes, i: int) -> int:
        """The offset in block of the range's line ``i`` (counted on from the last one sought)."""
        at, off = self.at
        n = i - at
        if n < 0:
            raise AssertionError("runs are sought in order")
        avg = self.avg
        while n > 4:
            x = block.rfind(b"\n", off, min(self.end, off + int((n - 2) * avg)))
            if x < off:
                break
            c = block.count(b"\n", off, x + 1)
            if c > n:  # lines shorter than the range's mean: aim nearer
                avg /= 2
                continue
            off, n = x + 1, n - c
        for _ in range(n):
            off = block.find(b"\n", off, self.end) + 1 or self.end
        self.at = (i, off)
        return off

    def _step_line(self, block: bytes, a: int, b: int) -> bytes | None:
        raw = block[a:b]
        c = self.code.get(raw.translate(None, _DROP))
        return raw if c is not None and c in _STEP else None

    def samples_before(self, block: bytes, offset: int, until: int) -> None:
        """The sample step lines (one each SAMPLE bytes) before ``until`` not read yet."""
        while self.sample < until:
            p, self.sample = self.sample, next(self.samples, self.end)
            a = max(block.rfind(b"\n", 0, p) + 1, self.done)
            if a >= until:
                break
            b = block.find(b"\n", a, self.end)
            b = self.end if b < 0 else b
            raw = self._step_line(block, a, b)
            if raw is not None:
                self.line(raw, offset + a, counted=True)
            self.done = b + 1

    def before(self, block: bytes, offset: int, a: int) -> None:
        """The step lines just before a run (up to LOOK, not read yet)."""
        lines, p = [], a
        while len(lines) < LOOK and p - 1 > self.done:
            q = max(block.rfind(b"\n", self.done, p - 1) + 1, self.done)
            raw = self._step_line(block, q, p - 1)
            if raw is None:
                break
            lines.append((q, raw))
            p = q
        for q, raw in reversed(lines):
            self.line(raw, offset + q, counted=True)
        self.done = max(self.done, a)

    def after(self, block: bytes, offset: int, b: int) -> None:
        """The step lines just after a run (up to LOOK)."""
        p = b
        for _ in range(LOOK):
            if p >= self.end:
                break
            q = block.find(b"\n", p, self.end)
            q = self.end if q < 0 else q
            raw = self._step_line(block, p, q)
            if raw is None:
                break
            self.line(raw, offset + p, counted=True)
            p = q + 1
        self.done = max(self.done, p)

    def text(self, line: str, order: int, counted: bool = False) -> bool:
        """Read one clean line; True where it is a step line whose numbers are all finite and nothing else."""
        run = self.run
        rank, text = split_prefix(line)
        t = self.clock.of(text)
        if t is not None:
            self.now = t
            run.first_time = t if run.first_time is None else min(run.first_time, t)
            run.last_time = t if run.last_time is None else max(run.last_time, t)
        rec = step_of(text, self.reader)
        fed = rec is None or _MESSAGE.search(text)
        if fed:
            if "poch" in text and (m := EPOCH_START.search(text)):  # a bar's lines that follow are of this epoch
                self.epoch = int(m.group(1) or m.group(2))
            self.events.order = order
            self.events.feed(self.path, rank if rank is not None else _event_rank(text, self.rank), self.now, text)
            if rec is None:
                return False
        if rec["epoch"] is None and self.epoch is not None and rec["step"] is None:
            rec["epoch"], rec["told"] = self.epoch, True  # said by another line: a bar's restart is no resume
        if rec["toolkit"] != self.toolkit:
            self.reader, self.toolkit = _READER[rec["toolkit"]], rec["toolkit"]
        run.formats[rec["toolkit"]] += 0 if counted else 1
        if rec["rank"] is None:
            rec["rank"] = (
                rank if rank is not None else rank_of(text) if rec["toolkit"] != "plain" else marked_rank(text)
            )
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
            and (rec["step"] is not None or (rec["epoch"] is not None and not rec.get("told")))
            # another file of the same rank (a toolkit's own log.txt beside its console) goes back only in time
            and (
                series.last["file"] == rec["file"]
                or (rec["stamped"] and series.last["stamped"] and rec["time"] > series.last["time"])
            )
        ):
            run.resumes.append({"rank": rec["rank"], "before": series.last, "after": rec})
        if rec["batch"] is not None:
            run.epoch_start.setdefault((rec["rank"], rec["epoch"]), rec["batch"])
        series.add(rec)
        if rec["nonfinite"]:
            run.nonfinite.append(rec)
        return not fed and not rec["nonfinite"]


# a line that says an epoch starts, with no step of its own: SpeechBrain's, Keras's, a loop's own
EPOCH_START = re.compile(
    r"(?:Going into|Starting|Start(?:ing)? training|Begin(?:ning)?) epoch:? (\d+)|^\W*Epoch (\d+)/\d+\s*$", re.I
)


def _event_rank(text: str, default: int | None) -> int | None:
    r = rank_of(text)
    return r if r is not None else default


__all__ = ["LogRun", "Series", "log_files", "read_logs"]

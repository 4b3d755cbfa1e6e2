"""Log files read into the run's model (:mod:`.run`): the lines that can say something, found by their fingerprints
(:mod:`.fingerprint`), read in Python once; the step lines that say nothing else counted and sampled."""

from __future__ import annotations

import re
import sys
from collections import Counter
from itertools import repeat

from . import stream
from .events import Events
from .fingerprint import CODES, CODE_FORMAT, DROP, EDGE, FEW, FORMAT_CODE, LONG, LONG_RUN, LOOK, NOT_STEP, PRINT_CODES
from .fingerprint import RUN, SAMPLE, SIGS, STATE, STEP, Sig, TINY, UNKNOWN, rank_marks
from .marks import Clock, marked_rank, rank_of, split_prefix, world_of
from .run import LogRun, Series, file_rank, finite, log_files, position
from .counters import bar_count
from .progress import went_back
from .toolkits import READERS, step_of, validation
from .words import BAR_END, EPOCH_START

_READER = dict(READERS)
_BAR_END = re.compile(BAR_END)
BAR_NEAR = 3  # lines: a bar redrawn just before a line of numbers is that line's place (not an earlier bar's)
# what in a step line is a message of its own besides the step (a progress bar with a message glued on)
_MESSAGE = re.compile(
    r"OVERFLOW|[Oo]verflow|Watchdog|Traceback|[Ee]rror|[Kk]illed|[Ss]kipping|exitcode|death signal|got signal|"
    r"out of memory|[Pp]atience|not finite|Terminated\s*$|\^C|Received SIG|KeyboardInterrupt|"
    r"Segmentation fault|Aborted|Bus error|core dumped|"  # the shell's word on the job, glued after a step line
    r"was NaN|Assertion `|contains NaN|"  # MockingBird's "grad_norm was NaN!"; a failed CUDA assertion; Ignite's
    r"\(failed \d+\)"  # wandb's word on the script's exit, glued after its last bar
)

# loguru's "| module:function:line - ": where the line was logged from (a function named training_step), no step
_LOGURU = re.compile(r"(?<=\| )[\w.<>-]+:[\w<>-]+:\d+ - ")


def read_logs(paths: list[str], fast: bool = True) -> LogRun:
    """The files' model. ``fast=False`` reads every line in Python (what the fast read is checked against)."""
    run = LogRun()
    events = Events()
    first = {}  # each file's first clock: a line above it happened no later than that
    for i, path in enumerate(log_files(paths)):
        run.files.append(path)
        (f := _File(run, events, path, i, fast)).read()
        first[path] = f.first
    events.finish()
    for e in events.events:
        e["no_later"] = first.get(e["file"]) if e["time"] is None else None
    run.events = sorted(events.events, key=lambda e: (e["time"] is None, e["time"] or 0))
    if len({r["file"] for r in run.nonfinite}) > 1:  # per-rank files: the first by their clocks, not by file order
        clocked = all(r["stamped"] for r in run.nonfinite)  # else some have only the last clock above: by step
        run.nonfinite.sort(key=lambda r: ((r["time"] is None,) if clocked else position(r), r["time"] or 0, r["order"]))
    run.event_counts = events.counts
    return run


class _File:
    """One file's reading: its clock, its rank, the step format it settled on."""

    def __init__(self, run: LogRun, events: Events, path: str, index: int, fast: bool = True):
        self.run, self.events, self.path, self.index, self.quick = run, events, path, index, fast
        # a time of day alone takes the date a stamp of the file says, wherever it is (its ends read where one comes)
        dated = (lambda: stream.ends(path)) if path != "-" else None
        self.clock, self.now, self.reader, self.toolkit = Clock(dated), None, None, None
        self.first = None  # the file's first clock
        self.epoch = None  # the epoch a line said is starting (SpeechBrain's "Going into epoch 2"), for bars
        self.bar: tuple[int, int] | None = None  # the last progress bar's count and its line's number
        self.named: set[str] = set()  # the totals of training's bars by name ("Train: 5559/9008", "Epoch 3:")
        self.totals: set[str] = set()  # the totals of the bars that moved past 0
        self.at: tuple | None = None  # the fast read's place: (line index, byte offset) of the last line read
        self.stepped: tuple | None = None  # the last (epoch, batch) whose global step a line named, and that step
        self.read_in_full = 0  # lines read by text(), to tell how near a bar was
        self.rank = file_rank(path)
        self.base = index << 40  # a line's order in the whole read: its file, then its byte offset
        self.code: dict[bytes, int] = {}  # a fingerprint -> its line's byte (a template's format, a run's code)
        self.codes = iter(PRINT_CODES)
        self.sigs: dict[bytes, Sig] = {}  # a run's fingerprints (its lines' bytes, else joined) -> what it gave
        self.kept = 0  # bytes of sigs' keys
        self.singles: dict[bytes, Sig] = {}  # the fingerprint of a run of one line -> its sig
        self.done = 0  # in the block read now: the bytes before this are read (a run, a step line near one)
        self.prev = None  # the range fast() read last, where its lines were not all read: (block, offset, end, done)
        self.stamped = -1  # the order of the last line read whose stamp is the file's time now
        self.pure, self.wait = 0, 4  # > 0: the last blocks held step lines only (see steps_only)

    def read(self) -> None:
        # a piece is read once EDGE bytes after it are in: the file's last EDGE bytes are read line by line
        ahead, after, offset = [], 0, 0  # pieces not read yet; their bytes but the first one's
        for data, lo, hi in stream.pieces(sys.stdin.buffer if self.path == "-" else self.path, stream.CHUNK):
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
        """block[lo:hi], at the file's offset + lo; its bytes in the file's first EDGE and its last ``tail`` by line."""
        slow_head = EDGE - (offset + lo) if offset + lo < EDGE else 0
        if not self.quick or hi - lo <= slow_head + tail or hi - lo < TINY:  # (a line two reads cut: TINY)
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
        self.prev = None  # its last line read

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
            fp = raw.translate(None, DROP)
            if self.code.setdefault(fp, FORMAT_CODE[self.toolkit]) != FORMAT_CODE[self.toolkit]:
                self.code[fp] = UNKNOWN  # lines of two formats, or a step and a run's line, alike: read each

    def fast(self, block: bytes, offset: int, start: int, end: int) -> None:
        """The lines of block[start:end] (whole lines), fingerprinted in C (see KEPT): the step lines
        counted (a sample read), each run of other lines read in full or counted as its like were."""
        if not self.code:  # no step format seen yet: nothing to count
            return self.lines(block[start:end], offset + start)
        # the whole read's fingerprints (no copy of it), and where those of block[start:end] begin and end
        prints, run = block.translate(None, DROP), self.run
        c0 = len(block[:start].translate(None, DROP)) if start else 0
        c1 = len(prints) - len(block[end:].translate(None, DROP)) if end < len(block) else len(prints)
        self.done, self.at, self.start, self.end = start, (0, start), start, end
        self.samples = iter(range(start + SAMPLE // 2, end, SAMPLE))
        self.sample = next(self.samples, 1 << 62)
        if self.steps_only(prints, c0, c1):  # step lines only (most blocks of most logs): no line cut out
            return self.part(block, offset, [], b"", end)  # no line to read but the samples
        fps = (prints if c0 == 0 and c1 == len(prints) else prints[c0:c1]).split(b"\n")
        if block.endswith(b"\n", start, end):
            fps.pop()
        run.lines += len(fps)
        self.avg = max(1.0, (end - start) / max(1, len(fps)))  # bytes a line, for seek's first aim
        while True:  # ends at the return: a cut leaves the long run's rest, so fps is never empty
            codes = bytes(map(self.code.get, fps, repeat(UNKNOWN)))
            long = LONG_RUN.search(codes)  # lines of a format not seen yet: read LONG, then code the rest anew
            if long is None:
                return self.part(block, offset, fps, codes, end)
            cut, at, self.end = long.start() + LONG, self.at, end
            b = self.seek(block, cut)
            self.at = at
            self.part(block, offset, fps[:cut], codes[:cut], b)
            fps = fps[cut:]
            self.done, self.at, self.start = b, (0, b), b

    def part(self, block: bytes, offset: int, fps: list, codes: bytes, end: int) -> None:
        """The lines of block[self.start:end], their fingerprints ``fps`` and the bytes ``codes`` they have."""
        run, last = self.run, len(fps)
        self.end = end
        for c in STEP:
            if n := codes.count(c):
                run.formats[CODE_FORMAT[c]] += n
        self.avg = max(1.0, (end - self.start) / max(1, last))
        lead = last - len(codes.lstrip(NOT_STEP))  # a run the range begins with, the lines before it cut
        trail = len(codes.rstrip(NOT_STEP))  # a run it ends with
        if lead:
            self.read_run(block, offset, self.start, self.seek(block, lead))
        if lead < trail:
            counts, todo = self.events.counts, Counter(RUN.findall(codes, lead, trail))
            if all(s is not None and s.countable(counts) for s in map(self.sigs.get, todo)):
                for sig, n in todo.items():  # the bulk of a long log: each run counted as its like were
                    self.count(self.sigs[sig], n)
            else:
                self.runs(block, offset, fps, codes, lead, trail)
        if lead <= trail < last:
            b = end
            for _ in range(last - trail):
                b = max(block.rfind(b"\n", self.start, b - 1) + 1, self.start)
            self.read_run(block, offset, max(b, self.done), end)
        self.samples_before(block, offset, end)
        self.prev = (block, offset, end, self.done)

    def steps_only(self, prints: bytes, c0: int, c1: int) -> bool:
        """Whether prints[c0:c1] (whole lines) are all templates or counted lines alone between step lines (a
        warning at every checkpoint), and if so count them in C. Tried while it holds, else once in a few blocks."""
        self.pure += 1
        if self.pure <= 0 or not prints.endswith(b"\n", c0, c1):
            return False
        counts = self.events.counts
        steps = [(fp + b"\n", c) for fp, c in self.code.items() if c in STEP]
        singles = [(fp + b"\n", s) for fp, s in self.singles.items() if s.countable(counts)]
        tiles = steps + singles
        if not steps or len(tiles) > 6 or any(a[0] != b[0] and a[0].endswith(b[0]) for a in tiles for b in tiles):
            return False  # many, or one the end of another (their counts could then tile the block wrongly)
        if not any(prints.endswith(t, c0, c1) for t, _ in steps):
            return False  # the last line not a step's: it may begin a run the next range goes on with
        n = [prints.count(t, c0, c1) for t, _ in tiles]
        lines = prints.count(b"\n", c0, c1)
        # each counted line alone between step lines, each after a step line (two alike may mean more together:
        # C++'s terminate and its what())
        alone = n[len(steps) :] == [sum(prints.count(t + f, c0, c1) for t, _ in steps) for f, _ in singles]
        if not alone or sum(n) != lines or sum(k * len(t) for k, (t, _) in zip(n, tiles)) != c1 - c0:
            self.wait = min(2 * self.wait, 256)
            self.pure = -self.wait  # not again for a while: longer each time it fails
            return False
        self.wait = 4
        self.run.lines += lines
        for k, (_, c) in zip(n, tiles):
            if k and isinstance(c, Sig):
                self.count(c, k)
            elif k:
                self.run.formats[CODE_FORMAT[c]] += k
        return True

    def runs(self, block: bytes, offset: int, fps: list, codes: bytes, lead: int, trail: int) -> None:
        """Runs of codes[lead:trail], one by one, in order."""
        counts = self.events.counts
        for m in RUN.finditer(codes, lead, trail):
            i, j = m.span()
            sig = m.group()
            if UNKNOWN in sig:
                sig = b"\n".join(fps[i:j])
            s = self.sigs.get(sig)
            if s is not None and s.countable(counts):
                self.count(s)
                continue
            a, b = self.seek(block, i), self.seek(block, j)
            if s is not None and not s.fixed:
                self.read_run(block, offset, a, b)
                continue
            ranks = rank_marks(block[a:b])
            if s is not None and s.n >= FEW:
                if ranks in s.ranks:
                    self.count(s)
                else:  # a rank new to runs like this one: read it, its first failure may be this one
                    s.ranks.add(ranks)
                    self.read_run(block, offset, a, b, s=s)
                continue
            got = self.alone(block, offset, a, b)
            self.read_run(block, offset, a, b, s=Sig(got, ranks))
            if s is not None:
                s.same(got)
                s.ranks.add(ranks)
                continue
            if self.kept + len(sig) > SIGS:
                continue
            s = self.sigs[sig] = Sig(got, ranks)
            self.kept += len(sig)
            if j - i == 1:
                self.singles[fps[i]] = s
            # its lines' codes from now on (a new one where a line has none): the next blocks see the run by its codes
            coded = bytes(self.code.get(fp) or self.code.setdefault(fp, next(self.codes, UNKNOWN)) for fp in fps[i:j])
            if UNKNOWN not in coded and coded not in self.sigs:
                self.sigs[coded] = s
                self.kept += len(coded)

    def count(self, s: Sig, n: int = 1) -> None:
        counts = self.events.counts
        for k, v in s.kinds:
            counts[k] = counts.get(k, 0) + n * v
        for k, v in s.formats:
            self.run.formats[k] += n * v
        self.run.nonfinite.more += n * s.nonfinite

    def read_run(self, block: bytes, offset: int, a: int, b: int, look: bool = True, s: Sig | None = None) -> None:
        """The run block[a:b] read in full, and (``look``) the step lines just before it (the step a failure came at)
        and after it (where a rank went on after a restart) unless ``s`` says runs like it neither resume nor set."""
        self.samples_before(block, offset, a)
        if look:
            if a == self.start and self.prev is not None:  # the range begins with it: the last one ended so
                self.before(*self.prev)
            self.before(block, offset, a, self.done)
            self.done = max(self.done, a)
            self.clock_at(block, offset, a)
        self.lines_in(block, offset, a, b)
        self.done = max(self.done, b)
        if look and (s is None or not s.fixed):  # (a run that has a resume or sets a state is not fixed)
            self.after(block, offset, b)

    def alone(self, block: bytes, offset: int, a: int, b: int) -> tuple:
        """What the run block[a:b] gives read alone, from the file's state now: (events by kind, step lines
        by format, non-finite step lines, whether a run like it can be counted)."""
        alone = _File(LogRun(), Events(), self.path, self.index, fast=False)
        alone.clock = Clock()  # (its times are not what it gives: no read of the file's ends for a date)
        alone.clock.year, alone.now, alone.reader, alone.toolkit = self.clock.year, self.now, self.reader, self.toolkit
        state = {k: getattr(self, k, None) for k in STATE}
        alone.__dict__.update(state)
        alone.lines_in(block, offset, a, b)
        alone.events.finish()
        # a loss scale's value decides a verdict (it collapsed), a resume where the latest attempt begins, a
        # line sets what the next ones read (the epoch a bar is in): a run that does any is always read
        decisive = any(e.get("to") is not None or e["kind"] == "resume" for e in alone.events.events)
        fixed = not decisive and all(getattr(alone, k, None) == v for k, v in state.items())
        counts, formats = alone.events.counts, alone.run.formats
        return tuple(sorted(counts.items())), tuple(sorted(formats.items())), len(alone.run.nonfinite), fixed

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
        return raw if self.code.get(raw.translate(None, DROP), UNKNOWN) in STEP else None

    def samples_before(self, block: bytes, offset: int, until: int) -> None:
        """The sample step lines (one each SAMPLE bytes) before ``until`` not read yet."""
        while self.sample < until:
            p, self.sample = self.sample, next(self.samples, 1 << 62)
            a = max(block.rfind(b"\n", 0, p) + 1, self.done)
            if a >= until:
                break
            b = block.find(b"\n", a, self.end)
            b = self.end if b < 0 else b
            if (raw := self._step_line(block, a, b)) is not None:
                self.line(raw, offset + a, counted=True)
            self.done = b + 1

    def before(self, block: bytes, offset: int, a: int, done: int) -> None:
        """The step lines just before block[a:] (up to LOOK), not before ``done`` (read)."""
        lines, p = [], a
        while len(lines) < LOOK and p - 1 > done:
            q = max(block.rfind(b"\n", done, p - 1) + 1, done)
            if (raw := self._step_line(block, q, p - 1)) is None:
                break
            lines.append((q, raw))
            p = q
        for q, raw in reversed(lines):
            self.line(raw, offset + q, counted=True)

    def clock_at(self, block: bytes, offset: int, a: int) -> None:
        """The file's time at block[a:]: the stamp of the nearest line before it that has one, where it was counted."""
        p = a
        for _ in range(4 * LOOK):
            if p <= self.start or self.base + offset + p <= self.stamped:
                return
            q = max(block.rfind(b"\n", self.start, p - 1) + 1, self.start)
            for text in reversed(stream.clean(block[q : p - 1])):
                t = self.clock.of(split_prefix(text)[1])
                if t is not None:
                    self.now, self.stamped, self.first = t, self.base + offset + q, self.first or t
                    return
            p = q

    def after(self, block: bytes, offset: int, b: int) -> None:
        """The step lines just after a run (up to LOOK)."""
        p = b
        for _ in range(LOOK):
            if p >= self.end:
                break
            q = block.find(b"\n", p, self.end)
            q = self.end if q < 0 else q
            if (raw := self._step_line(block, p, q)) is None:
                break
            self.line(raw, offset + p, counted=True)
            p = q + 1
        self.done = max(self.done, p)

    def text(self, line: str, order: int, counted: bool = False) -> bool:
        """Read one clean line; True where it is a step line whose numbers are all finite and nothing else."""
        run = self.run
        rank, text = split_prefix(line)
        t = self.clock.of(text)
        if " - " in text and "| " in text:
            text = _LOGURU.sub("", text, count=1)
        if t is not None:
            self.now, self.stamped, self.first = t, order, self.first or t
        # what the file's clock does not say (glog's year, a time of day's date), on the line's events and its record
        guessed = {f"{self.clock.guessed}_guessed": True} if self.clock.guessed and self.now is not None else {}
        rec = step_of(text, self.reader)
        self.read_in_full += 1
        if rec is not None and (b := rec.pop("bar", None)) is not None:
            if "rain" in b[0] or "poch" in b[0]:
                self.named.add(b[1])
            elif self.named and b[1] not in self.named:  # a bar of no name under "Train: 5559/9008": an inner loop's
                rec = None
            elif not b[0] and rec["batch"] == 0 and b[1] not in self.totals:
                if self.toolkit not in (None, rec["toolkit"]):  # a new bar of no name at 0 after another format's
                    rec = None  # step line: a loop not begun (an evaluation's)
            if rec is not None and rec["batch"]:
                self.totals.add(b[1])
        barred = "[" in text or "it/s " in text or "s/it " in text  # tqdm's, or a bar without brackets
        bar = bar_count(text) if "/" in text and barred and not validation(text) else None
        if bar is not None:
            self.bar = (bar, self.read_in_full)
        if fed := rec is None or _MESSAGE.search(text):
            if "poch" in text and (m := EPOCH_START.search(text)):  # a bar's lines that follow are of this epoch
                self.epoch = int(m.group(1) or m.group(2))
            self.events.order = order
            who = rank if rank is not None else (r if (r := rank_of(text)) is not None else self.rank)
            kept = len(self.events.events)
            self.events.stamp = {"stamped": t is not None, **guessed}
            self.events.feed(self.path, who, self.now, text, bar)
            self.events.stamp = {}  # what is said at the end (a traceback the file's end cut) is of no one line
            if len(self.events.events) > kept:  # the step each rank was at when it came: kept however long the log
                for s in self.run.series.values():
                    s.pin()
            if rec is None:
                return False
        near = self.bar is not None and self.read_in_full - self.bar[1] <= BAR_NEAR
        if rec["step"] is None and rec["batch"] is None and near:
            rec["step"] = self.bar[0]  # a line of numbers printed under a bar (Hugging Face's dicts): its count
        if rec["step"] is not None and rec["batch"] is not None:
            self.stepped = (rec["epoch"], rec["batch"], rec["step"])
        elif self.stepped is not None and self.stepped[:2] == (rec["epoch"], rec["batch"]):
            rec["step"] = self.stepped[2]  # its global step said on a line of its own (DLLogger's, a value a line)
        if rec["epoch"] is None and self.epoch is not None and rec["step"] is None:
            rec["epoch"], rec["told"] = self.epoch, True  # said by another line: a bar's restart is no resume
        if rec["toolkit"] != self.toolkit:
            self.reader, self.toolkit = _READER[rec["toolkit"]], rec["toolkit"]
        run.formats[rec["toolkit"]] += 0 if counted else 1
        if rec["rank"] is None:  # a bar's rank is said before its end, not by a line glued after it
            said = text[: m.end()] if rec["toolkit"] == "lightning" and (m := _BAR_END.search(text)) else text
            rec["rank"] = rank if rank is not None else (marked_rank if rec["toolkit"] == "plain" else rank_of)(said)
        if rec["rank"] is None:
            rec["rank"] = self.rank
        if run.world is None:
            run.world = world_of(text)
        rec["time"], rec["file"], rec["order"], rec["stamped"] = self.now, self.path, order, t is not None
        rec.update(guessed)
        rec["nonfinite"] = not finite(rec)
        series = run.series.setdefault(rec["rank"], Series())
        run.first_steps.setdefault(rec["file"], rec)
        # Lightning's bar at 0, redrawn before the next epoch (its postfix the last's): no resume, nor compared with
        if not (rec["toolkit"] == "lightning" and rec["batch"] == 0):
            kind = (rec["toolkit"], rec.pop("drawn", None))  # a bar (by its total) or a line, of its format
            if (last := series.moved.get(kind)) and went_back(run, rec, last):
                run.resumes.append({"rank": rec["rank"], "before": last, "after": rec})
            series.moved[kind] = rec
        if rec["batch"] is not None:
            run.epoch_start.setdefault((rec["rank"], rec["epoch"]), rec["batch"])
        series.add(rec)
        if rec["nonfinite"]:
            run.nonfinite.append(rec)
        return not fed and not rec["nonfinite"]


__all__ = ["read_logs"]

"""A log line's time (Python logging's, ISO, Hugging Face's US dates, glog's ``E0301 12:00:00.123456`` and Hydra's
``[05-07 13:05:33]``, which have no year) and rank (PyTorch's ``[rank3]:``, torchrun's ``[default3]:``, NCCL's, icefall's, ESPnet's, WeNet's)."""

from __future__ import annotations

import calendar
import re
import time

_HMS = r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
_ISO = re.compile(rf"(?P<y>\d{{4}})-(?P<mo>\d\d)-(?P<d>\d\d)[ T_]{_HMS}(?:[.,](?P<frac>\d{{1,6}}))?")
_US = re.compile(rf"(?P<mo>\d\d)/(?P<d>\d\d)/(?P<y>\d{{4}}),? {_HMS}(?:[.,](?P<frac>\d{{1,6}}))?")  # Hugging Face's
_GLOG = re.compile(rf"(?:^|[\s\[:])[IWEF](?P<mo>\d\d)(?P<d>\d\d) {_HMS}\.(?P<frac>\d{{1,6}})")
_GLOG_GLUED = re.compile(rf"[IWEF](?P<mo>\d\d)(?P<d>\d\d) {_HMS}\.(?P<frac>\d{{6}}) +\d+ ")  # after a bar's end too
# a month and a day without a year, first on the line: Hydra's and audiocraft's "[05-07 13:05:33][flashy.solver]",
# mmengine's console "12/01 10:32:53 - mmengine - INFO - ..."
_MONTH_DAY = re.compile(rf"\[?(?P<mo>\d\d)[-/](?P<d>\d\d) {_HMS}(?:[.,](?P<frac>\d{{1,6}}))?(?![\d:])")
# a time of day alone, first on the line: "18:33:56.018 <r1> ERROR ...", "[15:50:15] r1 e1 i1/8"
_DAYTIME = re.compile(rf"\[?{_HMS}(?:[.,](?P<frac>\d{{1,6}}))?(?![\d:])")

# a rank mark a line begins with; its text after the mark is the line as the rank wrote it
_MARK = r"\[(?:rank|default|[\w.-]+:)(\d+)\]:"  # PyTorch's; torchrun's, its role first (default, a host's "gpu3:")
# what a collector puts before a line: strong marks (a rank's, mpirun's, a container's) are always taken off; a bare
# stamp or host name only before a rank mark or a line read from its first character (a traceback, torchrun's summary)
_STRONG = (
    (re.compile(rf"^\s*{_MARK}\s?"), 1),  # PyTorch's and torchrun's, indented where a thread quotes it
    # a loop's own "[r1][ep 0 ...", a logger's "INFO [rank0] trainer: ..." (an error's level word is kept)
    (re.compile(r"^(?:(?:INFO|DEBUG)\s+)?\[(?:rank|r)(\d{1,5})\](?=\[| \S)"), 1),
    (re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:\s?"), 1),  # mpirun --tag-output: [job,rank]
    (re.compile(r"^(?:stdout|stderr) [FP] "), None),  # a CRI container log, after its timestamp
    (re.compile(r"^[\w.-]+(?:[-_]\d+)?\s+\| "), None),  # docker compose: "trainer-1  | "
)
_TIME = re.compile(
    r"^\[?(?:\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?|"
    r"(?:[A-Z][a-z]{2} )?[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?: \d{4})?)\]?:?"
    r"(?:\s+|(?=\[\d+,\d+\]<std))"  # mpirun --timestamp-output's "Fri Aug 18 12:44:11 2017[1,93]<stderr>:"
)
# "[1]: " after a stamp; srun's "1: " (not darknet's step: "1014: 6.31, 5.90 avg, 0.001 rate")
_WEAK_RANK = re.compile(r"^\[(\d{1,5})\]:(?: (?=\S)| ?(?=\s|$))|^(\d{1,4}): (?=\S)(?![-+\w.]+, [-+\w.]+ avg)")
_HOST = re.compile(r"^[a-zA-Z][\w.-]*[\w]:\s(?=\S)")  # pdsh / a collector's "node03: "
# a line that is read from its first character: what a collector's prefix must not hide
STRUCTURAL = re.compile(
    r"^(?:Traceback \(most|\s*File \"|\s+\S|[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b|"
    r"\[\d+\]:\s*$|(?:rank|exitcode|time|host|error_file|traceback)\s*:|Root Cause|Failures:|={8}|-{8}|"
    rf"<NO_OTHER|During handling|The above exception|\S+ FAILED\s*$|{_MARK}|"
    r"terminate called|Fatal Python error|Segmentation fault|Killed\b|[~^]{2,}\s*$)"  # 3.11's markers under a frame
)
# a loop's own short mark, the last word of a line's first brackets: "[train r1] ...", "12:00:01 [w1] upd=3 ...",
# "[it 0012/0030 r1] ctc=3.41", "... | r1 | step 2 |"
_OWN_R = (
    # (after a time of day, a date before it or not: "2026-12-01 10:00:07 [GPU 1] step 7")
    r"^(?:(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d\S* )?\[(?:[^\][]{0,40} )?(?:[rw]|gpu|GPU|rank|local_rank|cuda)[:= ]?"
    r"(\d{1,4})\] |\| r(\d{1,4}) \||^\S*\d\d:\d\d:\d\d\S* r(\d{1,4}) "
    r"|^\S*\d\d:\d\d:\d\d\S* \W{0,2} ?[A-Za-z][\w.-]{0,30}/r(\d{1,4}) "  # "06:33:51.742 ~ hum/r1 ~ INFO": a host's rank
    r"|^\S*\d\d:\d\d:\d\d\S* <[rw](\d{1,4})> "  # "18:33:56.018 <r1> ERROR"
    r"|(?:\||::) ?[A-Za-z][\w-]{0,30}[/.](?:gpu|rank|proc|r)(\d{1,4}) ?(?:\||::)"  # "| node0/gpu1 |", ":: host0.proc1 ::"
    r"|^(?:\[[^\][]{1,40}\])+\[[Rr](\d{1,4})\]"  # after a stamp of its own: "[2026-11-30 21:43:38.889][R1][e0/s013]"
)
_RANKS = (
    re.compile(r"\[Rank (\d+)\]|\[RANK (\d+)\]"),  # NCCL / c10d messages; Accelerate's logger
    re.compile(r"\] \((\d+)/(\d+)\) "),  # icefall: [train.py:123] (3/8)
    re.compile(r"^\[[^\]\s:]+:(\d+)/(\d+)\]"),  # ESPnet: [host:3/8]
    re.compile(r"\brank (\d+)(?:\s+bs \d+.*)?$"),  # WeNet's step line ends with it
    re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank"),  # torchelastic's failure summary
    re.compile(_OWN_R),  # a loop's own "[train r1] ep=0", "... | r1 | step 2 |", "2026-11-30T04:35:34 r1 epoch=1"
    re.compile(r"\b[Rr]ank(?:[ _]?|:\s*)(\d+)\b"),  # any other "rank 3" / "Rank 3" / "RANK_3" / "rank: 3"
)


def split_prefix(line: str) -> tuple[int | None, str]:
    """The rank a collector's or launcher's prefix names, and the line as the process wrote it:
    ``[rank3]: text`` -> ``(3, "text")``; ``2026-09-17 13:40:05 [1]:   File "x.py" ...`` -> ``(1, '  File ...')``;
    a line without such a mark -> ``(None, line)``. The time is read from the whole line, before this."""
    rank = None
    for _ in range(4):  # marks nest: a timestamp, then a host, then a rank mark
        for pattern, group in _STRONG:
            if m := pattern.match(line):
                if group is not None:
                    rank = int(m.group(group))
                line = line[m.end() :]
                break
        else:
            weak = _TIME.match(line) or _HOST.match(line)
            rest = line[weak.end() :] if weak else line
            if r := _WEAK_RANK.match(rest):
                if r.group(1) is not None and not rest[r.end() :].strip():
                    return rank, line  # torchrun's own "[0]:" record mark, alone on its line
                rank, line = int(r.group(1) or r.group(2)), rest[r.end() :]
                continue
            if weak and (STRUCTURAL.match(rest) or any(p.match(rest) for p, _ in _STRONG)):
                line = rest
                continue
            break
    return rank, line


def rank_of(line: str) -> int | None:
    """The rank the line says it is from, by the first mark that fits."""
    m = next((found for pattern in _RANKS if (found := pattern.search(line))), None)
    return int(next(g for g in m.groups() if g is not None)) if m else None


# a loop's own mark beside its step: "[rank 1] step 15", "rank=1 step=1" (first, or after a bracket or bar)
_LOOP_RANK = re.compile(rf"\[[Rr]ank ?(\d+)\]|(?:^|[\[({{|,]\s*)rank\s*=\s*(\d+)\b|{_OWN_R}")


def marked_rank(line: str) -> int | None:
    """The rank a line's explicit mark names (``[RANK 1]``, ``[Rank 1]``, ``[rank 1]``, ``rank=1`` first): what a
    loop of one's own prints beside its step, where a bare "rank 3" may be anything."""
    m = _RANKS[0].search(line) or _LOOP_RANK.search(line)
    return int(next(g for g in m.groups() if g is not None)) if m else None


def world_of(line: str) -> int | None:
    """The world size where the mark carries it (icefall's ``(3/8)``, ESPnet's ``[host:3/8]``)."""
    m = _RANKS[1].search(line) or _RANKS[2].search(line)
    return int(m.group(2)) if m else None


class Clock:
    """Turns a line's stamp into seconds since the epoch (UTC as written: only the order and the gaps
    matter). glog's stamps take the year of the last full stamp seen, else this year; a time of day alone takes
    the last full stamp's date, else the first of January of this year, a day later each time it goes back by
    more than half a day (midnight). ``guessed``: what the last stamp read did not say ("year", "date")."""

    def __init__(self, dated=None):
        self.year = time.gmtime().tm_year
        self.date: tuple[int, int, int] | None = None  # the last stamp's that had one (glog's: its year guessed)
        self.full, self.guessed = False, None  # a full stamp seen
        self._days, self._last = 0, None  # days a time of day alone went past midnight; its last second
        # where a stamp lacks its year or date before a full one: the text (the file's first and last lines) to find
        # one in
        self._dated = dated

    def _seed(self) -> None:
        """The date of the first stamp of the file's ends, asked once, for a stamp read before any full one."""
        text, self._dated = self._dated(), None
        for pattern in (_ISO, _US, _GLOG_GLUED):
            m = pattern.search(text)
            if m is not None and 1 <= int(m["mo"]) <= 12 and 1 <= int(m["d"]) <= 31:
                year = int(m["y"]) if "y" in m.groupdict() else self.year
                self.date, self.year, self.full = (year, int(m["mo"]), int(m["d"])), year, "y" in m.groupdict()
                return

    def of(self, line: str) -> float | None:
        if len(line) < 9:
            return None
        if m := _ISO.search(line, 0, 80) or _US.search(line, 0, 60):
            self.year, self.full, self.guessed = int(m["y"]), True, None
            self.date, self._days, self._last = (self.year, int(m["mo"]), int(m["d"])), 0, None
            return _seconds(self.year, m)
        m = _GLOG.search(line, 0, 60) or _MONTH_DAY.match(line)
        if m and 1 <= int(m["mo"]) <= 12 and 1 <= int(m["d"]) <= 31:
            if not self.full and self._dated is not None:  # its year, where the file says it
                self._seed()
            self.guessed = None if self.full else "year"
            self.date, self._days, self._last = (self.year, int(m["mo"]), int(m["d"])), 0, None
            return _seconds(self.year, m)
        if (m := _DAYTIME.match(line)) and int(m["h"]) < 24 and int(m["mi"]) < 60 and int(m["s"]) < 61:
            if self.date is None and self._dated is not None:
                self._seed()
            self.guessed = None if self.full else "year" if self.date else "date"
            y, mo, d = self.date or (self.year, 1, 1)
            t = calendar.timegm((y, mo, d, *map(int, m.group("h", "mi", "s")), 0, 0, 0)) + 86400 * self._days
            if self._last is not None and t < self._last - 43200:
                self._days, t = self._days + 1, t + 86400
            self._last = t
            return t + (float("0." + m["frac"]) if m["frac"] else 0.0)
        return None


def _seconds(year: int, m: re.Match) -> float | None:
    try:
        t = calendar.timegm((year, *map(int, m.group("mo", "d", "h", "mi", "s")), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    return t + (float("0." + m["frac"]) if m["frac"] else 0.0)


__all__ = ["Clock", "marked_rank", "rank_of", "split_prefix", "world_of"]

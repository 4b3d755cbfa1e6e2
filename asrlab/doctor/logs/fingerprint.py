"""Which lines of a long log must be read in Python: the bytes a line must hold to say more than "a step went
by" (:data:`KEYS`, the one list of trigger words), and each line's fingerprint (the bytes it keeps of them and
its step format's code), so that a stretch of lines like those already read in full is counted, not re-read."""

from __future__ import annotations

import re

from . import events as _events
from .toolkits import READERS

# what a failure, a non-finite value, a resume or a torchrun summary prints: a step line without any is only sampled
KEYS = tuple(
    b"nan|inf|NaN|Inf|NAN|INF|rror|xception|raceback|atchdog|imed out|imeout|xitcode|ignal|illed|OVERFLOW|verflow|"
    b"kipping|scale is|finite|not correct|invalid|onitoredBarrier|store based|NCCL work|emory|Root Cause|Failures:|"
    b"esum|estor|heckpoint|oading|DataLoader|empty slice|worker|Abort|abort|Segmentation|core dumped|FAILED|failed|"
    b"ailure|FATAL|atal|CRITICAL|erminated|ddress already|^C|Ended (code".split(b"|")
)

# The fast read (reader's _File.fast): a line's fingerprint is what is left when digits, spaces, most punctuation
# and most lower-case letters go (KEPT): every finite line of a step format leaves one template, a word of KEYS, a
# nan or an inf another. One C pass (bytes.translate) makes each line one byte: its template's format, the code of
# a run read in full (Sig), or "?"; a regex could not: an alternation of KEYS runs at 33 MB/s (grep -c: 1.5 GB/s).
_RARE_FIRST = b"zqxjkvbpygfwmucldrhsnioate"  # lower-case letters, the rarest in log text first


def _kept(keys) -> bytes:
    # upper-case letters and brackets; not the punctuation every line has plenty of (,:;=_/), for speed
    kept = set(b"\nABCDEFGHIJKLMNOPQRSTUVWXYZ!\"#$%&'()*<>?@[\\]^`{|}~")
    for k in keys:  # each word of KEYS leaves at least one byte: the line that holds it is not a template's
        if not any(c in kept for c in k):
            kept.add(min((c for c in k if c in _RARE_FIRST), key=_RARE_FIRST.index, default=k[0]))
    return bytes(sorted(kept))


KEPT = _kept(KEYS)
DROP = bytes(c for c in range(256) if c not in KEPT)
FORMAT_CODE = {name: 97 + i for i, (name, _) in enumerate(READERS)}  # a template's format: a, b, c, ...
CODE_FORMAT = {c: name for name, c in FORMAT_CODE.items()}
STEP = bytes(FORMAT_CODE.values())
UNKNOWN = 63  # "?": a line not seen in a run read in full, or like lines that read differently
NOT_STEP = bytes(c for c in range(256) if c not in STEP)
RUN = re.compile(b"[^" + re.escape(STEP) + b"]+")
LONG = 512  # a run of more lines (a format not seen yet) is read LONG lines at a time, the rest coded anew
LONG_RUN = re.compile(b"[^" + re.escape(STEP) + b"]{%d,}" % (LONG + 1))
PRINT_CODES = range(128, 256)  # the codes a run's fingerprints get once read in full
# a run's ranks: [rank3]:, [Rank 3], rank : 3, local_rank: 3 (ank), icefall's (3/8), ESPnet's [host:3/8]
_RANK_MARKS = (re.compile(rb"ank\D{0,6}?(\d+)"), re.compile(rb"\((\d+)/\d+\)"), re.compile(rb":(\d+)/\d+\]"))
EDGE = 1 << 16  # bytes at a file's start and end read line by line: its formats, and each rank's last steps
TINY = 1 << 12  # a piece this short is read line by line
SAMPLE = 1 << 21  # one step line read in Python for each this many bytes of the rest
LOOK = 8  # step lines read around a run read in full: the step a failure happened at, what led to it, a resume's
FEW = 3  # a run's fingerprints read in full this many times before its like are counted
SIGS = 1 << 24  # bytes of runs' fingerprints remembered per file (memory bounded whatever the log)
# what a _File keeps from a line for the lines after it (besides the clock): a run that changes any is always read
STATE = ("epoch",)
CODES = 1 << 14  # fingerprints given a byte per file (templates, and lines of runs read in full)


class Sig:
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

    def countable(self, counts: dict) -> bool:
        """Counted without a look at its ranks: read FEW times, and every kind of its events past those kept
        (a rank's first of them would not be kept by a line-by-line read either)."""
        if not self.blind and self.n >= FEW and self.fixed:
            self.blind = all(counts.get(k, 0) >= _events.KEEP for k, _ in self.kinds)
        return self.blind


def rank_marks(raw: bytes) -> frozenset:
    return frozenset(int(x) for p in _RANK_MARKS for x in p.findall(raw))

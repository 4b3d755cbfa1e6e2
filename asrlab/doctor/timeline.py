"""One timeline of a run: what every source says went wrong, as failure events on one clock (:mod:`.verdict` picks
the first): ``kind``, ``verdict``, ``time`` (seconds since the epoch, None where the source has no clock), ``order``
(its line's place within its source), ``rank``, ``at`` (``{"step", "epoch", "batch"}``), ``source``, ``text``.
``consequence``: its own lines show it followed another failure (a survivor's lost-peer error, a rank being ended
by its launcher); ``transient``: the run went on after it (a non-finite step finite again at the next one).
"""

from __future__ import annotations

import bisect
from pathlib import Path

NO_STEP = {"step": None, "epoch": None, "batch": None}


def resumes(*, ledger=False, resumed_from=(), per_rank=None, trained_again=(), from_output=()) -> dict:
    """The ``resumes`` section, one shape whatever was read: ``ledger`` (asrlab's resume ledger was there), the
    steps it says the run ``resumed_from``, where rank 0's metrics went back (``steps_trained_again``) and where a
    log's or a job's output shows the steps went back (``from_output``)."""
    said = {"ledger": ledger, "resumed_from": list(resumed_from), "per_rank": per_rank or {}}
    return {**said, "steps_trained_again": list(trained_again), "from_output": list(from_output)}


def failure(verdict: str, kind: str, time: float | None, text: str, *, source: str, rank=None, step=None, **more):
    """A failure event (see the module docstring); ``step`` is a step record or a plain step number."""
    place = {k: step.get(k) for k in NO_STEP} if isinstance(step, dict) else {**NO_STEP, "step": step}
    e = {"verdict": verdict, "kind": kind, "time": time, "order": more.pop("order", 0), "rank": rank, "at": place}
    return {**e, "source": source, "text": text, **more}


def suspect(text: str, culprit: dict | None = None) -> dict:
    """A thing that looks wrong that no rule names, of no rank, at ``culprit``'s place (none given: no step): no
    all-clear (``Reading.suspects``)."""
    return {"rank": None, "culprit": culprit or {"rank": None, **NO_STEP}, "text": text}


class JobClock:
    """When each byte of a watched job's output came (``job.times``, kept by ``asrlab watch``): a line's
    time is when the stretch it came in was kept. None for every offset where the watch kept no clock."""

    def __init__(self, path: str | Path):
        self.offsets: list[int] = []
        self.times: list[float] = []
        try:
            text = Path(path).read_text()
        except OSError:
            return
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:  # both read before either is kept: the two lists stay in step
                    offset, t = int(parts[0]), float(parts[1])
                except ValueError:  # a line cut by a watch that was killed while writing it
                    continue
                self.offsets.append(offset)
                self.times.append(t)

    def __bool__(self) -> bool:
        return bool(self.offsets)

    def at(self, offset: int | None) -> float | None:
        if not self.offsets or offset is None:
            return None
        return self.times[max(bisect.bisect_right(self.offsets, offset) - 1, 0)]


__all__ = ["JobClock", "NO_STEP", "failure", "resumes", "suspect"]

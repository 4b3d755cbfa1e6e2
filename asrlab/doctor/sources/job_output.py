"""What a watched job printed (``EXP/job.log``, kept by ``asrlab watch``), as a source beside the run folder: the
text log's reading of it, each event on the folder's clock (``job.times``: when each stretch of output came)."""

from __future__ import annotations

from pathlib import Path

from ...lab.layout import JOB_LOG, JOB_TIMES
from ...lab.stall.errors import LAUNCH_SLACK_S
from ...lab.stall.heartbeat import read_heartbeats
from ..logs.progress import culprit
from ..timeline import JobClock
from ..verdict import first_failure
from . import Reading, text_log

NAME = "job output"
OFFSET = (1 << 40) - 1  # a log event's order holds its file's index above this and its byte offset below


def read(exp: Path, launched: float | None = None) -> Reading | None:
    """The job's output as a reading (None where the watch kept none); its section: what it says alone.
    ``launched``: when the latest launch began (the run folder's reading of it): what came before is history."""
    from ..verdict import decide

    path = Path(exp) / JOB_LOG
    if not path.exists() or path.stat().st_size == 0:
        return None
    r = text_log.read([str(path)])
    clock = JobClock(Path(exp) / JOB_TIMES)
    ranks = {b.get("pid"): rank for rank, b in read_heartbeats(exp).items() if b.get("rank_known") is not False}
    for e in r.events:
        # a process named by its pid (the shell's, torchrun's beside its local rank): the rank the watch saw
        if (e.get("rank") is None or e.get("local")) and e.get("pid") in ranks:
            e["rank"] = ranks[e["pid"]]
        e["joined_time"] = clock.at(e.get("order", 0) & OFFSET) if clock else None
    gone = [e for e in r.events if launched and (e["joined_time"] or 1e18) < launched - LAUNCH_SLACK_S]
    if gone:  # printed before this launch began (the watch keeps every launch's output in one file): history
        r.events = [e for e in r.events if not any(e is g for g in gone)]
        if (e := first_failure(gone)) is not None:
            r.history.append(f"an earlier launch: {e['say']()['summary'][:240]}")
    if clock:
        r.raw.clock = lambda order: clock.at(order & OFFSET)  # a hang told by the job's pace: on the watch's clock
    alone = decide([r])
    for e in r.events:
        e["source"] = NAME
        e["say"] = _owned(e["say"])
        e.pop("_phrased", None)  # phrased alone above; on the folder's timeline it is said as the job's own output
    s = r.sections
    last = [
        {"rank": x["rank"], "last": x["last"], "culprit": culprit(x["rank"], r.raw.series[x["rank"]].last)}
        for x in s["ranks"]
        if x["last"]
    ]
    said = {k: alone[k] for k in ("verdict", "summary", "culprit")}
    kept = {k: s[k] for k in ("formats", "lines", "nonfinite")}
    r.sections = {"file": str(path), **said, **kept, "last_steps": last, "resumes": s["resumes"], "history": r.history}
    r.history = [f"in the job's output: {h}" for h in r.history]
    r.source, r.suspects, r.outcome = NAME, [], None  # the folder says how a run that did not fail ended
    return r


def _owned(say):
    def said() -> dict:
        p = say()
        return {**p, "summary": p["summary"] + " (the job's own output)"}

    return said


__all__ = ["NAME", "read"]

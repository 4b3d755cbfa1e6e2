"""The one rule over what every source read: the first failure by time (consequences never before their cause),
by clock, else by step, else the source listed first; ``unknown`` where lines look wrong and no failure is named;
else what the most specific source says of a run that did not fail."""

from __future__ import annotations

from ..lab.stall.heartbeat import STALE_S
from .timeline import NO_STEP

FAILED = ("stalled", "nonfinite_halt", "nonfinite", "crashed", "killed", "out_of_memory", "unknown")
VERDICTS = ("finished", "running", "stopped", *FAILED, "no_failure_seen")
QUOTED = 5  # lines that look wrong quoted in an ``unknown`` verdict
DEATHS = ("killed", "out_of_memory", "crashed")
STOP_SLACK_S = 2.0  # the watch records its stop once it has passed the signal on: the job may print first


def when(e: dict) -> float | None:
    """An event's time; for a line with no clock above its file's first one, that clock (it happened no later)."""
    return e["time"] if e.get("time") is not None else e.get("no_later")


def key(e: dict) -> tuple:
    """Which of two events came first: by time where both have one (an event without a time at the clock it
    happened no later than, its file's first; without that, after every timed one), a root cause before the
    failures its launcher saw in the same instant, else by their order."""
    t = when(e)
    return (t if t is not None else float("inf"), not e.get("root", False), e.get("order", 0))


def first_failure(events: list[dict]) -> dict | None:
    """The first failure by time that is not a consequence of another; a transient one only where nothing
    ended the run; a consequence only where the sources hold nothing else (all the log shows is a survivor's)."""
    for tier in (
        [e for e in events if not e.get("consequence") and not e.get("transient")],
        [e for e in events if not e.get("consequence")],
        events,
    ):
        if tier:
            return min(tier, key=key)
    return None


def culprit(e: dict | None) -> dict:
    """``{"rank", "step", "epoch", "batch"}`` of the first failure: where it says the culprit is."""
    if e is None:
        return {"rank": None, **NO_STEP}
    place = e.get("at") or NO_STEP
    step = next((place[k] for k in ("step", "batch", "epoch") if place[k] is not None), None)
    rank = e.get("culprit_rank", e.get("rank"))
    return {"rank": rank, "step": step, "epoch": place["epoch"], "batch": place["batch"]}


def in_epoch(c: dict) -> bool:
    """Whether a culprit's step is its place in an epoch (a bar's batch: "epoch 1, batch 14"), no global step."""
    return c.get("step") is not None and c.get("epoch") is not None and c["step"] == c.get("batch")


def decide(readings: list) -> dict:
    """``{"verdict", "summary", "culprit", "first", "basis", "history"}`` from the readings (in precedence
    order) of :mod:`.sources`."""
    history = [h for r in readings for h in r.history]
    firsts = [(r, e) for r in readings if (e := first_failure(r.events)) is not None]
    if firsts:
        (r, e), said = _first(firsts)
        out = _said(e)
        if said:
            out["summary"] += said
        c = out["culprit"]
        if c["step"] is None:  # a stall report, a rank's error: the step where another source places it
            others = (_said(x)["culprit"] for _, x in firsts if x is not e)
            p = next((o for o in others if o["step"] is not None and o["rank"] in (None, c["rank"])), None)
            out["culprit"] = c if p is None else {**c, "step": p["step"], "epoch": p["epoch"], "batch": p["batch"]}
        return {**out, "basis": e.get("source") or r.source, "history": history}
    outcome = next((r.outcome for r in readings if r.outcome and not r.outcome.get("silent")), None)
    odd = [s for r in readings for s in r.suspects]
    if outcome is None and not odd and (open_end := _open_end(readings)):
        return {**open_end, "culprit": culprit(None), "first": None, "basis": "series", "history": history}
    outcome = outcome or next((r.outcome for r in readings if r.outcome), None) or {"verdict": "no_failure_seen"}
    if outcome["verdict"] == "no_failure_seen" and odd:  # lines look wrong and nothing names it: never all clear
        ranks = {s["rank"] for s in odd}
        c = {**odd[0]["culprit"], "rank": ranks.pop() if len(ranks) == 1 else None}
        n = sum(len(r.suspects) for r in readings)
        said = [k for k in ("epoch", "batch", "step") if c.get(k) is not None]  # a step that is the batch, once
        place = ", ".join(f"{k} {c[k]}" for k in said if k != "step" or "batch" not in said or c["step"] != c["batch"])
        said = f"no rule names a failure, but {n} line{'s look' if n > 1 else ' looks'} wrong"
        said += (f" (after {place})" if place else "") + ": " + " | ".join(s["text"][:160] for s in odd[:QUOTED])
        first = {k: v for k, v in odd[0].items() if k != "culprit"}
        out = {"verdict": "unknown", "summary": said, "culprit": c, "first": first, "basis": "suspect lines"}
        return {**out, "history": history}
    return {
        **outcome,
        "summary": outcome.get("summary") or "no failure seen",
        "culprit": culprit(None),
        "first": None,
        "basis": outcome.get("basis") or next((r.source for r in readings if r.outcome is outcome), None),
        "history": history,
    }


def _open_end(readings: list) -> dict | None:
    """Series that just stop, where nothing read says the run ended (no log's step lines, no toolkit's end of
    training): an event file or a metrics table does not record how a run ended, and a crash, a kill or a hang
    leave series that stop as a finished run's do. No all-clear, said with where they stop."""
    tables = [r for r in readings if r.series]
    if not tables:
        return None
    ends = {r.source: max(s for p in r.series.values() for s, _ in p[-1:]) for r in tables}
    said = ", ".join(f"{src}'s at step {step}" for src, step in ends.items())
    summary = f"no failure in the series, but nothing read says the run ended: they stop ({said}); a crash, a kill or "
    summary += "a hang leaves series that stop as a finished run's do"
    return {"verdict": "unknown", "summary": summary}


def _said(e: dict) -> dict:
    """The chosen event as its source phrases it."""
    if "say" in e:
        p = e.get("_phrased") or e.setdefault("_phrased", e["say"]())  # phrased once: several looks may ask
        first = {k: v for k, v in p.items() if k not in ("summary", "culprit")}
        return {"verdict": p["verdict"], "summary": p["summary"], "culprit": p["culprit"], "first": first}
    first = {k: v for k, v in e.items() if k not in ("say", "_phrased", "at")}
    return {"verdict": e["verdict"], "summary": e["text"], "culprit": culprit(e), "first": first}


def _time(e: dict) -> float | None:
    """An event's second on a true clock: a watched job's line on the folder's, a run folder's or an event file's
    own; a log's timestamps are its machine's local time, which no other source's clock can be set against."""
    if "joined_time" in e:
        return e["joined_time"]
    return None if e.get("source") == "log" else e.get("time")


SAME_S = 1.0


def _before(a: dict, b: dict) -> bool:
    """Whether ``a`` (of a later-listed source) came before ``b``: by their clocks, else by their steps. A rank
    that vanished is dated by its last heartbeat: it ended up to a heartbeat's staleness later (what its own
    folder recorded just before it ended, a stall report, came first). One kind of failure two sources saw within
    :data:`SAME_S` is one failure: the earlier-listed source says it (a job's line is dated when the watch read it,
    after the event file's writer dated the same step's value)."""
    ta, tb = _time(a), _time(b)
    if ta is not None and tb is not None:
        same = SAME_S if a.get("verdict") == b.get("verdict") and a.get("source") != b.get("source") else 0.0
        return ta + STALE_S * bool(a.get("guess")) + same < tb + STALE_S * bool(b.get("guess"))
    sa, sb = (culprit(x)["step"] if "at" in x else None for x in (a, b))
    return sa is not None and sb is not None and sa < sb


def _tier(e: dict) -> int:
    return 2 if e.get("consequence") else 1 if e.get("transient") else 0


def _first(firsts: list[tuple]) -> tuple[tuple, str]:
    """The first of each source's first failures, and what to say after it (a later source's own failure)."""
    (r0, e0), rest = firsts[0], firsts[1:]
    for r, e in rest:
        if r.source == "job output" and r0.source == "run folder":
            r0, e0 = _job_or_folder(r0, e0, r, e)
        elif _tier(e) < _tier(e0) or (_tier(e) == _tier(e0) and _before(e, e0)):
            r0, e0 = r, e
    if e0.get("then"):  # what the folder recorded followed the job's own failure
        return (r0, e0), f"; then {_said(e0['then'])['summary']}"
    own = ("run folder", "job output")
    later = [
        (r, e) for r, e in firsts if e is not e0 and _tier(e) == 0 and r.source not in own and r0.source not in own
    ]
    return (r0, e0), "".join(f"; then, in the {r.source}: {_said(e)['summary']}" for r, e in later[:1])


def spoke(e: dict) -> bool:
    """An event that is its own failure: not a consequence of another, or a signal from outside the job."""
    return not e.get("consequence") or bool(e.get("outside"))


def _job_or_folder(rf, folder: dict, rj, job: dict) -> tuple:
    """A run folder's first failure and the watched job's own: one failure seen twice (the folder's guess at a rank
    that ended without a word, the job's words for how), the folder's halt report over the printed non-finite
    loss, the watch's stop over what the job printed once told to end; else the earlier."""
    jv = _said(job)
    # the folder's guess at which rank vanished first (a launcher that ends itself when its child dies, Lightning's,
    # is seen to end first) yields to the job's own words for a death, not to a survivor's lost peer it explains
    # (a rank's end by a signal the launcher did not send is one of those words, though it yields to any cause in the job)
    if folder.get("guess") and spoke(job) and (jv["verdict"] == "stopped" or jv["verdict"] in DEATHS):
        seen = [t for t in (_time(job), folder["time"]) if t is not None]
        return rj, {**job, "joined_time": min(seen) if seen else None}  # the earliest sighting of the one failure
    if folder["verdict"] == "nonfinite_halt" and jv["verdict"] == "nonfinite":
        return rf, folder
    if folder["kind"] == "stop" and jv["verdict"] == "stalled":  # the stop ended a hang the job's pace shows
        return rj, {**job, "then": folder}
    if folder["kind"] == "stop" and (jv["verdict"] == "stopped" or (
        _time(job) is not None and folder["time"] is not None and _time(job) >= folder["time"] - STOP_SLACK_S
    )):  # fmt: skip
        return rf, folder
    c = jv["culprit"]
    same = folder.get("rank") is not None and folder["rank"] == c["rank"] and folder["verdict"] == jv["verdict"]
    if first_failure([folder, {**job, "time": _time(job)}]) is folder:
        # a rank's error the watch recorded knows no step; the job's last line before its traceback places it
        unplaced = all(v is None for v in folder["at"].values())
        return rf, {**folder, "at": {k: c[k] for k in NO_STEP}} if unplaced and same else folder
    # the rank's error the watch recorded after its traceback was printed: the same failure, not a second one
    return rj, {**job, "then": None if folder.get("guess") or same else folder}


__all__ = ["FAILED", "VERDICTS", "culprit", "decide", "first_failure", "in_epoch", "key", "when"]

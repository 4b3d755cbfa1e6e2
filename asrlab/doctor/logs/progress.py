"""How far each rank of a logged run got: where a step line stands (epoch, batch, step), the seconds a step
took, the spread between the slowest and fastest rank, and the resumes with the batches run again."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
import time as _time

from . import stream
from .checkpoints import named_place
from .run import LogRun, position
from .words import EPOCH_START
from ..timeline import suspect

# a bar's count and total: tqdm's "96/120 [00:23" or "[7/12]  58%|", Keras' " 7/12 ━━━━━━━━ 1s 297ms/step",
# fastprogress's "[6/12 00:00<00:01"
_BAR_AT = re.compile(r"(?<![\d.])(\d+)/(\d+)(?:\s*\[(?:\d+:)?\d+:\d+|\s+━|\]?\s+\d+%\||\s+\d+:\d+<)")
# mmengine's logger hook, a line every few iterations: "Epoch(train) [1][25/64]  lr: ...", "Iter(train) [ 500/1000]"
_LOGGED_AT = re.compile(r"(?:Epoch|Iter)\(train\)\s*(?:\[\d+\])?\s*\[\s*(\d+)/(\d+)\]")


def clock(t: float | None) -> str:
    return _time.strftime("%Y-%m-%d %H:%M:%S", _time.gmtime(t)) if t else "time unknown"


def where(rec: dict | None) -> str:
    """A step record's place as its toolkit counts: ``step 1200`` or ``epoch 3, batch 1500``."""
    if rec is None or all(rec.get(k) is None for k in ("step", "batch", "epoch")):
        return "no step line of a format it knows"  # training may have gone on in lines of another format
    if rec["step"] is not None:
        return f"step {rec['step']}" + (f" (epoch {rec['epoch']})" if rec["epoch"] is not None else "")
    if rec["batch"] is not None:
        return f"epoch {rec['epoch']}, batch {rec['batch']}" if rec["epoch"] is not None else f"batch {rec['batch']}"
    return f"epoch {rec['epoch']}"


def at(rec: dict | None) -> str:
    """``at step 1200`` / ``at epoch 3, batch 1500`` / ``with no step line of a format it knows before it``."""
    return f"with {where(rec)} before it" if rec is None else "at " + where(rec)


def placed(e: dict) -> dict | None:
    """Where no step line of a known format came before it, the last step another line of its file named."""
    return None if e.get("place") is None else {"step": e["place"], "epoch": None, "batch": None}


def named_later(e: dict, rec: dict | None) -> dict | None:
    """``rec``, the step line before the event ``e``, or the later step a line after it named ("upd=12 about to ...",
    "saving checkpoint at step 1200"): the last counter printed before the failure."""
    if rec is None or rec.get("file") != e.get("file") or (e.get("placed_at") or -1) <= rec.get("order", 1 << 62):
        return rec
    return placed(e) if e["place"] > (step_number(rec) or -1) else rec


def step_number(rec: dict | None) -> int | None:
    if rec is None:
        return None
    n = rec["step"] if rec["step"] is not None else rec["batch"] if rec["batch"] is not None else rec["epoch"]
    return None if isinstance(n, float) and not n.is_integer() else n  # a fractional epoch (0.01) is no step


def culprit(rank, rec: dict | None) -> dict:
    """The culprit as JSON says it: the rank, its step as the toolkit counts (global step, else batch, else epoch)."""
    epoch, batch = (rec["epoch"], rec["batch"]) if rec else (None, None)
    return {"rank": rank, "step": step_number(rec), "epoch": epoch, "batch": batch}


def went_back(run: LogRun, rec: dict, last: dict) -> bool:
    """Whether a rank's step record ``rec`` went back from its ``last`` (a restart), or its step went on while its
    batch went back within one epoch ("batch=14/40 step=14", then "batch=1/40 step=15"): its loader began it again."""
    reloaded = (
        None not in (rec["step"], last["step"], rec["epoch"], rec["batch"], last["batch"])
        and rec["step"] > last["step"]
        and rec["epoch"] == last["epoch"]
        and rec["batch"] < last["batch"]
        and not rec.get("told")
    )
    return reloaded or (
        position(rec) < position(last)
        and (rec["step"] is None) == (last["step"] is None)  # a step after an epoch's batch: not one counter
        and (rec["epoch"] is None or last["epoch"] is None or rec["epoch"] <= last["epoch"])  # counted per epoch
        and (rec["step"] is not None or (rec["epoch"] is not None and not rec.get("told")))
        # another file of the same rank (a toolkit's own log.txt beside its console) goes back only in time, or
        # where it begins inside the other's steps (the log of a restart, one file an attempt)
        and (
            last["file"] == rec["file"]
            or (rec["stamped"] and last["stamped"] and rec["time"] > last["time"])
            or (
                not rec["stamped"]
                and run.first_steps[rec["file"]] is rec
                and position(run.first_steps[last["file"]]) < position(rec)
            )
        )
    )


def resume_records(run: LogRun) -> list[dict]:
    """Where the steps went back (a restart), and how many ran again; trained twice or not as the checkpoint's name
    tells (one of an epoch's end, ``epoch_2.pt``, then the next epoch from batch 0 trains nothing twice)."""
    paths = [e for e in run.events if e["kind"] == "resume"]
    loaded = paths[0].get("path") if paths else None
    epoch, step = named_place(Path(loaded).stem) if loaded else (None, None)
    saved_epoch = epoch if step is None else None  # an epoch's end, not a step within one
    out, seen = [], set()
    for x in run.resumes:
        b, a = x["before"], x["after"]
        key = (x["rank"], position(b), position(a))
        if key in seen:
            continue
        seen.add(key)
        twice = None
        if a["step"] is not None and b["step"] is not None:
            again = b["step"] - a["step"] + 1
            text = f"resumed at step {a['step']} after step {b['step']}: {again} steps run again"
            zero, back = False, _data_back(run, x["rank"], a)
            if back is not None:  # the step went on from the checkpoint, its data did not
                twice, said = back
                text = f"resumed at step {a['step']} after step {b['step']} ({again} steps run again), its data not: {said}"
                if again <= 0:  # no step run again: only the data went back
                    again, text = None, f"its step went on from {b['step']} to {a['step']}, its data not: {said}"
        else:
            start = run.epoch_start.get((x["rank"], a["epoch"]))
            zero = a["epoch"] == b["epoch"] and a["batch"] is not None and start is not None and a["batch"] <= start
            if a["epoch"] == b["epoch"] and b["batch"] is not None and a["batch"] is not None:
                # every batch from the one it went back to through b; where the epoch started again, all of it:
                # b + 1 batches where it counts from 0 (a line at batch 0), b where it counts the batches done
                again = b["batch"] + (start == 0) if zero else b["batch"] - a["batch"] + 1
                text = f"the resume went back to batch {a['batch']} of epoch {a['epoch']} after batch {b['batch']}"
                text += ": the epoch started again at batch 0" if zero else ""
                text += f"; {again} batches of epoch {a['epoch']} run again"
                if zero and a["epoch"] is not None and saved_epoch == a["epoch"] - 1:
                    text += f" (from the checkpoint of epoch {saved_epoch}'s end: none trained twice)"
                elif zero:
                    text += " (trained twice where the checkpoint it loaded was saved within the epoch)"
            else:
                again, text = None, f"resumed at {where(a)} after {where(b)}"
        row = {"rank": x["rank"], "before": where(b), "after": where(a), "restarted_epoch": zero, "run_again": again}
        # trained_twice: the batches the lines show were trained before the restart and again after
        out.append({**row, "trained_twice": twice, "time": a["time"], "text": text})
    if paths and out:
        out[0]["checkpoint"] = loaded
    return [o for o in out if o["rank"] == out[0]["rank"]] if out else []


def _data_back(run: LogRun, rank, a: dict) -> tuple[int | bool, str] | None:
    """A restart whose step went on from its checkpoint (N+1) but whose data did not, against the last line before it
    at a lower step: ``(batches trained twice, or True where its epoch went back too, said)``, else None."""
    if a["batch"] is None:
        return None
    known = [r for r in run.series[rank].all() if r["order"] < a["order"]]  # (a restart's own file after the other's)
    # lines that print an epoch as a's do, or none as a's do ("tick=21 batch=0")
    known = [r for r in known if r["step"] is not None and r["batch"] is not None]
    known = [r for r in known if (r["epoch"] is None) == (a["epoch"] is None)]
    # no epoch said: batch 0 may be the next epoch's, unless the earlier attempt's same step read another
    if a["epoch"] is None and not any(r["step"] == a["step"] and r["batch"] != a["batch"] for r in known):
        return None
    known = [r for r in known if r["step"] < a["step"]]
    if not known:
        return None
    r = max(known, key=lambda r: (r["step"], r["order"]))  # the place is compared as epoch, then batch
    if (a["epoch"] or 0, a["batch"]) > (r["epoch"] or 0, r["batch"]):
        return None  # it went on from where the checkpoint's step had been
    if (a["epoch"] or 0) < (r["epoch"] or 0):
        had = f"where step {r['step']} had been at {where(r)}"
        return True, f"step {a['step']} read epoch {a['epoch']}, batch {a['batch']}, {had}"
    n = r["batch"] - a["batch"] + 1
    least = "" if r["step"] == a["step"] - 1 else " at least"
    of = "" if a["epoch"] is None else f" of epoch {a['epoch']}"
    return n, (
        f"step {a['step']} read batch {a['batch']}{of}, where step {r['step']} had been at batch "
        f"{r['batch']}: batches {a['batch']} to {r['batch']} trained twice{least} (the loader started its epoch again, "
        "not from the checkpoint's place)"
    )


SPAN_S = 10.0  # seconds a gap between step lines covers at least: stamps to the second, 20 steps in one


def stretches(recs: list[dict], span: float = SPAN_S):
    """``(a, b, steps)``: stretches of one rank's stamped step lines, each at least ``span`` seconds (a log stamped to
    the second puts many steps in one) from where the last ended or the count broke (an epoch, a resume)."""
    a = None
    for b in (r for r in recs if r.get("stamped") and r.get("time") is not None):
        if a is not None:
            da, db = position(a), position(b)
            steps = db[-1] - da[-1] if len(da) == len(db) and da[:-1] == db[:-1] else None
            if steps is not None and steps > 0 and b["time"] >= a["time"]:
                if b["time"] - a["time"] < span or b["time"] == a["time"]:
                    continue  # the stretch goes on from the same first line
                yield a, b, steps
        a = b  # the next stretch starts here


def cut_short(run: LogRun, found: set[str]) -> list[dict]:
    """Logs ``found`` in a folder given, or given with one (a run's files, read after it ended; a log given alone
    may be an excerpt of a run going on), that stop where training was under way: the last line a progress bar
    short of its total ("96/120 [00:23<00:03"), or the start of an epoch ("Going into epoch 2") after an earlier
    epoch's lines. The run stopped there (a kill, a hang, an error printed elsewhere) or is still running:
    suspects (:func:`..timeline.suspect`), no all-clear."""
    out = []
    for f in (f for f in run.files if f in found):
        ends = stream.ends(f)
        if (tail := ends.rstrip("\r\n").rsplit("\r", 1)[-1]) and not tail.strip():
            continue  # a bar wiped on closing (tqdm's leave=False): it ended
        lines = [x.strip() for raw in ends.encode().split(b"\n") for x in stream.clean(raw)]
        starts = [i for i, x in enumerate(lines) if EPOCH_START.search(x)]
        bar = (_BAR_AT.search(lines[-1]) or _LOGGED_AT.search(lines[-1])) if lines else None
        if bar and int(bar[1]) < int(bar[2]):
            said = f"{Path(f).name} stops as its progress bar is at {bar[1]} of {bar[2]} ({lines[-1][:100]})"
        elif starts and starts[-1] == len(lines) - 1 and any(i + 1 not in starts for i in starts[:-1]):
            said = f"{Path(f).name} ends as an epoch begins ({lines[-1][:100]})"
        else:
            continue
        said += ", nothing after it: the run stopped there (a kill, a hang, an error printed elsewhere) or is running"
        rec = max((r for r in run.last_steps().values() if r is not None), key=position, default=None)
        out.append(suspect(said, culprit(None, rec)))
    return out


def rank_progress(run: LogRun) -> list[dict]:
    out = []
    for rank, s in sorted(run.series.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        recs = s.all()
        rates = [r["rate"] for r in recs if r["rate"]]
        gaps = [(b["time"] - a["time"]) / steps for a, b, steps in stretches(recs)]  # a step's seconds, each stretch
        seen = {"rank": rank, "steps_logged": s.seen, "last": where(s.last), "last_time": s.last["time"]}
        timed = {"steps_per_s": rates[-1] if rates else None, "s_per_step": statistics.median(gaps) if gaps else None}
        out.append({**seen, **timed})
    return out


def step_spread(ranks: list[dict]) -> dict | None:
    """The slowest rank's seconds per step against the fastest's: a rank that holds the others up."""
    timed = [r for r in ranks if r["s_per_step"]]
    if len(timed) < 2:
        return None
    slow, fast = max(timed, key=lambda r: r["s_per_step"]), min(timed, key=lambda r: r["s_per_step"])
    ratio = round(slow["s_per_step"] / fast["s_per_step"], 3)
    return {"slowest": slow["rank"], "fastest": fast["rank"], "ratio": ratio}


def last_before(run: LogRun, rank, e: dict) -> dict | None:
    """The last step record of ``rank`` (of any rank when unknown) before the event ``e``: by the order of
    the lines in the same file, else by time."""
    s = run.series.get(rank) if rank is not None else None
    if s is None and run.series:
        # a rank that prints no step lines of its own (only rank 0 does, in most toolkits) trains in lockstep
        # with the ranks that do: the job's last logged step is its step too
        s = max(run.series.values(), key=lambda x: x.seen)
    if s is None:
        return None
    recs = s.all()
    same = [r for r in recs if r["file"] == e.get("file")]
    if same and e.get("order") is not None:  # a step logged in the same instant is the step it happened in
        before = [r for r in same if r["order"] <= e["order"] or (r["stamped"] and r["time"] == e.get("time"))]
    elif e.get("time") is not None:
        before = [r for r in recs if r["time"] is not None and r["time"] <= e["time"]]
    else:
        return s.last
    return before[-1] if before else None


def next_after(run: LogRun, rank, e: dict) -> dict | None:
    """The first step record of the same file after the event ``e``, of its rank (any rank when unknown)."""
    series = [run.series[rank]] if rank in run.series else list(run.series.values())
    later = [r for s in series for r in s.all() if r["file"] == e.get("file") and r["order"] > e.get("order", 0)]
    return min(later, key=lambda r: r["order"]) if later else None


def trained_on(run: LogRun, e: dict) -> bool:
    """Whether a rank's steps went on past where they were at ``e`` (an exception ignored in a loader's __del__, a
    worker the loader replaced): not its end. A worker ended by the job's own end (SIGTERM, Ctrl-C) is not."""
    nxt, last = next_after(run, e.get("rank"), e), last_before(run, e.get("rank"), e)
    ended = "Terminated" in e["text"] or any(x["kind"] == "stop" and x["order"] < e["order"] for x in run.events)
    # a record of another shape after it (an epoch's header after a step's line) is no redraw of the last one
    shape = last is not None and nxt is not None and len(position(nxt)) != len(position(last))
    return nxt is not None and not ended and (last is None or shape or position(nxt) > position(last))


def redrawn_after(run: LogRun, rank, e: dict) -> dict | None:
    """Where no line before a failure placed it, the step line just after it: a progress bar redrawn as the
    exception unwound (tqdm draws its last state when it closes), whose count is where the job was."""
    nxt = next_after(run, rank, e)
    return nxt if nxt is not None and nxt["order"] - e.get("order", 0) < REDRAWN_WITHIN else None


REDRAWN_WITHIN = 64 << 10  # bytes of the file after the failure's first line: its traceback, then the redraw

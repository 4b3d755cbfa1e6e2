"""Any text log (a toolkit's, a launcher's, a scheduler's; several files, ``-`` for stdin), as a source: each line
that can be a first failure (read by :mod:`..logs`) as an event, phrased once chosen; the lines that look wrong;
the sections (hang, non-finite, resumes, ranks). A survivor's timeout, the agent's SIGTERM to the others, a
lost-peer error are consequences: never the cause while a cause is in the log."""

from __future__ import annotations

import re
import time
from pathlib import Path

from ...errors import UsageError
from ..logs.hang import hang
from ..logs.nonfinite import at_step, diverging, finite_after, lone_lossy, nonfinite_section as _nonfinite
from ..logs.nonfinite import persistent_skips, skipped_overflow, unscaled_skip
from ..logs.progress import at, clock, culprit, cut_short, last_before, named_later, placed, rank_progress
from ..logs.progress import redrawn_after, resume_records, step_number, step_spread, trained_on, where
from ..logs.reader import read_logs
from ..logs.run import LogRun, log_files, position
from ..logs.counters import counter_of
from ..logs.toolkits import validation
from ..logs.words import NAN_VALUE
from ..series import EVAL
from ..timeline import resumes
from ..verdict import first_failure, when
from ...lab.stall.watchdog import STALL_EXIT
from . import Reading

NAME = "log"
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")  # a stop, not a kill
RAISED = {"exception": "crashed", "oom": "out_of_memory", "nonfinite_error": "nonfinite"}  # a rank's own errors
_OOM_KILLER = re.compile(r"out of memory: Kill(?:ed)? process \d+|oom-kill")  # the kernel's (dmesg), a cgroup's
_FROM_0 = re.compile(r"^Batch \d+: Invalid loss, terminating training")  # Keras' TerminateOnNaN counts from 0
SILENT_S, SILENT_LINES = 30.0, 10  # a stop this long after the last step line and this many times its pace: a hang


def _silence(run: LogRun, e: dict) -> tuple[float, dict] | None:
    """``(seconds, last step)`` where the job was stopped long after its last step line, by its own pace: it hung."""
    # a watched job's lines each on the watch's clock, the time it kept them; else the lines' own stamps
    timed = (lambda x: run.clock(x["order"])) if run.clock else (lambda x: x["time"] if x["stamped"] else None)
    t = run.clock(e["order"]) if run.clock else when(e)
    # a stop's line without a clock of its own came after the last stamped line: a line the job printed after its
    # last step (a checkpoint saved, an evaluation's bar) is no silence
    ended = e["verdict"] == "stopped" or e.get("outside")
    if not ended or t is None or (e.get("stamped") is False and not run.clock):
        return None
    recs = [(x, tx) for s in run.series.values() for x in s.all() if (tx := timed(x)) is not None and tx <= t]
    if not recs:
        return None
    last, t_last = max(recs, key=lambda r: r[1])
    times = sorted({tx for _, tx in recs})
    gaps = sorted(b - a for a, b in zip(times, times[1:]) if b > a)
    pace = gaps[len(gaps) // 2] if gaps else 0.0  # the median time between two step lines
    gap = t - t_last
    # the step it hung at: the last line before the stop, stamped or not (a bar between stamped lines)
    return (gap, last_before(run, None, e) or last) if gap > max(SILENT_S, SILENT_LINES * pace) else None


def _latest_restart(run: LogRun) -> dict | None:
    """The step record where the job last started again (its steps went back: a resume, a relaunch)."""
    backs = [x["after"] for x in run.resumes] + [e for e in run.events if e["kind"] == "resume"]
    return max(backs, key=lambda r: r["order"]) if backs else None


def _since(e: dict, rec: dict) -> bool:
    """Whether the event came after the step record: by the order of their lines in one file, else by time."""
    if e.get("file") == rec["file"] or e.get("time") is None or rec.get("time") is None:
        return e.get("order", 0) > rec["order"]
    return e["time"] >= rec["time"]


def _as_consequence(e: dict, raised: set, lost: set) -> dict:
    """A rank's exit code whose only error in the log is a consequence (its collective timed out, its peer went away;
    ``lost``: the ranks with one, ``raised``: those with an error of their own): a consequence, not a failure."""
    if e["kind"] != "exit" or e.get("signal") or e.get("rank") is None:
        return e
    return {**e, "consequence": True} if e["rank"] in lost and e["rank"] not in raised else e


def _named(e: dict, strict: bool = False) -> dict | None:
    """The step the failure's own line names (``at iteration=0``); ``strict``: by a counter's name only."""
    n = counter_of(text := e.get("text") or "", named=strict)
    n = n + 1 if n is not None and _FROM_0.search(text) else n
    return None if n is None else {"step": n, "epoch": None, "batch": None}


def _causes(run: LogRun) -> list[tuple]:
    """``(verdict, event)`` for every event that can be a first failure."""
    out, stops = [], [e.get("order", 0) for e in run.events if e["kind"] == "stop"]
    stalled = any(e["kind"] == "watch_stall" for e in run.events)
    # the watch's word on a stall the ranks did not then get past (the job finished after one they did)
    stalls = [x for x in run.events if x["kind"] == "watch_stall" and not any(
        y["kind"] == "watch_passed" and y["file"] == x["file"] and y["order"] > x["order"] for y in run.events)]  # fmt: skip
    # the kernel's OOM killer says, after, whom it killed: a SIGKILL beside its line was for memory
    oom = next((x for x in run.events if x["kind"] == "oom" and _OOM_KILLER.search(x["text"])), None)
    for e in run.events:
        k, code = e["kind"], e.get("exitcode")
        if k == "exception":
            # a traceback cut before its exception line after the launcher was told to end: its own (SignalException)
            after_stop = e.get("cut") and any(o < e.get("order", 0) for o in stops)
            out.append(("crashed", {**e, "consequence": True} if after_stop else e))
        elif k == "oom":
            out.append(("out_of_memory", e))
        elif k in ("nonfinite_error", "nonfinite_line") or (k == "scale" and e.get("fatal")):
            out.append(("nonfinite", e))
        elif k == "worker_killed" or (k == "exit" and e.get("signal") and e["signal"] not in STOP_SIGNALS):
            sig = "SIGKILL" if (e.get("signal") or "").lower().startswith("kill") else e.get("signal")
            out.append(("out_of_memory", oom) if sig == "SIGKILL" and oom else ("killed", {**e, "signal": sig}))
        elif k == "exit" and e.get("signal") in STOP_SIGNALS and e.get("source") == "torch.multiprocessing":
            out.append(("stopped", e))  # the first process mp.spawn saw end was sent a stop: the job's, from outside
        elif k == "exit" and code == STALL_EXIT and stalled:  # a rank the stall watchdog ended
            out.append(("crashed", {**e, "consequence": True}))
        elif k == "exit" and (not -64 <= (code or 0) <= 0 or (e.get("root") and code is None)):
            out.append(("crashed", e))  # a root cause whose exit code the paste cuts off: still the first failure
        elif k == "stop":  # beside the watch's word on a stall in this file: the watch's, or a person's of a hung job
            found = any(x["file"] == e["file"] for x in stalls)
            # a rank's word on a signal its launcher had just said it was sending the ranks left (torchrun's "Sending
            # process N closing signal", mp.spawn's "Terminating process N via signal"): the launcher's doing
            found = found or e.get("rank") is not None and any(
                a["kind"] == "agent_stop" and a["file"] == e["file"] and a["order"] < e["order"] for a in run.events)  # fmt: skip
            out.append(("stopped", {**e, "consequence": True} if found else e))
        elif k == "watch_stall" and e in stalls:
            # a node's watch that saw only ranks waiting on another's: that node's word leads
            blind = e["rank"] is None and "not watched here" in e.get("said", "")
            blind = blind and any(x["kind"] == "watch_stall" and x["rank"] is not None for x in run.events)
            out.append(("stalled", {**e, "consequence": True} if blind else e))
        elif k == "watch_verdict":  # the watch's word from its run folder: the failure where the lines say none
            out.append((e["said_verdict"], {**e, "consequence": True}))
        elif k in ("consequence", "abort"):  # a survivor's error, a C++ abort whose exit code the log may say:
            out.append(("crashed", {**e, "consequence": True}))  # the first failure only where nothing else is
    r = next((r for r in run.nonfinite if not skipped_overflow(run, r)), None)
    if r is not None:
        # ranks non-finite at one step: which went first, that step's lines do not say (an all-reduce spreads it),
        # but where one rank's loss is not finite and the others' gradient norms alone, it is that rank
        lead = lone_lossy(run, r)
        same = {lead["rank"]} if lead else {x["rank"] for x in at_step(run, r)}
        r = lead or r
        e = {"kind": "nonfinite_step", "rank": r["rank"], "time": r["time"], "stamped": r["stamped"], "record": r}
        e.update((k, True) for k in ("year_guessed", "date_guessed") if r.get(k))
        e.update(order=r["order"], file=r["file"])
        many = {"rank": None, "culprit_rank": None, "ranks": None if None in same else sorted(same)}
        out.append(("nonfinite", {**e, **many} if len(same) > 1 else e))
    # a validation pass's non-finite line (beside a training step's, or a stop): the first failure where nothing else is
    # (by its words, or by the field it names: "avg. test_loss nan")
    evaluated = lambda x: validation(x["text"]) or EVAL.search(x.get("said") or "")  # noqa: E731
    out = [(v, {**x, "consequence": True} if x["kind"] == "nonfinite_line" and evaluated(x) else x) for v, x in out]
    skips = persistent_skips(run)
    # a step printed non-finite after the scale fell, in the same file: one incident, said where the step is
    if skips and not (r is not None and r["file"] == skips.get("file") and r["order"] > skips.get("order", 0)):
        out.append(("nonfinite", skips))
    if unscaled := unscaled_skip(run):
        out.append(("nonfinite", unscaled))
    if all(x.get("consequence") for _, x in out):  # only what followed a cause (a lost peer): the watch's word is it
        out = [(v, {**x, "consequence": False} if x["kind"] == "watch_verdict" else x) for v, x in out]
    return out


def read(paths: list[str], skip: set[str] = frozenset()) -> Reading | None:
    """The logs among ``paths`` (files, folders, ``-``) but ``skip`` (another source's files); None where none."""
    files = [f for f in log_files(paths) if f not in skip]
    missing = [p for p in files if p != "-" and not Path(p).exists()]
    if missing:
        raise UsageError(f"{missing[0]}: nothing there (no such file or folder)")
    if not files:
        return None
    t0 = time.perf_counter()
    run = read_logs(files)
    events, sections, history = timeline_of(run)
    world = run.world or (max(run.ranks()) + 1 if run.ranks() else None)
    sections.update(files=run.files, lines=run.lines, unread=run.unread, formats=dict(run.formats), world_size=world)
    sections.update(events=dict(run.event_counts), read_s=round(time.perf_counter() - t0, 3))
    restart = _latest_restart(run)
    odd = [e for e in run.events if e["kind"] == "suspect" and (restart is None or _since(e, restart))]
    # an error-level line after which training went on (steps of finite losses logged): said, not a failure
    after = [finite_after(run, e) for e in odd]  # each a pass over the step records: once per line
    went_on, odd = [e for e, a in zip(odd, after) if a], [e for e, a in zip(odd, after) if not a]
    # an evaluation's metric printed nan ("eval wer=nan") in a log of training steps: its evaluation is broken
    evals = [e for e in went_on + odd if run.series and validation(e["text"]) and NAN_VALUE.search(e["text"])]
    seen = {id(e) for e in evals}
    went_on, odd = [e for e in went_on if id(e) not in seen], [e for e in odd if id(e) not in seen]
    if odd:  # the place of the first, which the verdict says (only it)
        odd[0]["culprit"] = culprit(odd[0]["rank"], last_before(run, odd[0]["rank"], odd[0]))
    odd += cut_short(run, set(files) if any(Path(p).is_dir() for p in paths) else set())
    warned = diverging(run)  # said on the first line of an all-clear: a loss that diverged and stayed so
    if evals:
        said = f"the evaluation printed a non-finite value {len(evals)} times: {evals[0]['text'][:120]}"
        warned.append({"kind": "eval_nonfinite", "name": None, "step": None, "rank": evals[0]["rank"], "text": said})
    said = _healthy(run, sections, went_on) + (f"; but {warned[0]['text']}" if warned else "")
    return Reading(
        NAME, run.files, events=events, suspects=odd, sections=sections, history=history, raw=run, warnings=warned,
        # an empty log is nothing to judge; one of no step and no event says nothing of how the run went ("silent")
        outcome={"verdict": "unknown" if not run.lines else "no_failure_seen", "summary": said,
                 "silent": not run.series and not run.events},
    )  # fmt: skip


def timeline_of(run: LogRun) -> tuple[list[dict], dict, list[str]]:
    """``(events, sections, history)``: every event that can be the log's first failure (each with ``say``), the
    sections, and an earlier attempt's failures (before the job was started again and went on)."""
    timeouts = [e for e in run.events if e["kind"] == "timeout" and not _passed(run, e)]
    d: dict = {
        "hang": hang(run, timeouts) if timeouts else None,
        "nonfinite": _nonfinite(run),
        "resumes": resumes(from_output=resume_records(run)),
        "ranks": rank_progress(run),
    }
    d["step_spread"] = step_spread(d["ranks"])
    transient = d["nonfinite"] is not None and d["nonfinite"].get("transient")
    raised = {x.get("rank") for x in run.events if x["kind"] in RAISED}
    lost = {x.get("rank") for x in run.events if x["kind"] in ("consequence", "timeout")}
    causes = [(v, _as_consequence(e, raised, lost)) for v, e in _causes(run)]
    # non-finite for a step and finite again: the run went on; what ended it, if anything did, is the failure
    went_on = transient and any(v != "nonfinite" for v, _ in causes)
    events = [{**e, "verdict": v, "transient": went_on and e["kind"] == "nonfinite_step"} for v, e in causes]
    # a traceback cut before its exception line (and torch.multiprocessing's word on its process) after a timeout
    # in its file: the timeout is what it raised (a store never reached, a collective that gave up)
    for e in events:
        if (e.get("cut") or e.get("source") == "torch.multiprocessing") and not e.get("type"):
            if any(t.get("file") == e.get("file") and t.get("order", 0) < e.get("order", 0) for t in timeouts):
                e["consequence"] = True
    events += [{**t, "verdict": "stalled"} for t in timeouts]
    _twins(events)
    _signalled(events)
    # a rank ended by SIGTERM that its own launcher did not send (not one of the pids it closed, or none was
    # closed): from outside, where nothing else failed
    sent = {e.get("pid") for e in run.events if e["kind"] == "agent_stop"}
    outside = [e for e in run.events if e["kind"] == "exit" and e.get("signal") in STOP_SIGNALS]
    outside = [e for e in outside if (e.get("pid") not in sent if e.get("pid") else not sent)]
    events += [{**e, "verdict": "killed", "consequence": True, "outside": True} for e in outside[:1]]
    history = []
    # a worker killed, an out of memory the toolkit skips the batch of by design (once gone past in a file, each
    # one of that file), after which training went on
    past = {e["file"] for e in events if e.get("recoverable") and finite_after(run, e)}
    for e in [e for e in events if (e["kind"] == "worker_killed" and trained_on(run, e)) or (
            e.get("recoverable") and e["file"] in past)]:  # fmt: skip
        history.append(f"training went on after: {e['text'][:240]}")
        events.remove(e)
    restart = _latest_restart(run)
    if restart is not None and (gone := first_failure([e for e in events if not _since(e, restart)])):
        # a failure before the job was started again and went on: the earlier attempt's, not the run's verdict
        said = gone.get("text") or where(gone.get("record"))  # a non-finite step record has no line of text
        history.append(f"an earlier attempt: {gone['verdict']}: {said[:240]}")
        events = [e for e in events if _since(e, restart)]
    for e in events:
        e["source"] = NAME
        e["say"] = lambda e=e: _phrased(run, e, d)
    return events, d, history


def _twins(events: list[dict]) -> None:
    """Ranks that raised one error (its type and words, their numbers aside): which printed it first says little, and
    torchrun's root cause (the first whose exit it saw) names one of them; the others' are the same failure."""
    raised = [e for e in events if e["kind"] == "exception" and e.get("type") and e.get("rank") is not None]
    root = next((e for e in events if e["kind"] == "exit" and e.get("root") and e.get("rank") is not None), None)
    if root is None or not raised:
        return
    gist = lambda e: (e["type"], re.sub(r"\d+", "N", e.get("message") or ""))  # noqa: E731
    first = gist(first_failure(raised))
    same = [e for e in raised if gist(e) == first]
    twin = next((e for e in same if e["rank"] == root["rank"]), None)
    if twin is None or len({e["rank"] for e in same}) < 2:
        return
    for e in same:
        if e is not twin:
            e["consequence"] = True


def _signalled(events: list[dict]) -> None:
    """A process's own word on the signal that ended it ("Fatal Python error: Aborted") names no rank; the rank its
    launcher found ended by that signal first (torchrun's root cause) is the one, where only one was."""
    roots = [e for e in events if e["kind"] == "exit" and e.get("root") and e.get("rank") is not None]
    for e in events:
        same = {x["rank"] for x in roots if x.get("signal") == e.get("signal")}
        if e["kind"] == "exit" and e.get("rank") is None and e.get("signal") and len(same) == 1:
            e["rank"] = same.pop()


def _phrased(run: LogRun, first: dict, d: dict) -> dict:
    """The event as the log says it, once chosen: its verdict refined, its culprit, its sentence (``summary``)."""
    e = _phrase(run, first, d)
    if d["resumes"]["from_output"]:
        e["summary"] += "; " + d["resumes"]["from_output"][0]["text"]
    return e


def _phrase(run: LogRun, first: dict, d: dict) -> dict:
    view = _event_view(first)
    if first["kind"] == "watch_verdict":
        c = {**culprit(first["rank"], last_before(run, first["rank"], first)), "rank": first["rank"]}
        return {**view, "verdict": first["said_verdict"], "culprit": c, "summary": f"asrlab watch: {first['said']}"}
    if first["kind"] == "watch_stall":  # asrlab watch's own word, from the ranks' stacks, or a rank's own watchdog's
        rank = first["rank"]
        rec = (run.last_steps().get(rank) if rank is not None else None) or last_before(run, rank, first)
        who = "asrlab watch" if "asrlab watch: " in first["text"] else "the ranks' own stall watchdog"
        # the step the watch read from the rank's own loop (a rank waiting for data: the step that batch is for), as
        # its run folder says it, over the last the rank printed; a place in an epoch stays the lines'
        c, n = culprit(rank, rec), re.search(r"\b(?:at|of) step (\d+)", first["said"])
        c = {**c, "step": int(n.group(1)), "batch": None} if n and (c["step"] is None or c["epoch"] is None) else c
        return {**view, "verdict": "stalled", "culprit": c, "summary": f"{who} found the job stalled: {first['said']}"}
    if first["verdict"] == "stalled":
        h = d["hang"]
        rank = h["behind"][0] if len(h["behind"]) == 1 else None
        last = run.last_steps()
        rec = last.get(rank) or max((r for r in last.values() if r is not None), key=position, default=None)
        rec = rec or placed(first)
        return {**view, "verdict": "stalled", "culprit": culprit(rank, rec), "summary": h["text"]}
    if first.get("outside"):
        rec = last_before(run, first["rank"], first)
        said = f"rank {first['rank']} was ended by {first['signal']} from outside the job (a scheduler's pre-emption, "
        said += f"a time limit, kill) {at(rec)}"
        return {**view, "verdict": "killed", "culprit": culprit(first["rank"], rec), "summary": said}
    if (silent := _silence(run, first)) is not None:
        gap, rec = silent
        last = {r: x for r, x in run.last_steps().items() if r is not None}
        low = min((position(x) for x in last.values()), default=None)
        behind = [r for r, x in last.items() if position(x) == low]
        lone = behind[0] if len(behind) == 1 and len(last) > 1 else None  # behind the others' last step: hung there
        rec = last[lone] if lone is not None else rec
        said = f"the job logged nothing for {gap:.0f} s after {where(rec)} before it was ended ({first['text'][:160]})"
        said += ": it hung there (a rank waiting for data or in a collective: its stacks, from asrlab watch, say where)"
        return {**view, "verdict": "stalled", "culprit": culprit(lone, rec), "summary": said}
    if (gone := _gone_before(run, first)) is not None:
        rank, rec = gone
        said = f"rank {rank}'s lines end {at(rec)} without a word of why (a signal ended it: SIGKILL, the OOM killer, "
        said += f"a lost node; or it printed its error elsewhere, the console); then rank {first['rank']} was told to "
        said += f"stop ({first['text'][:160]}) and lost its peer: a launcher ending the ranks left"
        return {**view, "verdict": "crashed", "culprit": culprit(rank, rec), "summary": said}
    verdict, e = _refine(run, first["verdict"], first)
    rank = e.get("culprit_rank", e.get("rank") if e.get("rank") is not None else (e.get("record") or {}).get("rank"))
    if verdict == "stopped" and len({x.get("rank") for x in run.events if x["kind"] == "stop"}) > 1:
        e, rank = {**e, "rank": None, "text": e["text"] + "; every rank was told it"}, None  # the launcher passed it on
    # the failure's own line naming its step ("Batch 3: Invalid loss") says it better than the line before
    near, named = last_before(run, rank, e), _named(e, strict=True)
    # ... unless the line before names the same batch with its epoch ("Epoch 1: 28% 7/25", then "in batch 7"); a
    # step past that line's count is of its epoch ("Epoch 2: 44/120", then "in micro-batch 45")
    named = None if named and near and near["epoch"] is not None and near["batch"] == named["step"] else named
    ahead = named and near and named["epoch"] is None and named["step"] > (near["batch"] or near["step"] or 0)
    named = {**named, "epoch": near["epoch"]} if ahead else named
    rec = e.get("record") or named or near or _named(e) or placed(e)
    rec = named_later(e, rec or redrawn_after(run, rank, e))
    abort = _abort(run, {**e, "rank": rank}) if verdict == "killed" else None
    said = _say(run, verdict, {**e, "rank": rank}, rec, d, abort)
    if abort and abort["mismatch"]:
        rank = None  # the rank that aborted saw the mismatch; whose code branched, no line says
    nf = d["nonfinite"] or {}
    if verdict == "nonfinite" and rec is not None and nf.get("first"):
        # the section's first non-finite step is the verdict's: one event, said once
        nf["first"].update(rank=rank, step=step_number(rec), epoch=rec["epoch"], batch=rec["batch"])
    if nf.get("transient") and verdict != "nonfinite":
        said += f"; earlier, for a while: {nf['text']}"
    return {**_event_view(e), "verdict": verdict, "culprit": culprit(rank, rec), "summary": said}


def _gone_before(run: LogRun, stop: dict) -> tuple | None:
    """``(rank, its last step record)`` where a stop sent to one rank alone was its launcher's ending of the ranks
    left: that rank then lost its peer, and one other rank's lines had ended before the stop without a word."""
    r0 = stop.get("rank")
    if stop["kind"] != "stop" or r0 is None or stop.get("time") is None:
        return None
    if any(x["kind"] == "stop" and x.get("rank") != r0 for x in run.events):
        return None
    if not any(x["kind"] == "consequence" and x.get("rank") == r0 and _since(x, stop) for x in run.events):
        return None
    quiet = []
    for rank, s in run.series.items():
        last = s.last
        if rank in (None, r0) or last is None or not last["stamped"]:
            continue
        if last["time"] <= stop["time"] and not any(x.get("rank") == rank and _since(x, last) for x in run.events):
            quiet.append((rank, last))
    return quiet[0] if len(quiet) == 1 else None


def _passed(run: LogRun, e: dict) -> bool:
    """A wait (a start-up barrier's, Horovod's stall inspector's) that steps followed or the store completed: passed."""
    if not e.get("waiting"):
        return False
    if any(x["kind"] == "barrier_done" and x.get("order", 0) > e.get("order", 0) for x in run.events):
        return True
    later = [r for s in run.series.values() for r in s.all()[-1:]]  # each rank's last step: after it, by line or clock
    return any(r["file"] == e.get("file") and r["order"] > e.get("order", 0) or (r["time"] or 0) > (e.get("time") or 1e18)
               for r in later)  # fmt: skip


def _refine(run: LogRun, verdict: str, e: dict) -> tuple[str, dict]:
    """An exit without a signal stands for the traceback of its rank where the log has one."""
    if e["kind"] == "exit" and not e.get("signal"):
        # an exit code is a rank's failure said by its launcher; what failed is that rank's exception, else (several
        # failed, one printed) another rank's; else one of no rank printed before the launcher's word in its file (the
        # ranks' lines unmarked), not the launcher's own traceback after it
        raised = [x for x in run.events if x["kind"] in RAISED]
        tb = [x for x in raised if x.get("rank") == e["rank"]] or [x for x in raised if x.get("rank") is not None]
        tb = tb or [x for x in raised if x.get("file") == e.get("file") and x.get("order", 0) < e.get("order", 0)]
        if tb:
            return RAISED[tb[0]["kind"]], tb[0] if tb[0].get("rank") is not None else {**tb[0], "rank": e["rank"]}
    if e["kind"] in RAISED and e.get("rank") is None:
        roots = [x for x in run.events if x["kind"] == "exit" and x.get("root")]
        # else the one rank its launcher then said failed (torch elastic's "failed (exitcode: 1) local_rank: 0")
        said = {x["rank"] for x in run.events if x["kind"] == "exit" and x.get("exitcode") and not x.get("signal")
                and x.get("rank") is not None and x.get("file") == e.get("file") and x["order"] >= e["order"]}  # fmt: skip
        if roots or len(said) == 1:
            e = {**e, "rank": roots[0]["rank"] if roots else said.pop()}
    return verdict, e


def _event_view(e: dict) -> dict:
    return {k: v for k, v in e.items() if k not in ("record", "say", "_phrased")}


def _say(run: LogRun, verdict: str, e: dict, rec: dict | None, d: dict, abort: dict | None) -> str:
    # a log with no rank marks anywhere is one process's: "the job", not "a rank"
    who = f"rank {e['rank']}" if e.get("rank") is not None else "a rank" if run.ranks() else "the job"
    if e.get("kind") == "nonfinite_step" and e.get("ranks"):  # several at the same step: none named the culprit
        who = f"ranks {', '.join(map(str, e['ranks']))} at the same step"  # sorted, every rank known (_causes)
    when = at(rec)
    line = ""
    if e.get("where"):
        f, n, fn = e["where"]
        line = f" (at {f.replace(chr(92), '/').split('/')[-1]}:{n} in {fn})"
    if verdict == "killed":
        sig = e.get("signal") or "a signal"
        what = who
        if e["kind"] == "worker_killed":
            what = "a DataLoader worker" + (f" of {who}" if e.get("rank") is not None else "")
        hint = " (SIGKILL: the kernel's OOM killer, a scheduler or a lost node)" if sig == "SIGKILL" else ""
        s = f"{what} was killed by {sig} {when}{hint}"
        if a := abort:  # the C++ exception that aborted it, as its process printed
            s += f": it aborted on {a['type'] or 'a C++ exception'}: {a['message'][:240]}"
            if a["mismatch"]:
                s += " (the ranks called different collectives: a rank that ran out of data and left the loop while "
                s += "another still trains, or a branch on the rank; which, the abort does not say"
                last = [f"rank {r} {at(x)}" for r, x in sorted(run.last_steps().items()) if r is not None]
                s += f": the ranks' last steps: {', '.join(last)})" if last else ")"
    elif verdict == "out_of_memory":
        s = f"{who} ran out of memory {when}: {e['text'][:200]}{line}"
    elif verdict == "nonfinite" and e["kind"] == "nonfinite_step":
        s = f"{who}: {(d['nonfinite'] or {}).get('text', 'a value not finite')} ({when})"
    elif verdict == "nonfinite" and e["kind"] == "scale_collapse":
        s = f"{who}: the loss scale fell to {e['to']:g} {when}: the gradients overflow at every step, not only while the scale calibrates"
    elif verdict == "stopped" and e["kind"] == "exit" and "terminated with signal" in e["text"]:
        s = f"{who} was ended by {e['signal']} from outside the job (a scheduler, a time limit, kill) {when}, the first "
        s += f"process mp.spawn saw end ({e['text'][:160]})"
    elif verdict == "stopped" and e.get("rank") is not None and "death signal" not in e["text"]:
        # one rank's own interrupt (KeyboardInterrupt in its traceback), its launcher told nothing
        s = f"{who} was stopped by {e.get('signal') or 'a signal'} sent to it alone {when} ({e['text'][:160]})"
    elif verdict == "stopped":
        # torchrun's agent says it was signalled; a trainer's own handler (Lightning's, NeMo's preemption) is not it
        to = " to its launcher" if re.search("death signal|got signal", e["text"]) else ""
        to = " to asrlab watch" if e.get("by") == "asrlab watch" else to
        s = f"the job was stopped by {e.get('signal') or 'a signal'}{to} {when} ({e['text'][:160]})"
    elif verdict == "nonfinite" and e["kind"] == "grad_skip":
        s = f"{who}: the gradient norm was not finite ({e.get('grad')}) {when}, in a run without a dynamic loss "
        s += f"scale (fp32 or bf16: no scaler calibrates): the step was skipped ({e['text'][:120]})"
    elif verdict == "nonfinite" and e["kind"] == "skips":
        s = f"{who}: {e['count']} steps in a row skipped for non-finite gradients {when} ({e['text'][:120]})"
    elif verdict == "nonfinite":
        s = f"{who}: non-finite values {when}: {e['text'][:200]}{line}"
    elif e.get("consequence") and e["kind"] == "consequence":  # all the lines show is a survivor's word
        s = f"{who} failed {when} on what another rank did: {e['text'][:300]}{line}; the rank that failed first is not in these lines"
    else:
        s = f"{who} failed first {when}: {e['text'][:300]}{line}"
    if e.get("time"):  # a line without a clock of its own: after the last one above it
        # no year, or no date, where none was said
        stamp = clock(e["time"])[11 if e.get("date_guessed") else 5 if e.get("year_guessed") else 0 :]
        s += f" (after {stamp})" if e.get("stamped") is False else f" ({stamp})"
    if d["hang"]:
        s += f"; then {d['hang']['reported']}"
    return s


def _abort(run: LogRun, e: dict) -> dict | None:
    """The C++ exception that aborted the event's rank (SIGABRT), as its process printed it; ``mismatch``: gloo's
    word on ranks that called different collectives."""
    a = next((x for x in run.events if x["kind"] == "abort" and x.get("rank") in (None, e.get("rank"))), None)
    m = a["message"] if a and e.get("signal") == "SIGABRT" else None
    return m and {**a, "mismatch": "collective mismatch" in m or "op.preamble.length <= op.nbytes" in m}


def _healthy(run: LogRun, d: dict, went_on: list[dict]) -> str:
    if not run.series and not run.events:
        if not run.lines:
            return "the log is empty: nothing in it to judge"
        return f"no failure seen, and no line of a known format: {run.lines} lines, none a training step or a failure"
    s = "no failure seen"
    if d["resumes"]["from_output"]:
        r = d["resumes"]["from_output"][0]
        s = f"{s}; {r['text']}"
        if r.get("trained_twice"):
            s = f"no crash, hang or non-finite value seen; but a restart trained data twice: {r['text']}"
    if d["nonfinite"] and d["nonfinite"].get("first"):
        s += "; non-finite values " + d["nonfinite"]["text"]
    if went_on:
        s += f"; training went on after {len(went_on)} error-level line(s): {went_on[0]['text'][:160]}"
    return s


__all__ = ["NAME", "read", "timeline_of"]

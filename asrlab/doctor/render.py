"""The text of ``asrlab doctor``: the verdict first, then each section."""

from __future__ import annotations

from ..lab.stall.flight import collectives_text
from ..lab.stall.verdict import rank_line, ranks_named, ranks_text
from ..lab.timing import format_split
from . import FAILED
from .verdict import in_epoch

FIRST = 5  # keys, steps, ... named in the text before "+N more" (as many as the parts name)
# how a first error is headed when it is the consequence of something else
_CONSEQUENCES = (
    ("ended_from_outside", "error of a rank being ended (a consequence, not the cause)"),
    ("lost_peer", "error of a rank whose peer was gone (a consequence, not the cause)"),
    ("waited", "error of a rank that gave up waiting in a collective (the stall's consequence)"),
)
# a coverage epoch of every key once; "ended" has no expected keys: one that no epoch reached is not seen
_ONCE = {"complete": "each exactly once", "ended": "every key seen once; whether all were seen is not known"}


def _untrained(x: dict) -> str:
    """A rank's untrained rest of an epoch, as the ledger recorded it."""
    n, b = x["utterances"], x["batches"]
    where = f"after step {x['after_step']}"
    if x.get("after_batch"):
        where = f"after its batch {x['after_batch']} (step {x['after_step']})"
    if b is None:  # the guard could not count them: say so, never a number
        why = "the loader has no len" if x.get("after_batch") else "the loader has no len, or resumed itself mid-epoch"
        size = f"an unknown number of batches ({why})"
    elif n is None:
        size = f"{b} batches (an unknown number of utterances)"
    else:
        size = f"{'' if x['exact'] else 'about '}{n} utterances ({b} batches)"
    said = f"left {size} untrained {where}"
    which = ", ".join(x["keys"]) + (" ..." if x["known"] > len(x["keys"]) else "")
    if not x["keys"] or x["exact"]:
        return said + (f": {which}" if x["keys"] else "")
    return f"{said}; of them, the {x['known']} it had read ahead: {which} (UnevenGuard(..., untrained='keys') lists them all)"


def _few(items: list, total: int | None = None, sep: str = ", ") -> str:
    total = len(items) if total is None else total
    more = total - min(len(items), FIRST)
    return sep.join(map(str, items[:FIRST])) + (f" (+{more} more)" if more > 0 else "")


def _rank_line(r: dict, flags: bool = True) -> str:
    if not flags or r["state"] in ("alive", "done"):  # (from a report: a stale heartbeat there says nothing more)
        return f"  {rank_line(r)}"
    state = {"gone": "process gone", "frozen": "FROZEN: process alive, heartbeat stale"}
    said = state.get(r["state"], "no heartbeat: frozen or gone")
    return f"  {rank_line(r)}, heartbeat {r['heartbeat_age_s']:g} s old [{said}]"


def next_step(d: dict, log: bool = False) -> str | None:
    """What to do about a run folder's verdict (``log``: a log's, a toolkit folder's), in one line (``next``)."""
    ckpt = (d.get("checkpoints") or {}).get("newest_loadable")
    if log:  # a toolkit's run or a loop of one's own: its own way of resuming
        resume = f"its newest checkpoint is {ckpt}" if ckpt else "resuming from its newest checkpoint, if it saves any"
    elif d.get("config"):  # a run of asrlab train
        resume = f"--resume auto continues from {ckpt}" if ckpt else "no checkpoint loads, so it starts over"
    elif d["checkpoints"].get("own"):  # a watched loop's own checkpoints: its own way of resuming
        resume = f"its newest checkpoint is {ckpt}" if ckpt else "none of its checkpoints is intact"
    elif ckpt:  # a loop of the parts, or a watched command
        resume = f"RunState.load() resumes from {ckpt}"
    else:
        resume = "no checkpoint of asrlab.lab's RunState loads, so it starts over unless the loop has its own"
    v = d["verdict"]
    if v == "stalled" and log and "asrlab watch" in d["summary"]:  # the watch saved the ranks' stacks: read them
        return "read the ranks' stacks the watch saved: the `asrlab doctor EXP` under its last line reads them"
    if v == "stalled" and log:
        who = "the rank named is the one the others waited for" if d["culprit"]["rank"] is not None else (
            "the log names no rank behind the others (NCCL_DEBUG=INFO shows the network's part)")  # fmt: skip
        return f"{who}; run it again under asrlab watch --stall-timeout for every rank's stacks when it hangs"
    if v == "stalled":
        return (
            f"read the stacks in {(d.get('stall') or {}).get('report') or 'the ranks named above'}; a rank waiting "
            "for data points at its loader or storage, one blocked in a collective at the rank named first"
        )
    if v == "crashed":
        return f"fix the cause, then run the same command again ({resume})"
    if v == "out_of_memory":
        smaller = "data.max_frames_in_batch" if d.get("config") else "the batch"
        return f"make {smaller} (or the model) smaller, then run the same command again ({resume})"
    if v == "nonfinite_halt":
        bundle = (d["halt"] or {}).get("saved") or next((e["bundle"] for e in d["nonfinite"]["events"]), None)
        how = f"asrlab.lab.replay_step('{bundle}', model, loss_fn) with the loop's model and loss"
        if d.get("config"):  # asrlab's trainer: its own model
            how = f"asrlab.train.replay.replay('{bundle}')"
        return f"replay the saved step in each precision: {how}" if bundle else None
    if v == "nonfinite":
        return (
            "read the loss, the gradient norm and the learning rate over the steps before the first non-finite one: "
            "a lower peak learning rate, warm-up, gradient clipping or bf16/fp32 each cure it (notebook 03 compares "
            "them); asrlab.lab's numerics guard saves the step to replay"
        )
    if v == "killed" and "called different collectives" in d["summary"]:
        return (
            "find the collective one rank skips or adds: a branch on the rank around a collective (a metric's "
            "all-reduce, a barrier), or a rank whose data ran out first (asrlab.lab's UnevenGuard stops every "
            f"rank at the same step); then run the same command again ({resume})"
        )
    if v == "killed":
        return (
            "a signal ended it: for SIGKILL, the kernel's OOM killer (dmesg) or the scheduler's log says who sent it; "
            f"for SIGSEGV or SIGABRT, the native library in its last lines; then run the same command again ({resume})"
        )
    if v == "stopped":
        return f"run the same command again to continue ({resume})"
    if v == "unknown" and d.get("basis") == "series":
        return "its console, or the launcher's or scheduler's log, says how it ended: give it with this folder"
    if v == "unknown" and log:
        return "the lines around those quoted, or the scheduler's log, say how it ended"
    if v == "unknown":
        return "the run's own output (its log, the scheduler's) says how it ended"
    return None


def _nonfinite_log(nf: dict, head: int = 8, tail: int = 2) -> list[str]:
    """Every non-finite step the guard logged, one line each (the first ``head`` and last ``tail`` of many),
    then the utterances that were not finite with their steps."""
    log = nf.get("log") or []
    lines = [f"  every non-finite step: {nf['count']}"] if log else []
    shown = log if len(log) <= head + tail + 1 else log[:head] + [None] + log[-tail:]
    for e in shown:
        if e is None:
            lines.append(f"    ... {len(log) - head - tail} more")
            continue
        bad = e.get("utterances")
        which = f"not finite: {_few(bad)}" if bad else "every utterance of it finite"
        if bad is None:
            which = "which utterance not told"
        by = f" ({e['found_by']})" if e.get("found_by") else ""
        batch = f"; batch {_few(e.get('keys') or [])}" if bad is None else ""
        lines.append(f"    step {e['step']}, rank {e['rank']}: {e['kind']}; {which}{by}{batch}")
    many = sorted(nf.get("by_utterance", {}).items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    if many:
        said = [f"{k} (step{'s' if len(v) > 1 else ''} {_few(v)})" for k, v in many]
        lines.append(f"  utterances not finite: {_few(said, sep='; ')}")
    if nf.get("other_versions"):
        lines.append(
            f"  ({nf['other_versions']} lines of another format version passed over: a newer asrlab wrote them)"
        )
    return lines


def format_diagnosis(d: dict) -> str:
    """The text of ``asrlab doctor``, whatever was read: the verdict first, then each section."""
    if d.get("exp") is None:
        return _log_text(d) + "\n"
    lines = [*_head(d), f"  experiment: {d['exp']}"]
    lines += [f"  also read: {f} ({n})" for s in d.get("sources") or [] for f in s["files"] for n in s["notes"]]
    if d.get("next"):
        lines.append(f"  next: {d['next']}")
    if e := d["error"]:
        lines += ["", next((said for k, said in _CONSEQUENCES if e.get(k)), "first error") + f": {e['line']}"]
        if not e.get("usage"):  # the first error's own traceback under it, then the ranks that failed after it
            lines += ["  " + ln for ln in e["traceback_tail"]]
        if e["also_failed"]:
            lines.append(f"  {ranks_text(e['also_failed'])} failed after it (errors in {d['exp']}/errors/)")
    if d["stall"]:
        lines += ["", f"stall report ({d['stall']['report']}): {d['stall']['verdict']}"]
        lines += [f"  {rank_line(r)}" for r in d["stall"]["ranks"]]
        lines += ["  " + ln for ln in collectives_text(d["stall"].get("collectives"))]
    elif d["ranks"]:
        lines += ["", "ranks (last heartbeats):"] + [_rank_line(r, d["basis"] == "heartbeats") for r in d["ranks"]]
    for h in d["history"]:
        lines.append(f"  ({h})")

    st = d["steps"]
    lines += ["", "step times (per rank):"]
    if not st["ranks"]:
        lines.append(f"  {st.get('missing') or 'no metrics'}")
    for r in st["ranks"]:
        if r["median_step_s"] is None:  # asrlab watch: shares of sampled time, no steps
            shares = ", ".join(f"{100 * v:.0f}% {k}" for k, v in (r.get("shares") or {}).items())
            lines.append(f"  {ranks_named([r])} (sampled stacks): {shares}")
        else:
            how = "mean (heartbeat)" if r.get("source") else "median"
            lines.append(
                f"  rank {r['rank']}: steps {r['steps']}, {how} {r['median_step_s']:.4f} s/step, "
                f"{100 * r['data_wait_share']:.0f}% of it waiting for data"
            )
            if r.get("split"):
                lines.append(f"    wall clock: {format_split(r['split'])}")
        if r.get("bound") and d["verdict"] not in FAILED:  # a stall's or a crash's time is no bound
            lines.append(f"    bound: {r['bound']['bound']}: {r['bound']['evidence']}")
    if st["spread"] and "slowest_rank" in st["spread"]:
        s = st["spread"]
        lines.append(
            f"  spread: rank {s['slowest_rank']} slowest ({s['slowest_s']:.4f} s), {s['ratio']:.2f}x rank "
            f"{s['fastest_rank']} ({s['fastest_s']:.4f} s)"
        )
    slow = (st["spread"] or {}).get("slow_reader")
    if slow is not None and d["verdict"] not in FAILED:  # a failure's own verdict says what held the ranks
        share = {r["rank"]: r["data_wait_share"] for r in st["ranks"]}
        rest = ", ".join(f"{100 * v:.0f}%" for r, v in sorted(share.items()) if r != slow)
        lines.append(
            f"  rank {slow} waits for data far more than the others ({100 * share[slow]:.0f}% of its time; "
            f"the others {rest}): its reads hold the others up"
        )

    if mix := d.get("corpora"):
        lines += ["", "corpora (all ranks; audio seconds per second of loader work):"]
        for c, x in mix["corpora"].items():
            rate = x["audio_per_load_s"] if x["audio_per_load_s"] is not None else "-"
            slowest = "  <- slowest to load" if c == mix["slowest"] else ""
            lines.append(f"  {c}: {x['utts']} utterances, {x['hours']:.3f} h, {rate} s/s{slowest}")

    nf = d["nonfinite"]
    printed = ((d.get("job_output") or {}).get("nonfinite") or {}).get("first") and d["job_output"]["nonfinite"]
    # asrlab's trainer guards every step: "none" is its word; a loop of its own says only what its guard or output did
    none = " none" if d.get("config") else " none recorded (by asrlab's numerics guard, or in the job's output it read)"
    if d["verdict"] == "nonfinite":  # the job's line of no step format the doctor reads: the verdict quotes it
        none = " none on a step line of a format the doctor reads; the first line it printed is quoted above"
    lines += ["", "non-finite steps:" + ("" if nf["events"] or nf["steps"] or nf.get("log") or printed else none)]
    if printed:  # what the loop printed: the same event the verdict read, when the verdict is the job's
        f = printed["first"]
        where = ", ".join(f"{k} {f[k]}" for k in ("epoch", "batch") if f.get(k) is not None) or f"step {f['step']}"
        who = f"rank {f['rank']}, " if f.get("rank") is not None else ""
        lines.append(
            f"  the job's output ({d['job_output']['file']}): first at {who}{where}: {printed['text']} "
            f"({printed['count']} non-finite step lines)"
        )
    if d["halt"] and d["verdict"] != "nonfinite_halt":  # (the verdict above says it otherwise)
        lines.append(f"  halt{'' if d['halt']['current'] else ' (earlier launch)'}: {d['halt']['message']}")
    for e in nf["events"]:
        micro = (e.get("micro_batches") or 1) > 1 and e.get("micro_batch") is not None
        said = f"  step {e['step']}, rank {e['rank']}: {e['kind']} not finite, first in "
        said += f"{e.get('where') or e.get('module')}; utterances {_few(e.get('keys') or [])}"
        said += f" (micro-batch {e['micro_batch'] + 1} of {e['micro_batches']})" if micro else ""
        said += f"; not finite: {_few(e['utterances'])} ({e['found_by']})" if e.get("utterances") else ""
        lines.append(said)
        if e.get("cause"):
            lines.append(f"    cause: {e['cause']['text']}")
        lines.append(f"    bundle: {e['bundle']}")
    lines += _nonfinite_log(nf)
    logged = {e["step"] for e in nf.get("log", [])}
    unsaved = [s for s in nf["steps"] if s not in {e["step"] for e in nf["events"]} | logged]
    if unsaved:
        lines.append(f"  also not finite (rank 0's metrics, no bundle): steps {_few(unsaved)}")

    if ls := d["loss_scale"]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(ls["skipped_by_kind"].items())) or "none"
        scale = "not logged"
        if "first" in ls:
            scale = f"first {ls['first']:g}, min {ls['min']:g}, last {ls['last']:g}, {ls['changes']} changes"
        rollbacks = f"; rollbacks: {ls['rollbacks']}" if ls["rollbacks"] else ""
        lines += ["", f"loss scale: {scale}"]
        lines.append(f"  skipped steps: {ls['skipped']} (in the steps that count: {kinds}){rollbacks}")

    rs = d["resumes"]
    said = "not recorded (the loop keeps no ledger: asrlab.lab's RunState records one)"
    if rs["resumed_from"]:
        said = ", ".join(f"from step {s}" for s in rs["resumed_from"])
    elif rs["from_output"]:
        said = "read from the job's output: " + "; ".join(r["text"] for r in rs["from_output"])
    elif rs["ledger"] or d.get("config"):
        said = "none" if rs["ledger"] else "no ledger (train.ledger=false)"
    lines += ["", f"resumes: {said}"]
    for x in rs["steps_trained_again"]:
        lines.append(f"  metrics: after step {x['after_step']} training went back to step {x['back_to_step']}")

    cov = d["coverage"]
    if cov is None and d.get("coverage_not_measured"):
        lines += ["", f"coverage: not measured: {d['coverage_not_measured']}"]
    elif cov is None and d.get("config"):
        lines += ["", "coverage: no ledger (--ledger / train.ledger=true records which utterances each step used)"]
    elif cov is None:
        lines += ["", "coverage: not recorded (the loop keeps no ledger of the utterances each step trained)"]
    else:
        lines += ["", f"coverage (ledger; expected: {cov['against']}):" + (" BROKEN" if cov["broken"] else "")]
        for e in cov["epochs"]:
            if e["status"] in _ONCE and e["exactly_once"]:
                lines.append(f"  epoch {e['epoch']}: {e['status']}, {e['keys']} keys, {_ONCE[e['status']]}")
                continue
            so_far = " so far, none twice" if e["status"] == "in progress" and not e["repeated"] else ""
            parts = [f"{e['keys']} keys{so_far}"]
            if e["repeated"]:
                twice = [f"{k} x{n}" for k, n in e["repeated_keys"].items()]
                parts.append(f"{e['repeated']} repeated ({_few(twice, e['repeated'])})")
            if e["skipped"]:
                parts.append(f"{e['skipped']} skipped ({_few(e['skipped_keys'], e['skipped'])})")
            if e["unexpected"]:
                parts.append(f"{e['unexpected']} not expected ({_few(e['unexpected_keys'], e['unexpected'])})")
            if e["status"] == "cut short":
                lines.append(
                    f"  epoch {e['epoch']}: cut short (a rank ran out of data and every rank stopped), "
                    f"{e['keys']} keys trained" + (", " + ", ".join(parts[1:]) if parts[1:] else "")
                )
                lines += [f"    rank {r}: {_untrained(x)}" for r, x in e["cut_short"].items()]
                continue
            status = "incomplete" if e["status"] == "in progress" else e["status"]
            lines.append(f"  epoch {e['epoch']}: {status}, " + ", ".join(parts))
        if cov["broken"] and (d.get("config") or {}).get("uneven") == "stop" and d["world_size"] > 1:
            lines.append(
                "  (uneven=stop ends an epoch on every rank when the first runs out: the others' last "
                "utterances are skipped that epoch)"
            )

    ck = d["checkpoints"]
    lines += ["", f"checkpoints ({len(ck['files'])}):" + ("" if ck["files"] else " none")]
    for c in ck["files"]:
        at = f"step {c['step']}" if c["epoch"] is None and c.get("step") is not None else f"epoch {c['epoch']}"
        lines.append(f"  {c['file']}: {at}{' (done)' if c.get('epoch_done') else ''}, {c['state']}")
    for p in ck["partial_writes"]:
        lines.append(f"  {p}: a write that never finished")
    if ck["files"]:
        lines.append(f"  newest loadable: {ck['newest_loadable'] or 'NONE (a resume starts from scratch)'}")
    return "\n".join(lines) + "\n"


def _head(d: dict) -> list[str]:
    """The verdict and its culprit, first whatever was read."""
    c = d["culprit"]
    said = [f"{k} {c[k]}" for k in ("rank", "step") if c[k] is not None]
    if c.get("epoch") is not None and c.get("batch") is not None and c["step"] == c["batch"]:
        said[-1] = f"epoch {c['epoch']}, batch {c['batch']}"  # the step is the batch's count in its epoch
    return [f"{d['verdict'].upper()}: {d['summary']}"] + (["  culprit: " + ", ".join(said)] if said else [])


def _log_text(d: dict) -> str:
    """A log's or a toolkit folder's diagnosis: the verdict, what was read, then each section."""
    lines = _head(d) + ([f"  next: {d['next']}"] if d.get("next") else [])
    fmts = ", ".join(f"{k} ({v} step lines)" for k, v in sorted(d["formats"].items(), key=lambda kv: -kv[1]))
    if d["files"] or not d.get("sources"):  # a toolkit's folder of tables alone: no log lines to count
        lines.append(
            f"read: {len(d['files'])} file{'s' if len(d['files']) != 1 else ''}, {d['lines']} lines in "
            f"{d['read_s']:.2f} s; formats: {fmts or 'no training-step lines of a known format'}"
            + (
                f"; {d['unread']} line{'s' if d['unread'] != 1 else ''} not read (a reader failed)"
                if d["unread"]
                else ""
            )
        )
    for s in d.get("sources") or []:
        series = (d.get("series") or {}).get(s["source"], {})
        steps = [x for v in series.values() for x in v["steps"]]
        lines.append(
            f"read: {s['source']} ({len(s['files'])} files): {len(series)} series"
            + (f" ({_few(sorted(series))})" if series else "")
            + (f", steps {min(steps)} to {max(steps)}" if steps else "")  # where a killed run's points end
        )
        lines += [f"  {n}" for n in s["notes"]]
    if d["events"]:
        lines.append("recognised: " + ", ".join(f"{k} {v}" for k, v in sorted(d["events"].items())))
    for w in d.get("warnings") or []:
        lines.append(f"warning ({w['source']}): {w['text']}")
    for h in d.get("history") or []:
        lines.append(f"history: {h}")
    if d["hang"]:
        lines.append(f"hang: {d['hang']['text']}")
    if d["nonfinite"] and d["nonfinite"].get("first"):
        lines.append(f"non-finite: {d['nonfinite']['text']} ({d['nonfinite']['count']} non-finite step lines)")
    elif d["nonfinite"] and d["nonfinite"]["norm_skips"]:  # no step non-finite: the gradient norms fp16 skipped
        lines.append(f"loss scale: {d['nonfinite']['text']}")
    for r in d["resumes"]["from_output"]:
        who = "resume" if r["rank"] is None else f"resume (rank {r['rank']})"
        lines.append(f"{who}: {r['text']}" + (f"; from {r['checkpoint']}" if r.get("checkpoint") else ""))
    ck = d.get("checkpoints")
    if ck:
        lines.append(
            f"checkpoints ({len(ck['files'])}): newest {ck['newest'] or 'none intact'}"
            + (f"; not intact: {', '.join(ck['broken'])}" if ck["broken"] else "")
        )
        for r in ck["files"][:8]:
            held = ", ".join(f"{k} {r[k]}" for k in ("epoch", "step") if r[k] is not None) or "no epoch or step in it"
            state = "" if r["intact"] else f" (NOT INTACT: {r['why']})" if r["intact"] is False else f" ({r['why']})"
            if r.get("after_failure"):
                c = d["culprit"]
                at = f"epoch {c['epoch']}, batch {c['batch']}" if in_epoch(c) else f"step {c['step']}"
                state += f" (saved at or after {at}, the first not finite: resume from an earlier one)"
            lines.append(f"  {r['file']}: {held}{state}")
    if d["ranks"]:
        lines.append("ranks (last logged step):")
        for r in d["ranks"]:
            rate = f", {r['steps_per_s']:.2f} steps/s" if r["steps_per_s"] else ""
            rate = f", {r['s_per_step']:.3g} s/step" if r["s_per_step"] else rate
            who = f"rank {r['rank']}" if r["rank"] is not None else "lines naming no rank"
            lines.append(f"  {who}: {r['last']}{rate}")
        sp = d.get("step_spread")
        if sp and sp["ratio"] >= 1.2:
            lines.append(
                f"  rank {sp['slowest']} takes {sp['ratio']:.2f}x the seconds per step of rank {sp['fastest']}"
            )
    return "\n".join(lines)

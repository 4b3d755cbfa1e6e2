"""The failure events of asrlab's run folder (:mod:`.run_folder` reads it): this launch's rank errors, the
non-finite halt, the stall report, a stop, ranks that ended without a word; where none is a failure, what the
loop said (``lab.json``), else the ranks' heartbeats, else the metrics."""

from __future__ import annotations

import re
import time
from pathlib import Path

from ..logs.progress import clock
from ...lab.stall.errors import ended_from_outside, error_line, error_summary
from ...lab.stall.heartbeat import STALE_S, phase_at, read_timeline
from ...lab.stall.peers import read_peer_exits
from ...lab.stall.verdict import culprit_of, phase_text, ranks_named, ranks_text, verdict
from ...lab.state.ledger import ledger_path, read_ledger
from ...lab.layout import WATCH
from ...lab.stop import STOP_FILE
from ..logs.tracebacks import COLLECTIVE_TIMEOUT, exception_kind
from ..logs.words import exit_signal
from ..timeline import failure
from .text_log import SILENT_S, STOP_SIGNALS

Lines, Beats = dict[str, list[dict]], dict[int, dict]  # each rank's metrics lines (rank_metrics), its last heartbeat

# what a collective raises on a rank whose peer process went away (gloo, NCCL, the store)
LOST_PEER = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|recvBytes|ProcessGroupNCCL.*(abort|watchdog)|"
    r"NCCL communicator was aborted|Socket Timeout|failed to recv|Connection refused",
    re.I,
)


def timeline_of(
    exp: Path, d: dict, lab: dict, train_cfg: dict, metrics: Lines, beats: Beats, errors: list[dict], stall: dict | None
) -> tuple[list[dict], dict | None]:
    """``(events, outcome)``: this launch's failures, else a stop, a failure the loop marked, a rank gone; else the
    outcome ``lab.json``, the heartbeats or the metrics say. What ranks recorded once told to stop is no failure."""
    world_size, halt, ckpts = d["world_size"], d["halt"], d["checkpoints"]
    status = lab.get("status")
    stop_time = lab.get("stop_time") if status == "stopped" else None
    if stop_time is not None:
        errors = [e for e in errors if e["time"] < stop_time]
        halt = halt if halt is not None and halt.get("time", 0) < stop_time else None
        stall = stall if stall is not None and stall.get("time", 0) < stop_time else None
        d["error"] = error_summary(errors[0], errors) if errors else None
    passed = None
    if stall is not None and lab.get("stall_passed") and status == "finished" and not stall.get("failure"):
        passed, stall = stall, None  # reported, then the ranks moved on and the job finished: said, not the verdict
    failures = []  # this launch's failures, as events on the run's timeline
    if errors:
        e0, said = errors[0], d["error"]["line"]
        rank, step, guess = e0["rank"], e0.get("step"), False
        erred = {e["rank"] for e in errors}
        lost_peer = LOST_PEER.search(e0.get("message") or "") is not None
        # a rank gone by the error (a survivor's lost peer: its heartbeat, which the watch writes, may come a look
        # later than its end, which the error had already seen)
        by = e0["time"] + (LOOK_S if lost_peer else 0.0)
        vanished = [r for r in d["ranks"] if r["state"] == "gone" and r["rank"] not in erred]
        vanished = [r for r in vanished if beats.get(r["rank"], {}).get("time", 1e18) <= by]
        consequence = lost_peer or ended_from_outside(e0)  # a survivor's error, or a rank being ended
        held = None if vanished else _held_up(e0, beats)
        # a survivor's error (a rank gone, or none seen gone here), unless a peer that held it up is the cause
        d["error"]["lost_peer"] = lost_peer and held is None
        # a collective that gave up waiting for a peer the stall report names: the hang's consequence
        d["error"]["waited"] = stall is not None and COLLECTIVE_TIMEOUT.search(e0.get("message") or "") is not None
        if vanished and consequence:  # the first error is a survivor's: the rank gone is the cause
            gone, rank, step = _vanished(exp, metrics, vanished, beats, ckpts)
            said, consequence, guess = f"{gone}; then {said}", False, True
        if held is not None:  # a collective that timed out: a stall, caused by the peer that never came
            b = beats[held]
            doing = f"{phase_text(b.get('phase'), b.get('step'))} for {e0['time'] - b['since']:.0f} s"
            doing += f"; {b['detail']}" if b.get("detail") else ""
            text = f"rank {held} held the others up ({doing}): rank {rank} timed out: {e0.get('message', '')[:200]}"
            e = failure("stalled", "timeout", e0["time"], text, source="errors", rank=held, step=b.get("step"))
            failures.append(e)
        elif consequence and not lost_peer and all(ended_from_outside(e) for e in errors):
            # every rank's error is of its being ended by a signal (its DataLoader workers "killed by signal:
            # Terminated"), and no rank went first: a signal to the job from outside stopped it
            sig = {"Terminated": "SIGTERM", "Hangup": "SIGHUP", "Interrupt": "SIGINT"}
            name = next((v for k, v in sig.items() if f"signal: {k}" in (e0.get("message") or "")), "a signal")
            text = f"the job was stopped by {name} from outside: {ranks_text(sorted(erred))} ended by it ({said})"
            failures.append(failure("stopped", "stop", e0["time"], text, source="errors", step=step, consequence=True))
        else:
            cause_elsewhere = lost_peer and consequence  # no rank here went first: another node's, or unrecorded
            if cause_elsewhere:
                said += " (a consequence: a peer of it was gone first, not seen from this folder)"
            more = {"culprit_rank": None} if cause_elsewhere else {}
            # the rank's own error said out of memory (torch.OutOfMemoryError, MemoryError): as a log's would be
            oom = not guess and exception_kind(f"{e0.get('type') or ''}: {e0.get('message') or ''}") == "oom"
            failures.append(failure(
                "out_of_memory" if oom else "crashed", "error", e0["time"], said, source="errors", rank=rank, step=step,
                consequence=consequence, guess=guess, lost_peer=lost_peer, **more,
            ))  # fmt: skip
    if halt is not None and halt["current"]:
        place = {"rank": halt.get("rank"), "step": halt.get("step")}
        failures.append(failure("nonfinite_halt", "halt", halt["time"], halt["message"], source="halt report", **place))
    failed = (stall or {}).get("failure")
    # the watchdog stopped the ranks a failed rank left waiting: a crash, said by the report (a rank being ended
    # from outside: said with the errors above)
    if failed and not (errors and ended_from_outside(failed)):
        place = {"rank": failed.get("rank"), "step": failed.get("step")}
        t = failed.get("time", stall["time"])
        failures.append(failure("crashed", "error", t, error_line(failed), source="stall report", **place))
        if d["error"] is None:
            d["error"] = error_summary(failed, [failed])
    elif stall is not None and not failed:
        for e in failures:  # an error the watchdog then saw the others wait on
            if e["verdict"] == "crashed":
                e["text"] += f"; then the watchdog found: {stall['verdict']}"
        rank = culprit_of(stall.get("verdict") or "")
        place = {"rank": rank, "step": next((r.get("step") for r in stall["ranks"] if r.get("rank") == rank), None)}
        failures.append(failure("stalled", "stall", stall["time"], stall["verdict"], source="stall report", **place))
    if failures:
        return failures, None

    steps = [b.get("step") for b in beats.values() if b.get("step") is not None]
    top = max(steps) if steps else None
    at = f" at step {top}" if steps else ""
    if stop_time is not None:
        said = f"ended by {lab.get('stopped_by') or 'a signal'}{at}"
        if (hung := _hung(exp, beats, stop_time)) is not None:  # stopped once it had hung: the hang is what went wrong
            text = f"{hung}, then {said}: it had hung (no rank moved for {SILENT_S:.0f} s or more before the stop)"
            return [failure("stalled", "stall", stop_time, text, source="lab.json", rank=culprit_of(hung))], None
        e = failure("stopped", "stop", stop_time, said, source="lab.json", step=top, ended_by=lab.get("stopped_by"))
        return [e], None
    if status == "failed":
        gone = [r for r in d["ranks"] if r["state"] == "gone"]
        code = lab.get("exit_code")
        name = exit_signal(code, shell=True) if gone else None  # 128 + N, or -N: killed, or stopped from outside
        ended = (name, "stopped" if name in STOP_SIGNALS else "killed") if name else None
        if gone and world_size == 1 and code:
            # the one process: the watch's exit code is the process's own (no launcher between)
            step, said = _last_step(exp, metrics, gone[0])
            after = f" after step {step}, the last its {said} shows" if step is not None else ""
            who = f"the job's one process (pid {gone[0]['pid']})"
            how, text = "crashed", f"{who} exited with code {code}{after}, recording no error"
            text += " (no traceback: the job's own output says why)"
            if ended:
                how, text = ended[1], f"{who} was ended by {ended[0]} (exit code {code}){after}"
            return [failure(how, "exit", lab.get("ended"), text, source="lab.json", rank=0, step=step)], None
        if ended and (ended[1] == "stopped" or _spawner(exp)):
            # the job's own process (a launcher, or rank 0 that launched the others) ended on a stop signal, or
            # mp.spawn's launcher, no rank, on any signal (a rank's death makes it exit 1): its ranks ended with it
            stopped = ended[1] == "stopped"
            how = "a signal from outside to the launcher" if stopped else "a signal to the launcher itself"
            text = f"the job's main process was ended by {ended[0]} (exit code {code}){at}: {how}; "
            text += f"{ranks_named(gone)} ended with it"
            e = failure(ended[1], "stop" if stopped else "exit", lab.get("ended"), text, source="lab.json",
                        step=top, ended_by=f"{ended[0]} to the job's launcher")  # fmt: skip
            return [e], None
        if gone:  # ranks that ended without a word: one of them vanished first
            return [_gone(exp, metrics, gone, beats, ckpts)], None
        rc = f" (exit code {code})" if code is not None else ""
        said = f"the training loop marked the run failed (lab.json){rc} and recorded no error"
        return [failure("crashed", "marked_failed", lab.get("ended"), said, source="lab.json", guess=True)], None
    ranks = d["ranks"]
    missing = [r for r in range(world_size) if r not in beats]
    if status == "finished" or (ranks and not missing and all(r["state"] == "done" for r in ranks)):
        out = {**_finished(d, lab, train_cfg, ckpts), "basis": "lab.json" if status else "heartbeats"}
        if passed is not None:
            when = clock(passed["time"])
            out["summary"] += f"; the watch reported a stall at {when} ({passed['verdict']}), then the ranks moved on"
        return [], out
    if not ranks:
        return [], {**_without_heartbeats(metrics, d, train_cfg, ckpts), "basis": "metrics"}
    out = {"verdict": "running", "ended_by": None, "basis": "heartbeats"}
    gone, frozen, silent, alive = ([r for r in ranks if r["state"] == s] for s in ("gone", "frozen", "silent", "alive"))
    if gone:
        return [_gone(exp, metrics, gone, beats, ckpts)], None
    if frozen:
        r = frozen[0]
        said = (
            f"{ranks_named(frozen)} frozen: process alive (pid {r['pid']}) but no heartbeat for "
            f"{r['heartbeat_age_s']:.0f} s, last seen {phase_text(r['phase'], r['step'])} (stopped with SIGSTOP, or a "
            "C call holding the GIL); no stall report was written"
        )
        return [], {**out, "verdict": "stalled", "summary": said}
    if not alive:
        said = (
            f"no heartbeat for {min(x['heartbeat_age_s'] for x in silent):.0f} s from any rank, written on "
            f"{silent[0]['host']} (not this host: its processes cannot be checked from here): the run ended without "
            "a report, or its machines are unreachable"
        )
        return [], {**out, "verdict": "unknown", "summary": said}
    limit = f" of {train_cfg['max_steps']}" if train_cfg.get("max_steps") else ""
    said = [f"running, step {d['last_step'] or 0}{limit}"]
    if silent:
        age = max(x["heartbeat_age_s"] for x in silent)
        said.append(f"{ranks_named(silent)}: no heartbeat for {age:.0f} s (another host: frozen or gone)")
    if missing:
        said.append(f"{ranks_text(missing)}: no heartbeat")
    if d["stop_requested"]:
        said.append(f"a stop was requested ({exp / STOP_FILE}): it ends after the current step")
    return [], {**out, "summary": "; ".join(said)}


def history(
    lab: dict, recorded: list[dict], errors: list[dict], halt: dict | None, report: dict | None, stall: dict | None
) -> list[str]:
    """Failures of earlier launches into this EXP: ``recorded``, every rank error in the folder, of which ``errors``
    are this launch's; ``report``, the stall report, ``stall`` when this launch's."""
    out = []
    current = {(e["rank"], e.get("time")) for e in errors}
    started = lab.get("started") if lab.get("watched") else None  # the watch's one launch of its command
    for e in recorded:
        if (e["rank"], e.get("time")) not in current:
            why = (
                " (a rank whose peer was gone: a consequence, not the cause)"
                if LOST_PEER.search(e.get("message") or "")
                else " (a rank being ended: what followed the launch's failure, not its cause)"
                if ended_from_outside(e)
                else ""
            )
            # its ranks started again under the one watched command: a launcher's restart (torchrun --max-restarts)
            again = started is not None and (e.get("time") or 0) >= started
            out.append(f"{'an earlier attempt of this launch' if again else 'earlier launch'}: {error_line(e)}{why}")
    if halt is not None and not halt["current"]:
        out.append(f"earlier launch: {halt['message']}")
    if report is not None and stall is None:
        out.append(f"earlier launch stalled: {report.get('verdict')}")
    return out + [f"earlier launch: {_ended(x)}" for x in lab.get("earlier", [])]


def _ended(x: dict) -> str:
    """``ended 12:04:31, failed, exit code 137 (SIGKILL)``: how an earlier launch into the EXP ended."""
    if "ended" not in x:
        started = time.strftime("%H:%M:%S", time.localtime(x["started"]))
        return f"started {started}, its end not recorded (killed, or its machine lost)"
    said = f"ended {time.strftime('%H:%M:%S', time.localtime(x['ended']))}, {x.get('status', 'status not recorded')}"
    rc = x.get("exit_code")
    if rc is not None:
        said += f", exit code {rc}"
        if sig := exit_signal(rc, shell=True):
            said += f" ({sig})"
    if x.get("stopped_by"):
        said += f", by {x['stopped_by']}"
    return said


LOOK_S = 1.0  # the watch's looks at the ranks are this far apart at most (2 a second, and its own work)
UNSAID = "killed (SIGKILL, the OOM killer, a lost node), or it printed its traceback to its own output"
WAITS = ("data", "sync", "allreduce", "ddp_allreduce", "collective")  # a rank that waits on its loader or peers
BUSY = ("start", "index", "compile", "checkpoint", "eval", "epoch_end", "left_loop", "next_epoch", "done", "exited")


def _hung(exp: Path, beats: Beats, at: float) -> str | None:
    """The hang a stop at ``at`` ended, as the watch words a stall: no rank moved for :data:`SILENT_S` and one waited
    (a slow start, an evaluation or a save is no hang); a rank that moved after the stop as its timeline had it then."""
    timelines = read_timeline(exp) if any((b.get("since") or 0) > at for b in beats.values()) else {}
    snaps = {}
    for r, b in beats.items():
        if (b.get("since") or 0) > at:
            then = phase_at(timelines.get(r, []), at)
            b = {**b, "phase": then["phase"], "since": then["t"], "detail": ""} if then else {}
        if b.get("since") is not None and b.get("phase"):
            snaps[r] = b
    phases = [b["phase"] for b in snaps.values()]
    if not snaps or any(p in BUSY for p in phases) or not any(p in WAITS for p in phases):
        return None
    return None if min(at - b["since"] for b in snaps.values()) < SILENT_S else verdict(snaps, 0, at)


def _held_up(e0: dict, beats: Beats) -> int | None:
    """The rank a collective timed out waiting for (gloo's "Timed out waiting 20000ms for recv", NCCL's watchdog):
    of the others, the one whose heartbeat held its phase longest by then, outside a collective and not starting."""
    if not COLLECTIVE_TIMEOUT.search(e0.get("message") or ""):
        return None
    held = [(b["since"], r) for r, b in beats.items() if r != e0["rank"] and b.get("since") is not None]
    held = [(t, r) for t, r in held if beats[r].get("phase") not in ("collective", "start")]
    return min(held)[1] if held else None


def _spawner(exp: Path) -> bool:
    """Whether the watch saw torch.multiprocessing.spawn's launcher, a process of no rank, start the ranks."""
    return any('"launcher"' in p.read_text(errors="replace") for p in (Path(exp) / WATCH / "ranks").glob("*.json"))


def _gone(exp: Path, metrics: Lines, gone: list[dict], beats: Beats, ckpts: dict) -> dict:
    """Ranks that ended without a word, as the run's failure: a guess the job's own output can say better."""
    said, rank, step = _vanished(exp, metrics, gone, beats, ckpts)
    t = beats.get(rank, {}).get("time")  # None where no rank named
    return failure("crashed", "vanished", t, said, source="heartbeats", rank=rank, step=step, guess=True)


def _vanished(
    exp: Path, metrics: Lines, gone: list[dict], beats: Beats, ckpts: dict
) -> tuple[str, int | None, int | None]:
    """``(text, rank, step)`` of ranks that ended without an error or a finish: the one the others saw end first
    (their watchdogs watch their host's ranks), else whose heartbeat stopped clearly first, at its last step."""
    seen = read_peer_exits(exp)
    beat = {r["rank"]: beats.get(r["rank"], {}).get("time", 0.0) for r in gone}
    by_peers = sorted((seen[r["rank"]], r["rank"]) for r in gone if r["rank"] in seen)
    if by_peers:
        first, how = {r["rank"]: r for r in gone}[by_peers[0][1]], "the first to end, as the other ranks saw it"
    else:
        order = sorted(gone, key=lambda r: beat[r["rank"]])
        clear = len(order) == 1 or beat[order[1]["rank"]] - beat[order[0]["rank"]] > 2 * STALE_S
        first = order[0] if clear else None
        how = "its heartbeat stopped first" if clear and len(order) > 1 else ""
    after = [r for r in gone if first is None or r["rank"] != first["rank"]]
    newest = next((c["step"] for c in ckpts["files"] if c["file"] == ckpts["newest_loadable"]), None)
    saved = f"; the newest checkpoint is of step {newest}" if newest is not None else ""
    if newest is None and ckpts["files"]:  # (none of asrlab's in the folder: the loop's own may be elsewhere)
        saved = "; no checkpoint loads"
    if first is None:  # ended together, and nothing says which went first
        step, said = _last_step(exp, metrics, gone[0])
        named = ranks_named(sorted(gone, key=lambda r: r["rank"]))
        text = f"{named} ended without recording an error within a second of each other"
        if step is not None:
            text += f" (step {step} the last trained, by the {said}{saved})"
        elif saved:
            text += f" ({saved[2:]})"
        text += ": one was killed (SIGKILL, the OOM killer, a lost node) and its launcher ended the others; the "
        text += "launcher's own log (torchrun's \"Root Cause\") names which"
        return text, None, step
    step, said = _last_step(exp, metrics, first)
    if step is not None:
        last = f"step {step} the last it trained, by its {said}"
    else:
        last = f"last seen {phase_text(first['phase'], first['step'])}"
    text = f"{ranks_named([first])} ended without recording an error: it vanished" + (f" ({how})" if how else "")
    text += f" (pid {first['pid']} on {first['host']}, {last}{saved}): {UNSAID}"
    if after:
        text += f"; {ranks_named(after)} ended after it (stopped by the launcher or by the lost peer)"
    return text, first["rank"] if first.get("rank_known") is not False else None, step


def _last_step(exp: Path, metrics: Lines, r: dict) -> tuple[int | None, str]:
    """The last step rank ``r`` trained: its ledger's, else its metrics'."""
    ledger = read_ledger(exp, r["rank"]) if ledger_path(exp, r["rank"]).exists() else []
    if ledger:
        return ledger[-1]["step"], "ledger"
    m = metrics.get(f"rank{r['rank']}", [])
    if m and m[-1].get("step") is not None:
        return m[-1]["step"], "metrics"
    return None, ""


def _finished(d: dict, lab: dict, train_cfg: dict, ckpts: dict) -> dict:
    """Every rank done: finished by a limit of its config (or in its loop's word), else stopped on request."""
    step = d["last_step"]
    if lab.get("status") == "finished" or (not train_cfg and not d["stop_requested"]):
        said = "finished" + (f" at step {step}" if step is not None else "")
        return {"verdict": "finished", "ended_by": "the training loop", "summary": said}  # a user's loop: its word
    if (limited := _limit_reached(train_cfg, step, ckpts)) is not None:
        return limited
    limits = ", ".join(f"{k}={train_cfg[k]}" for k in ("max_steps", "max_epochs", "max_minutes") if train_cfg.get(k))
    said = f"stopped on request at step {step}, before its limits ({limits or 'none'})"
    said += "; it resumes from its last checkpoint"
    return {"verdict": "stopped", "ended_by": "a stop request", "summary": said}


def _limit_reached(train_cfg: dict, step: int | None, ckpts: dict) -> dict | None:
    """Finished by which of the config's limits: ``max_steps``, ``max_epochs`` (a checkpoint marker closes the last
    epoch), ``max_minutes`` (the training clock the newest checkpoint holds); None where none was reached."""
    max_steps, max_epochs = int(train_cfg.get("max_steps") or 0), int(train_cfg.get("max_epochs") or 0)
    if max_steps and step is not None and step >= max_steps:
        limit = f"max_steps={max_steps}"
    elif max_epochs and any(c.get("epoch") == max_epochs - 1 and c.get("epoch_done") for c in ckpts["files"]):
        limit = f"max_epochs={max_epochs}"
    else:
        minutes, elapsed = float(train_cfg.get("max_minutes") or 0), ckpts.get("clock_s")
        if not (minutes and elapsed is not None and elapsed >= 60 * minutes):
            return None
        limit = f"max_minutes={minutes:g}"
    return {"verdict": "finished", "ended_by": limit, "summary": f"finished at step {step} ({limit} reached)"}


def _without_heartbeats(metrics: Lines, d: dict, train_cfg: dict, ckpts: dict) -> dict:
    """No heartbeat (the stall watchdog was off: ``train.stall_timeout_s=0``): the metrics' last line."""
    last = max((m[-1]["time"] for m in metrics.values() if m and m[-1].get("time")), default=None)
    step = d["last_step"]
    if (limited := _limit_reached(train_cfg, step, ckpts)) is not None:
        return limited
    age = d["time"] - last if last is not None else None
    watched = float(train_cfg.get("stall_timeout_s") or 0) > 0
    if watched and age is not None and age > STALE_S and last >= (d["launched"] or 0):
        # the watchdog writes a heartbeat within a second of training's start: none at all, with steps
        # logged, is a process that ended in that second
        said = (
            f"the run ended without recording an error {age:.0f} s ago at step {step}, before its limits and before "
            "its stall watchdog wrote a heartbeat: killed (SIGKILL, the OOM killer), or it printed its traceback to "
            "its own output"
        )
        return {"verdict": "crashed", "ended_by": None, "summary": said}
    median = max((r["median_step_s"] for r in d["steps"]["ranks"]), default=0.0)
    if age is not None and age < max(60.0, 20 * median):
        said = f"running, step {step} (no heartbeats: the last metrics line is {age:.0f} s old)"
        return {"verdict": "running", "ended_by": None, "summary": said}
    seen = f"last metrics line {age:.0f} s ago, at step {step}" if age is not None else "no metrics"
    said = f"no heartbeats (stall watchdog off?) and {seen}, before its limits: stopped, killed or crashed; the run's "
    said += "own output says which"
    return {"verdict": "unknown", "ended_by": None, "summary": said}

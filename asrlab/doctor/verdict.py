"""The doctor's verdict on a run: the earliest failure this launch recorded, else what the loop said
(``lab.json``), else the ranks' heartbeats, else the metrics."""

from __future__ import annotations

from pathlib import Path

from ..lab.metrics import metric_files, read_metrics
from ..lab.stall.errors import error_line
from ..lab.stall.heartbeat import STALE_S
from ..lab.stall.verdict import phase_text, ranks_text
from ..lab.stop import STOP_FILE
from .read import error_entry

def verdict(exp: Path, d: dict, lab: dict, train_cfg: dict, beats: dict[int, dict], world_size: int,
             errors: list[dict], halt: dict | None, stall: dict | None, ckpts: dict) -> dict:
    """``{"verdict", "summary", "ended_by", "basis"}`` from the failures this launch recorded (the earliest),
    else ``lab.json``'s status, else the heartbeats, else the metrics."""
    failures = []
    if errors:
        failures.append((errors[0]["time"], "crashed", d["error"]["line"], "errors"))
    if halt is not None and halt["current"]:
        failures.append((halt["time"], "nonfinite_halt", halt["message"], "halt report"))
    if stall is not None:
        failure = stall.get("failure")
        if failure:  # the watchdog stopped the ranks a failed rank left waiting: a crash, said by the report
            failures.append((failure.get("time", stall["time"]), "crashed", error_line(failure), "stall report"))
            if d["error"] is None:
                d["error"] = error_entry(failure, [failure])
        else:
            failures.append((stall["time"], "stalled", stall["verdict"], "stall report"))
    if failures:
        _, verdict, summary, basis = min(failures, key=lambda f: f[0])
        if verdict == "crashed" and stall is not None and not stall.get("failure"):
            summary += f"; then the watchdog found: {stall['verdict']}"
        return {"verdict": verdict, "summary": summary, "ended_by": None, "basis": basis}

    status = lab.get("status")
    if status == "failed":
        return {"verdict": "crashed", "ended_by": None, "basis": "lab.json",
                "summary": "the training loop marked the run failed (lab.json) and recorded no error"}
    ranks = d["ranks"]
    missing = [r for r in range(world_size) if r not in beats]
    if status == "finished" or (ranks and not missing and all(r["state"] == "done" for r in ranks)):
        return {**_finished(exp, d, lab, train_cfg, ckpts), "basis": "lab.json" if status else "heartbeats"}
    if not ranks:
        return {**_without_heartbeats(exp, d, train_cfg, ckpts), "basis": "metrics"}
    out = {"verdict": "running", "ended_by": None, "basis": "heartbeats"}
    gone, frozen, silent, alive = ([r for r in ranks if r["state"] == s] for s in ("gone", "frozen", "silent", "alive"))
    if gone:
        r = gone[0]
        return {**out, "verdict": "crashed", "summary": (
            f"{ranks_text([x['rank'] for x in gone])} ended without recording an error (rank {r['rank']}, pid "
            f"{r['pid']}, last seen {phase_text(r['phase'], r['step'])}): killed (SIGKILL, the OOM killer, a lost "
            "node), or, started without asrlab's launcher, it printed its traceback to its own output")}
    if frozen:
        r = frozen[0]
        return {**out, "verdict": "stalled", "summary": (
            f"{ranks_text([x['rank'] for x in frozen])} frozen: process alive (pid {r['pid']}) but no heartbeat "
            f"for {r['heartbeat_age_s']:.0f} s, last seen {phase_text(r['phase'], r['step'])} (stopped with SIGSTOP, "
            "or a C call holding the GIL); no stall report was written")}
    if not alive:
        return {**out, "verdict": "unknown", "summary": (
            f"no heartbeat for {min(x['heartbeat_age_s'] for x in silent):.0f} s from any rank, written on "
            f"{silent[0]['host']} (not this host: its processes cannot be checked from here): the run ended "
            "without a report, or its machines are unreachable")}
    said = [f"running, step {d['last_step'] or 0}" + (f" of {train_cfg['max_steps']}" if train_cfg.get("max_steps")
                                                      else "")]
    if silent:
        said.append(f"{ranks_text([x['rank'] for x in silent])}: no heartbeat for "
                    f"{max(x['heartbeat_age_s'] for x in silent):.0f} s (another host: frozen or gone)")
    if missing:
        said.append(f"{ranks_text(missing)}: no heartbeat")
    if d["stop_requested"]:
        said.append(f"a stop was requested ({exp / STOP_FILE}): it ends after the current step")
    return {**out, "summary": "; ".join(said)}


def _finished(exp: Path, d: dict, lab: dict, train_cfg: dict, ckpts: dict) -> dict:
    """Every rank done: finished by a limit of its config (or in its loop's word), else stopped on request."""
    step = d["last_step"]
    if lab.get("status") == "finished" or (not train_cfg and not d["stop_requested"]):
        return {"verdict": "finished", "ended_by": "the training loop",  # a user's loop: its own word for it
                "summary": "finished" + (f" at step {step}" if step is not None else "")}
    ended_by = _limit_reached(train_cfg, step, ckpts) if train_cfg else None
    if ended_by is None:
        limits = ", ".join(f"{k}={train_cfg[k]}" for k in ("max_steps", "max_epochs", "max_minutes")
                           if train_cfg.get(k))
        return {"verdict": "stopped", "ended_by": "a stop request",
                "summary": f"stopped on request at step {step}, before its limits ({limits or 'none'}); "
                           "it resumes from its last checkpoint"}
    return {"verdict": "finished", "ended_by": ended_by, "summary": f"finished at step {step} ({ended_by} reached)"}


def _limit_reached(train_cfg: dict, step: int | None, ckpts: dict) -> str | None:
    """Which of the config's limits ended the run: ``max_steps``, ``max_epochs`` (a checkpoint marker
    closes the last epoch), ``max_minutes`` (the training clock the newest checkpoint holds), or None."""
    max_steps, max_epochs = int(train_cfg.get("max_steps") or 0), int(train_cfg.get("max_epochs") or 0)
    if max_steps and step is not None and step >= max_steps:
        return f"max_steps={max_steps}"
    if max_epochs and any(c.get("epoch") == max_epochs - 1 and c.get("epoch_done") for c in ckpts["files"]):
        return f"max_epochs={max_epochs}"
    minutes = float(train_cfg.get("max_minutes") or 0)
    elapsed = ckpts.get("clock_s")
    if minutes and elapsed is not None and elapsed >= 60 * minutes:
        return f"max_minutes={minutes:g}"
    return None


def _without_heartbeats(exp: Path, d: dict, train_cfg: dict, ckpts: dict) -> dict:
    """No heartbeat (the stall watchdog was off: ``train.stall_timeout_s=0``): the metrics' last line."""
    last = None
    for name in metric_files(exp):
        m = read_metrics(exp, name)
        if m and m[-1].get("time"):
            last = max(last or 0.0, m[-1]["time"])
    step = d["last_step"]
    ended_by = _limit_reached(train_cfg, step, ckpts) if train_cfg else None
    if ended_by:
        return {"verdict": "finished", "ended_by": ended_by, "summary": f"finished at step {step} ({ended_by} reached)"}
    age = d["time"] - last if last is not None else None
    watched = float(train_cfg.get("stall_timeout_s") or 0) > 0
    if watched and age is not None and age > STALE_S and last >= (d["launched"] or 0):
        # the watchdog writes a heartbeat within a second of training's start: none at all, with steps
        # logged, is a process that ended in that second
        return {"verdict": "crashed", "ended_by": None, "summary": (
            f"the run ended without recording an error {age:.0f} s ago at step {step}, before its limits and "
            "before its stall watchdog wrote a heartbeat: killed (SIGKILL, the OOM killer), or it printed its "
            "traceback to its own output")}
    median = max((r["median_step_s"] for r in d["steps"]["ranks"]), default=0.0)
    if age is not None and age < max(60.0, 20 * median):
        return {"verdict": "running", "ended_by": None,
                "summary": f"running, step {step} (no heartbeats: the last metrics line is {age:.0f} s old)"}
    said = f"last metrics line {age:.0f} s ago, at step {step}" if age is not None else "no metrics"
    return {"verdict": "unknown", "ended_by": None, "summary": (
        f"no heartbeats (stall watchdog off?) and {said}, before its limits: stopped, killed or crashed; "
        "the run's own output says which")}

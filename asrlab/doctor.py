"""``asrlab doctor EXP``: what happened to a run, read from everything it left in its experiment folder.

:func:`diagnose` returns a plain dict (JSON-ready); :func:`format_diagnosis` turns it into the text a
person reads. Nothing here writes to EXP or talks to the run: a doctor may look at a live run.

The verdict is one of :data:`VERDICTS`. Files left by an earlier launch into the same EXP (an error
before a resume, an old halt report) are history, not the verdict: only those written since the latest
launch (``lab.json``'s ``started``, else the time the trainer wrote ``config.yaml``) decide it, and of
those the earliest (a stall's watchdog kills leave later errors on the other ranks, a rank's error
leaves the others stalled).
"""

from __future__ import annotations

import json
import math
import socket
import time
from collections import Counter
from pathlib import Path

import yaml

from .data.loader import mix_counts
from .errors import UsageError
from .files import read_jsonl
from .lab.timing import format_split, step_split
from .lab.state import checkpoint
from .lab.stall.errors import error_line, rank_errors
from .lab.stall.heartbeat import read_heartbeats
from .lab.state.ledger import coverage, coverage_report, ledger_ranks
from .lab.metrics import metric_files, rank_summary, read_metrics
from .lab.stall.watch import phase_text, rank_states, ranks_text
from .lab.stop import STOP_FILE

VERDICTS = ("finished", "running", "stopped", "stalled", "nonfinite_halt", "crashed", "unknown")
FAILED = ("stalled", "nonfinite_halt", "crashed", "unknown")
HEARTBEAT_STALE_S = 3.0   # 3x the watchdog's 1 s write interval: older, the rank's process is frozen or gone
LAUNCH_SLACK_S = 2.0      # a rank can record its error just before rank 0 rewrites config.yaml
FIRST = 5                 # keys, steps, ... named in the text before "+N more"

# any of these makes a folder an experiment folder
_RUN_FILES = ("config.yaml", "lab.json", "metrics", "heartbeat", "errors", "checkpoints", "ledger",
              "stall_report.json", "nonfinite")


def diagnose(exp: str | Path, now: float | None = None) -> dict:
    """Everything ``asrlab doctor`` says about the run in ``exp``, as a JSON-ready dict.

    Keys: ``verdict`` (one of :data:`VERDICTS`), ``summary`` (one sentence), ``ok`` (False when the run
    failed or its coverage is broken: ``asrlab doctor`` exits 1), ``world_size``, ``ranks`` (per rank: what
    it is doing or did last), ``error``, ``stall``, ``halt``, ``steps`` (per-rank timing and the spread),
    ``nonfinite``, ``loss_scale``, ``resumes``, ``coverage``, ``checkpoints``, ``history`` (failures of
    earlier launches). Raises :class:`UsageError` when ``exp`` is not a folder with a run in it.
    """
    exp = Path(exp)
    if not exp.is_dir():
        raise UsageError(f"{exp}: not a directory")
    if not any((exp / name).exists() for name in _RUN_FILES):
        raise UsageError(f"{exp}: no run there (none of {', '.join(_RUN_FILES)})")
    now = time.time() if now is None else now
    lab = _read_json(exp / "lab.json") or {}
    train_cfg = _train_config(exp)
    launched = _launch_time(exp, lab)
    rid, beats = _latest_heartbeats(exp)
    report = _read_json(exp / "stall_report.json")
    world_size = int(lab.get("world_size") or (report or {}).get("world_size") or
                     (max(beats) + 1 if beats else 0) or len(metric_files(exp)) or 1)

    rank0 = _kept(read_metrics(exp)) if (exp / "metrics" / "rank0.jsonl").exists() else []
    ckpts = checkpoint_integrity(exp)
    d: dict = {"exp": str(exp), "time": now, "world_size": world_size, "launched": launched or None,
               "config": {k: train_cfg.get(k) for k in ("max_steps", "max_epochs", "max_minutes", "nonfinite",
                                                        "uneven", "ledger", "stall_timeout_s")} if train_cfg else None,
               "last_step": rank0[-1]["step"] if rank0 else None,
               "stop_requested": (exp / STOP_FILE).exists()}
    d["ranks"] = [_rank_state(b, now) for _, b in sorted(beats.items())]
    d["steps"] = step_times(exp)
    d["corpora"] = corpus_throughput(exp)
    d["nonfinite"] = nonfinite_events(exp)
    d["loss_scale"] = loss_scale_history(rank0)
    d["resumes"] = resume_points(exp)
    d["coverage"] = ledger_coverage(exp, lab, ckpts)
    d["checkpoints"] = ckpts

    since = launched - LAUNCH_SLACK_S if launched else 0.0
    errors = rank_errors(exp, since, rid)
    halt = _halt(exp, since)
    stall = report if report is not None and report.get("time", 0) >= since else None
    d["error"] = _error_entry(errors[0], errors) if errors else None
    d["halt"] = halt
    d["stall"] = _stall_entry(exp, stall) if stall else None
    d["history"] = _history(exp, since, errors, halt, stall)
    d.update(_verdict(exp, d, lab, train_cfg, beats, world_size, errors, halt, stall, ckpts))
    broken = d["coverage"] is not None and d["coverage"]["broken"]
    d["ok"] = d["verdict"] not in FAILED and not broken
    return _clean(d)


# --------------------------------------------------------------------------- reading the run's files

def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or being replaced right now
        return None


def _train_config(exp: Path) -> dict:
    """The ``train`` section of the run's ``config.yaml`` (asrlab's trainer writes it; a user loop may not)."""
    try:
        return (yaml.safe_load((exp / "config.yaml").read_text()) or {}).get("train") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return {}


def _launch_time(exp: Path, lab: dict) -> float:
    """When the latest launch started: ``lab.json``'s ``started``, else when rank 0 wrote ``config.yaml``."""
    if lab.get("started"):
        return float(lab["started"])
    try:
        return (exp / "config.yaml").stat().st_mtime
    except OSError:
        return 0.0


def _latest_heartbeats(exp: Path) -> tuple[str | None, dict[int, dict]]:
    """The heartbeats of the newest launch (the run id of the newest file): ranks an earlier, wider launch
    left behind are not this run's."""
    beats = read_heartbeats(exp)
    if not beats:
        return None, {}
    rid = max(beats.values(), key=lambda b: b.get("time", 0)).get("run")
    return rid, {r: b for r, b in beats.items() if b.get("run") == rid}


def _kept(lines: list[dict]) -> list[dict]:
    """Metric lines of the steps that count: when the steps go back (a resume, a rollback), the lines of
    the steps trained again replace the earlier ones (as :func:`asrlab.lab.state.ledger.read_ledger` does)."""
    out: list[dict] = []
    for m in lines:
        while out and out[-1].get("step", 0) >= m.get("step", 0):
            out.pop()
        out.append(m)
    return out


def _process(pid: int | None, host: str | None, seen: float) -> str:
    """``"alive"``, ``"gone"``, or ``"unknown"`` (another host, or no pid) for the process of a heartbeat
    last written at ``seen``; a pid now held by a process started after that is someone else's."""
    if not pid or host != socket.gethostname():
        return "unknown"
    import psutil

    try:
        p = psutil.Process(pid)
        return "alive" if p.create_time() <= seen and p.status() != psutil.STATUS_ZOMBIE else "gone"
    except psutil.Error:
        return "gone"


def _rank_state(b: dict, now: float) -> dict:
    """One rank from its heartbeat: phase, step, how long, and whether its process is still there.

    ``state``: ``done``; ``alive`` (heartbeat fresh); ``frozen`` (stale, process still there: stopped, or
    a C call holding the GIL); ``gone`` (stale or not, the process has ended without finishing);
    ``silent`` (stale, on another host: which of the two cannot be told from here).
    """
    age = now - b.get("time", now)
    proc = _process(b.get("pid"), b.get("host"), b.get("time", now))
    if b.get("phase") == "done":
        state = "done"
    elif proc == "gone":
        state = "gone"
    elif age <= HEARTBEAT_STALE_S:
        state = "alive"
    else:
        state = "frozen" if proc == "alive" else "silent"
    return {"rank": b["rank"], "phase": b.get("phase"), "step": b.get("step"),
            "in_phase_s": round(max(0.0, (now if state == "alive" else b.get("time", now)) - b.get("since", now)), 1),
            "heartbeat_age_s": round(age, 1), "state": state, "detail": b.get("detail") or "",
            "pid": b.get("pid"), "host": b.get("host"), "completed": b.get("completed")}


def _halt(exp: Path, since: float) -> dict | None:
    """``EXP/nonfinite/halt.json`` (the trainer's halt report), with ``current``: written by this launch."""
    path = exp / "nonfinite" / "halt.json"
    h = _read_json(path)
    if h is None:
        return None
    return {**{k: h.get(k) for k in ("message", "rollbacks", "step", "rank", "kind", "module", "direction", "where",
                                     "keys", "loss", "grad_norm", "loss_scale", "saved")},
            "time": path.stat().st_mtime, "current": path.stat().st_mtime >= since}


def _error_entry(e: dict, errors: list[dict]) -> dict:
    tb = (e.get("traceback") or "").rstrip().splitlines()
    return {"rank": e["rank"], "type": e.get("type"), "message": e.get("message"), "time": e.get("time"),
            "phase": e.get("phase"), "step": e.get("step"), "usage": e.get("usage"), "line": error_line(e),
            "traceback_tail": tb[-8:], "also_failed": sorted({x["rank"] for x in errors} - {e["rank"]})}


def _stall_entry(exp: Path, report: dict) -> dict:
    _, ranks = rank_states(exp)  # the report's ranks, as the notebook's stall view reads them
    return {"verdict": report.get("verdict"), "time": report.get("time"), "timeout_s": report.get("timeout_s"),
            "failure": report.get("failure"), "report": str(exp / "stall_report.txt"),
            "ranks": [{k: r.get(k) for k in ("rank", "phase", "step", "in_phase_s", "detail", "host", "pid", "note")}
                      for r in ranks]}


def _history(exp: Path, since: float, errors: list[dict], halt: dict | None, stall: dict | None) -> list[str]:
    """Failures of earlier launches into this EXP (the run was resumed after them)."""
    out = []
    current = {(e["rank"], e.get("time")) for e in errors}
    for e in rank_errors(exp):
        if (e["rank"], e.get("time")) not in current:
            out.append(f"earlier launch: {error_line(e)}")
    if halt is not None and not halt["current"]:
        out.append(f"earlier launch: {halt['message']}")
    report = _read_json(exp / "stall_report.json")
    if report is not None and stall is None:
        out.append(f"earlier launch stalled: {report.get('verdict')}")
    return out


# --------------------------------------------------------------------------- the verdict

def _verdict(exp: Path, d: dict, lab: dict, train_cfg: dict, beats: dict[int, dict], world_size: int,
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
                d["error"] = _error_entry(failure, [failure])
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
    if watched and age is not None and age > HEARTBEAT_STALE_S and last >= (d["launched"] or 0):
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


# --------------------------------------------------------------------------- the sections

def step_times(exp: str | Path) -> dict:
    """Per rank: steps, median step time, share of it waiting for data (:func:`rank_summary`, the first step
    left out), and the spread: the slowest rank and how much slower than the fastest its median step is."""
    missing = None
    try:
        ranks = rank_summary(exp)
    except KeyError as e:  # a loop's metrics without the trainer's timing keys
        ranks, missing = [], f"the metrics lines have no {e}"
    ranks = ranks or _heartbeat_times(exp)  # a loop without asrlab's metrics: its heartbeat's time per phase
    if not ranks and missing:
        return {"ranks": [], "spread": None, "missing": missing}
    out: dict = {"ranks": [{**r, "median_step_s": round(r["median_step_s"], 6),
                            "data_wait_share": round(r["data_wait_share"], 4)} for r in ranks], "spread": None}
    for r in out["ranks"]:
        if r.get("source") is None:  # from metrics lines: where the steps' wall clock went
            try:
                r["split"] = step_split(read_metrics(exp, f"rank{r['rank']}")[1:])
            except KeyError:  # a loop's metrics without the timing keys
                r["split"] = None
    if len(ranks) > 1:
        slow = max(ranks, key=lambda r: r["median_step_s"])
        fast = min(ranks, key=lambda r: r["median_step_s"])
        out["spread"] = {"slowest_rank": slow["rank"], "fastest_rank": fast["rank"],
                         "slowest_s": round(slow["median_step_s"], 6), "fastest_s": round(fast["median_step_s"], 6),
                         "ratio": round(slow["median_step_s"] / max(1e-9, fast["median_step_s"]), 3)}
    return out


def corpus_throughput(exp: str | Path) -> dict | None:
    """Per corpus of a mixed run, over every rank's metrics (the steps that count): utterances, audio
    hours, and audio seconds per second of loader work (reading and decoding), the slowest named: a
    corpus far slower than the rest starves the ranks that draw it. None for a run on one list."""
    total = mix_counts([m for name in metric_files(exp) for m in _kept(read_metrics(exp, name))])
    if not total:
        return None
    out = {c: {"utts": n, "hours": round(a / 3600, 4), "audio_per_load_s": round(a / w, 1) if w > 0 else None}
           for c, (n, a, w) in sorted(total.items())}
    rated = [c for c in out if out[c]["audio_per_load_s"]]
    return {"corpora": out, "slowest": min(rated, key=lambda c: out[c]["audio_per_load_s"]) if len(rated) > 1 else None}


def _heartbeat_times(exp: Path) -> list[dict]:
    """Per rank, from the time a StallWatch heartbeat kept per phase (a loop without asrlab's metrics):
    steps done, mean seconds per step (``median_step_s`` holds the mean), share of it waiting for data."""
    out = []
    for rank, b in sorted(read_heartbeats(exp).items()):
        spent = {p: s for p, s in (b.get("phase_s") or {}).items() if p not in ("start", "epoch_end", "done", "eval")}
        steps = b.get("completed", 0)
        if steps and sum(spent.values()) > 0:
            total = sum(spent.values())
            out.append({"rank": rank, "steps": steps, "median_step_s": total / steps,
                        "data_wait_share": spent.get("data", 0.0) / total, "source": "heartbeat (mean)"})
    return out


def nonfinite_events(exp: str | Path) -> dict:
    """The replay bundles of non-finite steps (``EXP/nonfinite/step*-rank*/``: step, kind, module, direction,
    utterance ids) and the steps any rank's metrics marked non-finite (its loss, or gradients; fp16
    overflows the loss scaler handles are counted in :func:`loss_scale_history`). Every rank's: a rank's
    own non-finite loss is marked on that rank only."""
    events = []
    for report in sorted(Path(exp).glob("nonfinite/step*-rank*/report.json")):
        m = _read_json(report)
        if m is None:
            continue
        events.append({**{k: m.get(k) for k in ("step", "rank", "epoch", "kind", "module", "direction", "where",
                                                "keys", "loss", "grad_norm", "loss_scale", "precision")},
                       "bundle": str(report.parent)})
    steps = sorted({m["step"] for name in metric_files(exp) for m in read_metrics(exp, name)
                    if m.get("nonfinite") in ("loss", "grad")})
    return {"events": events, "steps": steps}


def loss_scale_history(rank0: list[dict]) -> dict | None:
    """Rank 0's loss scale over the steps that count (first, min, last, how often it changed) and the
    skipped steps by kind (``scaler``: fp16 overflow the scaler handles; ``loss``/``grad``: not finite)."""
    if not rank0:
        return None
    scales = [m["loss_scale"] for m in rank0 if m.get("loss_scale") is not None]
    kinds = Counter(m.get("nonfinite") for m in rank0 if m.get("nonfinite"))
    out = {"skipped": rank0[-1].get("skipped", 0), "skipped_by_kind": dict(kinds),
           "rollbacks": rank0[-1].get("rollbacks", 0)}
    if scales:
        out.update(first=scales[0], min=min(scales), last=scales[-1],
                   changes=sum(1 for a, b in zip(scales, scales[1:]) if a != b))
    return out


def resume_points(exp: str | Path) -> dict:
    """Where the run went back to a checkpoint: the ledger's ``resumed_from`` lines (a resume or a
    rollback), per rank; and where rank 0's metrics went back (only resumes that lost steps show there)."""
    exp = Path(exp)
    per_rank = {r: [x["resumed_from"] for x in read_jsonl(exp / "ledger" / f"rank{r}.jsonl") if "resumed_from" in x]
                for r in ledger_ranks(exp)}
    steps = sorted({s for v in per_rank.values() for s in v})
    raw = read_metrics(exp) if (exp / "metrics" / "rank0.jsonl").exists() else []
    redone = [{"after_step": a["step"], "back_to_step": b["step"] - 1}
              for a, b in zip(raw, raw[1:]) if b["step"] <= a["step"]]
    return {"ledger": bool(per_rank), "resumed_from": steps, "per_rank": {str(r): v for r, v in per_rank.items()},
            "steps_trained_again": redone}


def _expected_keys(exp: Path, lab: dict) -> tuple[set[str] | None, str]:
    """The keys each epoch should train on once: ``lab.json``'s ``epoch_keys`` (a file of keys, one a line,
    or a JSON list), else None (judged against the keys seen in any epoch)."""
    ref = lab.get("epoch_keys")
    if not ref:
        return None, "every key seen in any epoch; the run does not record the keys it expects"
    path = Path(ref) if Path(ref).is_absolute() else exp / ref
    try:
        text = path.read_text()
    except OSError:
        return None, f"every key seen in any epoch; lab.json's epoch_keys {path} cannot be read"
    keys = json.loads(text) if path.suffix == ".json" else [ln.split()[0] for ln in text.splitlines() if ln.strip()]
    return set(keys), f"the {len(keys)} keys of {path}"


def ledger_coverage(exp: str | Path, lab: dict | None = None, ckpts: dict | None = None) -> dict | None:
    """Per epoch of the ledger: trained exactly once, else the keys repeated and skipped.

    An epoch is complete when the ledger goes on into a later one or a checkpoint marker closes it. A
    complete epoch must hold every expected key exactly once; an incomplete one no key twice. The
    expected keys are ``lab.json``'s ``epoch_keys`` when the run names them; otherwise (asrlab's trainer
    does not record its data list) every key seen in any epoch of the run, so a key left out of every
    epoch, or of the only epoch, cannot be seen. Returns None without a ledger.
    """
    exp = Path(exp)
    if not ledger_ranks(exp):
        return None
    cov = coverage(exp)
    expected, against = _expected_keys(exp, lab or {})
    if expected is None:
        expected = set().union(*cov.values()) if cov else set()
    closed = {c["epoch"] for c in (ckpts or checkpoint_integrity(exp))["files"] if c.get("epoch_done")}
    epochs = []
    for e in sorted(cov):
        # closed by a checkpoint marker (asrlab's trainer), followed by a later epoch, or the last epoch of a
        # loop that says it finished (lab.json) holding every expected key
        ended = (lab or {}).get("status") == "finished" and e == max(cov)
        complete = e in closed or any(later > e for later in cov) or (ended and expected <= set(cov[e]))
        r = coverage_report(exp, e, expected, FIRST, cov)
        skipped = r["skipped_count"] if complete else 0  # an epoch still going has not reached them yet
        epochs.append({"epoch": e, "complete": complete, "keys": len(cov[e]), "once": r["once"],
                       "repeated": r["repeated_count"], "repeated_keys": dict(r["repeated"]),
                       "skipped": skipped, "skipped_keys": r["skipped"] if complete else [],
                       "unexpected": r["unknown_count"], "unexpected_keys": r["unknown"],
                       "exactly_once": r["exactly_once"] if complete else None})
    broken = any(x["repeated"] or (x["complete"] and not x["exactly_once"]) for x in epochs)
    return {"expected": len(expected), "against": against, "epochs": epochs, "broken": broken}


def checkpoint_integrity(exp: str | Path) -> dict:
    """Each checkpoint: its marker, its bytes against the marker's SHA-256; the newest a resume would
    load (:func:`asrlab.lab.state.checkpoint.load_latest`), and the training clock it holds."""
    d = Path(exp) / "checkpoints"
    files = []
    for m in checkpoint.list_checkpoints(d):
        path = d / m["file"]
        entry = {"step": m["step"], "epoch": m.get("epoch"), "epoch_done": m.get("epoch_done"), "file": m["file"],
                 "marker": m["complete"], "sha256_ok": None}
        try:
            entry["bytes"] = path.stat().st_size
            if m["complete"]:
                entry["sha256_ok"] = checkpoint.sha256(path) == m.get("sha256")
        except FileNotFoundError:  # a live run's keep_last removed it just now
            continue
        entry["state"] = ("ok" if entry["sha256_ok"] else "no marker (write interrupted: never loaded)"
                          if not m["complete"] else "SHA-256 mismatch (truncated or corrupt: never loaded)")
        files.append(entry)
    partial = sorted(p.name for p in d.glob("*.tmp")) if d.is_dir() else []
    newest = clock = None
    if any(f["sha256_ok"] for f in files):
        found = checkpoint.load_latest(d)
        if found is not None:
            state, marker = found
            newest = marker["file"]
            clock = (state.get("clock") or {}).get("elapsed_s")
    return {"files": files, "partial_writes": partial, "newest_loadable": newest, "clock_s": clock}


# --------------------------------------------------------------------------- output

def _clean(x: object) -> object:
    """JSON-ready: inf and nan as strings (strict JSON has neither)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _few(items: list, total: int | None = None) -> str:
    total = len(items) if total is None else total
    more = total - min(len(items), FIRST)
    return ", ".join(map(str, items[:FIRST])) + (f" (+{more} more)" if more > 0 else "")


def _rank_line(r: dict, flags: bool = True) -> str:
    state = {"alive": "", "done": "", "gone": " [process gone]", "frozen": " [FROZEN: process alive, heartbeat stale]",
             "silent": " [no heartbeat: frozen or gone]"}[r["state"]]
    stale = f", heartbeat {r['heartbeat_age_s']:g} s old" if r["state"] not in ("alive", "done") else ""
    if not flags:  # the verdict came from a report: a stale heartbeat there says nothing more
        state = stale = ""
    detail = f"; {r['detail']}" if r.get("detail") else ""
    took = "" if r["state"] == "done" else f" for {r['in_phase_s']:g} s"
    return (f"  rank {r['rank']} ({r.get('host')}, pid {r.get('pid')}): {phase_text(r['phase'], r['step'])}"
            f"{took}{stale}{detail}{state}")


def _next(d: dict) -> str | None:
    """What to do about the verdict, in one line."""
    ckpt = d["checkpoints"]["newest_loadable"]
    resume = f"--resume auto continues from {ckpt}" if ckpt else "no checkpoint loads, so it starts over"
    v = d["verdict"]
    if v == "stalled":
        return (f"read the stacks in {(d['stall'] or {}).get('report') or 'the ranks named above'}; a rank waiting "
                "for data points at its loader or storage, one blocked in a collective at the rank named first")
    if v == "crashed":
        return f"fix the cause, then run the same command again ({resume})"
    if v == "nonfinite_halt":
        bundle = (d["halt"] or {}).get("saved") or next((e["bundle"] for e in d["nonfinite"]["events"]), None)
        return f"replay the saved step in each precision: asrlab.lab.numerics.stats.replay('{bundle}')" if bundle else None
    if v == "stopped":
        return f"run the same command again to continue ({resume})"
    if v == "unknown":
        return "the run's own output (its log, the scheduler's) says how it ended"
    return None


def format_diagnosis(d: dict) -> str:
    """The text of ``asrlab doctor``: the verdict first, then each section."""
    lines = [f"{d['verdict'].upper()}: {d['summary']}", f"  experiment: {d['exp']}"]
    hint = _next(d)
    if hint:
        lines.append(f"  next: {hint}")
    if d["error"]:
        e = d["error"]
        lines += ["", f"first error: {e['line']}"]
        if e["also_failed"]:
            lines.append(f"  {ranks_text(e['also_failed'])} failed after it (errors in {d['exp']}/errors/)")
        if not e.get("usage"):
            lines += ["  " + ln for ln in e["traceback_tail"]]
    if d["stall"]:
        lines += ["", f"stall report ({d['stall']['report']}): {d['stall']['verdict']}"]
        for r in d["stall"]["ranks"]:
            if r.get("phase") is None:
                lines.append(f"  rank {r['rank']}: {r.get('note') or 'no heartbeat'}")
            else:
                lines.append(f"  rank {r['rank']} ({r.get('host')}, pid {r.get('pid')}): "
                             f"{phase_text(r['phase'], r['step'])} for {r['in_phase_s']:g} s"
                             + (f"; {r['detail']}" if r.get("detail") else ""))
    elif d["ranks"]:
        lines += ["", "ranks (last heartbeats):"] + [_rank_line(r, d["basis"] == "heartbeats") for r in d["ranks"]]
    for h in d["history"]:
        lines.append(f"  ({h})")

    st = d["steps"]
    lines += ["", "step times (per rank):"]
    if not st["ranks"]:
        lines.append(f"  {st.get('missing') or 'no metrics'}")
    for r in st["ranks"]:
        how = "mean (heartbeat)" if r.get("source") else "median"
        lines.append(f"  rank {r['rank']}: steps {r['steps']}, {how} {r['median_step_s']:.4f} s/step, "
                     f"{100 * r['data_wait_share']:.0f}% of it waiting for data")
        if r.get("split"):
            lines.append(f"    wall clock: {format_split(r['split'])}")
    if st["spread"]:
        s = st["spread"]
        lines.append(f"  spread: rank {s['slowest_rank']} slowest ({s['slowest_s']:.4f} s), {s['ratio']:.2f}x rank "
                     f"{s['fastest_rank']} ({s['fastest_s']:.4f} s)")

    mix = d.get("corpora")
    if mix:
        lines += ["", "corpora (all ranks; audio seconds per second of loader work):"]
        for c, x in mix["corpora"].items():
            lines.append(f"  {c}: {x['utts']} utterances, {x['hours']:.3f} h, "
                         f"{x['audio_per_load_s'] if x['audio_per_load_s'] is not None else '-'} s/s"
                         + ("  <- slowest to load" if c == mix["slowest"] else ""))

    nf = d["nonfinite"]
    lines += ["", "non-finite steps:" + ("" if nf["events"] or nf["steps"] else " none")]
    if d["halt"] and d["verdict"] != "nonfinite_halt":  # (the verdict above says it otherwise)
        lines.append(f"  halt{'' if d['halt']['current'] else ' (earlier launch)'}: {d['halt']['message']}")
    for e in nf["events"]:
        keys = e.get("keys") or []
        lines.append(f"  step {e['step']}, rank {e['rank']}: {e['kind']} not finite, first in "
                     f"{e.get('where') or e.get('module')}; utterances {_few(keys)}")
        lines.append(f"    bundle: {e['bundle']}")
    unsaved = [s for s in nf["steps"] if s not in {e["step"] for e in nf["events"]}]
    if unsaved:
        lines.append(f"  also not finite (rank 0's metrics, no bundle): steps {_few(unsaved)}")

    ls = d["loss_scale"]
    if ls:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(ls["skipped_by_kind"].items())) or "none"
        scale = (f"first {ls['first']:g}, min {ls['min']:g}, last {ls['last']:g}, {ls['changes']} changes"
                 if "first" in ls else "not logged")
        lines += ["", f"loss scale: {scale}", f"  skipped steps: {ls['skipped']} (in the steps that count: {kinds})"
                  + (f"; rollbacks: {ls['rollbacks']}" if ls["rollbacks"] else "")]

    rs = d["resumes"]
    lines += ["", "resumes: " + (", ".join(f"from step {s}" for s in rs["resumed_from"]) if rs["resumed_from"] else
                                 "none" if rs["ledger"] else "no ledger (train.ledger=false)")]
    for x in rs["steps_trained_again"]:
        lines.append(f"  metrics: after step {x['after_step']} training went back to step {x['back_to_step']}")

    cov = d["coverage"]
    if cov is None:
        lines += ["", "coverage: no ledger (--ledger / train.ledger=true records which utterances each step used)"]
    else:
        lines += ["", f"coverage (ledger; expected: {cov['against']}):" + (" BROKEN" if cov["broken"] else "")]
        for e in cov["epochs"]:
            if e["complete"] and e["exactly_once"]:
                lines.append(f"  epoch {e['epoch']}: complete, {e['keys']} keys, each exactly once")
                continue
            parts = [f"{e['keys']} keys" + ("" if e["complete"] or e["repeated"] else " so far, none twice")]
            if e["repeated"]:
                parts.append(f"{e['repeated']} repeated ("
                             + _few([f"{k} x{n}" for k, n in e["repeated_keys"].items()], e["repeated"]) + ")")
            if e["skipped"]:
                parts.append(f"{e['skipped']} skipped ({_few(e['skipped_keys'], e['skipped'])})")
            if e["unexpected"]:
                parts.append(f"{e['unexpected']} not expected ({_few(e['unexpected_keys'], e['unexpected'])})")
            lines.append(f"  epoch {e['epoch']}: {'complete' if e['complete'] else 'incomplete'}, " + ", ".join(parts))
        if cov["broken"] and (d.get("config") or {}).get("uneven") == "stop" and d["world_size"] > 1:
            lines.append("  (uneven=stop ends an epoch on every rank when the first runs out: the others' last "
                         "utterances are skipped that epoch)")

    ck = d["checkpoints"]
    lines += ["", f"checkpoints ({len(ck['files'])}):" + ("" if ck["files"] else " none")]
    for c in ck["files"]:
        lines.append(f"  {c['file']}: epoch {c['epoch']}{' (done)' if c.get('epoch_done') else ''}, {c['state']}")
    for p in ck["partial_writes"]:
        lines.append(f"  {p}: a write that never finished")
    if ck["files"]:
        lines.append(f"  newest loadable: {ck['newest_loadable'] or 'NONE (a resume starts from scratch)'}")
    return "\n".join(lines) + "\n"


__all__ = ["FAILED", "VERDICTS", "checkpoint_integrity", "diagnose", "format_diagnosis", "ledger_coverage",
           "loss_scale_history", "nonfinite_events", "resume_points", "step_times"]

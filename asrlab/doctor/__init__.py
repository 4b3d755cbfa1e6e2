"""``asrlab doctor PATH ...``: what happened to a run, read from whatever it left: asrlab's run folder (several,
one per node), a job's logs, a toolkit's folder (its logs, TensorBoard event files, Hugging Face Trainer's state,
Lightning's metrics.csv, checkpoints).

:func:`diagnose` is the one entry: a plain dict (JSON-ready) with the same keys (:data:`SCHEMA`) whatever was read;
:func:`format_diagnosis` turns it into the text a person reads. Nothing here writes to what it reads or talks to
the run: a doctor may look at a live run.

The verdict is one of :data:`VERDICTS`. Files left by an earlier launch into the same EXP (an error
before a resume, an old halt report) are history, not the verdict: only those written since the latest
launch (``lab.json``'s ``started``, else the time the trainer wrote ``config.yaml``) decide it, and of
those the earliest (a stall's watchdog kills leave later errors on the other ranks, a rank's error
leaves the others stalled).
"""

from __future__ import annotations

import time
from pathlib import Path

from ..lab import layout
from ..lab.layout import is_run
from ..errors import UsageError
from ..lab.metrics import metric_files, read_metrics
from ..lab.stall.heartbeat import rank_state
from ..lab.stop import STOP_FILE
from .read import (
    error_entry,
    halt_report,
    history,
    json_ready,
    kept_steps,
    latest_heartbeats,
    launch_time,
    read_json,
    stall_entry,
    train_config,
)
from ..lab.stall.errors import rank_errors
from .timeline import culprit

# render and sections import torch (via lab.timing, lab.state): loaded on first use, so that a wrong folder is
# said at once and ``asrlab doctor`` starts without it
_LAZY = {
    "format_diagnosis": "render",
    "checkpoint_integrity": "sections",
    "corpus_throughput": "sections",
    "ledger_coverage": "sections",
    "loss_scale_history": "sections",
    "nonfinite_events": "sections",
    "resume_points": "sections",
    "step_times": "sections",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


VERDICTS = (
    "finished",
    "running",
    "stopped",
    "stalled",
    "nonfinite_halt",
    "nonfinite",
    "crashed",
    "killed",
    "out_of_memory",
    "unknown",
    "no_failure_seen",
)
FAILED = ("stalled", "nonfinite_halt", "nonfinite", "crashed", "killed", "out_of_memory", "unknown")
LAUNCH_SLACK_S = 2.0  # a rank can record its error just before rank 0 rewrites config.yaml


# the keys of every diagnosis, whatever was read (None where the paths held nothing of the kind): what happened,
# then asrlab's run folder's sections, then a log's and a toolkit folder's
SCHEMA = (
    "read", "paths", "verdict", "summary", "ok", "culprit", "first", "history", "world_size", "ranks", "nonfinite",
    "resumes", "checkpoints", "warnings", "series", "sources",
    "exp", "time", "launched", "config", "last_step", "stop_requested", "steps", "corpora", "loss_scale", "coverage",
    "coverage_not_measured", "error", "halt", "stall", "ended_by", "basis", "job_output", "nodes",
    "files", "lines", "formats", "events", "hang", "step_spread", "read_s",
)  # fmt: skip


def diagnose(paths, now: float | None = None) -> dict:
    """What ``asrlab doctor PATH ...`` says, as a JSON-ready dict with the keys of :data:`SCHEMA`: run folders
    (several: one per node, read as one run), else logs and toolkit folders. Raises :class:`UsageError` for
    nothing there, or for run folders beside other paths."""
    paths = [str(paths)] if isinstance(paths, (str, Path)) else [str(p) for p in paths]
    if not paths:
        raise UsageError("nothing to read: give a run's folder, its logs, or a toolkit's folder")
    for p in paths:
        if p != "-" and not Path(p).exists():
            raise UsageError(
                f"{p}: not a directory, nothing is there (give a run's folder, what asrlab train got as --exp, or "
                "the run's log files)"
            )
    from .logs.run import log_files
    from .sources import found

    empty = [p for p in paths if Path(p).is_dir() and not is_run(p) and not log_files([p]) and not found([p])]
    if empty:
        raise UsageError(
            f"{empty[0]}: no run there (none of asrlab's {', '.join(layout.RUN_FILES)}), no log files (*.log, *.txt, "
            "*.out, log-train-*, rank*) and no TensorBoard event files, trainer_state.json or metrics.csv"
        )
    runs = [p != "-" and is_run(p) for p in paths]
    if not any(runs):
        from .logs import diagnose_logs

        return conform(diagnose_logs(paths), "logs", paths)
    if not all(runs):
        bad = ", ".join(p for p, r in zip(paths, runs) if not r)
        raise UsageError(f"give run folders or logs, not both: {bad} is not a run folder")
    if len(paths) == 1:
        return conform(diagnose_run(paths[0], now), "run folder", paths)
    import tempfile

    from .merge import merge_runs

    d = diagnose_run(merge_runs(paths, tempfile.mkdtemp(prefix="asrlab-doctor-")), now)
    d["nodes"] = paths
    return conform(d, "run folder", paths)


def conform(d: dict, read: str, paths: list[str]) -> dict:
    """``d`` with every key of :data:`SCHEMA` (None where not read), in its order; a key outside it is a bug."""
    extra = set(d) - set(SCHEMA)
    assert not extra, f"keys outside the doctor's schema: {sorted(extra)}"
    d = {**d, "read": read, "paths": paths}
    return {k: d.get(k) for k in SCHEMA}


def diagnose_run(exp: str | Path, now: float | None = None) -> dict:
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
    if not is_run(exp):
        raise UsageError(
            f"{exp}: no run there (none of asrlab's {', '.join(layout.RUN_FILES)}); a toolkit's folder is read "
            "as its logs: asrlab doctor FOLDER"
        )
    from .sections import (
        checkpoint_integrity,
        corpus_throughput,
        ledger_coverage,
        loss_scale_history,
        nonfinite_events,
        resume_points,
        step_times,
    )
    from .job_output import read_job_output
    from .verdict import verdict

    now = time.time() if now is None else now
    lab = read_json(layout.lab(exp)) or {}
    train_cfg = train_config(exp)
    launched = launch_time(exp, lab)
    rid, beats = latest_heartbeats(exp)
    report = read_json(layout.stall_report(exp))
    world_size = int(
        lab.get("world_size")
        or (report or {}).get("world_size")
        or (max(beats) + 1 if beats else 0)
        or len(metric_files(exp))
        or 1
    )

    rank0 = kept_steps(read_metrics(exp)) if layout.metrics(exp, "rank0").exists() else []
    ckpts = checkpoint_integrity(exp)
    d: dict = {
        "exp": str(exp),
        "time": now,
        "world_size": world_size,
        "launched": launched or None,
        "config": {
            k: train_cfg.get(k)
            for k in ("max_steps", "max_epochs", "max_minutes", "nonfinite", "uneven", "ledger", "stall_timeout_s")
        }
        if train_cfg
        else None,
        "last_step": rank0[-1]["step"] if rank0 else None,
        "stop_requested": (exp / STOP_FILE).exists(),
    }
    d["ranks"] = [rank_state(b, now) for _, b in sorted(beats.items())]
    d["steps"] = step_times(exp)
    d["corpora"] = corpus_throughput(exp)
    d["nonfinite"] = nonfinite_events(exp)
    d["loss_scale"] = loss_scale_history(rank0)
    d["resumes"] = resume_points(exp)
    d["coverage"] = ledger_coverage(exp, lab, ckpts)
    if lab.get("coverage_not_measured"):  # the loop's batches carry no ids it could find: nothing to judge
        d["coverage"], d["coverage_not_measured"] = None, lab["coverage_not_measured"]
    d["checkpoints"] = ckpts

    since = launched - LAUNCH_SLACK_S if launched else 0.0
    errors = rank_errors(exp, since, rid)
    halt = halt_report(exp, since)
    stall = report if report is not None and report.get("time", 0) >= since else None
    d["error"] = error_entry(errors[0], errors) if errors else None
    d["halt"] = halt
    d["stall"] = stall_entry(exp, stall) if stall else None
    d["history"] = history(exp, since, errors, halt, stall)
    v = verdict(exp, d, lab, train_cfg, beats, world_size, errors, halt, stall, ckpts)
    event = v.pop("event", None)  # the folder's first failure; the job's output joins it on one timeline
    d.update(v)
    event = read_job_output(exp, d, event)
    d["culprit"] = culprit(event)
    broken = d["coverage"] is not None and d["coverage"]["broken"]
    d["ok"] = d["verdict"] not in FAILED and not broken
    return json_ready(d)


__all__ = [
    "FAILED",
    "VERDICTS",
    "is_run",
    "checkpoint_integrity",
    "SCHEMA",
    "conform",
    "diagnose",
    "diagnose_run",
    "format_diagnosis",
    "ledger_coverage",
    "loss_scale_history",
    "nonfinite_events",
    "resume_points",
    "step_times",
]

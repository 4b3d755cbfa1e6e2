"""asrlab's run folder (what ``asrlab train``, a loop of asrlab's parts or ``asrlab watch`` left), as a source:
each part's reading gathered into the folder's sections, and from them the failure events (:mod:`.run_events`).
Only files written since the latest launch decide the verdict; an earlier launch's are history."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from ...data.plan import corpus_throughput
from ...files import read_json
from ...lab import layout
from ...lab.metrics import kept_steps, loss_scale_history, rank_metrics, step_times, went_back
from ...lab.numerics.events import nonfinite_summary, read_halt
from ...lab.stall.errors import LAUNCH_SLACK_S, error_summary, launch
from ...lab.stall.heartbeat import latest_heartbeats, rank_state
from ...lab.stall.report import stall_summary
from ...lab.state.checkpoint import integrity
from ...lab.state.ledger import epoch_coverage_report, resumed_from
from ...lab.stop import STOP_FILE
from ..timeline import resumes
from . import Reading
from .run_events import history, timeline_of

NAME = "run folder"


def inner_runs(exp: Path) -> list[Path]:
    """asrlab's own run folders of the job ``asrlab watch`` kept in ``exp``: those directly inside ``exp``, else the
    one its command's ``--exp`` names (``asrlab train --exp X``, a loop of the parts given one)."""
    lab = read_json(Path(exp) / layout.LAB) or {}
    cmd = [str(a) for a in lab.get("watched") or []]
    if not cmd:  # not a watch's folder: a run folder inside another run's is a run of its own
        return []
    inside = sorted(p for p in exp.iterdir() if p.is_dir() and layout.is_run(p))
    if inside:
        return inside
    named = [b for a, b in zip(cmd, cmd[1:]) if a == "--exp"] + [a[6:] for a in cmd if a.startswith("--exp=")]
    base = Path(lab.get("cwd") or ".")
    return [base / n for n in named if (base / n).resolve() != exp.resolve() and layout.is_run(base / n)]


def read(exp: Path, now: float | None = None) -> Reading:
    """The run in ``exp``: its events, its outcome, and its sections (the diagnosis's run-folder keys); ``inside``:
    the watched job's own run folders (:func:`inner_runs`). Each part reads its files once, in turn (one module of
    asrlab.lab after another: the order a reader follows)."""
    now = time.time() if now is None else now
    train_cfg, inside = train_config(exp), inner_runs(exp)
    lab = read_json(Path(exp) / layout.LAB) or {}
    report = read_json(Path(exp) / layout.STALL_REPORT)
    rid, beats = latest_heartbeats(exp)
    ranks = [rank_state(b, now) for _, b in sorted(beats.items())]
    # what this launch recorded decides the verdict; the rest is history
    launched, recorded, errors = launch(exp, lab, beats, rid)
    error = error_summary(errors[0], errors) if errors else None
    since = launched - LAUNCH_SLACK_S if launched else 0.0
    stall = report if report is not None and report.get("time", 0) >= since else None
    stalled = stall_summary(exp, stall) if stall else None
    metrics = rank_metrics(exp)  # each rank's lines, read once
    rank0 = kept_steps(metrics.get("rank0", []))
    loss_scale, trained_again = loss_scale_history(rank0), went_back(metrics.get("rank0", []))
    steps = step_times(metrics, beats)
    corpora = corpus_throughput([m for lines in metrics.values() for m in kept_steps(lines)])
    ckpts = integrity(exp, clock_of=_elapsed)
    per_rank = resumed_from(exp)
    closed = {c["epoch"] for c in ckpts["files"] if c.get("epoch_done")}
    # None where the loop's batches carry no ids it could find: nothing to judge
    coverage = None if lab.get("coverage_not_measured") else epoch_coverage_report(exp, lab, closed)
    nonfinite, halt = nonfinite_summary(exp, metrics), read_halt(exp, since)
    world_size = lab.get("world_size") or (report or {}).get("world_size") or (max(beats) + 1 if beats else 0)
    world_size = int(world_size or len(metrics) or 1)
    keep = ("max_steps", "max_epochs", "max_minutes", "nonfinite", "uneven", "ledger", "stall_timeout_s")
    back_to, by_rank = sorted({s for v in per_rank.values() for s in v}), {str(r): v for r, v in per_rank.items()}
    resumed = resumes(ledger=bool(per_rank), resumed_from=back_to, per_rank=by_rank, trained_again=trained_again)
    d: dict = {
        "exp": str(exp), "time": now, "world_size": world_size, "launched": launched or None,
        "config": {k: train_cfg.get(k) for k in keep} if train_cfg else None,
        "last_step": rank0[-1]["step"] if rank0 else None, "stop_requested": (exp / STOP_FILE).exists(),
        "ranks": ranks, "steps": steps, "corpora": corpora, "nonfinite": nonfinite, "loss_scale": loss_scale,
        "resumes": resumed, "coverage": coverage, "coverage_not_measured": lab.get("coverage_not_measured"),
        "checkpoints": ckpts, "error": error, "halt": halt, "stall": stalled,
    }  # fmt: skip
    past = history(lab, recorded, errors, halt, report, stall)
    events, outcome = timeline_of(exp, d, lab, train_cfg, metrics, beats, errors, stall)
    return Reading(NAME, [str(exp)], events=events, outcome=outcome, sections=d, history=past, inside=inside)


def _elapsed(state: dict, file: str) -> float | None:
    from ...lab.state.run_state import elapsed_s  # torch, loaded by now to read the checkpoint

    return elapsed_s(state, file)


def train_config(exp: Path) -> dict:
    """The ``train`` section of the run's ``config.yaml`` (asrlab's trainer writes it; a user loop may not)."""
    try:
        return (yaml.safe_load((Path(exp) / layout.CONFIG).read_text()) or {}).get("train") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return {}

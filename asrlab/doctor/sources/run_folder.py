"""asrlab's run folder (what ``asrlab train``, a loop of asrlab's parts or ``asrlab watch`` left), as a source:
each part's own reading of its files (heartbeats, metrics, checkpoints, ledger, non-finite log, rank errors,
halt and stall reports) gathered into the folder's sections, and from them the failure events of the one
timeline (:mod:`.run_events`).

Files left by an earlier launch into the same folder (an error before a resume, an old halt report) are history,
not the verdict: only those written since the latest launch (``lab.json``'s ``started``, else the time the trainer
wrote ``config.yaml``) decide it.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from ...data.plan import corpus_throughput
from ...files import read_json
from ...lab import layout
from ...lab.metrics import kept_steps, loss_scale_history, rank_metrics, step_times, went_back
from ...lab.numerics.events import nonfinite_summary, read_halt
from ...lab.stall.errors import ended_from_outside, error_line, error_summary, of_launch, rank_errors
from ...lab.stall.heartbeat import latest_heartbeats, rank_state
from ...lab.stall.report import stall_summary
from ...lab.state.checkpoint import integrity
from ...lab.state.ledger import epoch_coverage_report, resumed_from
from ...lab.stop import STOP_FILE
from ..logs.words import exit_signal
from ..timeline import resumes
from . import Reading
from .run_events import timeline_of

NAME = "run folder"
LAUNCH_SLACK_S = 2.0  # a rank can record its error just before rank 0 rewrites config.yaml


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
    """The run in ``exp``: its events, its outcome, and its sections (the diagnosis's run-folder keys)."""
    now = time.time() if now is None else now
    train_cfg = train_config(exp)
    lab = read_json(Path(exp) / layout.LAB) or {}
    report = read_json(Path(exp) / layout.STALL_REPORT)
    rid, beats = latest_heartbeats(exp)
    recorded = rank_errors(exp)  # every launch's
    metrics = rank_metrics(exp)  # each rank's lines, read once
    rank0 = kept_steps(metrics.get("rank0", []))
    ckpts = integrity(exp, clock_of=_elapsed)
    per_rank = resumed_from(exp)
    # what this launch recorded decides the verdict; the rest is history
    launched = launch_time(exp, lab, beats, recorded)
    since = launched - LAUNCH_SLACK_S if launched else 0.0
    stall = report if report is not None and report.get("time", 0) >= since else None
    errors = of_launch(recorded, since, rid)
    halt = read_halt(exp, since)
    world_size = int(
        lab.get("world_size")
        or (report or {}).get("world_size")
        or (max(beats) + 1 if beats else 0)
        or len(metrics)
        or 1
    )
    keep = ("max_steps", "max_epochs", "max_minutes", "nonfinite", "uneven", "ledger", "stall_timeout_s")
    closed = {c["epoch"] for c in ckpts["files"] if c.get("epoch_done")}
    d: dict = {
        "exp": str(exp),
        "time": now,
        "world_size": world_size,
        "launched": launched or None,
        "config": {k: train_cfg.get(k) for k in keep} if train_cfg else None,
        "last_step": rank0[-1]["step"] if rank0 else None,
        "stop_requested": (exp / STOP_FILE).exists(),
        "ranks": [rank_state(b, now) for _, b in sorted(beats.items())],
        "steps": step_times(metrics, beats),
        "corpora": corpus_throughput([m for lines in metrics.values() for m in kept_steps(lines)]),
        "nonfinite": nonfinite_summary(exp, metrics),
        "loss_scale": loss_scale_history(rank0),
        "resumes": resumes(
            ledger=bool(per_rank),
            resumed_from=sorted({s for v in per_rank.values() for s in v}),
            per_rank={str(r): v for r, v in per_rank.items()},
            trained_again=went_back(metrics.get("rank0", [])),
        ),
        # None where the loop's batches carry no ids it could find: nothing to judge
        "coverage": None if lab.get("coverage_not_measured") else epoch_coverage_report(exp, lab, closed),
        "coverage_not_measured": lab.get("coverage_not_measured"),
        "checkpoints": ckpts,
        "error": error_summary(errors[0], errors) if errors else None,
        "halt": halt,
        "stall": stall_summary(exp, stall) if stall else None,
    }
    past = history(lab, recorded, errors, halt, report, stall)
    events, outcome = timeline_of(exp, d, lab, train_cfg, metrics, beats, world_size, errors, halt, stall, ckpts)
    return Reading(NAME, [str(exp)], events=events, outcome=outcome, sections=d, history=past)


def _elapsed(state: dict, file: str) -> float | None:
    from ...lab.state.run_state import elapsed_s  # torch, loaded by now to read the checkpoint

    return elapsed_s(state, file)


def train_config(exp: Path) -> dict:
    """The ``train`` section of the run's ``config.yaml`` (asrlab's trainer writes it; a user loop may not)."""
    try:
        return (yaml.safe_load((Path(exp) / layout.CONFIG).read_text()) or {}).get("train") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return {}


def launch_time(exp: Path, lab: dict, beats: dict[int, dict], recorded: list[dict] = ()) -> float:
    """When the latest launch started: ``lab.json``'s ``started``, else when rank 0 wrote ``config.yaml``; in a
    copied folder (its files' times newer than its newest heartbeat's), when its ranks started (``beats``: the
    latest heartbeats). Where the launcher started its ranks again since (torchrun's ``--max-restarts``: rank
    errors of another run id recorded since), when the latest attempt's ranks started."""
    if lab.get("started"):
        rid = next(iter(beats.values())).get("run") if beats else None
        again = [b["started"] for b in beats.values() if b.get("started")]
        if again and any(e.get("run") not in (None, rid) and e.get("time", 0) >= lab["started"] for e in recorded):
            return max(float(lab["started"]), min(again))
        return float(lab["started"])
    try:
        written = (Path(exp) / layout.CONFIG).stat().st_mtime
    except OSError:
        written = 0.0
    if beats and written > max(b.get("time", 0.0) for b in beats.values()):
        return min(b.get("started") or b.get("since", written) for b in beats.values())
    return written


def history(
    lab: dict, recorded: list[dict], errors: list[dict], halt: dict | None, report: dict | None, stall: dict | None
) -> list[str]:
    """Failures of earlier launches into this EXP (the run was resumed after them): ``recorded``, every rank
    error in the folder, of which ``errors`` are this launch's; ``report``, the stall report, ``stall`` when
    this launch's."""
    out = []
    current = {(e["rank"], e.get("time")) for e in errors}
    for e in recorded:
        if (e["rank"], e.get("time")) not in current:
            ended = (
                " (a rank being ended: what followed the launch's failure, not its cause)"
                if ended_from_outside(e)
                else ""
            )
            out.append(f"earlier launch: {error_line(e)}{ended}")
    if halt is not None and not halt["current"]:
        out.append(f"earlier launch: {halt['message']}")
    if report is not None and stall is None:
        out.append(f"earlier launch stalled: {report.get('verdict')}")
    for x in lab.get("earlier", []):
        out.append(f"earlier launch: {_ended(x)}")
    return out


def _ended(x: dict) -> str:
    """``ended 12:04:31, failed, exit code 137 (SIGKILL)``: how an earlier launch into the EXP ended."""
    if "ended" not in x:
        return (
            f"started {time.strftime('%H:%M:%S', time.localtime(x['started']))}, its end not recorded (killed, or its "
            "machine lost)"
        )
    said = f"ended {time.strftime('%H:%M:%S', time.localtime(x['ended']))}, {x.get('status', 'status not recorded')}"
    rc = x.get("exit_code")
    if rc is not None:
        said += f", exit code {rc}"
        if sig := exit_signal(rc, shell=True):
            said += f" ({sig})"
    if x.get("stopped_by"):
        said += f", by {x['stopped_by']}"
    return said

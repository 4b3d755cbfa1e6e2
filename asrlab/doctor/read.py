"""Reading what a run left in its experiment folder: its config, launch time, newest heartbeats, error
records, halt and stall reports. Nothing here writes to EXP or talks to the run."""

from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path

import yaml

from ..lab import layout
from ..lab.stall.flight import last_collectives
from ..lab.stall.errors import ended_from_outside, error_line
from ..lab.stall.heartbeat import read_heartbeats
from ..lab.stall.report import rank_states


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or being replaced right now
        return None


def train_config(exp: Path) -> dict:
    """The ``train`` section of the run's ``config.yaml`` (asrlab's trainer writes it; a user loop may not)."""
    try:
        return (yaml.safe_load(layout.config(exp).read_text()) or {}).get("train") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return {}


def launch_time(exp: Path, lab: dict, beats: dict[int, dict]) -> float:
    """When the latest launch started: ``lab.json``'s ``started``, else when rank 0 wrote ``config.yaml``; in a
    copied folder (its files' times newer than its newest heartbeat's), when its ranks started (``beats``: the
    latest heartbeats)."""
    if lab.get("started"):
        return float(lab["started"])
    try:
        written = layout.config(exp).stat().st_mtime
    except OSError:
        written = 0.0
    if beats and written > max(b.get("time", 0.0) for b in beats.values()):
        return min(b.get("started") or b.get("since", written) for b in beats.values())
    return written


def latest_heartbeats(exp: Path) -> tuple[str | None, dict[int, dict]]:
    """The heartbeats of the newest launch (the run id of the newest file): ranks an earlier, wider launch
    left behind are not this run's."""
    beats = read_heartbeats(exp)
    if not beats:
        return None, {}
    rid = max(beats.values(), key=lambda b: b.get("time", 0)).get("run")
    return rid, {r: b for r, b in beats.items() if b.get("run") == rid}


def kept_steps(lines: list[dict]) -> list[dict]:
    """Metric lines of the steps that count: when the steps go back (a resume, a rollback), the lines of
    the steps trained again replace the earlier ones (as :func:`asrlab.lab.state.ledger.read_ledger` does)."""
    out: list[dict] = []
    for m in lines:
        while out and out[-1].get("step", 0) >= m.get("step", 0):
            out.pop()
        out.append(m)
    return out


def halt_report(exp: Path, since: float) -> dict | None:
    """``EXP/nonfinite/halt.json`` (the trainer's halt report), with ``current``: written by this launch."""
    path = layout.halt(exp)
    h = read_json(path)
    if h is None:
        return None
    return {
        **{
            k: h.get(k)
            for k in (
                "message",
                "rollbacks",
                "step",
                "rank",
                "kind",
                "module",
                "direction",
                "where",
                "keys",
                "loss",
                "grad_norm",
                "loss_scale",
                "saved",
            )
        },
        "time": path.stat().st_mtime,
        "current": path.stat().st_mtime >= since,
    }


def error_entry(e: dict, errors: list[dict]) -> dict:
    tb = (e.get("traceback") or "").rstrip().splitlines()
    return {
        "rank": e["rank"],
        "type": e.get("type"),
        "message": e.get("message"),
        "time": e.get("time"),
        "phase": e.get("phase"),
        "step": e.get("step"),
        "usage": e.get("usage"),
        "line": error_line(e),
        "traceback_tail": tb[-8:],
        "also_failed": sorted({x["rank"] for x in errors} - {e["rank"]}),
        "ended_from_outside": ended_from_outside(e),
        "lost_peer": False,  # set where the verdict names the killed or vanished rank it followed
        "waited": False,  # set where it is a collective's timeout in a run the stall report says hung
    }


def stall_entry(exp: Path, report: dict) -> dict:
    _, ranks = rank_states(exp)  # the report's ranks, as the notebook's stall view reads them
    return {
        "verdict": report.get("verdict"),
        "time": report.get("time"),
        "timeout_s": report.get("timeout_s"),
        "failure": report.get("failure"),
        "report": str(layout.stall_text(exp)),
        "collectives": last_collectives(exp),
        "ranks": [
            {
                k: r.get(k)
                for k in ("rank", "rank_known", "phase", "step", "in_phase_s", "detail", "host", "pid", "note")
            }
            for r in ranks
        ],
    }


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
            f"started {time.strftime('%H:%M:%S', time.localtime(x['started']))}, never finished (its watch ended first)"
        )
    said = f"ended {time.strftime('%H:%M:%S', time.localtime(x['ended']))}, {x.get('status', 'status not recorded')}"
    rc = x.get("exit_code")
    if rc is not None:
        said += f", exit code {rc}"
        if 128 < rc < 128 + 65:
            try:
                said += f" ({signal.Signals(rc - 128).name})"
            except ValueError:
                pass
    if x.get("stopped_by"):
        said += f", by {x['stopped_by']}"
    return said


def json_ready(x: object) -> object:
    """JSON-ready: inf and nan as strings (strict JSON has neither)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_ready(v) for v in x]
    return x

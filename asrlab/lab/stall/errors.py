"""A rank's error, recorded where every other rank and the launcher can read it.

``EXP/errors/rank{R}.json`` holds when a rank failed, what it raised and the traceback. The other
ranks' stall watchdogs read it (a rank that raised leaves the others waiting in their next
collective until its timeout: the watchdog ends them within seconds instead, naming the rank that
failed first), and so do the launcher and ``asrlab doctor``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import traceback
from pathlib import Path

from ..layout import CONFIG, ERRORS
from ...errors import UsageError
from ...files import atomic_write
from . import relay
from .heartbeat import PHASES, run_id


def record_rank_error(
    exp: str | Path,
    error: BaseException,
    rank: int | None = None,
    run: str | None = None,
    phase: str | None = None,
    step: int | None = None,
) -> Path:
    """Write this rank's error to ``EXP/errors/rank{R}.json`` (when, what, where, the traceback). Across
    nodes, an error that says a peer went away also names the ranks that did (:func:`.relay.lost_peers`).
    ``run`` is this launch's id by default (:func:`.heartbeat.run_id`; a torch elastic restart is another
    launch): an error of the attempt before a restart is history, however close to the restart it came."""
    if getattr(error, "rank_error_file", None):  # recorded where it happened: that time stays the error's
        return error.rank_error_file
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    run = run_id() if run is None else run
    path = Path(exp) / ERRORS / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "time": time.time(),
        "type": type(error).__name__,
        "message": str(error),
        "usage": isinstance(error, (UsageError, FileNotFoundError)),
        "run": run,
        "phase": phase,
        "step": step,
        "traceback": "".join(traceback.format_exception(error)),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        **({"node": relay.node_rank(), "host": socket.gethostname()} if relay.across_nodes() else {}),
    }

    def write() -> None:
        atomic_write(path, json.dumps(record))  # whole or absent: another rank polls this folder
        relay.flush()  # and to the other nodes, where they do not share this folder

    write()  # first without: a rank that asks which peers went away waits on the others' errors
    write_torchelastic_error(record)
    lost = relay.lost_peers(record["message"])
    if lost:
        record["lost"] = lost
        write()
    error.rank_error_file = path
    return path


def write_torchelastic_error(record: dict) -> None:
    """The error also where torchrun's agent looks (``TORCHELASTIC_ERROR_FILE``, as torch's ``@record``
    writes it): its summary then shows the exception, and its root cause is the rank that failed first,
    by this error's time, not by which process the agent saw end first."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):  # the loop's own @record, or an earlier error, stays
        return
    data = {
        "message": {
            "message": f"{record['type']}: {record['message']}",
            "extraInfo": {"py_callstack": record["traceback"], "timestamp": str(int(record["time"]))},
        }
    }
    try:
        atomic_write(Path(path), json.dumps(data))
    except OSError:
        pass


# what a rank raises once it is being ended from outside (a launcher's SIGTERM to the survivors of another
# rank's failure, a scheduler's): its DataLoader worker "killed by signal: Terminated", torchelastic's
# SignalException. A consequence of that failure or stop, never a failure of its own.
ENDED = re.compile(r"killed by signal: (Terminated|Hangup|Interrupt)\b|SignalException|got signal: (1|2|15)\b")


def ended_from_outside(e: dict) -> bool:
    """The error says its rank (or the rank's worker) was being ended by a signal: see :data:`ENDED`."""
    return bool(ENDED.search(f"{e.get('type')}: {e.get('message')}"))


def rank_errors(exp: str | Path, since: float = 0.0, run: str | None = None) -> list[dict]:
    """Every rank error recorded since ``since`` (wall clock; of run ``run`` when given), earliest first, and
    errors of ranks being ended from outside (:func:`ended_from_outside`) after every other."""
    errors = []
    for path in (Path(exp) / ERRORS).glob("rank*.json"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return of_launch(sorted(errors, key=lambda e: (ended_from_outside(e), e["time"])), since, run)


def of_launch(errors: list[dict], since: float, run: str | None = None) -> list[dict]:
    """Those of ``errors`` recorded since ``since`` (wall clock; of run ``run`` when given), in their order."""
    return [e for e in errors if e.get("time", 0) >= since and (run is None or e.get("run") in (None, run))]


LAUNCH_SLACK_S = 2.0  # a rank can record its error just before rank 0 rewrites config.yaml


def launch(exp: str | Path, lab: dict, beats: dict[int, dict], run: str | None) -> tuple[float, list[dict], list[dict]]:
    """``(launched, recorded, errors)``: when the latest launch into ``exp`` started (:func:`launch_time`), every
    rank error recorded in the folder (every launch's), and this launch's (of run ``run``): what an earlier launch
    recorded is history, not the verdict."""
    recorded = rank_errors(exp)
    launched = launch_time(exp, lab, beats, recorded)
    return launched, recorded, of_launch(recorded, launched - LAUNCH_SLACK_S if launched else 0.0, run)


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
        written = (Path(exp) / CONFIG).stat().st_mtime
    except OSError:
        written = 0.0
    if beats and written > max(b.get("time", 0.0) for b in beats.values()):
        return min(b.get("started") or b.get("since", written) for b in beats.values())
    return written


def first_rank_error(exp: str | Path, since: float = 0.0, run: str | None = None) -> tuple[dict | None, list[int]]:
    """The first rank error recorded since ``since`` (wall clock; see :func:`rank_errors`), and every rank
    that recorded one."""
    errors = rank_errors(exp, since, run)
    return (errors[0] if errors else None), sorted(e["rank"] for e in errors)


def error_line(e: dict) -> str:
    """``rank 1 failed at step 7 (in the forward pass): ValueError: bad frame``."""
    where = (
        f" at step {e['step']} ({PHASES.get(e['phase'], e['phase'])})"
        if e.get("phase") and e.get("step") is not None
        else ""
    )
    lines = [line for line in e["message"].splitlines() if line.strip()]
    said = f"{e['type']}: {lines[0] if lines else ''}"
    if len(lines) > 1 and lines[0].startswith("Caught "):  # a DataLoader worker's error: its own last line
        said = f"{lines[-1].strip()} ({lines[0].rstrip('.')})"
    node = f" on node {e['node']} ({e.get('host')})" if "node" in e else ""
    lost = e.get("lost")
    if isinstance(lost, str):
        return f"{lost}; rank {e['rank']}{node} then failed{where}: {said}"
    if lost:
        gone = ", ".join(
            f"rank {b['rank']}" + (f" on node {b.get('node')} ({b.get('host')})" if "node" in b else "") for b in lost
        )
        last = lost[0]
        seen = (
            f", last seen {PHASES.get(last['phase'], last['phase'])} of step {last.get('step')}"
            if last.get("phase")
            else ""
        )
        return (
            f"{gone} stopped responding (process or node gone{seen}); rank {e['rank']}{node} then failed{where}: {said}"
        )
    return f"rank {e['rank']}{node} failed{where}: {said}"


def format_rank_error(first: dict, ranks: list[int], exp: str | Path) -> str:
    """The first rank's error, said once: one line for a usage error, the traceback for anything else."""
    others = [r for r in ranks if r != first["rank"]]
    tail = (
        f" (rank{'s' * (len(others) > 1)} {', '.join(map(str, others))} too; each error in {Path(exp) / ERRORS}/)"
        if others
        else ""
    )
    if first["usage"]:
        return f"asrlab: error: rank {first['rank']}: {first['message']}{tail}"
    said = f"rank {first['rank']} failed first{tail}:\n{first['traceback'].rstrip()}"
    return f"{said}\nLOST: {error_line(first)}" if first.get("lost") else said  # the cause, last


def error_summary(e: dict, errors: list[dict]) -> dict:
    """Rank error ``e`` as the doctor says it, with the other ranks of ``errors`` that failed too."""
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


__all__ = [
    "ENDED",
    "ended_from_outside",
    "error_line",
    "first_rank_error",
    "of_launch",
    "launch",
    "launch_time",
    "format_rank_error",
    "rank_errors",
    "record_rank_error",
    "write_torchelastic_error",
    "error_summary",
]

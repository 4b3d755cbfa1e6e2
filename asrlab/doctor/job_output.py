"""What a watched job printed (``EXP/job.log``, kept by ``asrlab watch``), read with the toolkits' log
readers and laid over what the run folder says: the loop's own non-finite losses, torchrun's exit codes
and signals (a killed rank named with its real signal), a traceback the job printed, the step it was at."""

from __future__ import annotations

from pathlib import Path

from ..lab.layout import job_log
from .logs import diagnose_logs
from .verdict import LOST_PEER

# what the folder alone can say of a rank that ended without a word, and what the job's output can replace
_GUESSED = ("ended without recording an error", "the training loop marked the run failed")


def _lost_peer(error: dict | None) -> bool:
    """The rank's error says a peer went away (the folder's own reading, :data:`.verdict.LOST_PEER`): what a
    survivor raises after another rank was killed, never a cause of its own beside the killed rank."""
    return error is not None and bool(LOST_PEER.search(error.get("message") or ""))


def read_job_output(exp: Path, d: dict) -> None:
    """Add ``job_output`` to the diagnosis ``d`` and correct its verdict where the job's own lines know more."""
    path = job_log(exp)
    if not path.exists() or path.stat().st_size == 0:
        return
    logs = diagnose_logs([str(path)])
    last = [r for r in logs["ranks"] if r["last"]]
    d["job_output"] = {
        "file": str(path),
        "verdict": logs["verdict"],
        "summary": logs["summary"],
        "culprit": logs["culprit"],
        "formats": logs["formats"],
        "lines": logs["lines"],
        "last_steps": {str(r["rank"]): r["last"] for r in last},
    }
    said = logs["summary"] + " (the job's own output)"
    v = d["verdict"]
    lost_peer = _lost_peer(d.get("error"))
    if (
        logs["verdict"] == "nonfinite"
        and v in ("finished", "running", "stopped", "crashed", "stalled")
        and not d.get("halt")
    ):
        if v in ("crashed", "stalled") and not any(g in d["summary"] for g in _GUESSED):
            said += f"; then {d['summary']}"  # what the folder knows for sure followed the non-finite values
        d.update(verdict="nonfinite", summary=said, culprit=logs["culprit"], basis="job output")
    elif (
        logs["verdict"] in ("killed", "out_of_memory")
        and (v != "stalled" or logs["verdict"] == "out_of_memory")
        and v in ("crashed", "unknown")
        and (d.get("error") is None or any(g in d["summary"] for g in _GUESSED) or lost_peer)
    ):
        if lost_peer:
            said += f"; then {d['summary']}"
            d["error"]["lost_peer"] = True  # said under the cause, not as the first error
        d.update(verdict=logs["verdict"], summary=said, culprit=logs["culprit"], basis="job output")
    elif logs["verdict"] == "crashed" and v in ("crashed", "unknown") and d.get("error") is None:
        d.update(summary=said, culprit=logs["culprit"], basis="job output")
    if v == "stopped" and " at step " not in d["summary"] and last:
        d["summary"] += " at " + "; ".join(
            f"rank {r['rank']}: {r['last']}" if r["rank"] is not None else r["last"] for r in last
        )


__all__ = ["read_job_output"]

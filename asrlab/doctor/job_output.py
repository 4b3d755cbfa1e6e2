"""What a watched job printed (``EXP/job.log``, kept by ``asrlab watch``), read with the toolkits' log readers,
and its first failure placed on the run's timeline beside the run folder's: the loop's own non-finite losses,
torchrun's exit codes and signals (a killed rank named with its real signal), a traceback the job printed, the
step it was at. ``job.times`` (kept by the watch beside the log) puts the job's lines on the folder's clock."""

from __future__ import annotations

from pathlib import Path

from ..lab.layout import job_log, job_times
from .logs import diagnose_logs
from .timeline import JobClock, failure, first_failure

OFFSET = (1 << 40) - 1  # a log event's order holds its file's index above this and its byte offset below
DEATHS = ("killed", "out_of_memory", "crashed")


def job_failure(exp: Path, logs: dict) -> dict | None:
    """The job output's first failure as an event of the run's timeline (its time from ``job.times``)."""
    first = logs.get("first")
    if logs["verdict"] in ("no_failure_seen", "unknown") or not first:  # lines that only look wrong: not a failure
        return None
    clock = JobClock(job_times(exp))
    c = logs["culprit"]
    return failure(
        logs["verdict"],
        "job output",
        clock.at(first.get("order", 0) & OFFSET) if clock else None,
        logs["summary"] + " (the job's own output)",
        source="job output",
        rank=c["rank"],
        step=c,
        order=first.get("order", 0),
    )


def _same_death(folder: dict, job: dict) -> bool:
    """The folder's guess at a rank that ended without a word, and the job's own words on how it ended (a rank
    killed, out of memory, raised; the launcher stopped): one failure seen twice, said by the job's output."""
    if not folder.get("guess"):
        return False
    if job["verdict"] == "stopped":
        return True  # a signal to the launcher: its ranks ended without a word of their own
    return job["verdict"] in DEATHS and (folder.get("rank") is None or job.get("rank") in (None, folder["rank"]))


def _placed(folder: dict, job: dict) -> dict:
    """The folder's failure, at the step the job's output places it where the folder has none (a rank's error
    recorded by the watch knows no step; the loop's last line before its traceback does): same verdict, same
    rank."""
    if any(v is not None for v in folder["at"].values()) or job["verdict"] != folder["verdict"]:
        return folder
    if folder.get("rank") is None or job.get("rank") != folder["rank"]:
        return folder
    return {**folder, "at": job["at"]}


STOP_SLACK_S = 2.0  # the watch records its stop once it has passed the signal on: the job may print first


def _after_stop(job: dict, stop: dict) -> bool:
    if job["verdict"] == "stopped":
        return True
    return job["time"] is not None and stop["time"] is not None and job["time"] >= stop["time"] - STOP_SLACK_S


def read_job_output(exp: Path, d: dict, folder: dict | None) -> dict | None:
    """Add ``job_output`` to the diagnosis ``d``; the run's first failure over the folder's event and the job's
    (:func:`.timeline.first_failure`) becomes the verdict. Returns that event (the culprit's)."""
    path = job_log(exp)
    if not path.exists() or path.stat().st_size == 0:
        return folder
    logs = diagnose_logs([str(path)])
    last = [r for r in logs["ranks"] if r["last"]]
    d["job_output"] = {
        "file": str(path),
        "verdict": logs["verdict"],
        "summary": logs["summary"],
        "culprit": logs["culprit"],
        "formats": logs["formats"],
        "lines": logs["lines"],
        "nonfinite": logs["nonfinite"],
        "last_steps": [{"rank": r["rank"], "last": r["last"]} for r in last],
        "resumes": logs["resumes"],
        "history": logs.get("history") or [],
    }
    if "resumes" in d and not d["resumes"]["ledger"] and logs["resumes"]:
        # no ledger in the folder: the job's own lines show where a restart went back to
        d["resumes"]["from_job_output"] = [r["text"] for r in logs["resumes"]]
    d["history"] = d.get("history", []) + [f"in the job's output: {h}" for h in d["job_output"]["history"]]
    job = job_failure(exp, logs)
    if d["verdict"] == "stopped" and " at step " not in d["summary"] and last:
        d["summary"] += " at " + "; ".join(
            f"rank {r['rank']}: {r['last']}" if r["rank"] is not None else r["last"] for r in last
        )
    if job is None:
        return folder
    if folder is not None and _same_death(folder, job):
        seen = [t for t in (job["time"], folder["time"]) if t is not None]
        job["time"] = min(seen) if seen else None  # the earliest sighting of the one failure
        folder = {**folder, "consequence": True}
    elif folder is not None and folder["verdict"] == "nonfinite_halt" and job["verdict"] == "nonfinite":
        return folder  # the loop's halt report says more of the same non-finite step than its printed loss
    elif folder is not None and folder["kind"] == "stop" and _after_stop(job, folder):
        return folder  # what the job printed once it was told to end: the stop's doing, said by who sent it
    first = first_failure([e for e in (folder, job) if e is not None])
    if first is not job:
        return _placed(folder, job) if first is folder else folder
    said = job["text"]
    if folder is not None and not folder.get("guess"):
        said += f"; then {d['summary']}"  # what the folder recorded followed the job's own failure
        if folder.get("lost_peer") and d.get("error"):
            d["error"]["lost_peer"] = True  # said under the cause, not as the first error
    d.update(verdict=job["verdict"], summary=said, basis="job output")
    return job


__all__ = ["job_failure", "read_job_output"]

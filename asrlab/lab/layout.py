"""The run folder (``EXP``): every file and folder a run writes there, named here and nowhere else.

``asrlab train``, the parts in a loop of one's own and ``asrlab watch`` write them; ``asrlab doctor``, the
explorers and the notebooks read them. Each folder's files (``rank3.jsonl``, ``rank3.json``) are named by the
module that writes them.
"""

from __future__ import annotations

from pathlib import Path

CONFIG = "config.yaml"  # asrlab train's config
LAB = "lab.json"  # the loop's own word: started, world size, how it ended
STALL_REPORT = "stall_report.json"  # a stall's verdict and every rank's state
STALL_TEXT = "stall_report.txt"  # the same, with every process's stacks, for a person
JOB_LOG = "job.log"  # what a job under asrlab watch printed
JOB_TIMES = "job.times"  # when each stretch of job.log came: "byte-offset unix-time" lines, the doctor's clock for it
UNITS = "units.txt"  # the tokenizer's units
METRICS, HEARTBEAT, ERRORS, LEDGER = "metrics", "heartbeat", "errors", "ledger"
CHECKPOINTS, NONFINITE, FLIGHT, STALL, WATCH = "checkpoints", "nonfinite", "flight", "stall", "watch"
DIAGNOSTICS = "diagnostics"  # the numerics' sampled traces
HALT = "halt.json"  # in NONFINITE: the halt the numerics guard made
LIGHTNING_CHECKPOINTS = "lightning.jsonl"  # in CHECKPOINTS: each checkpoint file Lightning saved, as saved
# any of these makes a folder a run folder
RUN_FILES = (CONFIG, LAB, METRICS, HEARTBEAT, ERRORS, CHECKPOINTS, LEDGER, STALL_REPORT, NONFINITE)


def config(exp: str | Path) -> Path:
    return Path(exp) / CONFIG


def lab(exp: str | Path) -> Path:
    return Path(exp) / LAB


def stall_report(exp: str | Path) -> Path:
    return Path(exp) / STALL_REPORT


def stall_text(exp: str | Path) -> Path:
    return Path(exp) / STALL_TEXT


def job_log(exp: str | Path) -> Path:
    return Path(exp) / JOB_LOG


def job_times(exp: str | Path) -> Path:
    return Path(exp) / JOB_TIMES


def metrics(exp: str | Path, name: str = "rank0") -> Path:
    """``metrics/<name>.jsonl``: ``rank<R>`` for a rank's steps, ``eval`` for the evaluations."""
    return Path(exp) / METRICS / f"{name}.jsonl"


def metrics_dir(exp: str | Path) -> Path:
    return Path(exp) / METRICS


def heartbeat_dir(exp: str | Path) -> Path:
    return Path(exp) / HEARTBEAT


def errors_dir(exp: str | Path) -> Path:
    return Path(exp) / ERRORS


def ledger_dir(exp: str | Path) -> Path:
    return Path(exp) / LEDGER


def checkpoints_dir(exp: str | Path) -> Path:
    return Path(exp) / CHECKPOINTS


def lightning_checkpoints(exp: str | Path) -> Path:
    return checkpoints_dir(exp) / LIGHTNING_CHECKPOINTS


def nonfinite_dir(exp: str | Path) -> Path:
    return Path(exp) / NONFINITE


def halt(exp: str | Path) -> Path:
    return Path(exp) / NONFINITE / HALT


def flight_dir(exp: str | Path) -> Path:
    return Path(exp) / FLIGHT


def stall_dir(exp: str | Path) -> Path:
    return Path(exp) / STALL


def watch_dir(exp: str | Path) -> Path:
    return Path(exp) / WATCH


def diagnostics_dir(exp: str | Path) -> Path:
    return Path(exp) / DIAGNOSTICS


def is_run(path: str | Path) -> bool:
    """A folder asrlab's trainer, the parts or asrlab watch wrote, not a folder of logs, nor a toolkit's own
    folder that holds a file of the same name (ESPnet's ``exp/asr_train_*`` has a ``config.yaml``, WeNet's
    ``step_N.pt``s, Lightning's a ``checkpoints/``): those are read as the toolkit's."""
    p = Path(path)
    if not p.is_dir():
        return False
    if any((p / name).exists() for name in (LAB, HEARTBEAT, ERRORS, LEDGER, STALL_REPORT, NONFINITE)):
        return True
    if any((p / METRICS).glob("rank*.jsonl")) or any((p / CHECKPOINTS).glob("step_*.done")):
        return True
    return _asrlab_config(p / CONFIG)


def _asrlab_config(path: Path) -> bool:
    """asrlab train's config: a ``train`` section among its top-level keys (ESPnet's, WeNet's have none)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return any(line.startswith("train:") for line in f)
    except OSError:
        return False


__all__ = [
    "CHECKPOINTS",
    "CONFIG",
    "DIAGNOSTICS",
    "ERRORS",
    "FLIGHT",
    "HALT",
    "HEARTBEAT",
    "JOB_LOG",
    "JOB_TIMES",
    "LAB",
    "LEDGER",
    "METRICS",
    "NONFINITE",
    "RUN_FILES",
    "STALL",
    "STALL_REPORT",
    "STALL_TEXT",
    "UNITS",
    "WATCH",
    "checkpoints_dir",
    "config",
    "diagnostics_dir",
    "errors_dir",
    "flight_dir",
    "halt",
    "heartbeat_dir",
    "is_run",
    "job_log",
    "job_times",
    "lab",
    "ledger_dir",
    "metrics",
    "metrics_dir",
    "nonfinite_dir",
    "stall_dir",
    "stall_report",
    "stall_text",
    "watch_dir",
]

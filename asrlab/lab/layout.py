"""The run folder (``EXP``): every file and folder a run writes there, named here and nowhere else
(a folder's or file's path is ``Path(exp) / layout.NAME``).

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
    "is_run",
]

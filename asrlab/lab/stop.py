"""A clean stop asked for from outside a run: the file ``EXP/STOP``.

Whoever wants the run to end (a notebook's Stop button, ``asrlab stop EXP``, a scheduler's
pre-emption hook) creates the file; every rank looks for it after each step, the ranks agree on it
in the all-reduce they already make for the time limit, and the run ends as if its budget were
spent: a checkpoint, an evaluation, exit code 0. A file, not a signal, because it reaches every
rank of every node the same way and cannot kill a rank halfway through a checkpoint.
"""

from __future__ import annotations

from pathlib import Path

STOP_FILE = "STOP"


def request_stop(exp: str | Path, reason: str = "requested") -> Path:
    """Ask the run writing to ``exp`` to stop after its current step."""
    path = Path(exp) / STOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason + "\n")
    return path


def stop_requested(exp: str | Path) -> bool:
    return (Path(exp) / STOP_FILE).exists()


def clear_stop(exp: str | Path) -> None:
    """Forget a request (the run that honoured it is over, or a new run starts)."""
    (Path(exp) / STOP_FILE).unlink(missing_ok=True)

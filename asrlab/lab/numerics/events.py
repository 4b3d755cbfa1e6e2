"""Every non-finite step of a run, one line each: ``EXP/nonfinite/rank{R}.jsonl``.

The numerics guard saves a replay bundle for the first non-finite step it locates (weights and batch: too
large to keep for each); every non-finite step, that one included, also gets a line here, so a bad
utterance that breaks a step again an epoch later is seen. A line holds the step, its kind (``loss`` or
``grad``), loss and gradient norm, whether the optimizer stepped, the step's utterance ids, and which of
them were not finite (``utterances``, with ``found_by``: how; None where that could not be told), and the
bundle when this step has one. No torch here: ``asrlab doctor`` reads it.
"""

from __future__ import annotations

from pathlib import Path

from .. import layout
from ...files import append_jsonl, read_jsonl

VERSION = 1  # of a line; a reader passes over lines of another version and counts them


def log_path(exp: str | Path, rank: int) -> Path:
    return layout.nonfinite_dir(exp) / f"rank{rank}.jsonl"


class NonFiniteLog:
    """This rank's lines (a run that stays finite writes none). Each is appended and the file closed again:
    the lines are rare, and read while the run goes on or after it was killed."""

    def __init__(self, exp: str | Path, rank: int):
        self.path = log_path(exp, rank)

    def write(self, record: dict) -> None:
        append_jsonl(self.path, [{"v": VERSION, **record}])


def read_events(exp: str | Path) -> tuple[list[dict], int]:
    """Every rank's lines in step order (with ``rank``), and how many lines of another version were passed over."""
    out, other = [], 0
    for path in sorted(layout.nonfinite_dir(exp).glob("rank*.jsonl")):
        try:
            rank = int(path.stem[4:])
        except ValueError:
            continue
        for rec in read_jsonl(path):
            if rec.get("v") != VERSION:
                other += 1
                continue
            out.append({**rec, "rank": rank})
    return sorted(out, key=lambda r: (r.get("step", 0), r["rank"])), other


__all__ = ["NonFiniteLog", "VERSION", "log_path", "read_events"]

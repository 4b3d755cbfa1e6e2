"""Lightning's ``metrics.csv`` (its CSVLogger, ``lightning_logs/version_N/``; NeMo's folders too), and any CSV a
training logger wrote (Keras' CSVLogger: ``epoch,loss,val_loss``, a row an epoch): one row per logged step, a column
per metric, empty where the row did not log it. ``step`` is the global step (a loop's own CSV:
its counter's column, else the row's place)."""

from __future__ import annotations

import csv
from pathlib import Path

from .. import series as judge_series
from . import Reading

NAME = "csv_metrics"
NOT_SERIES = {"epoch", "created_at"}
# the step's column: Lightning's, else a loop's own counter's; where none, a row is a step
STEPS = ("step", "global_step", "iteration", "iter", "it", "tick", "update", "num_updates", "batch")


def owns(path: Path) -> bool:
    """``metrics.csv``, or a CSV whose header has a loss column beside an epoch or step column."""
    if path.name == "metrics.csv":
        return True
    if path.suffix != ".csv":
        return False
    try:
        with open(path, newline="") as fh:
            head = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return any("loss" in c.lower() for c in head) and any(c in STEPS or c == "epoch" for c in head)


def read(files: list[Path]) -> Reading:
    series: dict[str, dict[int, float]] = {}
    notes = []
    for f in sorted(files):
        try:
            with open(f, newline="") as fh:
                rows = csv.DictReader(fh)
                col = next((c for c in STEPS if c in (rows.fieldnames or ())), None)
                if col is None:
                    notes.append(f"{f}: no step column (none of {', '.join(STEPS)}): each row read as a step")
                for i, row in enumerate(rows, 1):
                    step = row.get(col) if col else str(i)
                    if not step:
                        continue
                    for k, v in row.items():
                        if k in NOT_SERIES or k == col or k is None or not v:
                            continue
                        try:
                            series.setdefault(k, {})[int(float(step))] = float(v)  # "nan", "inf" read as such
                        except ValueError:
                            continue
        except OSError as err:
            notes.append(f"{f}: not read ({err})")
    out = {k: sorted(p.items()) for k, p in series.items()}
    events, warnings = judge_series.judge(NAME, out, {})
    return Reading(NAME, [str(f) for f in files], out, {}, events, warnings, notes)


__all__ = ["NAME", "owns", "read"]

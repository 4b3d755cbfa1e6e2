"""Lightning's ``metrics.csv`` (its CSVLogger, ``lightning_logs/version_N/``; NeMo's folders too): one row per
logged step, a column per metric, empty where the row did not log it. ``step`` is the global step."""

from __future__ import annotations

import csv
from pathlib import Path

from .. import series as judge_series
from . import Reading

NAME = "csv_metrics"
NOT_SERIES = {"step", "epoch", "created_at"}


def owns(path: Path) -> bool:
    return path.name == "metrics.csv"


def read(files: list[Path]) -> Reading:
    series: dict[str, dict[int, float]] = {}
    notes = []
    for f in sorted(files):
        try:
            with open(f, newline="") as fh:
                for row in csv.DictReader(fh):
                    step = row.get("step")
                    if not step:
                        continue
                    for k, v in row.items():
                        if k in NOT_SERIES or k is None or not v:
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

"""Hugging Face Trainer's ``trainer_state.json`` (its output folder's, each ``checkpoint-N/``'s): ``log_history``,
every logged value at its global step. Each file holds the whole history up to its step: the furthest is read.
Python's JSON writes a non-finite value as ``NaN``/``Infinity``, which it reads back as such."""

from __future__ import annotations

import json
from pathlib import Path

from .. import series as judge_series
from . import Reading

NAME = "trainer_state"
NOT_SERIES = {"step", "epoch", "total_flos"}


def owns(path: Path) -> bool:
    return path.name == "trainer_state.json"


def read(files: list[Path]) -> Reading:
    states, notes = [], []
    for f in files:
        try:
            states.append((json.loads(f.read_text()), f))
        except (OSError, ValueError) as err:  # a checkpoint's state cut by a kill: the others still say it
            notes.append(f"{f}: not read ({type(err).__name__}: {err})")
    if not states:
        return Reading(NAME, [str(f) for f in files], notes=notes)
    state, f = max(states, key=lambda sf: (sf[0].get("global_step") or 0, len(sf[0].get("log_history") or [])))
    series: dict[str, dict[int, float]] = {}
    for rec in state.get("log_history") or []:
        step = rec.get("step")
        if step is None:
            continue
        for k, v in rec.items():
            if k not in NOT_SERIES and isinstance(v, (int, float)) and not isinstance(v, bool):
                series.setdefault(k, {})[int(step)] = float(v)
    out = {k: sorted(p.items()) for k, p in series.items()}
    events, warnings = judge_series.judge(NAME, out, {})
    if state.get("max_steps") and state.get("global_step") is not None:
        notes.append(f"{f}: global step {state['global_step']} of max_steps {state['max_steps']}")
    return Reading(NAME, [str(x) for _, x in states], out, {}, events, warnings, notes)


__all__ = ["NAME", "owns", "read"]

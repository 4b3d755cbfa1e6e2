"""Hugging Face Trainer's ``trainer_state.json`` (its output folder's, each ``checkpoint-N/``'s): ``log_history``,
every logged value at its global step. Each file holds the whole history up to its step: the furthest is read.
Python's JSON writes a non-finite value as ``NaN``/``Infinity``, which it reads back as such."""

from __future__ import annotations

import json
from pathlib import Path

from .. import series as judge_series
from ..timeline import suspect
from . import TRAINED, Reading

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
    outcome, suspects = None, []
    step, last = state.get("global_step"), state.get("max_steps")
    if last and step is not None:
        notes.append(f"{f}: global step {step} of max_steps {last}")
        # Trainer ends by appending its train summary and saving at max_steps, or by a callback's stop (early
        # stopping), which the state's control records; a state short of all three was left by a run that ended
        # early or is still running
        control = ((state.get("stateful_callbacks") or {}).get("TrainerControl") or {}).get("args") or {}
        summary = any(TRAINED in r for r in state.get("log_history") or [])
        if summary or step >= last or control.get("should_training_stop"):
            outcome = {"verdict": "no_failure_seen", "summary": f"no failure seen: training ended at global step "
                       f"{step} of max_steps {last} ({f.name})", "basis": NAME}  # fmt: skip
        else:
            said = f"global step {step} of max_steps {last} in {f.parent.name}/{f.name}, no train summary after it and "
            said += "no stop asked: ended early (crash, kill, hang) or still running"
            suspects.append(suspect(said))
    return Reading(NAME, [str(x) for _, x in states], out, {}, events, warnings, notes, suspects, outcome)


__all__ = ["NAME", "owns", "read"]

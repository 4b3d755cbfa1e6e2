"""TensorBoard's event files (``events.out.tfevents.*``): every scalar's exact step series and wall-clock seconds.
Framing walked here without the CRCs (tensorboard's loader checks them in pure Python: ``benchmarks/tb_read.py``).
One run's files are one series per tag, a later launch's value of a step kept; runs side by side stay apart, each
tag named by its folder (``a/Loss/train``): a healthy run never hides a failed one."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .. import series as judge_series
from ..timeline import suspect
from . import TRAINED, Reading

NAME = "tensorboard"
DTYPES = {1: "float32", 2: "float64", 3: "int32", 9: "int64", 19: "float16", 14: "bfloat16"}


def owns(path: Path) -> bool:
    return "tfevents" in path.name


def _tensor_value(t) -> float | None:
    """A one-element tensor's value, or None (an image, a histogram, text)."""
    for values in (t.float_val, t.double_val, t.int64_val):
        if values:
            return float(values[0])
    if t.int_val and t.dtype != 7:  # 7: a string
        return float(t.int_val[0])
    if t.tensor_content and t.dtype in (1, 2) and not [d for d in t.tensor_shape.dim if d.size != 1]:
        import numpy as np

        return float(np.frombuffer(t.tensor_content, dtype=DTYPES[t.dtype])[0])
    return None


def _records(path: Path, notes: list[str]):
    """Each record's bytes: an 8-byte little-endian length, 4 bytes of its CRC, the record, 4 bytes of its CRC.
    The file is mapped, not read whole: a folder of large event files costs pages, not their size in memory."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    i, end = 0, len(data)
    try:
        while i + 12 <= end:
            (n,) = struct.unpack_from("<Q", data, i)
            if i + 16 + n > end:
                notes.append(f"{path.name}: cut after its last whole record (a writer killed mid-write)")
                return
            yield data[i + 12 : i + 12 + n]
            i += 16 + n
    finally:
        data.close()


def _scalars(f: Path, event_pb2, notes: list[str]) -> tuple[dict[str, dict[int, tuple[float, float]]], int]:
    """One file's scalars (tag -> step -> (value, wall time)) and how many records it held."""
    points: dict[str, dict[int, tuple[float, float]]] = {}
    records = 0
    try:
        for raw in _records(f, notes):
            records += 1
            e = event_pb2.Event.FromString(raw)
            if not e.HasField("summary"):
                continue
            for v in e.summary.value:
                kind = v.WhichOneof("value")
                x = v.simple_value if kind == "simple_value" else _tensor_value(v.tensor) if kind == "tensor" else None
                if x is not None:
                    points.setdefault(v.tag, {})[int(e.step)] = (float(x), e.wall_time)
    except Exception as err:  # noqa: BLE001  bytes that are not an event: said, the rest still read
        notes.append(f"{f.name}: read up to a damaged record ({type(err).__name__})")
    return points, records


@dataclass
class _Run:
    """One run's event files: its first folder, points (tag -> step -> (value, wall time)), first step, last fault."""

    folder: Path
    points: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    first: int | None = None
    wrong: str | None = None


def read(files: list[Path]) -> Reading:
    try:
        from tensorboard.compat.proto import event_pb2
    except ImportError:
        said = f"{len(files)} TensorBoard event files not read: pip install tensorboard (asrlab[tensorboard])"
        return Reading(NAME, [str(f) for f in files], notes=[said])
    notes: list[str] = []
    scanned = []
    for f in files:
        said = len(notes)
        points, records = _scalars(f, event_pb2, notes)
        wrong = (notes[-1] if len(notes) > said else None) if records else f"{f}: no record read (empty, or not events)"
        began = min((t for p in points.values() for _, t in p.values()), default=f.stat().st_mtime)
        scanned.append((began, f.name, f, points, wrong))
    # the file begun first (by its own clock, not its mtime) first: a later launch's value of a step replaces it
    runs: list[_Run] = []
    for _, _, f, points, wrong in sorted(scanned, key=lambda x: x[:2]):
        first = min((s for p in points.values() for s in p), default=None)
        run = next((r for r in reversed(runs) if r.folder == f.parent), None)
        if run is None and runs and first is not None and runs[-1].first is not None and first > runs[-1].first:
            run = runs[-1]  # another folder that goes on from the last run's steps: a resume (a new folder per launch)
        if run is None:  # a run of its own (side by side: both begin at the start), never merged into another
            run = _Run(f.parent)
            runs.append(run)
        for tag, p in points.items():
            run.points.setdefault(tag, {}).update(p)
        run.first = min((s for s in (run.first, first) if s is not None), default=None)
        run.wrong = wrong
    top = Path(os.path.commonpath([r.folder for r in runs])) if len(runs) > 1 else None
    series: dict[str, list[tuple[int, float]]] = {}
    wall: dict[str, list[float]] = {}
    for r in runs:
        label = f"{r.folder.relative_to(top).as_posix()}/" if top is not None and r.folder != top else ""
        for tag, p in r.points.items():
            series[label + tag] = [(s, p[s][0]) for s in sorted(p)]
            wall[label + tag] = [p[s][1] for s in sorted(p)]
    # a run whose last file was cut or empty: no all-clear (an earlier launch's cut file a resume went on from: a note)
    suspects = [suspect(r.wrong) for r in runs if r.wrong]
    events, warnings = judge_series.judge(NAME, series, wall)
    end = next((t for t in series if t.rsplit("/", 1)[-1] == TRAINED), None)
    said = f"no failure seen: training ended ({end} logged at step {series[end][-1][0]})" if end else None
    outcome = {"verdict": "no_failure_seen", "summary": said, "basis": NAME} if end else None
    return Reading(NAME, [str(f) for f in files], series, wall, events, warnings, notes, suspects, outcome)


__all__ = ["NAME", "owns", "read"]

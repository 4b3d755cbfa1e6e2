"""What a run left besides its text logs, read by sources: each module here owns one kind of file a toolkit
leaves in its folder and turns it into a :class:`Reading` (exact step series of every scalar it holds, and the
failure events and warnings those series show). A toolkit's folder is just several of these beside its logs.

A source module has ``owns(path) -> bool`` (whether a file is one of its kind, by its name) and
``read(files) -> Reading``. Adding a source is adding a module and its name to
:data:`SOURCES`; :func:`read_sources` finds and reads every one. Nothing here imports torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

# the modules of this package, each a source; the order is the order of their sections in the diagnosis
SOURCES = ("tensorboard", "trainer_state", "csv_metrics")
SKIP_DIRS = {".git", "__pycache__", "wandb", ".hydra"}
MAX_FILES = 10_000  # files looked at under one folder: a folder of a million shards is not a run's folder


@dataclass
class Reading:
    """What one source read: ``series`` (name -> ``[(step, value), ...]`` in step order, exactly as written),
    ``wall`` (name -> the wall-clock second of each point, where the source keeps one), ``events`` (failure
    events of :func:`..timeline.failure`; one may carry ``say``, a callable that phrases it once it is chosen),
    ``warnings`` (``{"kind", "name", "step", "text"}``: what is not yet a failure, a loss that diverges),
    ``notes`` (what it could not read, said)."""

    source: str
    files: list[str]
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    wall: dict[str, list[float]] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # lines that look wrong that no rule names (an all-clear is never given over them)
    suspects: list[dict] = field(default_factory=list)
    # what the source says where none of its events is a failure: {"verdict", "summary", ...} (a run folder's
    # finished, running or stopped on request; a log's "no failure seen" and what it did see)
    outcome: dict | None = None
    sections: dict = field(default_factory=dict)  # the source's own keys of the diagnosis (its schema's part)
    history: list[str] = field(default_factory=list)  # failures of an earlier attempt, said, not the verdict
    raw: object = None  # what was read, for plots (a log's step records)
    inside: list = field(default_factory=list)  # a watched job's own run folders in a run folder: read on their own


def _module(name: str):
    return importlib.import_module(f".{name}", __name__)


def walk(folder: Path) -> list[Path]:
    """The files under ``folder`` (hidden and tool folders left out), at most :data:`MAX_FILES`."""
    out: list[Path] = []
    stack = [folder]
    while stack and len(out) < MAX_FILES:
        d = stack.pop()
        try:
            entries = sorted(d.iterdir())
        except OSError:
            continue
        for p in entries:
            if p.name.startswith(".") or p.name in SKIP_DIRS:
                continue
            if p.is_dir():
                stack.append(p)
            elif p.is_file():
                out.append(p)
    return out


def files_of(paths: list[str]) -> list[Path]:
    """The files at ``paths``: each file given, each folder's files (:func:`walk`)."""
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        files += walk(path) if path.is_dir() else [path] if path.is_file() else []
    return files


def found(files: list[Path]) -> dict[str, list[Path]]:
    """Each source's files among ``files``."""
    out = {}
    for name in SOURCES:
        mine = [f for f in files if _module(name).owns(f)]
        if mine:
            out[name] = mine
    return out


def read_sources(files: list[Path]) -> list[Reading]:
    """Every source's reading of ``files`` (none where no source owns one of them)."""
    return [_module(name).read(mine) for name, mine in found(files).items()]


__all__ = ["Reading", "SOURCES", "files_of", "found", "read_sources", "walk"]

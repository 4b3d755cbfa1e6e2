"""What a run left besides its text logs: each module here owns one kind of file (``owns(path) -> bool``, by its
name) and reads it (``read(files) -> Reading``); adding one is adding a module and its name to :data:`SOURCES`.
Nothing here imports torch."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = ("tensorboard", "trainer_state", "csv_metrics")  # in the order of their sections in the diagnosis
SKIP_DIRS = {".git", "__pycache__", "wandb", ".hydra"}
# Hugging Face Trainer's train summary: logged (to its state and event files) once training ended; no other writer
# logs an end of training
TRAINED = "train_runtime"
MAX_FILES = 10_000  # files looked at under one folder: a folder of a million shards is not a run's folder


@dataclass
class Reading:
    """What one source read: ``series`` (name -> ``[(step, value), ...]``), ``wall`` (their wall-clock seconds),
    ``events`` (:func:`..timeline.failure`'s; ``say`` phrases one once chosen), ``warnings``, ``notes``."""

    source: str
    files: list[str]
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    wall: dict[str, list[float]] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suspects: list[dict] = field(default_factory=list)  # lines that look wrong that no rule names: no all-clear
    # where no event is a failure: {"verdict", "summary", ...} (finished, running, stopped; a log's "no failure seen")
    outcome: dict | None = None
    sections: dict = field(default_factory=dict)  # the source's own keys of the diagnosis
    history: list[str] = field(default_factory=list)  # failures of an earlier attempt, said, not the verdict
    raw: object = None  # what was read, for plots (a log's step records)
    inside: list = field(default_factory=list)  # a watched job's own run folders in a run folder: read on their own


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
    paths = [Path(p) for p in paths]
    return [f for p in paths for f in (walk(p) if p.is_dir() else [p] if p.is_file() else [])]


def read_sources(files: list[Path]) -> list[Reading]:
    """Every source's reading of its files among ``files`` (none where it owns none)."""
    out = []
    for name in SOURCES:
        module = importlib.import_module(f".{name}", __name__)
        if mine := [f for f in files if module.owns(f)]:
            out.append(module.read(mine))
    return out


__all__ = ["Reading", "SOURCES", "TRAINED", "files_of", "read_sources", "walk"]

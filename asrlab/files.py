"""Files a run writes while others read them: whole-file replacement, and JSON lines.

:func:`atomic_write` replaces a file whole: a reader (another rank, the doctor, a notebook) sees the old
content or the new, never half of it. JSON-lines files (metrics, ledger, diagnostics traces, timelines)
hold one object per line; a process killed while writing leaves a torn last line. Appending first ends such a line, so the
next record starts on a line of its own, and reading skips lines that do not parse, so a torn
line costs that record only, never the ones written after it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)


def atomic_write(path: str | Path, data: str | bytes | Callable, durable: bool = False) -> Path:
    """Write ``data`` (text, bytes, or a function that writes to a binary file) to ``path`` whole or not at all.

    The temporary file beside it is this process's and thread's own, so two writers of the same file (a
    failing rank and a survivor writing the report) never write into one temporary. ``durable``: fsync the
    file and its folder before returning, so a crash of the machine keeps it too (checkpoints)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def _open_append(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+b")
    if f.tell() > 0:
        f.seek(-1, 2)
        if f.read(1) != b"\n":  # a line torn by a killed writer: end it
            f.write(b"\n")
    f.close()
    return open(path, "a", buffering=1)  # line-buffered: each record reaches the file whole


class JsonLines:
    """Appends one JSON object per line to ``path`` (parent folders made)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.f = _open_append(self.path)

    def write(self, record: dict) -> None:
        self.f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.f.close()


def append_jsonl(path: str | Path, records: list[dict]) -> None:
    """Append ``records`` to ``path`` and close it again."""
    with _open_append(Path(path)) as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of ``path``; lines that do not parse (torn by a killed writer) are skipped."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            log.debug("%s:%d: not a whole JSON line (a writer killed mid-line?), skipped", path, n)
    return out


def read_json(path: str | Path) -> dict | None:
    """The JSON object at ``path``, None where it is absent or does not parse."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):  # absent, or being replaced right now
        return None

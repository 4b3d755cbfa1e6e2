"""JSON-lines files of a run (metrics, ledger, diagnostics traces, timelines): one object per line.

A process killed while writing leaves a torn last line. Appending first ends such a line, so the
next record starts on a line of its own, and reading skips lines that do not parse, so a torn
line costs that record only, never the ones written after it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


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

"""An executed notebook (papermill's, nbclient's, a saved JupyterLab session) read as the console its run printed:
each code cell's streams and text results, an error output as Python's traceback (IPython's colours and frames made
plain), and papermill's word (its cell metadata) on cells that never ended or never ran, which no output says."""

from __future__ import annotations

import json
import re
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# IPython 8's frames: "Cell In[4], line 6" and "File /path/tinyctc.py:59, in train(rank, world, cfg)"
_CELL = re.compile(r"^Cell (In\[\d+\]), line (\d+)")
_FILE = re.compile(r"^File (.+?):(\d+), in (\w+)")


def _text(x) -> str:
    return "".join(x) if isinstance(x, list) else str(x or "")


def _traceback(out: dict, cell: int) -> list[str]:
    """An error output as Python prints it: its frames, then ``Type: message``."""
    frames = []
    for entry in out.get("traceback") or []:
        for line in _ANSI.sub("", entry).splitlines():
            if m := _CELL.match(line.strip()):
                frames.append(f'  File "<cell {m[1]}>", line {m[2]}, in <module>')
            elif m := _FILE.match(line.strip()):
                frames.append(f'  File "{m[1]}", line {m[2]}, in {m[3]}')
    frames = frames or [f'  File "<cell {cell}>", line 1, in <module>']  # an exception whose frames it cannot tell
    said = f"{out.get('ename') or 'Exception'}: {out.get('evalue') or ''}".rstrip(": ")
    return ["Traceback (most recent call last):", *frames, *said.splitlines()]


def console(path: str | Path) -> str:
    """The text of ``path``'s outputs, as its run printed them, then papermill's word on a run that did not end."""
    nb = json.loads(Path(path).read_text(encoding="utf-8", errors="replace"))
    lines: list[str] = []
    ran, running, never, failed = [], [], [], False
    code = [c for c in nb.get("cells") or [] if c.get("cell_type") == "code"]
    for n, cell in enumerate(code, 1):
        pm = (cell.get("metadata") or {}).get("papermill") or {}
        for out in cell.get("outputs") or []:
            kind = out.get("output_type")
            if kind == "stream":
                lines += _text(out.get("text")).splitlines()
            elif kind in ("execute_result", "display_data") and set(out.get("data") or {}) == {"text/plain"}:
                # text alone: beside a richer form (a widget, a figure, a table) it names that form, not a printed line
                lines += _text(out["data"]["text/plain"]).splitlines()
            elif kind == "error":
                failed = True
                lines += _traceback(out, n)
        if pm.get("status") == "running":
            running.append(n)
        elif pm and pm.get("start_time") is None:  # papermill marks a cell it never reached "pending" (or "completed")
            never.append(n)
        elif pm:
            ran.append(n)
    if failed or not (nb.get("metadata") or {}).get("papermill"):
        return "\n".join(lines) + "\n"
    if running:  # the notebook was last written while this cell ran: the run never came back to say how it ended
        lines.append(
            f"papermill: code cell {running[0]} was still running when the notebook was last written, without an "
            "error output: a run still going, or one terminated from outside, or its kernel died"
        )
    elif never and ran and never[0] > ran[-1]:
        lines.append(
            f"papermill: code cell {never[0]}{' and those after it' if len(never) > 1 else ''} never ran after code "
            f"cell {ran[-1]} ended, without an error output: its kernel died, or the run was terminated from outside"
        )
    return "\n".join(lines) + "\n"


__all__ = ["console"]

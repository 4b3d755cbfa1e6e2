"""Checkpoints written atomically and loaded safely.

A checkpoint is ``EXP/checkpoints/step_XXXXXXXX.pt`` plus its completion marker
``step_XXXXXXXX.done`` (JSON: step, epoch, position, SHA-256 of the ``.pt``), written last.
Each file goes to a temporary name, is fsynced, then renamed, so a crash at any moment
leaves either a complete checkpoint or one without a marker, which is never loaded.
Loading uses ``torch.load(weights_only=True)``: tensors and plain containers only, no pickled code.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from ...files import atomic_write

log = logging.getLogger(__name__)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _Ticking:
    """A file that calls ``on_write`` on every write (a slow checkpoint is progress, not a stall)."""

    def __init__(self, f, on_write):
        self.f, self.on_write = f, on_write

    def write(self, b) -> int:
        self.on_write()
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint(ckpt_dir: Path, state: dict, step: int, info: dict, keep_last: int = 0, on_write=None) -> Path:
    """Write ``state`` for ``step`` atomically, then its marker; keep the newest ``keep_last`` (0: all).

    ``on_write`` (optional) is called on every chunk written (the stall watchdog's progress).
    """
    import torch  # here, not at the top: the doctor reads markers without torch's start-up

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step_{step:08d}.pt"
    atomic_write(path, lambda f: torch.save(state, _Ticking(f, on_write) if on_write else f), durable=True)
    marker = {"step": step, **info, "file": path.name, "sha256": sha256(path)}
    atomic_write(path.with_suffix(".done"), json.dumps(marker), durable=True)
    if keep_last > 0:
        for old in list_checkpoints(ckpt_dir)[:-keep_last]:
            (ckpt_dir / f"step_{old['step']:08d}.done").unlink(missing_ok=True)  # marker first
            (ckpt_dir / old["file"]).unlink(missing_ok=True)
    return path


def list_checkpoints(ckpt_dir: Path) -> list[dict]:
    """Every checkpoint file with its marker (``complete`` False where the marker is missing), oldest first."""
    out = []
    for pt in sorted(Path(ckpt_dir).glob("step_*.pt")):
        done = pt.with_suffix(".done")
        try:
            marker = json.loads(done.read_text())
            marker["complete"] = True
        except (FileNotFoundError, json.JSONDecodeError):
            marker = {"step": int(pt.stem.split("_")[1]), "file": pt.name, "complete": False}
        out.append(marker)
    return out


def load_latest(ckpt_dir: Path, map_location="cpu") -> tuple[dict, dict] | None:
    """(state, marker) of the newest complete checkpoint whose bytes match its marker, or None.

    A newest checkpoint that is incomplete, truncated or corrupt is passed over with a warning.
    """
    import torch

    for marker in reversed(list_checkpoints(ckpt_dir)):
        path = Path(ckpt_dir) / marker["file"]
        if not marker["complete"]:
            log.warning("checkpoint %s has no completion marker (interrupted write?); using an older one", path.name)
            continue
        if sha256(path) != marker["sha256"]:
            log.warning(
                "checkpoint %s does not match its SHA-256 (truncated or corrupt); using an older one", path.name
            )
            continue
        try:
            return torch.load(path, map_location=map_location, weights_only=True), marker
        except Exception as e:  # a file that hashes right but will not load is still unusable
            log.warning("checkpoint %s does not load (%s); using an older one", path.name, e)
    return None


def state_digest(state: dict) -> str:
    """One SHA-256 over the model and optimizer tensors of a checkpoint state, in a fixed order."""
    import torch

    h = hashlib.sha256()

    def walk(prefix: str, x) -> None:
        if isinstance(x, torch.Tensor):
            h.update(prefix.encode())
            h.update(x.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())  # 0-dim too
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                walk(f"{prefix}/{k}", x[k])
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(f"{prefix}/{i}", v)
        else:
            h.update(f"{prefix}={x!r}".encode())

    walk("model", state["model"])
    walk("optimizer", state["optimizer"])
    return h.hexdigest()

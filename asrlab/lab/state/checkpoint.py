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

from .. import layout
from ...files import atomic_write, read_jsonl

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


def integrity(exp: str | Path, clock_of=None) -> dict:
    """Each checkpoint: its marker, its bytes against the marker's SHA-256; the newest a resume would
    load (as :func:`load_latest` chooses), and the training clock it holds: ``clock_of(state, file)``, seconds or None
    (the run state's schema knows where it is kept); not read without it."""
    d = Path(exp) / layout.CHECKPOINTS
    files = []
    for m in list_checkpoints(d):
        path = d / m["file"]
        entry = {
            "step": m["step"],
            "epoch": m.get("epoch"),
            "epoch_done": m.get("epoch_done"),
            "file": m["file"],
            "marker": m["complete"],
            "sha256_ok": None,
        }
        try:
            entry["bytes"] = path.stat().st_size
            if m["complete"]:
                entry["sha256_ok"] = sha256(path) == m.get("sha256")
        except FileNotFoundError:  # a live run's keep_last removed it just now
            continue
        entry["state"] = (
            "ok"
            if entry["sha256_ok"]
            else "no marker (write interrupted: never loaded)"
            if not m["complete"]
            else "SHA-256 mismatch (truncated or corrupt: never loaded)"
        )
        files.append(entry)
    files += _lightning_checkpoints(exp)
    partial = sorted(p.name for p in d.glob("*.tmp")) if d.is_dir() else []
    newest = clock = None
    for f in reversed([f for f in files if f["sha256_ok"]]):  # as load_latest chooses, each file hashed once
        try:
            state = open_mapped(d / f["file"])
        except Exception:  # a file that hashes right but will not load is still unusable
            continue
        newest, clock = f["file"], clock_of(state, f["file"]) if clock_of is not None else None
        break
    if newest is None:  # Lightning's, by step: what fit(ckpt_path=...) would restore
        newest = next(
            (
                f["file"]
                for f in sorted(files, key=lambda f: f["step"], reverse=True)
                if f.get("lightning") and f["state"].startswith("ok")
            ),
            None,
        )
    return {"files": files, "partial_writes": partial, "newest_loadable": newest, "clock_s": clock}


def open_mapped(path: str | Path) -> dict:
    """A checkpoint's state, weights only, its tensors mapped from the file, not read: for its small values (a
    step, a clock). torch.save's legacy format (not a zip) cannot be mapped: ``RuntimeError``."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def _lightning_checkpoints(exp: str | Path) -> list[dict]:
    """The checkpoint files Lightning saved (as ``AsrlabCallback`` recorded them), the newest record of each,
    with its state now: ok (its size and time as saved), missing, or changed since (another run wrote it)."""
    newest: dict[str, dict] = {}
    path = Path(exp) / layout.CHECKPOINTS / layout.LIGHTNING_CHECKPOINTS
    for r in read_jsonl(path) if path.exists() else []:
        newest[r["file"]] = r
    out = []
    for r in sorted(newest.values(), key=lambda r: r["step"]):
        try:
            st = Path(r["file"]).stat()
            state = "ok" if (st.st_mtime, st.st_size) == (r["mtime"], r["bytes"]) else "changed since it was saved"
        except OSError:
            state = "missing"
        out.append(
            {
                "step": r["step"],
                "epoch": r["epoch"],
                "epoch_done": None,
                "file": r["file"],
                "marker": None,
                "sha256_ok": None,
                "bytes": r["bytes"],
                "state": f"{state} (Lightning's)",
                "lightning": True,
            }
        )
    return out

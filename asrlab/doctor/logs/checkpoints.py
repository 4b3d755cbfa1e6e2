"""The checkpoints beside a job's logs (``*.pt``, ``*.pth``, ``*.ckpt``, a folder that is one), each opened
memory-mapped on the CPU (no weight read, none moved to a device) for the epoch and step it holds; one that does not
open is not intact. The newest is the one a resume would load."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ...lab.state.checkpoint import open_mapped

PATTERNS = ("*.pt", "*.pth", "*.ckpt")
# WeNet's epoch_3.pt, Lightning's epoch=1-step=24.ckpt, HF's checkpoint-500, step_100.pt, iter_2000.pth; a loop's
# own ckpt_40.pt, ep1_it0120.pt, snap_00525.pth
_NAMED = re.compile(
    r"(?:(?<![a-z])(?:epoch|ep)[_=-]?(\d+)|(\d+)\s*epoch|step[_=-]?(\d+)|(?:checkpoint|ckpt|snap(?:shot)?)[-_](\d+)|"
    r"(?<![a-z])(?:iter|it)[_=-]?(\d+))",
    re.I,
)
# the keys a toolkit keeps its place under, at the top of the checkpoint or in a sub-dict
_STEP_KEYS = ("global_step", "step", "batch_idx_train", "iteration", "iter", "cur_step", "num_updates")
_EPOCH_KEYS = ("epoch", "cur_epoch", "epochs")
_SUBS = ("reporter", "loops", "train_state", "progress", "meta", "info")
MAX = 50  # checkpoints opened, newest files first
# a folder that is one checkpoint: Accelerate's save_state (step_N/ with model.safetensors, optimizer.bin,
# random_states_*.pkl), Hugging Face Trainer's checkpoint-N/
_WEIGHTS, _OPTIMIZER = ("model.safetensors", "pytorch_model.bin"), ("optimizer.bin", "optimizer.pt")
STATE_FILES = _WEIGHTS + _OPTIMIZER


def find(paths: list[str]) -> list[Path]:
    """The checkpoints, newest first (files, and folders that are one checkpoint): in the folders given, one level
    below (a recipe's ``exp/``), a logger's ``*/*/checkpoints/`` (Lightning's, NeMo's; a logger named after its folder
    one level deeper: ``lightning_logs/lightning_logs/version_0/checkpoints/``), and beside the files given."""
    globs = [
        (Path(p), ("", "*/", "*/*/checkpoints/", "*/*/*/checkpoints/")) if Path(p).is_dir() else (Path(p).parent, ("",))
        for p in paths
        if p != "-"
    ]
    found = {f for d, levels in globs for lv in levels for pat in PATTERNS for f in d.glob(lv + pat) if f.is_file()}
    found |= {
        f for d, levels in globs for f in d.glob("*/") if f.is_dir() and any((f / n).exists() for n in STATE_FILES)
    }
    found = {f for f in found if not any(f.parent == g and g in found for g in found)}  # a folder's own files: it
    return sorted(found, key=lambda f: f.stat().st_mtime, reverse=True)[:MAX]


def read_folder(path: Path) -> dict:
    """A folder that is one checkpoint: its step from its name, intact when its weights and its optimizer's
    state are there and not empty (a save cut short leaves one of them missing or empty)."""
    m = _NAMED.search(path.name)
    step = int(next((g for g in m.groups()[2:] if g), 0)) if m and any(m.groups()[2:]) else None
    epoch = int(m.group(1) or m.group(2)) if m and (m.group(1) or m.group(2)) else None
    weights, optim = ([path / n for n in names if (path / n).exists()] for names in (_WEIGHTS, _OPTIMIZER))
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    why = None
    if not weights or not optim:
        why = f"no {'weights' if not weights else 'optimizer state'} in it"
    elif any(f.stat().st_size == 0 for f in weights + optim):
        why = "an empty file in it"
    return {"file": str(path), "bytes": size, "epoch": epoch, "step": step, "intact": why is None, "why": why}


def _from(d: dict, keys: tuple[str, ...]) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
        if hasattr(v, "item") and getattr(v, "numel", lambda: 0)() == 1:
            return int(v.item())
    for sub in (d[k] for k in _SUBS if isinstance(d.get(k), dict)):  # one level down
        if (got := _from({k: v for k, v in sub.items() if not isinstance(v, dict)}, keys)) is not None:
            return got
    return None


def named_place(stem: str) -> tuple[int | None, int | None]:
    """``(epoch, step)`` a checkpoint's name says, either None: ``epoch_2``, ``epoch=1-step=24``, ``step_100``."""
    epoch = step = None
    for m in _NAMED.finditer(stem):  # both, where the name holds both (epoch=1-step=24)
        e, e2, st, ck, it = m.groups()
        if e or e2:
            epoch = int(e or e2)
        if st or ck or it:
            step = int(st or ck or it)
    return epoch, step


def read(path: Path) -> dict:
    """``{"file", "bytes", "epoch", "step", "intact", "why"}``: what one checkpoint file holds."""
    out = {"file": str(path), "bytes": path.stat().st_size, "epoch": None, "step": None, "intact": True, "why": None}
    out["epoch"], out["step"] = named_place(path.stem)
    side = path.with_suffix(".yaml")  # WeNet writes the epoch and step it saved beside the weights
    if side.exists():
        try:
            info = yaml.safe_load(side.read_text()) or {}
            out.update(epoch=info.get("epoch", out["epoch"]), step=info.get("step", out["step"]))
        except (OSError, yaml.YAMLError):
            pass
    try:
        import torch

        try:
            state = open_mapped(path)
        except Exception as e:  # noqa: BLE001  a toolkit's classes in it, or an older pickle, or broken bytes
            whole = _archive_whole(path)
            if whole is not None:  # a zip archive whose every member's CRC matches: its bytes are whole
                return out | {"intact": None, "why": f"not opened: {_needs(e)}; {whole}"}
            try:  # torch.save's legacy format (not a zip) cannot be mapped: read, weights only all the same
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e2:  # noqa: BLE001
                if "Weights only load failed" not in str(e2):
                    raise
                # a file's pickled code is never run: a run folder may come from anyone
                return out | {"intact": None, "why": f"not opened: {_needs(e2)}"}
    except ModuleNotFoundError as e:  # its classes are a toolkit's, not installed here: not a broken file
        return out | {"intact": None, "why": f"not opened: needs {e.name} (the toolkit that wrote it)"}
    except Exception as e:  # noqa: BLE001  whatever a cut or foreign file raises, it is what to report
        return out | {"intact": False, "why": f"{type(e).__name__}: {str(e)[:160]}"}
    if isinstance(state, dict):
        step, epoch = _from(state, _STEP_KEYS), _from(state, _EPOCH_KEYS)
        out["step"] = step if step is not None else out["step"]
        out["epoch"] = epoch if epoch is not None else out["epoch"]
    return out


_GLOBAL = re.compile(r"(?:Unsupported global|GLOBAL) :?\s*([\w.]+)")


def _needs(e: Exception) -> str:
    """What a weights-only load refused: the classes of the toolkit that pickled them."""
    m = _GLOBAL.search(str(e))
    return f"needs {m.group(1).split('.')[0]} ({m.group(1)}), the toolkit that wrote it" if m else type(e).__name__


def _archive_whole(path: Path) -> str | None:
    """Whether ``path`` is a zip archive (torch.save's format since 1.6) whose members all read back with their
    CRCs: what can be said of its bytes without unpickling a class; None when it is not one, or is broken."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            if z.testzip() is not None:
                return None
            n = len(z.infolist())
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return None
    return f"its archive is whole ({n} members, every CRC right)"


def _newest(r: dict) -> tuple:
    """What a resume would load sorts last: the highest step, else epoch, else the latest written."""
    return (*(-1 if r[k] is None else r[k] for k in ("step", "epoch")), Path(r["file"]).stat().st_mtime)


def checkpoints(paths: list[str]) -> dict | None:
    files = find(paths)
    if not files:
        return None
    rows = [read_folder(f) if f.is_dir() else read(f) for f in files]
    intact = [r for r in rows if r["intact"] is not False]  # None: whole bytes, not opened (a toolkit's classes)
    newest = max(intact, key=_newest, default=None)
    broken = [r["file"] for r in rows if r["intact"] is False]
    return {"files": rows, "newest": newest["file"] if newest else None, "broken": broken}


__all__ = ["checkpoints", "find", "named_place", "read"]

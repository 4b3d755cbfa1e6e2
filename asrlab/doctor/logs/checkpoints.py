"""The checkpoints that lie beside a job's logs, as each toolkit names them: WeNet's ``epoch_N.pt`` (with its
``epoch_N.yaml``) and ``step_N.pt``, icefall's ``epoch-N.pt`` and ``checkpoint-N.pt``, ESPnet's
``checkpoint.pth`` and ``N epoch.pth``/``Nepoch.pth``, Lightning's and NeMo's ``.ckpt``, and ``*.pt``/``*.pth``
of a loop's own. Each is opened memory-mapped on the CPU (no weight is read into memory, none moves to a
device) for the epoch and step it holds; one that does not open is not intact. The newest is the one a
resume would load: the highest step, else epoch, else the latest written."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

PATTERNS = ("*.pt", "*.pth", "*.ckpt")
_NAMED = re.compile(r"(?:epoch[_-]?(\d+)|(\d+)\s*epoch|step[_-]?(\d+)|checkpoint-(\d+)|iter[_-]?(\d+))", re.I)
# the keys a toolkit keeps its place under, at the top of the checkpoint or in a sub-dict
_STEP_KEYS = ("global_step", "step", "batch_idx_train", "iteration", "iter", "cur_step", "num_updates")
_EPOCH_KEYS = ("epoch", "cur_epoch", "epochs")
MAX = 50  # checkpoints opened, newest files first


def find(paths: list[str]) -> list[Path]:
    """The checkpoint files in the folders given and one level below them (a recipe's ``exp/`` and its
    ``checkpoints/``), and beside the files given, newest first."""
    globs = [(Path(p), ("", "*/")) if Path(p).is_dir() else (Path(p).parent, ("",)) for p in paths if p != "-"]
    found = {f for d, levels in globs for lv in levels for pat in PATTERNS for f in d.glob(lv + pat) if f.is_file()}
    return sorted(found, key=lambda f: f.stat().st_mtime, reverse=True)[:MAX]


def _from(d: dict, keys: tuple[str, ...]) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
        if hasattr(v, "item") and getattr(v, "numel", lambda: 0)() == 1:
            return int(v.item())
    for k in ("reporter", "loops", "train_state", "progress", "meta", "info"):  # one level down
        sub = d.get(k)
        if isinstance(sub, dict):
            got = _from({kk: vv for kk, vv in sub.items() if not isinstance(vv, dict)}, keys)
            if got is not None:
                return got
    return None


def read(path: Path) -> dict:
    """``{"file", "bytes", "epoch", "step", "intact", "why"}``: what one checkpoint holds."""
    out = {"file": str(path), "bytes": path.stat().st_size, "epoch": None, "step": None, "intact": True, "why": None}
    m = _NAMED.search(path.stem)
    if m:
        e, e2, st, ck, it = m.groups()
        out["epoch"] = int(e or e2) if (e or e2) else None
        out["step"] = int(st or ck or it) if (st or ck or it) else None
    side = path.with_suffix(".yaml")  # WeNet writes the epoch and step it saved beside the weights
    if side.exists():
        try:
            info = yaml.safe_load(side.read_text()) or {}
            out["epoch"] = info.get("epoch", out["epoch"])
            out["step"] = info.get("step", out["step"])
        except (OSError, yaml.YAMLError):
            pass
    try:
        import torch

        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception:  # noqa: BLE001  an older pickle (numbers, argparse.Namespace): read without mmap's zip check
            state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001  whatever a cut or foreign file raises, it is what to report
        out.update(intact=False, why=f"{type(e).__name__}: {str(e)[:160]}")
        return out
    if isinstance(state, dict):
        step, epoch = _from(state, _STEP_KEYS), _from(state, _EPOCH_KEYS)
        out["step"] = step if step is not None else out["step"]
        out["epoch"] = epoch if epoch is not None else out["epoch"]
    return out


def checkpoints(paths: list[str]) -> dict | None:
    files = find(paths)
    if not files:
        return None
    rows = [read(f) for f in files]
    intact = [r for r in rows if r["intact"]]
    newest = max(
        intact,
        key=lambda r: (
            r["step"] if r["step"] is not None else -1,
            r["epoch"] if r["epoch"] is not None else -1,
            Path(r["file"]).stat().st_mtime,
        ),
        default=None,
    )
    return {
        "files": rows,
        "newest": newest["file"] if newest else None,
        "broken": [r["file"] for r in rows if not r["intact"]],
    }


__all__ = ["checkpoints", "find", "read"]

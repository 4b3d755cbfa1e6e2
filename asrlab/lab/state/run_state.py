"""Everything a loop needs to continue exactly, saved in one call, and what it trained on, step by step.

:class:`RunState` saves the model, optimizer, scaler, scheduler, every rank's RNGs (Python, NumPy,
torch's CPU generator and the GPU's, which dropout on the GPU draws from) and every rank's loader
position (any loader with ``state_dict``/``load_state_dict``: asrlab's, torchdata's
``StatefulDataLoader``) atomically (:mod:`.checkpoint`: temporary file, fsync, rename, then a marker
with the SHA-256; a newest checkpoint that is incomplete or corrupt is passed over for an older one).
With ``ledger=True`` it keeps :mod:`.ledger`'s per-step record of sample keys, from which
:func:`.ledger.coverage_report` proves that an epoch trained every key exactly once across kills,
resumes and a change of world size, or lists what was skipped or repeated.

For a resume that is bitwise the run that was not interrupted, nothing may draw from the global RNG
between the save and the same point of the resumed run: give a ``DataLoader`` its own ``generator``
(creating its iterator otherwise draws its workers' seed from the global RNG, which dropout uses).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import torch

from . import checkpoint
from .. import dist
from .ledger import LedgerWriter, coverage_report, note_resume
from ..numerics.guard import rng_state, set_rng_state

log = logging.getLogger(__name__)
VERSION = 1


def all_rng_state(device: torch.device | None = None) -> dict:
    """Python's, NumPy's (when installed) and torch's RNG states, as plain containers and tensors."""
    out = {"python": random.getstate(), **rng_state(device)}
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state()
        out["numpy"] = (name, keys.tolist(), pos, has_gauss, cached)
    except ImportError:
        pass
    return out


def set_all_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Set what :func:`all_rng_state` saved (Python's and NumPy's only where saved)."""
    if state.get("python") is not None:
        random.setstate(_tuples(state["python"]))
    set_rng_state(state, device)
    if state.get("numpy") is not None:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def _tuples(x):
    """``random.setstate`` wants the tuples it gave; a round trip through ``torch.load`` may give lists."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


class RunState:
    """``state.save(step, epoch)`` (every rank, at the same step: a collective) and ``state.load()``
    (every rank: the newest good checkpoint, or None on a fresh start); ``state.record(step, epoch, keys)``
    after each step when ``ledger``. ``extra``: anything else of the loop's to keep (a dict of plain values)."""

    def __init__(self, exp: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scaler=None, scheduler=None, loader=None, ledger: bool = True, keep_last: int = 3):
        self.exp = Path(exp)
        self.model, self.optimizer, self.scaler, self.scheduler, self.loader = model, optimizer, scaler, scheduler, loader
        self.keep_last = keep_last
        self.rank, self.world_size = dist.world()
        self.group = dist.cpu_group()
        self.device = next(model.parameters()).device
        self.ledger = LedgerWriter(self.exp, self.rank) if ledger else None

    def _gather(self, obj) -> list:
        if self.group is None:
            return [obj]
        out = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj, group=self.group)
        return out

    def save(self, step: int, epoch: int = 0, extra: dict | None = None) -> Path | None:
        """Checkpoint ``EXP/checkpoints/step_{step}.pt`` (rank 0 writes; every rank must call it)."""
        ranks = self._gather({"rng": all_rng_state(self.device),
                              "loader": self.loader.state_dict() if hasattr(self.loader, "state_dict") else None})
        path = None
        if self.rank == 0:
            state = {"version": VERSION, "step": step, "epoch": epoch, "world_size": self.world_size,
                     "model": _unwrap(self.model).state_dict(), "ranks": ranks, "extra": extra or {}}
            for name in ("optimizer", "scaler", "scheduler"):
                part = getattr(self, name)
                if part is not None:
                    state[name] = part.state_dict()
            path = checkpoint.save_checkpoint(self.exp / "checkpoints", state, step, {"epoch": epoch},
                                              self.keep_last)
        if self.group is not None:
            torch.distributed.barrier(group=self.group)
        return path

    def load(self) -> dict | None:
        """Restore the newest good checkpoint; returns ``{"step", "epoch", "extra"}``, or None if there is none.

        Each rank takes back its own RNGs and loader position; with another world size than the one saved,
        the RNGs and loader positions are not restored (asrlab's own trainer re-plans the epoch; here the
        loop must), and a warning says so."""
        found = checkpoint.load_latest(self.exp / "checkpoints", map_location="cpu")
        if found is None:
            return None
        state, marker = found
        if state.get("version") != VERSION:
            raise ValueError(f"{marker['file']}: a checkpoint of version {state.get('version')!r}; "
                             f"this asrlab reads version {VERSION}")
        _unwrap(self.model).load_state_dict(state["model"])
        for name in ("optimizer", "scaler", "scheduler"):
            part = getattr(self, name)
            if part is not None and name in state:
                part.load_state_dict(state[name])
        if state["world_size"] == self.world_size:
            mine = state["ranks"][self.rank]
            set_all_rng_state(mine["rng"], self.device)
            if mine["loader"] is not None and hasattr(self.loader, "load_state_dict"):
                self.loader.load_state_dict(mine["loader"])
        else:
            log.warning("%s was saved by %d ranks, this run has %d: RNGs and loader positions not restored",
                        marker["file"], state["world_size"], self.world_size)
        note_resume(self.exp, self.ledger, state["step"], self.rank, self.world_size, state["world_size"])
        log.info("resumed from %s (step %d, epoch %d)", marker["file"], state["step"], state["epoch"])
        return {"step": state["step"], "epoch": state["epoch"], "extra": state.get("extra", {})}

    def record(self, step: int, epoch: int, keys) -> None:
        """The sample keys this rank trained on at ``step`` (the ledger)."""
        if self.ledger is not None:
            self.ledger.step(step, epoch, [str(k) for k in keys])

    def coverage(self, epoch: int, keys: set[str] | None = None) -> dict:
        """:func:`.ledger.coverage_report` of this run's ledger."""
        return coverage_report(self.exp, epoch, keys)

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP / FSDP-style wrappers, so a checkpoint loads with or without them."""
    return getattr(model, "module", model)


__all__ = ["RunState", "all_rng_state", "set_all_rng_state"]

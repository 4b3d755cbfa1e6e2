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

from .. import layout
from . import checkpoint, recorder
from .. import dist
from .recorder import recording
from .ledger import LedgerWriter, coverage_report, ledger_sizes, ledger_tail, note_resume, put_ledger_tail
from ..numerics.utterances import rng_state, set_rng_state

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
    after each step when ``ledger``. ``extra``: anything else of the loop's to keep (a dict of plain values).

    One schema for every checkpoint asrlab writes, its own trainer's included (:data:`VERSION`)::

        {"version", "step", "epoch", "world_size", "model", "optimizer"?, "scaler"?, "scheduler"?,
         "ranks": [{"rng": ..., "loader": ...} per rank], "extra": {...}}

    A checkpoint of another version is refused with the reason; an unversioned one of asrlab's trainer
    (per-rank ``rng`` and ``loader`` lists at the top) is read as this one (:func:`upgrade`).

    ``loader``: anything with ``state_dict``/``load_state_dict`` (asrlab's loader, torchdata's
    ``StatefulDataLoader``, a sampler); one with ``load_states`` (asrlab's) is given every rank's state, so it
    re-plans the epoch on another number of ranks or workers; the others get their own rank's state back
    when the world size is the saved one. ``shared_exp=False`` (nodes that do not share ``EXP``): rank 0
    reads the checkpoint and sends it to every rank, and each save first brings rank 0's copy of every
    rank's ledger up to date. ``on_write``: called per chunk written (progress for a stall watch).
    """

    def __init__(
        self,
        exp: str | Path,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scaler=None,
        scheduler=None,
        loader=None,
        ledger: bool = True,
        keep_last: int = 3,
        shared_exp: bool = True,
        on_write=None,
    ):
        self.exp = Path(exp)
        self.model, self.optimizer, self.scaler, self.scheduler, self.loader = (
            model,
            optimizer,
            scaler,
            scheduler,
            loader,
        )
        self.keep_last, self.shared_exp, self.on_write = keep_last, shared_exp, on_write
        self.rank, self.world_size = dist.world()
        self.group = dist.cpu_group()
        self.device = next(model.parameters()).device
        self.ledger = LedgerWriter(self.exp, self.rank) if ledger else None
        self._last = (0, 0)  # (step, epoch) of the last step recorded
        self._position = None  # this rank's loader position restored, for a guard given after (use_loader)

    def use_loader(self, loader) -> None:
        """Checkpoint ``loader``'s position from now on (``UnevenGuard(..., state=state)`` calls this, so that
        the guard may be made before or after :meth:`load`): a position restored before is handed to it (a
        loader that took it already is given it again through the guard, which so knows it resumed)."""
        held = self.loader
        wraps = {id(getattr(loader, "source", None)), id(getattr(loader, "state_of", None))}
        if held is not None and held is not loader and id(held) not in wraps and not _guards(held):
            raise ValueError(
                f"RunState checkpoints the position of {type(held).__name__} already; give the guard "
                "that loader, or give RunState no loader"
            )
        self.loader = loader
        if self._position is not None:
            position, self._position = self._position, None
            loader.load_state_dict(position)

    def _gather(self, obj) -> list:
        if self.group is None:
            return [obj]
        out = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj, group=self.group)
        return out

    def _from_rank0(self, obj):
        if self.group is None:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def save(self, step: int, epoch: int = 0, extra: dict | None = None, marker: dict | None = None) -> Path | None:
        """Checkpoint ``EXP/checkpoints/step_{step}.pt`` (rank 0 writes; every rank must call it). ``marker``:
        plain values for the checkpoint's marker file, which lists read without loading the checkpoint."""
        if self.ledger is not None and not self.shared_exp:
            self._gather_ledgers()
        ranks = self._gather(
            {
                "rng": all_rng_state(self.device),
                "loader": self.loader.state_dict() if hasattr(self.loader, "state_dict") else None,
            }
        )
        path = None
        if self.rank == 0:
            state = {
                "version": VERSION,
                "step": step,
                "epoch": epoch,
                "world_size": self.world_size,
                "model": _unwrap(self.model).state_dict(),
                "ranks": ranks,
                "extra": extra or {},
            }
            for name in ("optimizer", "scaler", "scheduler"):
                part = getattr(self, name)
                if part is not None:
                    state[name] = part.state_dict()
            listed = {"epoch": epoch, **(marker or {})}
            first = ranks[0]["loader"]
            if isinstance(first, dict) and "positions" in first:  # asrlab's loader: `asrlab ckpt` shows where it was
                listed["rank0_position"] = first["positions"]
            path = checkpoint.save_checkpoint(
                self.exp / layout.CHECKPOINTS, state, step, listed, self.keep_last, on_write=self.on_write
            )
        if self.group is not None:
            torch.distributed.barrier(group=self.group)
        return path

    def _gather_ledgers(self) -> None:
        """Bring rank 0's copies of every rank's ledger up to date: each rank sends what its ledger holds
        beyond rank 0's copy of it, so the checkpoint's node can prove coverage."""
        self.ledger.flush()
        sizes = self._from_rank0(ledger_sizes(self.exp, self.world_size) if self.rank == 0 else None)
        tails = self._gather(ledger_tail(self.exp, self.rank, sizes[self.rank]))
        if self.rank == 0:
            for r, data in enumerate(tails):
                if data:
                    put_ledger_tail(self.exp, r, sizes[r], data)

    def read(self) -> dict | None:
        """The newest good checkpoint in this schema, with ``"file"`` (its name), without restoring anything
        (None if there is none). Every rank must call it when ``shared_exp`` is False."""
        if self.shared_exp:
            found = checkpoint.load_latest(self.exp / layout.CHECKPOINTS, map_location="cpu")
        else:
            found = self._from_rank0(
                checkpoint.load_latest(self.exp / layout.CHECKPOINTS, map_location="cpu") if self.rank == 0 else None
            )
        if found is None:
            return None
        state, marker = found
        return {**upgrade(state, marker["file"]), "file": marker["file"]}

    def restore(self, state: dict, loader: bool = True) -> dict:
        """Take ``state`` (from :meth:`read`) back: model, optimizer, scaler, scheduler, this rank's RNGs (on
        another world size rank R takes rank R mod N's), and (``loader``) the loader's position. The ledger
        notes that the steps after it are undone. Returns ``{"step", "epoch", "extra"}``."""
        _unwrap(self.model).load_state_dict(state["model"])
        for name in ("optimizer", "scaler", "scheduler"):
            part = getattr(self, name)
            if part is not None and name in state:
                part.load_state_dict(state[name])
        ranks = state["ranks"]
        set_all_rng_state(ranks[self.rank % len(ranks)]["rng"], self.device)
        positions = [r["loader"] for r in ranks]
        self._position = None
        if loader and all(p is not None for p in positions):
            if hasattr(self.loader, "load_states"):
                self.loader.load_states(positions)  # every rank's: another layout re-plans the epoch
            elif state["world_size"] == self.world_size:
                position = positions[self.rank]
                if self.loader is not None and not (_guards(position) and not _guards(self.loader)):
                    self.loader.load_state_dict(position)
                # kept for a guard given after (use_loader): the one the loader is not yet, or one that wraps it
                self._position = None if _guards(self.loader) else position
            else:
                log.warning(
                    "%s was saved by %d ranks, this run has %d: the loader's position is not restored",
                    state.get("file"),
                    state["world_size"],
                    self.world_size,
                )
        note_resume(self.exp, self.ledger, state["step"], self.rank, self.world_size, state["world_size"])
        return {"step": state["step"], "epoch": state["epoch"], "extra": state.get("extra", {})}

    def load(self) -> dict | None:
        """Restore the newest good checkpoint; returns ``{"step", "epoch", "extra"}``, or None if there is none."""
        state = self.read()
        if state is None:
            return None
        out = self.restore(state)
        log.info("resumed from %s (step %d, epoch %d)", state["file"], state["step"], state["epoch"])
        return out

    def record(self, step: int, epoch: int, keys) -> None:
        """The sample keys this rank trained on at optimizer step ``step`` (the ledger). With gradient
        accumulation, every micro-batch's: one list of them all, or a list of each micro-batch's list."""
        self._last = (step, epoch)
        if self.ledger is not None:
            recorder.records(self)
            keys = list(keys)
            keys = [k for part in keys for k in part] if keys and isinstance(keys[0], (list, tuple)) else keys
            self.ledger.step(step, epoch, [str(k) for k in keys])

    def untrained(
        self,
        keys: list[str],
        batches: int | None = None,
        utterances: int | None = None,
        exact: bool = True,
        after_batch: int | None = None,
    ) -> None:
        """This rank's epoch ended with data left (another rank ran out, :class:`~asrlab.lab.UnevenGuard`
        calls this): what it did not train, after the last step recorded (its ``after_batch``-th batch of
        the epoch), into the ledger. ``batches`` None: not known (a loader without a length)."""
        if self.ledger is not None:
            step, epoch = self._last
            self.ledger.untrained(
                step,
                epoch,
                [str(k) for k in keys],
                batches,
                len(keys) if utterances is None and exact else utterances,
                exact,
                after_batch,
            )

    def coverage(self, epoch: int, keys: set[str] | None = None) -> dict:
        """:func:`.ledger.coverage_report` of this run's ledger."""
        return coverage_report(self.exp, epoch, keys)

    def close(self) -> None:
        """The ledger closed and the process group let go (:func:`asrlab.lab.dist.teardown`)."""
        self.group = None
        recorder.closed(self)
        if self.ledger is not None:
            self.ledger.close()


# what an unversioned trainer checkpoint keeps at its top level, and this schema under "extra"
_TRAINER_EXTRA = ("epoch_done", "skipped", "rollbacks", "epoch_step0", "clock")


def upgrade(state: dict, name: str = "checkpoint") -> dict:
    """``state`` in this schema: as it is when of :data:`VERSION`, converted when it is an unversioned trainer
    checkpoint, else a ValueError naming what it is."""
    version = state.get("version")
    if version == VERSION:
        return state
    if version is None and isinstance(state.get("rng"), list) and isinstance(state.get("loader"), list):
        out = {k: v for k, v in state.items() if k not in ("rng", "loader") + _TRAINER_EXTRA}
        out.update(
            version=VERSION,
            ranks=[{"rng": r, "loader": p} for r, p in zip(state["rng"], state["loader"])],
            extra={k: state[k] for k in _TRAINER_EXTRA if k in state},
        )
        return out
    raise ValueError(
        f"{name}: a checkpoint of version {version!r}; this asrlab reads version {VERSION} "
        "(and the trainer's checkpoints before it)"
    )


def _guards(x) -> bool:
    """Whether ``x`` is an uneven guard or a position one saved (a position the raw loader cannot take)."""
    from ..uneven import UnevenGuard  # here: the guard imports this package

    return isinstance(x, dict) and "uneven_guard" in x or isinstance(x, UnevenGuard)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP / FSDP-style wrappers, so a checkpoint loads with or without them."""
    return getattr(model, "module", model)


def elapsed_s(state: dict, file: str) -> float | None:
    """The training clock a loaded checkpoint's ``state`` holds (seconds), None for a checkpoint of another
    schema."""
    try:
        return (upgrade(state, file)["extra"].get("clock") or {}).get("elapsed_s")
    except ValueError:
        return None


__all__ = ["VERSION", "RunState", "all_rng_state", "recording", "set_all_rng_state", "upgrade", "elapsed_s"]

"""A plain ``DataLoader``'s place in its epoch, for an exact resume: ``loader = lab.Resumable(loader)``.

A ``DataLoader`` has no ``state_dict``: a loop that resumes from a checkpoint starts its epoch again from
batch 0, and trains its first batches twice. :class:`Resumable` counts the batches it hands out in the
current epoch; ``RunState(..., loader=loader)`` keeps that count in every checkpoint, and the resumed
loader skips that many batches at the start of its next epoch. Where the loader draws its batches from a
sampler over a map-style dataset (``DistributedSampler``, a ``BatchSampler``), the skipped batches' indices
are dropped before any is read; any other iterable is read through the skipped batches.

Exact only where the epoch's order depends on the epoch alone, not on when the epoch was started: a
``DistributedSampler`` (seed and ``set_epoch``), or a sampler with a generator seeded per epoch. A
``RandomSampler`` without a generator draws its order from the global RNG when the epoch starts, which a
resume restores to the checkpoint's moment instead. The workers' seed a ``DataLoader`` draws from the
global RNG at each epoch's start is drawn off the loop's own RNG stream. torchdata's ``StatefulDataLoader``
keeps its own position: give it to ``RunState`` as it is, with a ``generator`` of its own.
"""

from __future__ import annotations

import itertools

import torch
import torch.utils.data as tud

VERSION = 1


class _After:
    """A batch sampler from its ``n``-th batch on: the skipped indices are never handed to a worker."""

    def __init__(self, batch_sampler, n: int):
        self.batch_sampler, self.n = batch_sampler, n

    def __iter__(self):
        return itertools.islice(iter(self.batch_sampler), self.n, None)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.n)


def _skipping(loader: tud.DataLoader, n: int) -> tud.DataLoader:
    """The same loader, from its batch ``n`` on, without reading the batches before it."""
    workers = loader.num_workers
    return tud.DataLoader(
        loader.dataset,
        batch_sampler=_After(loader.batch_sampler, n),
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=False,
        pin_memory_device=loader.pin_memory_device,
        in_order=loader.in_order,
    )


def start_past(loader, n: int) -> tuple:
    """``(iterator, batches skipped)``: ``loader``'s epoch from its batch ``n`` on. A ``DataLoader`` with a
    batch sampler over a map-style dataset drops the skipped batches' indices before any is read; any other
    iterable is read through them."""
    if (
        n
        and isinstance(loader, tud.DataLoader)
        and loader.batch_sampler is not None
        and not isinstance(loader.dataset, tud.IterableDataset)
    ):
        return iter(_skipping(loader, n)), n
    it, skipped = iter(loader), 0
    for _ in range(n):  # an iterable without indices: read through what was trained
        if next(it, _END) is _END:
            break
        skipped += 1
    return it, skipped


class Resumable:
    """``for batch in Resumable(loader)``: the loader's batches, with a ``state_dict`` that says how many of
    this epoch's were handed out, and a ``load_state_dict`` after which the next epoch begins past them
    (see the module docstring). ``len``, ``sampler`` and ``set_epoch`` pass through to the loader."""

    def __init__(self, loader):
        self.loader = loader
        self.batches = 0  # handed out in the current epoch (those skipped at a resume included)
        self._skip = 0  # to skip when the next epoch starts

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def sampler(self):
        return getattr(self.loader, "sampler", None)

    def set_epoch(self, epoch: int) -> None:
        """The sampler's ``set_epoch`` (a ``DistributedSampler``'s shuffle of that epoch)."""
        sampler = self.sampler
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def __iter__(self):
        skip, self._skip = self._skip, 0
        # a DataLoader draws its workers' seed from the global RNG when its epoch starts: a resumed loop
        # starts it at another moment of the RNG's stream than the loop never stopped, so the draw is kept off
        # the loop's stream (dropout masks and the like stay the same in both)
        with torch.random.fork_rng(devices=[]):
            it, self.batches = start_past(self.loader, skip)
        for batch in it:
            self.batches += 1
            yield batch

    def state_dict(self) -> dict:
        return {"resumable": VERSION, "batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self._skip = batches_saved(state, "resumable", VERSION, "Resumable", "a position saved by lab.Resumable")


def batches_saved(state, tag: str, version: int, who: str, what: str) -> int:
    """The batch count of a position saved as ``{tag: version, "batches": n}``; a ValueError naming ``who``
    for anything else (not such a state, or another version)."""
    if not isinstance(state, dict) or tag not in state:
        raise ValueError(
            f"{who}.load_state_dict: not {what} ({sorted(state) if isinstance(state, dict) else type(state).__name__})"
        )
    if state[tag] != version:
        raise ValueError(f"{who}: a state of version {state[tag]}; this asrlab reads {version}")
    return int(state["batches"])


_END = object()

__all__ = ["Resumable", "batches_saved", "start_past"]

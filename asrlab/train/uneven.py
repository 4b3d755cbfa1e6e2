"""Uneven data across ranks: all ranks stop at the same step when one runs out.

When one rank's data ends before the others', that rank leaves the loop while the others wait for
it in their next gradient all-reduce, until the collective's timeout (field reports 000/001).
:class:`UnevenGuard` wraps any iterable of batches: before each batch every rank says whether it
has one (one tiny all-reduce on the gloo control group, :func:`.dist.cpu_group`, so it never waits
on GPU work even when training uses NCCL), and all stop together when one has not. DDP's ``join``
is the other answer (ranks that ran out shadow the others' all-reduces; :func:`after_join` then
gives every rank the optimizer state of one that trained longest); ``asrlab train --uneven`` offers both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import torch

from . import dist
from .stall import announce

log = logging.getLogger(__name__)


class UnevenGuard:
    """``for batch in UnevenGuard(loader):``: every rank gets the same number of batches.

    ``every``: agree once per ``every`` batches (one all-reduce per group; a rank holds back up to
    ``every`` - 1 batches it fetched early, so stops are still at the same step). After the loop,
    ``stopped_early`` says whether this rank had data left when another ran out, ``batches`` how many
    it yielded. Alone (no process group) it passes batches through.
    """

    def __init__(self, batches: Iterable, every: int = 1, group=None):
        if every < 1:
            raise ValueError("every must be >= 1")
        self.source, self.every = batches, every
        self.group = group if group is not None else dist.cpu_group()
        self.batches = 0
        self.stopped_early = False

    def _all_have(self, n: int) -> int:
        """The fewest batches any rank has of the ``every`` it tried to fetch."""
        if self.group is None:
            return n
        import torch.distributed as tdist

        announce("sync")
        t = torch.tensor([n], dtype=torch.int64)
        tdist.all_reduce(t, op=tdist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def __iter__(self) -> Iterator:
        it = iter(self.source)
        self.batches, self.stopped_early = 0, False
        while True:
            ahead = []
            for _ in range(self.every):
                b = next(it, _END)
                if b is _END:
                    break
                ahead.append(b)
            n = self._all_have(len(ahead))
            yield from ahead[:n]
            self.batches += n
            if n < self.every:
                self.stopped_early = n < len(ahead)
                if self.stopped_early:
                    log.info("uneven data: another rank ran out; this rank stops after %d batches with data left",
                             self.batches)
                return


_END = object()


def after_join(step: int, parts: list, counts: tuple = (), device: torch.device | None = None) -> tuple[int, tuple]:
    """After an epoch under DDP's ``Join`` (ranks that ran out shadowed the others' all-reduces): every
    rank takes the ``step``, the ``counts`` and the state of ``parts`` (optimizer, scheduler, scaler:
    anything with ``state_dict``) of a rank that trained longest; DDP kept the weights equal. A collective
    on the default group (``device``: where NCCL wants the objects); returns ``(step, counts)``."""
    import torch.distributed as tdist

    if not (tdist.is_available() and tdist.is_initialized()):
        return step, counts
    steps: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(steps, (step, tuple(counts)))
    src = max(range(len(steps)), key=lambda r: steps[r][0])
    if len({s for s, _ in steps}) == 1:
        return step, counts
    rank = tdist.get_rank()
    if rank == 0:
        log.info("join: ranks ended the epoch at steps %s; all continue from rank %d's step %d",
                 [s for s, _ in steps], src, steps[src][0])
    state = [p.state_dict() for p in parts] if rank == src else [None] * len(parts)
    tdist.broadcast_object_list(state, src=src, device=device)
    if rank != src:
        for p, s in zip(parts, state):
            p.load_state_dict(s)
    return steps[src]


__all__ = ["UnevenGuard", "after_join"]

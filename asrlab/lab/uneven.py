"""Uneven data across ranks: all ranks stop at the same step when one runs out.

When one rank's data ends before the others', that rank leaves the loop while the others wait for
it in their next gradient all-reduce, until the collective's timeout (the multi-GPU hang with mixed corpora).
:class:`UnevenGuard` wraps any iterable of batches: before each batch every rank says whether it
has one (one tiny all-reduce on the gloo control group, :func:`.dist.cpu_group`, so it never waits
on GPU work even when training uses NCCL; sent a batch ahead, so no rank waits for it), and all stop
together when one has not. DDP's ``join`` is the other answer (ranks that ran out shadow the others'
all-reduces; :func:`after_join` then gives every rank the optimizer state of one that trained
longest); ``asrlab train --uneven`` offers both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as tdist

from . import dist
from .keys import KeyFinder, KeysSpec
from .state.position import batches_saved, start_past
from .stall.watch import announce, reading_ahead

log = logging.getLogger(__name__)


class UnevenGuard:
    """``for batch in UnevenGuard(loader):``: every rank gets the same number of batches.

    The ranks agree one group ahead: the group after the one handed out is fetched first and its
    agreement sent without waiting, so it completes during the training of the batches before it and
    adds no synchronisation point of its own. ``every``: agree once per ``every`` batches (a rank
    fetches up to ``every`` batches ahead; stops are still at the same step). After the loop,
    ``stopped_early`` says whether this rank had data left when another ran out, ``batches`` how many
    it yielded. Alone (no process group) it passes batches through.

    The guard holds batches it has fetched and not handed out, so a loader's own position runs ahead
    of training: :meth:`state_dict` is the position of ``state_of`` (default: ``batches`` when it has a
    ``state_dict``) as it was before the first batch the guard holds, for a checkpoint that resumes
    exactly at the next untrained batch. Without one, the state is the number of batches handed out in
    this epoch, and a resumed guard skips that many from its source (which must give the same batches in
    the same order again: a seeded sampler's ``set_epoch``).

    A rank that stops with data left says what it did not train: the number of batches left (where the
    source has a length) and the utterance ids of the batches it holds (``untrained="keys"``: of all of
    them, by reading the rest of its data), in the log and, given ``state`` (a :class:`RunState` with its
    ledger), in the ledger, where ``asrlab doctor`` counts them. ``keys``: where a batch carries its ids
    (see :mod:`asrlab.lab.keys`).
    """

    def __init__(self, batches: Iterable, every: int = 1, group=None, state_of=None, state=None,
                 keys: KeysSpec = None, untrained: str = "count"):
        if every < 1:
            raise ValueError("every must be >= 1")
        if untrained not in ("count", "keys"):
            raise ValueError(f"untrained: 'count' or 'keys', not {untrained!r}")
        self.run_state, self.untrained = state, untrained
        self._find_keys = KeyFinder(keys, "UnevenGuard")
        self._skip = 0  # batches to skip at the next epoch's start (a resume without state_of)
        self.left: dict | None = None  # what this rank left untrained when it stopped early
        self.source, self.every = batches, every
        self.group = group if group is not None else dist.cpu_group()
        self.state_of = state_of if state_of is not None else (batches if hasattr(batches, "state_dict") else None)
        self.batches = 0
        self.stopped_early = False
        self._held: list = []  # [(position before it was fetched, batch)], oldest first
        self._sent = None      # the agreement under way (a loop that stops early leaves one)

    def state_dict(self) -> dict:
        """The position of ``state_of`` after the batches handed out so far; without ``state_of``, the
        number of batches handed out in this epoch (see the class docstring)."""
        if self.state_of is None:
            return {"uneven_guard": STATE_VERSION, "batches": self.batches}
        return self._held[0][0] if self._held else self.state_of.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Hands a saved position to ``state_of``, or (without it) skips the batches already trained when
        the next epoch starts (before iterating)."""
        if self.state_of is not None:
            self.state_of.load_state_dict(state)
            return
        self._skip = batches_saved(state, "uneven_guard", STATE_VERSION, "UnevenGuard",
                                   "a state of UnevenGuard without state_of=")

    def _fetch(self, it) -> list:
        got = []
        for _ in range(self.every):
            pos = self.state_of.state_dict() if self.state_of is not None else None
            b = next(it, _END)
            if b is _END:
                break
            got.append((pos, b))
        return got

    def _agree(self, n: int):
        """Send this rank's count; returns a callable for the fewest any rank has (waits only if not yet in).

        It is called while the loop awaits its next batch (phase ``data``): a wait for the other ranks is
        announced as ``sync``, and ``data`` again after it, since the guard fetches the next group then and
        a rank whose data hangs there is waiting for data, not blocked in the check."""
        t = torch.tensor([n], dtype=torch.int64)
        work = self._sent = tdist.all_reduce(t, op=tdist.ReduceOp.MIN, group=self.group, async_op=True)

        def result() -> int:
            if work.is_completed():
                work.wait()  # also when complete: it hands the result over (and any error)
            else:
                announce("sync")
                work.wait()
                announce("data")
            self._sent = None
            return int(t.item())
        return result

    def close(self) -> None:
        """After the loop (also one left early): the agreement under way waited for and the process group
        let go (:func:`asrlab.lab.dist.teardown`)."""
        dist.settle(self._sent)
        self._sent, self.group = None, None

    def __iter__(self) -> Iterator:
        self.stopped_early, self._held, self.left = False, [], None
        # resumed without state_of: past the batches trained before the checkpoint
        it, self.batches = start_past(self.source, self._skip) if self._skip else (iter(self.source), 0)
        self._skip = 0
        if self.group is None:
            for b in it:
                self.batches += 1
                yield b
            return
        self._held = self._fetch(it)
        fewest = self._agree(len(self._held))
        while True:
            n = fewest()
            if n == self.every:  # the next group first, so its agreement runs while this one trains
                reading_ahead(len(self._held))  # a hang here is in the read of a later step's batch
                ahead = self._fetch(it)
                reading_ahead(0)
                fewest = self._agree(len(ahead))
                self._held += ahead
            for _ in range(n):
                _, b = self._held.pop(0)
                self.batches += 1
                yield b
            if n < self.every:
                self.stopped_early = bool(self._held)
                if self.stopped_early:
                    self._note_left(it)
                return

    def _note_left(self, it) -> None:
        """What this rank leaves untrained: in the log, ``self.left`` and the ledger (given ``state``)."""
        held = [b for _, b in self._held]
        ids = [k for b in held for k in self._find_keys(b)]
        batches, exact = len(held), False
        if self.untrained == "keys":
            for b in it:  # the rest of this rank's epoch, read for its ids only
                batches += 1
                ids += self._find_keys(b)
            exact = True
        else:
            try:
                batches = len(self.source) - self.batches
                exact = batches == len(held)
            except TypeError:  # a source without a length: only what the guard holds is known
                batches = None
        per_batch = len(ids) / len(held) if held and ids else None
        utterances = len(ids) if exact else round(per_batch * batches) if per_batch and batches else None
        self.left = {"batches": batches, "utterances": utterances, "exact": exact, "keys": ids}
        rank = dist.world()[0]
        log.warning("uneven data: another rank ran out; rank %d stops after %d batches, leaving %s batches (%s%s "
                    "utterances) of this epoch untrained", rank, self.batches, batches if batches is not None else "?",
                    "" if exact else "about ", utterances if utterances is not None else "?")
        if self.run_state is not None:
            self.run_state.untrained(ids, batches, utterances, exact)


_END = object()
STATE_VERSION = 1


def after_join(step: int, parts: list, counts: tuple = (), device: torch.device | None = None) -> tuple[int, tuple]:
    """After an epoch under DDP's ``Join`` (ranks that ran out shadowed the others' all-reduces): every
    rank takes the ``step``, the ``counts`` and the state of ``parts`` (optimizer, scheduler, scaler:
    anything with ``state_dict``) of a rank that trained longest; DDP kept the weights equal. A collective
    on the default group (``device``: where NCCL wants the objects); returns ``(step, counts)``."""
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

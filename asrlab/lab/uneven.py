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
from .state.recorder import recording
from .stall.watch import reading_ahead, tell

log = logging.getLogger(__name__)


class UnevenGuard:
    """``for batch in UnevenGuard(loader):``: every rank gets the same number of batches.

    The ranks agree one group ahead: the group after the one handed out is fetched first and its
    agreement sent without waiting, so it completes during the training of the batches before it and
    adds no synchronisation point of its own. ``every``: agree once per ``every`` batches (a rank
    fetches up to ``every`` batches ahead; stops are still at the same step). After the loop,
    ``stopped_early`` says whether this rank had data left when another ran out, ``batches`` how many
    it yielded. Alone (no process group) it passes batches through.

    The cut shortens the epoch, so a loop's ``i + 1 == len(loader)`` no longer finds its last batch:
    ``guard.last`` is true on the final batch of the pass on every rank alike (read, it waits for the
    agreement under way: the loop pays for the lookahead only where it asks), and ``len(guard)`` is the
    number of batches the pass yields on every rank (the rest of the epoch after a resume), from its
    first batch on, where every rank knows how many its source has left (a TypeError otherwise: a
    source without a length, or a loader that resumed itself from a position).

    The guard holds batches it has fetched and not handed out, so a loader's own position runs ahead
    of training: :meth:`state_dict` is the position of ``state_of`` (default: ``batches`` when it has a
    ``state_dict``) as it was before the first batch the guard holds, for a checkpoint that resumes
    exactly at the next untrained batch. Without ``state_of``, the state is the number of batches handed
    out in this epoch, and a resumed guard skips that many from its source (which must give the same
    batches in the same order again: a seeded sampler's ``set_epoch``).

    ``state`` (a :class:`RunState`): the guard becomes the loader whose position the state checkpoints
    (a position the state restored before is handed to it), and a rank that stops with data left writes
    what it did not train into the state's ledger, where ``asrlab doctor`` reads the epoch as cut short:
    the batch it stopped after, the number of batches left (where the source has a length) and the
    utterance ids of the batches it holds (``untrained="keys"``: of all of them, by reading the rest of
    its data). ``keys``: where a batch carries its ids (see :mod:`asrlab.lab.keys`). Without ``state``, a
    rank that stops with data left writes the same into the ledger of the :class:`RunState` that records
    this process's steps over the same ranks (:func:`~asrlab.lab.state.recorder.recording`), if one does,
    less the batch it stopped after (a guard not given the state is not told of a resume: an
    ``islice(loader, start, None)`` pass does not start at the epoch's first batch).
    """

    def __init__(
        self,
        batches: Iterable,
        every: int = 1,
        group=None,
        state_of=None,
        state=None,
        keys: KeysSpec = None,
        untrained: str = "count",
        watch=None,
    ):
        if every < 1:
            raise ValueError("every must be >= 1")
        if untrained not in ("count", "keys"):
            raise ValueError(f"untrained: 'count' or 'keys', not {untrained!r}")
        self.run_state, self.untrained = state, untrained
        self.watch = watch  # the stall watch the loop runs under (``watch.data(guard)`` hands it over)
        self._find_keys = KeyFinder(keys, "UnevenGuard")
        self._skip = 0  # batches to skip at the next epoch's start (a resume without state_of)
        self.left: dict | None = None  # what this rank left untrained when it stopped early
        self.source, self.every = batches, every
        self.group = group if group is not None else dist.cpu_group()
        self.state_of = state_of if state_of is not None else (batches if hasattr(batches, "state_dict") else None)
        self.batches = 0
        self.stopped_early = False
        self._held: list = []  # [(position before it was fetched, batch)], oldest first
        self._sent = None  # the agreement under way (a loop that stops early leaves one)
        self._resumed = False  # state_of was given a position: the next pass starts where the loader was
        self._pass_resumed = False
        self._len: int | None = None  # batches this pass yields on every rank, once agreed
        self._last = False  # the batch just handed out ends the pass
        self._ahead = None  # the next group's agreement (alone: the iterator to peek); None: none follows
        if state is not None:
            state.use_loader(self)

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
            if isinstance(state, dict) and "uneven_guard" in state:
                raise ValueError(
                    "UnevenGuard.load_state_dict: a position saved by a guard without state_of "
                    "(a count of batches), and this guard hands positions to its loader"
                )
            self.state_of.load_state_dict(state)
            self._resumed = True  # how many of the epoch's batches went before is the loader's to know
            return
        self._skip = batches_saved(
            state, "uneven_guard", STATE_VERSION, "UnevenGuard", "a state of UnevenGuard without state_of="
        )

    def __len__(self) -> int:
        if self._len is None:
            raise TypeError(
                "len(UnevenGuard): not known (a rank's loader has no len, or its pass has not "
                "begun); guard.last marks the final batch"
            )
        return self._len

    def __bool__(self) -> bool:
        return True  # not len(): a guard is there whatever its length

    @property
    def last(self) -> bool:
        """True on the final batch of the pass, on every rank (see the class docstring)."""
        if self._last and self._ahead is not None:  # the group ends: does another follow?
            if isinstance(self._ahead, _Agreement):
                self._last = self._ahead.fewest("compute") == 0  # read inside the step: back to it after a wait
            else:  # alone: the next batch read ahead, held so that the position saved stays before it
                self._held = self._held or self._fetch_n(self._ahead, 1)
                self._last = not self._held
        return self._last

    def _fetch(self, it) -> list:
        return self._fetch_n(it, self.every)

    def _fetch_n(self, it, k: int) -> list:
        got = []
        for _ in range(k):
            pos = self.state_of.state_dict() if self.state_of is not None else None
            b = next(it, _END)
            if b is _END:
                break
            got.append((pos, b))
        return got

    def _agree(self, n: int, left: int | None = None) -> "_Agreement":
        """Send this rank's count without waiting (see :class:`_Agreement`). With ``left`` (the pass's first
        agreement): also the batches this rank's source has left, -1 where not known, so that
        ``len(guard)`` is the fewest where every rank knows."""
        agreed = _Agreement([n] if left is None else [n, left], self.group, self.watch)
        self._sent = agreed.work
        return agreed

    def _left(self) -> int | None:
        """The batches this pass can yield from this rank's source: its length less those handed out before
        (None where not known: no length, or a loader that resumed itself)."""
        if self._pass_resumed:
            return None
        try:
            return max(0, len(self.source) - self.batches)
        except TypeError:
            return None

    def close(self) -> None:
        """After the loop (also one left early): the agreement under way waited for and the process group
        let go (:func:`asrlab.lab.dist.teardown`)."""
        dist.settle(self._sent)
        self._sent, self.group = None, None

    def __iter__(self) -> Iterator:
        self.stopped_early, self._held, self.left = False, [], None
        self._len, self._last, self._ahead = None, False, None
        # resumed without state_of: past the batches trained before the checkpoint
        it, self.batches = start_past(self.source, self._skip) if self._skip else (iter(self.source), 0)
        self._skip, self._pass_resumed, self._resumed = 0, self._resumed, False
        try:
            yield from (self._alone(it) if self.group is None else self._agreed(it))
        finally:
            self._ahead = None  # the iterator or the agreement it holds not kept past the pass

    def _agreed(self, it) -> Iterator:
        self._held = self._fetch(it)
        left = self._left()
        agreed = self._agree(len(self._held), -1 if left is None else left)
        n = agreed.fewest()
        self._len, self._sent = agreed.length(), None
        while True:
            self._ahead = None
            if n == self.every:  # the next group first, so its agreement runs while this one trains
                reading_ahead(self.watch, len(self._held))  # a hang here is in the read of a later step's batch
                ahead = self._fetch(it)
                reading_ahead(self.watch, 0)
                self._ahead = agreed = self._agree(len(ahead))
                self._held += ahead
            for j in range(n):
                _, b = self._held.pop(0)
                self.batches += 1
                self._last = j == n - 1
                yield b
            if n < self.every:
                self.stopped_early = bool(self._held)
                if self.stopped_early:
                    self._note_left(it)
                return
            n, self._sent = agreed.fewest(), None

    def _alone(self, it) -> Iterator:
        """No process group: the source's batches, with ``last`` from a batch read ahead when asked for."""
        self._len = self._left()
        got = self._fetch_n(it, 1)
        while got:
            (_, b), self._held = got[0], []
            self.batches += 1
            self._last, self._ahead = True, it
            yield b
            got = self._held or self._fetch_n(it, 1)

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
            batches = self._left()
            exact = batches == len(held)
        per_batch = len(ids) / len(held) if held and ids else None
        utterances = len(ids) if exact else round(per_batch * batches) if per_batch and batches else None
        # the epoch's count is the loader's after a resume; without state= the guard is not told of one (a loop
        # that resumes by islice(loader, start, None)): its count is of this pass, not of the epoch
        after = None if self._pass_resumed or self.run_state is None else self.batches
        self.left = {"batches": batches, "utterances": utterances, "exact": exact, "keys": ids, "after_batch": after}
        rank = dist.world()[0]
        state = self.run_state
        if state is None:  # the RunState recording this loop's steps: of this process group, not an earlier run's
            state = recording()
            state = state if state is not None and state.group is self.group else None
        if batches is None:
            size = "an unknown number of batches (" + (
                "the loader resumed itself mid-epoch)" if self._pass_resumed else "the loader has no len)"
            )
        else:
            many = f"{'' if exact else 'about '}{utterances}" if utterances is not None else "an unknown number of"
            size = f"{batches} batches ({many} utterances)"
        log.warning(
            "uneven data: another rank ran out; rank %d stops after %d batches of this %s, leaving %s untrained%s",
            rank,
            self.batches,
            "epoch" if after is not None else "pass" if self.run_state is None else "epoch since the resume",
            size,
            ""
            if state is not None
            else " (a RunState that records the steps, or UnevenGuard(..., state=state), puts it in the ledger, "
            "for asrlab doctor)",
        )
        if state is not None:
            state.untrained(ids, batches, utterances, exact, after_batch=after)


class _Agreement:
    """One all-reduce (MIN) of the ranks' counts under way; :meth:`fewest` waits for it only if not yet in.

    It is sent while the loop awaits its next batch (phase ``data``): a wait for the other ranks is
    announced as ``sync``, and ``data`` again after it, since the guard fetches the next group then and a
    rank whose data hangs there is waiting for data, not blocked in the check. Holds no guard: a guard
    that held a callable holding itself would be freed only by the cycle collector, after its process
    group maybe, and a gloo work freed after its group aborts the process."""

    __slots__ = ("t", "work", "done", "watch")

    def __init__(self, values: list[int], group, watch=None):
        self.t = torch.tensor(values, dtype=torch.int64)
        self.work = tdist.all_reduce(self.t, op=tdist.ReduceOp.MIN, group=group, async_op=True)
        self.done, self.watch = False, watch

    def fewest(self, back: str = "data") -> int:
        """The fewest batches any rank has; ``back``: the phase to announce after a wait."""
        if not self.done:
            if self.work.is_completed():
                self.work.wait()  # also when complete: it hands the result over (and any error)
            else:
                tell(self.watch, "sync")
                self.work.wait()
                tell(self.watch, back)
            self.done = True
        return int(self.t[0])

    def length(self) -> int | None:
        """The fewest batches any rank's source has left, where every rank knows (the first agreement)."""
        return int(self.t[1]) if self.t.numel() > 1 and int(self.t[1]) >= 0 else None


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
        log.info(
            "join: ranks ended the epoch at steps %s; all continue from rank %d's step %d",
            [s for s, _ in steps],
            src,
            steps[src][0],
        )
    state = [p.state_dict() for p in parts] if rank == src else [None] * len(parts)
    tdist.broadcast_object_list(state, src=src, device=device)
    if rank != src:
        for p, s in zip(parts, state):
            p.load_state_dict(s)
    return steps[src]


__all__ = ["UnevenGuard", "after_join"]

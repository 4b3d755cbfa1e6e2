"""What the watch knows of one rank from its sampled stacks (:class:`RankView`), and where each rank's loop
stands against the others' (:class:`Loops`: a rank whose loop has ended while others still train)."""

from __future__ import annotations

import socket
import time

from ..lab.stall.classify import (
    Loop,
    held_phase,
    loop_frame,
    loop_of,
    own_code,
    own_frame,
    phase_of,
    step_of,
    waits_at,
    where,
    worker_busy,
    worker_own,
)
from ..lab.stall.verdict import WAITING
from .procs import Proc
from .sample import PySpy

TRAINING = ("data", "backward", "optimizer")  # phases whose stack is inside the training loop


def all_training(views: list, expected: int, printed: bool = False) -> bool:
    """Whether every rank (``expected`` of them on the node, at least) has been seen training: in a step's
    computation once (it has had its first batch), or in two phases of a step, or (``printed``) the job's own
    output has shown its steps. A rank waiting for a peer still importing, or for its first batch, is starting,
    not stalled."""
    steps = {"forward", "backward", "optimizer"}
    return len(views) >= expected and (
        printed or all(v.phases_seen & steps or len(v.phases_seen & (steps | {"data"})) >= 2 for v in views)
    )


SPIN_LINES = 3  # the lines a spinning loop's samples land on: `while True: pass` is two


def spinning(views: list, world: int, now: float, hold_s: float):
    """The one rank whose stacks have cycled in one function of its own code at a few lines for ``hold_s`` while
    every other rank waited that long in a collective, unmoved: it holds them up and gets no further (a loop
    that never ends, or a step of its own far longer than ``hold_s``); None where that is not so."""
    spun = [v for v in views if v.spin and now - v.spin[2] >= hold_s and now - v.moved < hold_s]  # still moving
    rest = [v for v in views if v not in spun]
    waiting = all(now - v.moved >= hold_s and v.held_phase(world) in WAITING for v in rest)
    return spun[0] if len(spun) == 1 and rest and waiting else None


def counting_on(views: list, sampler, wait_s: float = 1.0) -> bool:
    """Whether a rank in an evaluation pass, every sample of it on one line (a slow read, a sleep for storage),
    counts on all the same: a whole-number local of its innermost own frame changed over ``wait_s`` (py-spy only;
    a hung read's locals stay as they are)."""
    if not isinstance(sampler, PySpy):
        return False
    for v in views:
        frame = own_frame(v.stacks.get("MainThread") or []) if v.phase == "eval" else None
        if frame is None:
            continue
        before = _counts(sampler.locals_of(v.proc.pid, frame[0], frame[2]))
        time.sleep(wait_s)
        after = _counts(sampler.locals_of(v.proc.pid, frame[0], frame[2]))
        if any(after.get(k, n) != n for k, n in before.items()):
            return True
    return False


def _counts(values: dict[str, str]) -> dict[str, int]:
    return {k: int(v) for k, v in values.items() if isinstance(v, str) and v.lstrip("-").isdigit()}


class RankView:
    """One rank as the samples show it: its phase and since when, when its stacks last moved."""

    def __init__(self, proc: Proc, now: float):
        self.proc, self.phase, self.since, self.moved = proc, "start", now, now
        self.started = now  # when the watch found the process: a launcher's restart starts its ranks again
        self.first_seen: float | None = None  # the time of the first sample
        self.signature: tuple | None = None
        self.stacks: dict = {}
        self.workers: dict[int, dict] = {}
        self.phases_seen: set[str] = set()
        self.phase_s: dict[str, float] = {}  # seconds per phase, each sample's interval to the phase it found
        self.samples = 0
        self.lines: set[tuple[str, str, int]] = set()  # the lines of the job's own code seen on its main stack
        self.gpu_busy: float | None = None  # its GPU's mean busy share so far (NVML), where there is one
        # (own function, its lines, since): the innermost frame of the job's own code kept in one function at a few
        # lines (whatever library code it calls): a loop spinning there moves and never gets further
        self.spin: tuple | None = None

    def update(self, stacks: dict, workers: dict[int, dict], now: float) -> str | None:
        """Take a sample (``workers``: those sampled this time; a worker not sampled keeps its last stack,
        so that a look that skipped it is no movement); returns the new phase when it changed."""
        main = stacks.get("MainThread") or next(iter(stacks.values()), [])
        fresh = {w: {**s, "MainThread": worker_own(s.get("MainThread") or [])} for w, s in workers.items()}
        workers = {w: self.workers[w] for w in self.proc.workers if w in self.workers and w not in fresh}
        workers.update(fresh)
        signature = (tuple(main), tuple(tuple(s.get("MainThread") or ()) for _, s in sorted(workers.items())))
        if self.first_seen is None:
            self.first_seen = now
        else:
            self.phase_s[self.phase] = self.phase_s.get(self.phase, 0.0) + now - self._last_t
        self._last_t = now
        if signature != self.signature:
            self.signature, self.moved = signature, now
        self.stacks, self.workers, self.samples = stacks, workers, self.samples + 1
        inner = own_frame(main)
        if inner is None:
            self.spin = None
        elif self.spin and self.spin[0] == (inner[0], inner[2]) and len(self.spin[1] | {inner[1]}) <= SPIN_LINES:
            self.spin = (self.spin[0], self.spin[1] | {inner[1]}, self.spin[2])
        else:
            self.spin = ((inner[0], inner[2]), {inner[1]}, now)
        self.lines.update((f, fn, line) for f, line, fn in main if own_code(f))
        phase = phase_of(main)
        self.phases_seen.add(phase)
        if phase != self.phase:
            self.phase, self.since = phase, now
            return phase
        return None

    def held_phase(self, world: int) -> str:
        """Its phase when its stacks stopped moving (:func:`asrlab.lab.stall.classify.held_phase`)."""
        return held_phase(self.phase, world)

    def loop_state(self, loop: Loop) -> str | None:
        """``"inside"`` the training loop, ``"after"`` it (its function at a later line, or returned after the
        rank was seen inside), else None (before it, or not to be told)."""
        main = self.stacks.get("MainThread") or []
        frame = loop_frame(main, loop)
        if frame is not None:
            if frame[1] == loop[2] and phase_of(main) == "collective":
                return "head"  # its loader's iteration calls a collective: an epoch begins (or its data ran out)
            return "inside" if loop[2] <= frame[1] <= loop[3] else "after" if frame[1] > loop[3] else None
        seen = any(f == loop[0] and fn == loop[1] and loop[2] <= line <= loop[3] for f, fn, line in self.lines)
        return "after" if seen and phase_of(main) != "start" else None

    def detail(self) -> str:
        """Where the rank is in the job's own code; waiting for data, which workers read where."""
        main = self.stacks.get("MainThread") or []
        frame = own_frame(main)
        said = where(frame)
        if self.phase == "data":
            at = waits_at(frame)
            busy = [
                f"worker pid {pid} at {where(own_frame(s.get('MainThread') or [])) or 'a read'}"
                for pid, s in sorted(self.workers.items())
                if worker_busy(s.get("MainThread") or [])
            ]
            said = "; ".join(([at] if at else []) + (busy or ["no worker reading"]))
        elif said:
            said = f"at {said}"
        return said

    def snapshot(self, now: float, phase: str | None = None) -> dict:
        return {
            "rank": self.proc.rank,
            "rank_known": self.proc.known,  # False: the watch's count for a process no launcher named
            "phase": phase or self.phase,
            "step": None,
            "since": self.since,
            "beats": self.samples,
            "detail": self.detail(),
            "completed": None,
            "allow_s": 0.0,
            "pid": self.proc.pid,
            "host": socket.gethostname(),
            "node": 0,
            "time": now,
            "run": self.proc.run,
            "started": self.started,
            "watched": True,
            "phase_s": {p: round(t, 3) for p, t in self.phase_s.items()},
            "gpu_busy": self.gpu_busy,
        }


class Loops:
    """The job's training loop, learned from the samples: the job's own loop its ranks wait for data in (else
    run backward or the optimizer in); and the ranks past it while others are still in it (uneven data: a
    rank ran out of batches)."""

    def __init__(self):
        self.seen: dict[tuple[bool, Loop], int] = {}  # (seen waiting for data, loop): samples inside it

    def learn(self, view: RankView) -> None:
        if view.phase in TRAINING and (loop := loop_of(view.stacks.get("MainThread") or [])):
            key = (view.phase == "data", loop)
            self.seen[key] = self.seen.get(key, 0) + 1

    def _loop(self) -> Loop:
        """The training loop: the one ranks were seen waiting for data in, else the one seen most."""
        return max(self.seen.items(), key=lambda kv: (kv[0][0], kv[1]))[0][1]

    def counts(self, views: list[RankView], sampler) -> dict[int, int]:
        """Each rank's step in the training loop's own count, read from its locals (py-spy only): for a look,
        a loop whose every sample lands on one line (a step asleep, a long one) that counts on all the same."""
        if not isinstance(sampler, PySpy):
            return {}
        # a loop whose every sample is in its own code (asleep between steps) was never seen training: where it is
        loop = (
            self._loop()
            if self.seen
            else next((lp for v in views if (lp := loop_of(v.stacks.get("MainThread") or []))), None)
        )
        if loop is None:
            return {}
        out = {}
        for v in views:
            frame = loop_frame(v.stacks.get("MainThread") or [], loop)
            step = step_of(loop, frame[1], sampler.locals_of(v.proc.pid, loop[0], loop[1]), False) if frame else None
            if step is not None:
                out[v.proc.rank] = step
        return out

    def uneven(self, views: list[RankView], world: int, sampler) -> dict[int, dict]:
        """``{rank: {"phase", "step"}}`` for every rank when some are past the training loop and others in
        it, else empty: ``left_loop`` for the first, their held phase for the others. The steps are the
        loop's own count, read from its locals (py-spy only)."""
        if world < 2 or not self.seen:
            return {}
        loop = self._loop()
        states = {v.proc.rank: v.loop_state(loop) for v in views}
        frames = {v.proc.rank: loop_frame(v.stacks.get("MainThread") or [], loop) for v in views}
        # a rank at the loop's head in a collective, while another is inside a step, started its next epoch
        # early: its data ran out, whatever collective each is in
        in_step = any(s == "inside" and frames[r] is not None and frames[r][1] > loop[2] for r, s in states.items())
        ended = {r for r, s in states.items() if s == "after" or (s == "head" and in_step)}
        if not ended or "inside" not in states.values():
            return {}
        out = {}
        for v in views:
            frame = frames[v.proc.rank]
            after = v.proc.rank in ended
            step = None
            if frame is not None and isinstance(sampler, PySpy):
                step = step_of(loop, frame[1], sampler.locals_of(v.proc.pid, loop[0], loop[1]), after)
            phase = ("next_epoch" if states[v.proc.rank] == "head" else "left_loop") if after else v.held_phase(world)
            out[v.proc.rank] = {"phase": phase, "step": step}
        return out

"""The stall watch a training loop holds, and how asrlab's other parts show up in its verdict.

:class:`StallWatch` keeps this rank's heartbeat (the phase of the step it is in) and runs a
:class:`~.watchdog.Watchdog` over every rank's. The other parts (the uneven guard's data check, the numerics
guard's optimizer step) are handed the watch their loop runs under (``watch=``; ``watch.data(guard)`` hands
it to the guard it wraps) and name their phase to it with :func:`tell`: a part given none tells nobody.
"""

from __future__ import annotations

import atexit
import sys
import time
from pathlib import Path

import torch.distributed as tdist

from .. import dist
from ..stop import stopped_by
from .errors import rank_errors, record_rank_error
from .heartbeat import Heartbeat, run_id, say_compiles
from .report import write_lab_status, write_report
from .watchdog import Watchdog

FAILURE_COLLECT_S = 3.0  # how long a rank that raised waits for the others' stack dumps (they poll every second)


def tell(watch, phase: str, step: int | None = None) -> None:
    """Tell ``watch`` (what a part was handed: a :class:`StallWatch`, or a loop's own heartbeat keeper with an
    ``announced(phase, step)`` method, as asrlab's trainer's step phases; None: nobody) that the loop is now in
    ``phase``."""
    if watch is not None:
        watch.announced(phase, step)


def reading_ahead(watch, n: int) -> None:
    """Tell ``watch`` that the read under way is ``n`` batches beyond the one the loop awaits (a reader that
    holds batches fetched ahead, as the uneven guard does), so a hang in it names the step whose batch is
    being read as well as the loop's own step."""
    hb = getattr(watch, "hb", None)
    if hasattr(hb, "ahead"):
        hb.ahead = n


class StallWatch:
    """The stall watch for any training loop: a heartbeat per rank, watched from every rank.

    ::

        with StallWatch("exp", timeout_s=60) as watch:
            for batch in watch.data(loader):      # "data" while the next batch is awaited; one step per batch
                                                  # (accumulate=k: per k micro-batches)
                watch.enter("forward")
                loss = model(batch).mean()
                watch.enter("backward")
                loss.backward()
                watch.enter("optimizer")
                opt.step()

    A hang anywhere (a collective, the data, a file read, a lock in user code) ends the run within
    ``timeout_s`` + a few seconds with ``EXP/stall_report.txt``: the verdict naming the rank(s) and
    phase, every rank's stacks, and its data-loader workers' stacks when it waits for data. An
    exception leaving the ``with`` block is recorded (:mod:`.errors`); the other ranks' watches
    then stop them within seconds, the verdict naming that rank and its error, instead of leaving them
    in a collective until its timeout. ``watch.enter("eval", allow_s=900)`` marks a phase that may take
    long; the first step has ``first_step_s``. Ranks are those of the process group (or ``RANK``/
    ``WORLD_SIZE``); all ranks must share ``exp`` (a shared file system on several nodes).
    """

    def __init__(
        self,
        exp: str | Path,
        timeout_s: float = 60.0,
        first_step_s: float | None = None,
        timeline: bool = False,
        exit_on_stall: bool = True,
        poll_s: float = 1.0,
    ):
        self.exp = Path(exp)
        self.rank, self.world_size = dist.world()
        self.hb = Heartbeat(self.rank, timeline=timeline)
        self.timeout_s = timeout_s
        self.first_step_s = max(first_step_s or 5 * timeout_s, timeout_s)
        self.exit_on_stall, self.poll_s = exit_on_stall, poll_s
        self.rid = self._agree_on_run_id(dist.cpu_group())
        self.watchdog: Watchdog | None = None

    def _agree_on_run_id(self, group) -> str:
        """Rank 0's run id for every rank (processes started without torchrun have none in common)."""
        rid = [run_id()]
        if group is not None:
            tdist.broadcast_object_list(rid, src=0, group=group)
        return rid[0]

    def start(self) -> "StallWatch":
        self.exp.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            write_lab_status(
                self.exp,
                {
                    "world_size": self.world_size,
                    "status": "running",
                    "started": time.time(),
                    "run": self.rid,
                    "timeout_s": self.timeout_s,
                },
            )
        self.watchdog = Watchdog(
            self.hb,
            self.exp,
            self.world_size,
            self.timeout_s,
            self.first_step_s,
            poll_s=self.poll_s,
            exit_on_stall=self.exit_on_stall,
            rid=self.rid,
        )
        self.watchdog.start()
        say_compiles(self.hb)  # torch.compile's compilations are not stalls (an optimizer has imported dynamo)
        # a loop that never calls stop() still records its error (for the other ranks) or its end
        self._excepthook, sys.excepthook = sys.excepthook, self._on_uncaught
        atexit.register(self.stop)
        return self

    def _on_uncaught(self, kind, error, tb) -> None:
        self.stop(error if isinstance(error, Exception) else None)
        self._excepthook(kind, error, tb)

    def __enter__(self) -> "StallWatch":
        return self.start() if self.watchdog is None else self

    def enter(self, phase: str, step: int | None = None, allow_s: float = 0.0) -> None:
        """This rank is now in ``phase`` (any name; asrlab's own are described in the verdict)."""
        self.hb.enter(phase, step, allow_s)

    def announced(self, phase: str, step: int | None = None) -> None:
        """A phase another part names (:func:`tell`)."""
        self.hb.enter(phase, step)

    def tick(self) -> None:
        """Progress inside a long phase (an evaluation batch): no stall while ticks come."""
        self.hb.tick()

    def data(self, batches, accumulate: int = 1):
        """Yield from ``batches``, in phase ``data`` while each next batch is awaited and ``compute`` after it
        came (until the loop enters another phase); ``epoch_end`` when it runs out. Each ``accumulate``
        batches are one step (gradient accumulation: the optimizer steps once per ``accumulate``
        micro-batches; an epoch's last step may have fewer), done when the next batch is asked for. A part that
        takes a watch (:class:`~asrlab.lab.UnevenGuard`) and was given none is handed this one."""
        if getattr(batches, "watch", False) is None:
            batches.watch = self
        it, micro = iter(batches), 0
        self.hb.per_step = max(1, accumulate)
        while True:
            self.hb.micro = micro
            self.hb.enter("data", self.hb.step + 1 if micro == 0 else None)
            try:
                batch = next(it)
            except StopIteration:
                self.hb.completed += micro > 0  # the epoch's last, shorter step
                self.hb.micro = 0
                self.hb.enter("epoch_end")
                return
            self.hb.enter("compute")
            yield batch
            micro = (micro + 1) % self.hb.per_step
            self.hb.completed += micro == 0

    def stop(self, error: BaseException | None = None) -> None:
        """End the watch: ``error`` is recorded for the other ranks and ``asrlab doctor``; called in a ``finally``
        while an error goes by (``try: ... finally: watch.stop()``), that error."""
        if self.watchdog is None:
            return
        if error is None and isinstance(sys.exc_info()[1], Exception):  # (an exception already handled is not)
            error = sys.exc_info()[1]
        watchdog, self.watchdog = self.watchdog, None
        say_compiles(None)
        if sys.excepthook == self._on_uncaught:
            sys.excepthook = self._excepthook
        atexit.unregister(self.stop)
        if error is not None:
            record_rank_error(self.exp, error, self.rank, self.rid, self.hb.phase, self.hb.step)
            failure = rank_errors(self.exp, watchdog.t0, self.rid)[0]
            watchdog.flush()
            if failure["rank"] == self.rank:  # the first to fail reports, with the stacks the others dump
                write_report(
                    self.exp,
                    self.world_size,
                    self.timeout_s,
                    self.rid,  # when their watches see
                    wait_s=FAILURE_COLLECT_S,
                    since=watchdog.t0,
                    failure=failure,
                )  # the error
        else:
            self.hb.enter("done")
        watchdog.stop()
        if error is not None or self.rank == 0:  # the rank that failed says so (rank 0 may be killed before it could)
            asked = stopped_by() if error is None else None  # a clean stop a signal asked for (stop_on_signals)
            update = {
                "status": "failed" if error is not None else "stopped" if asked else "finished",
                "ended": time.time(),
            }
            if asked is not None:
                update.update(stopped_by=f"{asked.name} (a clean stop)", stop_time=update["ended"])
            write_lab_status(self.exp, update)

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop(exc if isinstance(exc, Exception) else None)
        return False


__all__ = ["StallWatch", "reading_ahead", "tell"]

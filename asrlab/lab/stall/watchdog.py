"""The stall watchdog: turn a hang into a short, precise report and a non-zero exit.

Every rank runs a ``Watchdog`` thread. Once a second it writes its rank's heartbeat file and
reads every rank's. Progress is any change of any rank's beat counter (a phase change, an
evaluation batch, checkpoint bytes written); when no rank has progressed for ``timeout_s``
(``first_step_s`` until every rank has finished its first step), the job is stalled:

1. every rank writes ``EXP/stall/rank{R}.json``: its heartbeat and the Python stacks of all
   its threads;
2. rank 0 gathers them (waiting a few seconds for the others) into ``EXP/stall_report.json``
   and ``EXP/stall_report.txt``, whose first line is the verdict (:mod:`.report`, :mod:`.verdict`);
3. every rank kills its data-loader workers and exits with ``STALL_EXIT``, so no process is
   left running and no collective is left blocking (torchrun then stops the job).

If a rank's watchdog thread cannot run at all (a C call holding the GIL), ``faulthandler``
dumps that rank's stacks and exits it after ``4 x timeout_s``; if rank 0 is the stuck one, the
launcher (``asrlab train --nproc N``) writes the report from what the ranks left.
The thread talks through files, never through collectives: those are what is stuck.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import psutil

from .. import layout
from . import relay
from .classify import own_frame, own_stack, phase_of, waits_at, where, worker_lines
from .peers import PeerExits
from .errors import error_line, rank_errors
from .heartbeat import Heartbeat, append_timeline, read_heartbeats, run_id, write_heartbeat
from .report import write_dump, write_lab_status, write_report

log = logging.getLogger(__name__)

STALL_EXIT = 3  # exit code of a rank (and of ``asrlab train``) stopped by the watchdog
COLLECT_S = 8.0  # how long rank 0 waits for the other ranks' stack dumps
PEER_FAILED_EXIT = 5  # exit code of a rank the watchdog stopped because another rank raised
# data-loader workers forked after the watchdog started dump their stacks on this signal (a real-time
# one: SIGUSR1/2 are often the user's or the scheduler's); only a process that catches it is sent it
WORKER_DUMP_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None


def kill_children() -> None:
    """Kill this process's children (data-loader workers) so none outlives the rank."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        try:
            child.kill()
        except psutil.Error:  # already gone
            pass


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (Linux: SigCgt in /proc); elsewhere, no."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


class ProgressClock:
    """How long no rank has made progress, against the allowance in force (first step or not).

    Fed every rank's heartbeat snapshots; progress is any change of any beat counter. Used by
    every rank's ``Watchdog`` and by the launcher of last resort.
    """

    def __init__(self, world_size: int, timeout_s: float, first_step_s: float):
        self.world_size, self.timeout_s, self.first_step_s = world_size, timeout_s, max(first_step_s, timeout_s)
        self._seen: dict[int, int] | None = None
        self._since = time.monotonic()

    def overdue(self, beats: dict[int, dict], extra_s: float = 0.0) -> float | None:
        """Seconds without progress when longer than the allowance (+ ``extra_s``), else None."""
        now = time.monotonic()
        current = {r: s["beats"] for r, s in beats.items()}
        if current != self._seen:
            self._seen, self._since = current, now
        started = len(beats) == self.world_size and all(
            s.get("completed", 0) > 0 or s["phase"] in ("epoch_end", "done") for s in beats.values()
        )
        idle = now - self._since
        allowance = max(
            [self.timeout_s if started else self.first_step_s] + [s.get("allow_s") or 0.0 for s in beats.values()]
        )  # a phase the user marked as slow
        return idle if idle > allowance + extra_s else None


class Watchdog(threading.Thread):
    """Watches every rank's heartbeat from this rank; see the module docstring."""

    def __init__(
        self,
        hb: Heartbeat,
        exp: str | Path,
        world_size: int,
        timeout_s: float,
        first_step_s: float,
        poll_s: float = 1.0,
        exit_on_stall: bool = True,
        rid: str | None = None,
    ):
        super().__init__(name="asrlab-watchdog", daemon=True)
        self.hb, self.exp, self.world_size = hb, Path(exp), world_size
        self.timeout_s, self.first_step_s, self.poll_s = timeout_s, max(first_step_s, timeout_s), poll_s
        self.exit_on_stall = exit_on_stall
        self.rid = rid or run_id()
        self.stalled = threading.Event()
        self._halt = threading.Event()
        self._fh_file = None
        self.t0 = time.time()
        for path in (
            self.exp / layout.HEARTBEAT / f"rank{hb.rank}.json",
            self.exp / layout.HEARTBEAT / f"rank{hb.rank}.timeline.jsonl",
            self.exp / layout.STALL / f"rank{hb.rank}.json",
        ):
            path.unlink(missing_ok=True)
        if hb.rank == 0:
            for name in (layout.STALL_REPORT, layout.STALL_TEXT):
                (self.exp / name).unlink(missing_ok=True)
        self._workers_file = self._arm_worker_dumps()
        self.relay: relay.Relay | None = None
        self.peers = (
            PeerExits(self.exp, hb.rank, world_size, self.rid) if world_size > 1 and PeerExits.available() else None
        )

    def _arm_worker_dumps(self):
        """Workers forked from now on inherit a handler that writes their stacks to ``stall/rank{R}.workers.txt``."""
        if WORKER_DUMP_SIGNAL is None or threading.current_thread() is not threading.main_thread():
            return None
        (self.exp / layout.STALL).mkdir(parents=True, exist_ok=True)
        f = open(self.exp / layout.STALL / f"rank{self.hb.rank}.workers.txt", "w")
        faulthandler.register(WORKER_DUMP_SIGNAL, file=f, all_threads=True, chain=False)
        return f

    def _dump_workers(self) -> None:
        """Ask each child process that has the handler for its stacks, one after another."""
        f = self._workers_file
        if f is None:
            return
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            if not catches(child.pid, WORKER_DUMP_SIGNAL):
                continue
            size = os.fstat(f.fileno()).st_size
            f.write(f"\n[data-loader worker, pid {child.pid}]\n")
            f.flush()
            try:
                os.kill(child.pid, WORKER_DUMP_SIGNAL)
            except OSError:
                continue
            deadline = time.time() + 1.0
            while time.time() < deadline and os.fstat(f.fileno()).st_size <= size + 40:
                time.sleep(0.02)
            time.sleep(0.05)  # let the dump finish

    def _worker_lines(self) -> list[str]:
        if self._workers_file is None:
            return []
        try:
            return worker_lines(Path(self._workers_file.name).read_text(errors="replace"))
        except OSError:
            return []

    def _arm_faulthandler(self) -> None:
        """Last resort if this thread itself cannot run: dump stacks and exit after 4 x timeout."""
        if self._fh_file is None:
            (self.exp / layout.STALL).mkdir(parents=True, exist_ok=True)
            self._fh_file = open(self.exp / layout.STALL / f"rank{self.hb.rank}.faulthandler.txt", "w")
        faulthandler.dump_traceback_later(
            4 * self.first_step_s if not self.hb.completed else 4 * self.timeout_s,
            exit=self.exit_on_stall,
            file=self._fh_file,
        )

    def run(self) -> None:
        try:
            self.relay = relay.start(self.exp, self.hb.rank, self.world_size, self.rid)  # None on one node
            self._watch()
        except Exception:  # never take training down; say so loudly
            log.exception("rank %d: the stall watchdog failed and is off", self.hb.rank)

    def _watch(self) -> None:
        clock = ProgressClock(self.world_size, self.timeout_s, self.first_step_s)
        self.flush()  # at once: a rank that fails in its first second is reported with the others' state
        if self.peers is not None:
            self.peers.start()
        while not self._halt.wait(self.poll_s):
            if self.peers is not None:
                self.peers.look()  # restarted peers, late ones
            self.flush()
            if self.exit_on_stall:
                self._arm_faulthandler()
            failed = [e for e in rank_errors(self.exp, self.t0, self.rid) if e["rank"] != self.hb.rank]
            if failed:
                self._on_stall(failed[0])
                return
            if clock.overdue(read_heartbeats(self.exp, self.rid)) is not None:
                self._on_stall()
                return

    def flush(self) -> None:
        write_heartbeat(self.exp, self.hb.snapshot(), self.rid)
        append_timeline(self.exp, self.hb.rank, self.hb.take_events())

    def _on_stall(self, failure: dict | None = None) -> None:
        """No progress (or ``failure``: another rank raised): dump this rank's stacks; the reporting rank
        (rank 0, or the lowest that did not fail) writes the report; then this rank exits."""
        self.stalled.set()
        faulthandler.cancel_dump_traceback_later()
        snap = self.hb.snapshot()
        stack = own_stack(threading.main_thread().ident)
        if self.world_size > 1 and snap["phase"] in ("compute", "step"):  # a loop's phase that says no more
            # stuck in backward under DDP is waiting for the other ranks' gradients: its all-reduce
            seen = phase_of(stack)
            if seen in ("backward", "collective"):  # in backward: DDP's gradient all-reduce
                snap["phase"] = "ddp_allreduce" if seen == "backward" else "collective"
        # the line of the user's own code it blocks at, and (waiting for data) each reading worker's
        frame = own_frame(stack)
        lines = [waits_at(frame) if snap["phase"] == "data" else f"at {where(frame)}"] if frame else []
        if snap["phase"] == "data":
            self._dump_workers()
            lines += self._worker_lines()
        snap["detail"] = "; ".join(([snap["detail"]] if snap.get("detail") else []) + lines)
        write_dump(self.exp, {**snap, "run": self.rid})
        relay.flush(self.relay)  # to the other nodes' reports
        if failure is None:
            log.error(
                "rank %d: no rank made progress for %g s; writing stacks to %s",
                self.hb.rank,
                self.timeout_s,
                self.exp / layout.STALL,
            )
        else:
            log.error("rank %d: %s; stopping this rank", self.hb.rank, error_line(failure))
        report_path = self.exp / layout.STALL_REPORT
        reporter = 0 if failure is None else min(r for r in range(self.world_size) if r != failure["rank"])
        if self.hb.rank == reporter:
            report = write_report(
                self.exp, self.world_size, self.timeout_s, self.rid, wait_s=COLLECT_S, since=self.t0, failure=failure
            )
            log.error("STALL: %s (report: %s)", report["verdict"], self.exp / layout.STALL_TEXT)
            if (self.exp / layout.LAB).exists():  # a loop of the user's: say how it ended
                write_lab_status(self.exp, {"status": "stalled" if failure is None else "failed", "ended": time.time()})
            print(
                f"{'STALL' if failure is None else 'FAILED'}: {report['verdict']}\n"
                f"full report: {self.exp / layout.STALL_TEXT}",
                file=sys.stderr,
                flush=True,
            )
        else:  # let the reporting rank finish the report before this rank's exit makes torchrun stop everyone
            deadline = time.time() + COLLECT_S + 4
            while not report_path.exists() and time.time() < deadline:
                time.sleep(0.2)
        if self.exit_on_stall:
            relay.flush(self.relay)
            kill_children()
            if failure is not None:
                _after_the_failed(failure)
            logging.shutdown()
            os._exit(STALL_EXIT if failure is None else PEER_FAILED_EXIT)

    def stop(self, settle: bool = True) -> None:
        """End watching (training is over); writes the final heartbeat and timeline. ``settle``: across
        nodes, wait a little for the other ranks' last heartbeats (no: more watching follows)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        if self.peers is not None:
            self.peers.stop()
        faulthandler.cancel_dump_traceback_later()
        if self._fh_file is not None:
            self._fh_file.close()
            Path(self._fh_file.name).unlink(missing_ok=True)
        if self._workers_file is not None and not self.stalled.is_set():
            faulthandler.unregister(WORKER_DUMP_SIGNAL)
            self._workers_file.close()
            Path(self._workers_file.name).unlink(missing_ok=True)
        if not self.stalled.is_set():
            self.flush()
        if self.relay is not None:
            self.relay.stop(wait_s=3.0 if settle else 0.0)


@contextlib.contextmanager
def watching(
    hb: Heartbeat, exp: str | Path, world_size: int, phase: str, timeout_s: float, first_step_timeout_s: float = 0.0
):
    """A :class:`Watchdog` over work before training's own (start-up), ``hb`` in ``phase`` meanwhile;
    off when ``timeout_s`` is 0."""
    watchdog = None
    if timeout_s > 0:
        watchdog = Watchdog(hb, exp, world_size, timeout_s, first_step_timeout_s)
        watchdog.start()
    hb.enter(phase)
    try:
        yield
    finally:
        hb.enter("start")
        if watchdog is not None:
            watchdog.stop(settle=False)  # training's own watchdog follows


def _after_the_failed(failure: dict, limit_s: float = 20.0) -> None:
    """Wait (at most ``limit_s``) for the rank that failed to end first, and for the clock to pass the
    second of its error: torchrun's agent names as root cause the failure with the earliest time, in
    whole seconds, and a survivor that ended first would take the blame."""
    deadline = time.time() + limit_s
    pid, here = failure.get("pid"), failure.get("host") in (None, socket.gethostname())
    while pid and here and time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.Error:
            break
        time.sleep(0.1)
    wait = int(failure.get("time", 0)) + 1.2 - time.time()
    if wait > 0:
        time.sleep(min(wait, max(0.0, deadline - time.time())))


__all__ = [
    "COLLECT_S",
    "catches",
    "PEER_FAILED_EXIT",
    "STALL_EXIT",
    "ProgressClock",
    "Watchdog",
    "kill_children",
    "watching",
]

"""``asrlab train --nproc N [--nnodes M ...]``: start N ranks with torchrun on this node and wait for them.

On several nodes the same command runs on each, and torchrun's own rendezvous makes them one job
(:class:`Nodes`); the stall watch's files reach every node through :mod:`asrlab.lab.stall.relay`.
The launcher is also the stall watchdog of last resort: if the ranks' own watchdogs cannot act
(rank 0 frozen, say), it stops the job and writes the stall report from what the ranks left.

Nothing of the job outlives it: a SIGTERM, SIGINT or SIGHUP to ``asrlab train`` is passed on to
torchrun's agent, which passes it to every rank, and each rank stops cleanly (:mod:`asrlab.lab.stop`:
a checkpoint at the same step on every rank); a second one ends the job at once. The agent ends with
the launcher (a parent-death signal) and each rank with the agent, so a launcher killed outright
(SIGKILL) leaves nothing running either.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..lab import layout
from ..errors import UsageError
from ..lab import (
    COLLECT_S,
    PARENT_GONE,
    STALL_EXIT,
    ProgressClock,
    end_with_parent,
    first_rank_error,
    format_rank_error,
    own_session_ending_with_parent,
    read_heartbeats,
    write_report,
)

log = logging.getLogger(__name__)


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


QUIET_ENV = "ASRLAB_LAUNCHER"  # set for ranks the asrlab launcher started: it reports their errors
# in every process of the job: its run folder (a forked rank's command line is its forkserver's, not asrlab's)
JOB_ENV = "ASRLAB_JOB"
AGENT_ENV = "ASRLAB_AGENT_PID"  # set by the launcher's torchrun agent for its ranks: who they end with
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what the launcher passes on to the job


@dataclass(frozen=True)
class Nodes:
    """A job over several nodes, as torchrun takes it: with ``node_rank`` the nodes are ranked as given
    (torchrun's static rendezvous, the first node's agent serving the store at ``endpoint``); without,
    as they join (the c10d rendezvous, elastic)."""

    nnodes: int
    node_rank: int | None
    endpoint: str
    run_id: str | None = None

    def torchrun_args(self) -> list[str]:
        host, _, port = self.endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--rdzv-endpoint {self.endpoint}: not HOST:PORT")
        args = [f"--nnodes={self.nnodes}"]
        if self.run_id:
            args.append(f"--rdzv-id={self.run_id}")
        if self.node_rank is not None:
            if not 0 <= self.node_rank < self.nnodes:
                raise UsageError(f"--node-rank {self.node_rank}: not between 0 and {self.nnodes - 1}")
            return args + [f"--node-rank={self.node_rank}", f"--master-addr={host}", f"--master-port={port}"]
        return args + ["--rdzv-backend=c10d", f"--rdzv-endpoint={self.endpoint}"]


# The ranks are forked from a process that imported these once (torch elastic's forkserver, the ranks' script run
# in the forked process), not each started as a new Python that imports them again: a rank's start-up is most of
# a short job's CPU. Importing them touches no GPU (each rank's CUDA is its own, made after the fork).
WARM = ("torch", "torch._dynamo", "asrlab.cli.train", "asrlab.train.trainer")
RANK_SCRIPT = Path(__file__).resolve().parent.parent / "cli" / "rank.py"  # (a path: no import of the cli)


def torchrun_command(nproc: int, train_args: list[str], nodes: Nodes | None = None, max_restarts: int = 0) -> list[str]:
    """torchrun on this node; ``max_restarts``: torch elastic restarts every rank after a failure (each
    resumes from the last checkpoint)."""
    where = ["--standalone"] if nodes is None else nodes.torchrun_args()
    return [
        sys.executable,
        "-m",
        "asrlab.train.launch",
        *where,
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--start-method=forkserver",
        "--run-path",
        str(RANK_SCRIPT),
        "train",
        *train_args,
    ]


def quiet_torchrun(argv: list[str]) -> int:
    """torchrun, without its report of failed ranks (a traceback and a table per failure, some forty lines
    that bury the rank's own error): one line per failed rank instead; the launcher then prints the first
    rank's own error. Returns the first failed rank's exit code (128 + the signal when one killed it)."""
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    logging.getLogger(api.__name__).addFilter(_without_traceback)
    # the agent has no error file of its own to copy a rank's into, and need not say so: the launcher prints it
    logging.getLogger(f"{ChildFailedError.__module__}.error_handler").addFilter(
        lambda r: not r.getMessage().startswith("no error file defined for parent")
    )
    api.MultiprocessContext._poll = _every_failure(api.MultiprocessContext._poll, api.ProcessFailure)
    try:
        torchrun_main(argv)
    except api.SignalException as e:  # passed on to the ranks, which have ended (or were killed after a grace)
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        for rank, f in sorted(e.failures.items()):
            how = f"signal {f.signal_name()}" if f.exitcode < 0 else f"exit code {f.exitcode}"
            print(f"torchrun: rank {rank} (pid {f.pid}) ended with {how}", file=sys.stderr, flush=True)
        # a rank a signal killed (the OOM killer's SIGKILL, a segfault) did not fail for its peers: the others'
        # errors in the same moment are of the peer they lost; else the first by time, as torch elastic says
        killed = [f for f in e.failures.values() if -64 <= f.exitcode < 0 and -f.exitcode not in PASSED_ON]
        code = (killed[0] if killed else e.get_first_failure()[1]).exitcode
        return code if code > 0 else 128 - code
    return 0


def _every_failure(poll, failure):
    """torch elastic's poll of forked ranks names only the first failed rank it happens to look at: the others
    that failed by then are named too (the rank a signal killed, beside the peer that lost it), as its poll of
    ranks started as programs does."""

    def every(self):
        result = poll(self)
        if result is not None and result.failures and self._pc is not None:
            for i, p in enumerate(self._pc.processes):
                if i not in result.failures and p.exitcode not in (None, 0):
                    result.failures[i] = failure(i, p.pid, p.exitcode, self.error_files[i])
        return result

    return every


def _without_traceback(record: logging.LogRecord) -> bool:
    """torch elastic's line for a forked rank that failed, without the traceback of how it learnt it."""
    record.exc_info = record.exc_text = None
    return True


def settle_rank() -> None:
    """In a rank the launcher's agent forked: as a rank started as a program of its own would be. Its own session
    (a signal to the agent's group is the agent's to pass on); ``PARENT_GONE`` (a clean stop) when the process
    that forked it ends, which it does with the agent, so that no rank outlives it; multiprocessing's default
    start method, not the forkserver that started it (the rank's DataLoader workers and pools fork from it).
    Nothing under another torchrun."""
    agent, parent = os.environ.get(AGENT_ENV, ""), psutil.Process(os.getppid())
    if not agent.isdigit() or int(agent) not in (parent.pid, parent.ppid()):
        return
    try:
        os.setsid()
    except OSError:  # already a session's leader
        pass
    end_with_parent(parent.pid)
    import multiprocessing

    multiprocessing.set_start_method(None, force=True)


class _PassOn:
    """While the launcher waits: the first of ``PASSED_ON`` goes to the agent as SIGTERM (torch elastic
    gives it to every rank, which stops cleanly, and kills what still runs after its grace); a second
    (but ``PARENT_GONE`` again) ends the whole job at once."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.got, self.before = proc, [], {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.before = {sig: signal.signal(sig, self._handler) for sig in PASSED_ON}
        return self

    def __exit__(self, *exc):
        for sig, old in self.before.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)

    def _handler(self, sig, frame) -> None:
        if self.got and sig == PARENT_GONE:  # sent again as the parent's threads end: one request
            return
        self.got.append(sig)
        if len(self.got) > 1:
            kill_tree(self.proc.pid)
            return
        print(
            f"asrlab train: {signal.Signals(sig).name}: every rank stops after its step with a checkpoint "
            "(again to end them at once)",
            file=sys.stderr,
            flush=True,
        )
        try:
            os.kill(self.proc.pid, signal.SIGTERM)  # the agent alone: the forkserver ends with it
        except ProcessLookupError:
            pass


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_all(procs: dict[int, psutil.Process]) -> None:
    """SIGKILL whatever of ``procs`` still runs (a frozen or stopped rank ignores SIGTERM)."""
    for p in procs.values():
        try:
            if p.is_running():  # same pid *and* start time: never a recycled pid
                p.kill()
        except psutil.Error:
            pass


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid`` and every process under it (torchrun, ranks, loader workers) at once."""
    try:
        root = {pid: psutil.Process(pid)}
    except psutil.Error:
        root = {}
    _kill_all({**root, **{p.pid: p for p in _descendants(pid)}})


def _stop(proc: subprocess.Popen) -> None:
    """Stop torchrun and its process group (SIGTERM, then SIGKILL)."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(
    nproc: int,
    train_args: list[str],
    exp: str | Path | None = None,
    stall_timeout_s: float = 0.0,
    first_step_s: float = 0.0,
    timeout_s: float | None = None,
    nodes: Nodes | None = None,
    max_restarts: int = 0,
) -> int:
    """Run ``asrlab train`` on ``nproc`` local ranks (of ``nodes``, when the job spans several); returns
    torchrun's exit code (``STALL_EXIT`` on a stall; 128 + the signal when one asked it to stop)."""
    env = dict(os.environ, **{QUIET_ENV: "1", "PYTHONUNBUFFERED": "1"})  # as `python -u`: a killed rank's lines kept
    if exp is not None:
        env[JOB_ENV] = str(exp)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    world = nproc * (nodes.nnodes if nodes is not None else 1)  # every rank's heartbeat reaches EXP (relay)
    t_launch = time.time()
    proc = subprocess.Popen(
        torchrun_command(nproc, train_args, nodes, max_restarts), env=env, preexec_fn=own_session_ending_with_parent()
    )
    clock, stalled = ProgressClock(world, stall_timeout_s, first_step_s), False
    family: dict[int, psutil.Process] = {}  # every rank and worker seen, to be sure none outlives the job
    try:
        with _PassOn(proc) as passed:
            while proc.poll() is None:
                try:  # back as soon as the job ends, else to look at the ranks again
                    proc.wait(timeout=0.2 if passed.got else 1.0)
                except subprocess.TimeoutExpired:
                    pass
                family.update({p.pid: p for p in _descendants(proc.pid)})
                if timeout_s and time.time() - t_launch > timeout_s:
                    _stop(proc)
                    raise TimeoutError(f"training ran past {timeout_s} s")
                if exp is None or not stall_timeout_s or passed.got:
                    continue
                beats = {r: s for r, s in read_heartbeats(Path(exp)).items() if s.get("time", 0) >= t_launch}
                idle = clock.overdue(beats, extra_s=COLLECT_S + 10)  # the ranks' own watchdogs had their chance
                if idle is not None:
                    log.error("no rank progressed for %.0f s and their watchdogs did not act: stopping the job", idle)
                    stalled = True
                    _stop(proc)
    except BaseException:
        _stop(proc)
        raise
    finally:
        _kill_all(family)
    code = proc.returncode
    if passed.got:  # (each rank said how it stopped)
        return 128 + passed.got[0]
    if exp is not None and code != 0:
        report = Path(exp) / layout.STALL_REPORT
        fresh = report.exists() and report.stat().st_mtime >= t_launch
        dumps = [p for p in (Path(exp) / layout.STALL).glob("rank*.json") if p.stat().st_mtime >= t_launch]
        first, ranks = first_rank_error(exp, since=t_launch)
        if not fresh and (dumps or stalled):  # (a rank's error, when one was recorded, is the verdict's cause)
            r = write_report(Path(exp), world, stall_timeout_s, since=t_launch, failure=first)
            print(
                f"{'FAILED' if first else 'STALL'}: {r['verdict']}\nfull report: {Path(exp) / layout.STALL_TEXT}",
                file=sys.stderr,
                flush=True,
            )
            fresh = True
        if first is not None:  # said once, last, after whatever the ranks and torchrun printed
            print(format_rank_error(first, ranks, exp), file=sys.stderr, flush=True)
        if fresh:
            return STALL_EXIT
    return code


if __name__ == "__main__":  # the ranks' torchrun (see torchrun_command)
    os.environ[AGENT_ENV] = str(os.getpid())  # its ranks end with it (settle_rank)
    import multiprocessing.forkserver

    multiprocessing.set_forkserver_preload(list(WARM))
    multiprocessing.forkserver.ensure_running()  # its imports beside the agent's own (rendezvous included)
    sys.exit(quiet_torchrun(sys.argv[1:]))

"""The stall watchdog: turn a hang into a short, precise report and a non-zero exit.

Every rank runs a ``Watchdog`` thread. Once a second it writes its rank's heartbeat file and
reads every rank's. Progress is any change of any rank's beat counter (a phase change, an
evaluation batch, checkpoint bytes written); when no rank has progressed for ``timeout_s``
(``first_step_s`` until every rank has finished its first step), the job is stalled:

1. every rank writes ``EXP/stall/rank{R}.json``: its heartbeat and the Python stacks of all
   its threads;
2. rank 0 gathers them (waiting a few seconds for the others) into ``EXP/stall_report.json``
   and ``EXP/stall_report.txt``, whose first line is the verdict;
3. every rank kills its data-loader workers and exits with ``STALL_EXIT``, so no process is
   left running and no collective is left blocking (torchrun then stops the job).

If a rank's watchdog thread cannot run at all (a C call holding the GIL), ``faulthandler``
dumps that rank's stacks and exits it after ``4 x timeout_s``; if rank 0 is the stuck one, the
launcher (``asrlab train --nproc N``) writes the report from what the ranks left.
The thread talks through files, never through collectives: those are what is stuck.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from ...files import atomic_write
from . import relay
from .errors import error_line, rank_errors, record_rank_error
from .heartbeat import PHASES, STALE_S, Heartbeat, append_timeline, read_heartbeats, run_id, write_heartbeat

log = logging.getLogger(__name__)

STALL_EXIT = 3  # exit code of a rank (and of ``asrlab train``) stopped by the watchdog
COLLECT_S = 8.0  # how long rank 0 waits for the other ranks' stack dumps
FAILURE_COLLECT_S = 3.0  # how long a rank that raised waits for the others' stack dumps (they poll every second)
PEER_FAILED_EXIT = 5  # exit code of a rank the watchdog stopped because another rank raised
# data-loader workers forked after the watchdog started dump their stacks on this signal (a real-time
# one: SIGUSR1/2 are often the user's or the scheduler's); only a process that catches it is sent it
WORKER_DUMP_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None


def stall_dir(exp: Path) -> Path:
    return Path(exp) / "stall"


# --------------------------------------------------------------------------- the verdict

def ranks_text(ranks: list[int]) -> str:
    """``[1]`` -> "rank 1"; ``[1, 2, 3]`` -> "ranks 1-3"; ``[0, 2, 3]`` -> "ranks 0, 2, 3"."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _who(group: list[dict], nodes: bool) -> str:
    """The ranks of ``group``, and (``nodes``: the job spans several) the node and host of each."""
    text = ranks_text([s["rank"] for s in group])
    if not nodes:
        return text
    where = sorted({(s.get("node", 0), s.get("host")) for s in group})
    return f"{text} on " + ", ".join(f"node {n} ({h})" for n, h in where)


def _groups(snaps: list[dict]) -> list[tuple[str, int, list[dict]]]:
    groups: dict[tuple[str, int], list[dict]] = {}
    for s in snaps:
        groups.setdefault((s["phase"], s["step"]), []).append(s)
    return sorted(((p, st, g) for (p, st), g in groups.items()), key=lambda x: (len(x[2]), min(s["since"] for s in x[2])))


def _is(group: list) -> str:
    return "is" if len(group) == 1 else "are"


def phase_text(phase: str, step: int) -> str:
    """``"in the forward pass of step 7"``: a phase as the verdicts say it."""
    if phase == "epoch_end":
        return f"{PHASES[phase]} (after step {step})"
    if phase in ("start", "index", "done"):
        return PHASES[phase]
    return f"{PHASES.get(phase, phase)} of step {step}"


def rank_line(e: dict) -> str:
    """``rank 1 (host, pid 42): waiting for data of step 7 for 12 s; detail``: one rank, as every report,
    the doctor and the stall explorer say it (``e``: a heartbeat entry with ``in_phase_s``)."""
    if e.get("phase") is None:
        return f"rank {e['rank']}: {e.get('note') or 'no heartbeat'}"
    took = "" if e["phase"] == "done" else f" for {e.get('in_phase_s') or 0:g} s"
    detail = f"; {e['detail']}" if e.get("detail") else ""
    return f"rank {e['rank']} ({e.get('host')}, pid {e.get('pid')}): {phase_text(e['phase'], e['step'])}{took}{detail}"


def verdict(snaps: dict[int, dict], world_size: int, now: float) -> str:
    """One sentence a person can act on, from every rank's last heartbeat."""
    present = [snaps[r] for r in sorted(snaps)]
    missing = [r for r in range(world_size) if r not in snaps]
    waited = {s["rank"]: int(now - s["since"]) for s in present}
    frozen = [s for s in present if now - s.get("time", now) > STALE_S]
    data = [s for s in present if s["phase"] == "data"]
    ended = [s for s in present if s["phase"] in ("epoch_end", "done")]
    nodes = len({s.get("node", 0) for s in present}) > 1
    if frozen:  # its watchdog thread stopped writing: the process itself is stopped, frozen or dead
        lead = frozen
        r = min(frozen, key=lambda s: s["time"])
        first = (f"{_who(frozen, nodes)} stopped responding {int(now - r['time'])} s ago "
                 f"(process frozen or gone; last seen {phase_text(r['phase'], r['step'])})")
    elif data:
        lead = data
        r = sorted(data, key=lambda s: s["since"])[0]
        detail = f" ({r['detail']})" if r.get("detail") else ""
        first = (f"{_who(data, nodes)} {'has' if len(data) == 1 else 'have'} waited "
                 f"{waited[r['rank']]} s for data at step {r['step']}{detail}")
    elif ended and len(ended) < len(present):
        lead = ended
        r = ended[0]
        first = (f"{_who(ended, nodes)} finished {'its' if len(ended) == 1 else 'their'} data "
                 f"at step {r['step']} and {'waits' if len(ended) == 1 else 'wait'} at epoch end")
    elif missing:
        lead = []
        first = f"{ranks_text(missing)} never wrote a heartbeat (not started, or frozen before its watchdog ran)"
    elif present:
        phase, step, lead = _groups(present)[0]  # the odd one out, the longest stuck first
        r = min(lead, key=lambda s: s["since"])
        first = f"{_who(lead, nodes)} {_is(lead)} {phase_text(phase, step)} for {waited[r['rank']]} s"
    else:
        return "no rank wrote a heartbeat"
    lead_ranks = {s["rank"] for s in lead}
    rest = [s for s in present if s["rank"] not in lead_ranks]
    parts = [first]
    for phase, step, g in sorted(_groups(rest), key=lambda x: min(s["rank"] for s in x[2])):
        parts.append(f"{ranks_text([s['rank'] for s in g])} {_is(g)} {phase_text(phase, step)}")
    if missing and lead:
        parts.append(f"{ranks_text(missing)} never wrote a heartbeat")
    return "; ".join(parts)


# --------------------------------------------------------------------------- dumps and report

def thread_stacks() -> dict[str, list[str]]:
    """The Python stack of every thread of this process, innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {f"{names.get(ident, 'thread')} ({ident})": [line.rstrip() for line in traceback.format_stack(frame)]
            for ident, frame in sys._current_frames().items()}


def write_dump(exp: Path, snap: dict) -> Path:
    return atomic_write(stall_dir(exp) / f"rank{snap['rank']}.json", json.dumps({**snap, "stacks": thread_stacks()}))


def write_report(exp: Path, world_size: int, timeout_s: float, rid: str | None = None,
                 wait_s: float = 0.0, since: float = 0.0, now: float | None = None, failure: dict | None = None) -> dict:
    """Gather the ranks' dumps (waiting up to ``wait_s`` for all of them) into the report files.

    Only files of run ``rid`` (when given) written after ``since`` (wall clock) count. Ranks
    without a dump are described from their last heartbeat file; their stacks may be in
    ``EXP/stall/rank{R}.faulthandler.txt``. ``failure``: a rank's recorded error (:mod:`.failures`),
    which the others were left waiting for: the verdict names it first.
    """
    exp = Path(exp)
    deadline = time.time() + wait_s
    while True:
        dumps = {}
        for path in stall_dir(exp).glob("rank*.json"):
            try:
                d = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if (rid is None or d.get("run") == rid) and d.get("time", 0) >= since:
                dumps[int(d["rank"])] = d
        if len(dumps) >= world_size - (failure is not None) or time.time() >= deadline:
            break
        time.sleep(0.2)
    beats = {r: b for r, b in read_heartbeats(exp, rid).items() if b.get("time", 0) >= since}
    snaps = {**beats, **dumps}
    if now is None:  # when the stall was seen: the first dump, else now
        now = min([s.get("time", 0.0) for s in dumps.values()] or [time.time()])
    if failure is None:
        said = verdict(snaps, world_size, now)
    else:  # the rank that raised first, then where it left the others
        rest = [x for r, x in sorted(snaps.items()) if r != failure["rank"]]
        said = "; ".join([error_line(failure)] + [f"{ranks_text([x['rank'] for x in g])} {_is(g)} {phase_text(p, st)}"
                                                  for p, st, g in sorted(_groups(rest), key=lambda x: x[2][0]["rank"])])
    report = {"verdict": said, "time": now, "timeout_s": timeout_s, "world_size": world_size, "ranks": [],
              "failure": failure}
    for r in range(world_size):
        s = snaps.get(r)
        if s is None:
            report["ranks"].append({"rank": r, "phase": None, "note": "no heartbeat"})
            continue
        entry = {k: s.get(k) for k in ("rank", "phase", "step", "since", "detail", "host", "pid")}
        entry["in_phase_s"] = round(now - s["since"], 1)
        entry["stacks"] = s.get("stacks")
        fh = stall_dir(exp) / f"rank{r}.faulthandler.txt"
        if entry["stacks"] is None and fh.exists() and fh.stat().st_size:
            entry["faulthandler"] = fh.read_text()
        workers = stall_dir(exp) / f"rank{r}.workers.txt"
        if s.get("phase") == "data" and workers.exists() and workers.stat().st_size:
            entry["workers"] = workers.read_text()
        report["ranks"].append(entry)
    for name, text in (("stall_report.txt", format_report(report)), ("stall_report.json", json.dumps(report, indent=1))):
        atomic_write(exp / name, text)  # the failing rank and a survivor may both write it
    return report


def format_report(report: dict) -> str:
    failure = report.get("failure")
    why = (f"{error_line(failure)}. The other ranks were left waiting for it (their state and stacks below)."
           if failure else
           f"No rank made progress for {report['timeout_s']:g} s; the watchdog stopped the job.")
    lines = [report["verdict"], "", why, ""]
    lines += [rank_line(e) for e in report["ranks"]]
    for e in report["ranks"]:
        if e.get("stacks"):
            lines += ["", f"--- rank {e['rank']}: Python stacks ---"]
            for name, frames in sorted(e["stacks"].items(), key=lambda kv: "MainThread" not in kv[0]):
                lines.append(f"[{name}]")
                lines += frames[-12:]
        elif e.get("faulthandler"):
            lines += ["", f"--- rank {e['rank']}: faulthandler dump ---", e["faulthandler"]]
        if e.get("workers"):
            lines += ["", f"--- rank {e['rank']}: its data-loader workers' stacks ---", e["workers"].rstrip()]
    if failure:
        lines += ["", f"--- rank {failure['rank']}: the error ---", failure["traceback"].rstrip()]
    return "\n".join(lines) + "\n"


def rank_states(exp: str | Path) -> tuple[str, list[dict]]:
    """``(verdict, [per-rank entry])`` from the stall report, or from the heartbeats of a run without one."""
    exp = Path(exp)
    report = exp / "stall_report.json"
    if report.exists():
        r = json.loads(report.read_text())
        return r["verdict"], r["ranks"]
    beats = read_heartbeats(exp)
    if not beats:
        return "no heartbeat: the run has not started, or this is not an experiment folder", []
    now = max(b.get("time", 0.0) for b in beats.values()) or time.time()
    ranks = [{**{k: b.get(k) for k in ("rank", "phase", "step", "since", "detail", "host", "pid")},
              "in_phase_s": round(now - b.get("since", now), 1), "stacks": None} for _, b in sorted(beats.items())]
    phases = {e["phase"] for e in ranks}
    verdict = ("no stall: every rank finished" if phases == {"done"} else
               "no stall report: the watchdog did not fire (the run is going, or ended another way)")
    return verdict, ranks


def kill_children() -> None:
    """Kill this process's children (data-loader workers) so none outlives the rank."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            child.kill()
    except Exception:  # psutil absent or a child already gone
        pass


# --------------------------------------------------------------------------- the thread

def _catches(pid: int, sig: int) -> bool:
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
            s.get("completed", 0) > 0 or s["phase"] in ("epoch_end", "done") for s in beats.values())
        idle = now - self._since
        allowance = max([self.timeout_s if started else self.first_step_s]
                        + [s.get("allow_s") or 0.0 for s in beats.values()])  # a phase the user marked as slow
        return idle if idle > allowance + extra_s else None


class Watchdog(threading.Thread):
    """Watches every rank's heartbeat from this rank; see the module docstring."""

    def __init__(self, hb: Heartbeat, exp: str | Path, world_size: int, timeout_s: float,
                 first_step_s: float, poll_s: float = 1.0, exit_on_stall: bool = True, rid: str | None = None):
        super().__init__(name="asrlab-watchdog", daemon=True)
        self.hb, self.exp, self.world_size = hb, Path(exp), world_size
        self.timeout_s, self.first_step_s, self.poll_s = timeout_s, max(first_step_s, timeout_s), poll_s
        self.exit_on_stall = exit_on_stall
        self.rid = rid or run_id()
        self.stalled = threading.Event()
        self._halt = threading.Event()
        self._fh_file = None
        self.t0 = time.time()
        for path in (self.exp / "heartbeat" / f"rank{hb.rank}.json",
                     self.exp / "heartbeat" / f"rank{hb.rank}.timeline.jsonl", stall_dir(self.exp) / f"rank{hb.rank}.json"):
            path.unlink(missing_ok=True)
        if hb.rank == 0:
            for name in ("stall_report.json", "stall_report.txt"):
                (self.exp / name).unlink(missing_ok=True)
        self._workers_file = self._arm_worker_dumps()
        self.relay: relay.Relay | None = None

    def _arm_worker_dumps(self):
        """Workers forked from now on inherit a handler that writes their stacks to ``stall/rank{R}.workers.txt``."""
        if WORKER_DUMP_SIGNAL is None or threading.current_thread() is not threading.main_thread():
            return None
        stall_dir(self.exp).mkdir(parents=True, exist_ok=True)
        f = open(stall_dir(self.exp) / f"rank{self.hb.rank}.workers.txt", "w")
        faulthandler.register(WORKER_DUMP_SIGNAL, file=f, all_threads=True, chain=False)
        return f

    def _dump_workers(self) -> None:
        """Ask each child process that has the handler for its stacks, one after another."""
        f = self._workers_file
        if f is None:
            return
        try:
            import psutil

            children = psutil.Process().children(recursive=True)
        except Exception:
            return
        for child in children:
            if not _catches(child.pid, WORKER_DUMP_SIGNAL):
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

    def _arm_faulthandler(self) -> None:
        """Last resort if this thread itself cannot run: dump stacks and exit after 4 x timeout."""
        if self._fh_file is None:
            stall_dir(self.exp).mkdir(parents=True, exist_ok=True)
            self._fh_file = open(stall_dir(self.exp) / f"rank{self.hb.rank}.faulthandler.txt", "w")
        faulthandler.dump_traceback_later(4 * self.first_step_s if not self.hb.completed else 4 * self.timeout_s,
                                          exit=self.exit_on_stall, file=self._fh_file)

    def run(self) -> None:
        try:
            self.relay = relay.start(self.exp, self.hb.rank, self.world_size, self.rid)  # None on one node
            self._watch()
        except Exception:  # never take training down; say so loudly
            log.exception("rank %d: the stall watchdog failed and is off", self.hb.rank)

    def _watch(self) -> None:
        clock = ProgressClock(self.world_size, self.timeout_s, self.first_step_s)
        self.flush()  # at once: a rank that fails in its first second is reported with the others' state
        while not self._halt.wait(self.poll_s):
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
        if snap["phase"] == "data":
            self._dump_workers()
        write_dump(self.exp, {**snap, "run": self.rid})
        relay.flush(self.relay)  # to the other nodes' reports
        if failure is None:
            log.error("rank %d: no rank made progress for %g s; writing stacks to %s",
                      self.hb.rank, self.timeout_s, stall_dir(self.exp))
        else:
            log.error("rank %d: %s; stopping this rank", self.hb.rank, error_line(failure))
        report_path = self.exp / "stall_report.json"
        reporter = 0 if failure is None else min(r for r in range(self.world_size) if r != failure["rank"])
        if self.hb.rank == reporter:
            report = write_report(self.exp, self.world_size, self.timeout_s, self.rid, wait_s=COLLECT_S,
                                  since=self.t0, failure=failure)
            log.error("STALL: %s (report: %s)", report["verdict"], self.exp / "stall_report.txt")
            if (self.exp / "lab.json").exists():  # a loop of the user's: say how it ended
                _write_lab_status(self.exp, {"status": "stalled" if failure is None else "failed", "ended": time.time()})
            print(f"{'STALL' if failure is None else 'FAILED'}: {report['verdict']}\n"
                  f"full report: {self.exp / 'stall_report.txt'}", file=sys.stderr, flush=True)
        else:  # let the reporting rank finish the report before this rank's exit makes torchrun stop everyone
            deadline = time.time() + COLLECT_S + 4
            while not report_path.exists() and time.time() < deadline:
                time.sleep(0.2)
        if self.exit_on_stall:
            relay.flush(self.relay)
            kill_children()
            logging.shutdown()
            os._exit(STALL_EXIT if failure is None else PEER_FAILED_EXIT)

    def stop(self, settle: bool = True) -> None:
        """End watching (training is over); writes the final heartbeat and timeline. ``settle``: across
        nodes, wait a little for the other ranks' last heartbeats (no: more watching follows)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
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
def watching(hb: Heartbeat, exp: str | Path, world_size: int, train_cfg, phase: str):
    """A :class:`Watchdog` over work before training's own (start-up), ``hb`` in ``phase`` meanwhile;
    off when ``train_cfg.stall_timeout_s`` is 0."""
    watchdog = None
    if train_cfg.stall_timeout_s > 0:
        watchdog = Watchdog(hb, exp, world_size, train_cfg.stall_timeout_s, train_cfg.first_step_timeout_s)
        watchdog.start()
    hb.enter(phase)
    try:
        yield
    finally:
        hb.enter("start")
        if watchdog is not None:
            watchdog.stop(settle=False)  # training's own watchdog follows


_WATCHED: list = []  # what announce() tells: the running StallWatch's heartbeat, or a loop's own (announced_to)


def announce(phase: str, step: int | None = None) -> None:
    """Tell this process's stall watch (if one runs) that it is now in ``phase``: how asrlab's other
    parts (the uneven guard's agreement, the numerics guard's optimizer step) show up in a verdict."""
    if _WATCHED:
        _WATCHED[-1].enter(phase, step)


@contextlib.contextmanager
def announced_to(enter):
    """Inside the block, :func:`announce` calls ``enter(phase, step)``: for a loop that keeps its own heartbeat
    and :class:`Watchdog` instead of a :class:`StallWatch` (asrlab's trainer, which also times each phase)."""
    listener = SimpleNamespace(enter=enter)
    _WATCHED.append(listener)
    try:
        yield
    finally:
        _WATCHED.remove(listener)


class StallWatch:
    """The stall watch for any training loop: a heartbeat per rank, watched from every rank.

    ::

        with StallWatch("exp", timeout_s=60) as watch:
            for batch in watch.data(loader):      # "data" while the next batch is awaited; one step per batch
                watch.enter("forward")
                loss = model(batch).mean()
                watch.enter("backward")
                loss.backward()
                watch.enter("optimizer")
                opt.step()

    A hang anywhere (a collective, the data, a file read, a lock in user code) ends the run within
    ``timeout_s`` + a few seconds with ``EXP/stall_report.txt``: the verdict naming the rank(s) and
    phase, every rank's stacks, and its data-loader workers' stacks when it waits for data. An
    exception leaving the ``with`` block is recorded (:mod:`.failures`); the other ranks' watches
    then stop them within seconds, the verdict naming that rank and its error, instead of leaving them
    in a collective until its timeout. ``watch.enter("eval", allow_s=900)`` marks a phase that may take
    long; the first step has ``first_step_s``. Ranks are those of the process group (or ``RANK``/
    ``WORLD_SIZE``); all ranks must share ``exp`` (a shared file system on several nodes).
    """

    def __init__(self, exp: str | Path, timeout_s: float = 60.0, first_step_s: float | None = None,
                 timeline: bool = False, exit_on_stall: bool = True, poll_s: float = 1.0):
        from .. import dist

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
            import torch.distributed as tdist

            tdist.broadcast_object_list(rid, src=0, group=group)
        return rid[0]

    def start(self) -> "StallWatch":
        self.exp.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            _write_lab_status(self.exp, {"world_size": self.world_size, "status": "running", "started": time.time(),
                                         "run": self.rid, "timeout_s": self.timeout_s})
        self.watchdog = Watchdog(self.hb, self.exp, self.world_size, self.timeout_s, self.first_step_s,
                                 poll_s=self.poll_s, exit_on_stall=self.exit_on_stall, rid=self.rid)
        self.watchdog.start()
        _WATCHED.append(self.hb)
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

    def tick(self) -> None:
        """Progress inside a long phase (an evaluation batch): no stall while ticks come."""
        self.hb.tick()

    def data(self, batches):
        """Yield from ``batches``, in phase ``data`` while each next batch is awaited and ``compute`` after it
        came (until the loop enters another phase); each batch is a step, done when the next one is asked
        for. ``epoch_end`` when it runs out."""
        it = iter(batches)
        while True:
            self.hb.enter("data", self.hb.step + 1)
            try:
                batch = next(it)
            except StopIteration:
                self.hb.enter("epoch_end")
                return
            self.hb.enter("compute")
            yield batch
            self.hb.completed += 1

    def stop(self, error: BaseException | None = None) -> None:
        """End the watch: ``error`` is recorded for the other ranks and ``asrlab doctor``."""
        if self.watchdog is None:
            return
        watchdog, self.watchdog = self.watchdog, None
        if self.hb in _WATCHED:
            _WATCHED.remove(self.hb)
        if sys.excepthook == self._on_uncaught:
            sys.excepthook = self._excepthook
        atexit.unregister(self.stop)
        if error is not None:
            record_rank_error(self.exp, error, self.rank, self.rid, self.hb.phase, self.hb.step)
            failure = rank_errors(self.exp, watchdog.t0, self.rid)[0]
            watchdog.flush()
            if failure["rank"] == self.rank:  # the first to fail reports, with the stacks the others dump
                write_report(self.exp, self.world_size, self.timeout_s, self.rid,  # when their watches see
                             wait_s=FAILURE_COLLECT_S, since=watchdog.t0, failure=failure)  # the error
        else:
            self.hb.enter("done")
        watchdog.stop()
        if error is not None or self.rank == 0:  # the rank that failed says so (rank 0 may be killed before it could)
            _write_lab_status(self.exp, {"status": "failed" if error is not None else "finished", "ended": time.time()})

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop(exc if isinstance(exc, Exception) else None)
        return False


def _write_lab_status(exp: Path, update: dict) -> None:
    """``EXP/lab.json``: what a loop using the parts says about its run (for ``asrlab doctor``)."""
    path = exp / "lab.json"
    try:
        state = json.loads(path.read_text()) if "started" not in update else {}
    except (OSError, ValueError):
        state = {}
    state.update(update)
    atomic_write(path, json.dumps(state, indent=1))


__all__ = ["PEER_FAILED_EXIT", "announce", "announced_to", "STALL_EXIT", "StallWatch", "Watchdog", "verdict", "write_report", "format_report", "ranks_text", "stall_dir"]

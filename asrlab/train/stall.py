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

import faulthandler
import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from .heartbeat import PHASES, Heartbeat, append_timeline, read_heartbeats, run_id, write_heartbeat

log = logging.getLogger(__name__)

STALL_EXIT = 3  # exit code of a rank (and of ``asrlab train``) stopped by the watchdog
COLLECT_S = 8.0  # how long rank 0 waits for the other ranks' stack dumps
STALE_S = 4.0    # a heartbeat file this much older than the others: that rank's process is frozen or gone


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


def _groups(snaps: list[dict]) -> list[tuple[str, int, list[dict]]]:
    groups: dict[tuple[str, int], list[dict]] = {}
    for s in snaps:
        groups.setdefault((s["phase"], s["step"]), []).append(s)
    return sorted(((p, st, g) for (p, st), g in groups.items()), key=lambda x: (len(x[2]), min(s["since"] for s in x[2])))


def _is(group: list) -> str:
    return "is" if len(group) == 1 else "are"


def _where(phase: str, step: int) -> str:
    if phase == "epoch_end":
        return f"{PHASES[phase]} (after step {step})"
    if phase in ("start", "done"):
        return PHASES[phase]
    return f"{PHASES.get(phase, phase)} of step {step}"


def verdict(snaps: dict[int, dict], world_size: int, now: float) -> str:
    """One sentence a person can act on, from every rank's last heartbeat."""
    present = [snaps[r] for r in sorted(snaps)]
    missing = [r for r in range(world_size) if r not in snaps]
    waited = {s["rank"]: int(now - s["since"]) for s in present}
    frozen = [s for s in present if now - s.get("time", now) > STALE_S]
    data = [s for s in present if s["phase"] == "data"]
    ended = [s for s in present if s["phase"] in ("epoch_end", "done")]
    if frozen:  # its watchdog thread stopped writing: the process itself is stopped, frozen or dead
        lead = frozen
        r = min(frozen, key=lambda s: s["time"])
        first = (f"{ranks_text([s['rank'] for s in frozen])} stopped responding {int(now - r['time'])} s ago "
                 f"(process frozen or gone; last seen {_where(r['phase'], r['step'])})")
    elif data:
        lead = data
        r = sorted(data, key=lambda s: s["since"])[0]
        detail = f" ({r['detail']})" if r.get("detail") else ""
        first = (f"{ranks_text([s['rank'] for s in data])} {'has' if len(data) == 1 else 'have'} waited "
                 f"{waited[r['rank']]} s for data at step {r['step']}{detail}")
    elif ended and len(ended) < len(present):
        lead = ended
        r = ended[0]
        first = (f"{ranks_text([s['rank'] for s in ended])} finished {'its' if len(ended) == 1 else 'their'} data "
                 f"at step {r['step']} and {'waits' if len(ended) == 1 else 'wait'} at epoch end")
    elif missing:
        lead = []
        first = f"{ranks_text(missing)} never wrote a heartbeat (not started, or frozen before its watchdog ran)"
    elif present:
        phase, step, lead = _groups(present)[0]  # the odd one out, the longest stuck first
        r = min(lead, key=lambda s: s["since"])
        first = f"{ranks_text([s['rank'] for s in lead])} {_is(lead)} {_where(phase, step)} for {waited[r['rank']]} s"
    else:
        return "no rank wrote a heartbeat"
    lead_ranks = {s["rank"] for s in lead}
    rest = [s for s in present if s["rank"] not in lead_ranks]
    parts = [first]
    for phase, step, g in sorted(_groups(rest), key=lambda x: min(s["rank"] for s in x[2])):
        parts.append(f"{ranks_text([s['rank'] for s in g])} {_is(g)} {_where(phase, step)}")
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
    d = stall_dir(exp)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"rank{snap['rank']}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**snap, "stacks": thread_stacks()}))
    os.replace(tmp, path)
    return path


def write_report(exp: Path, world_size: int, timeout_s: float, rid: str | None = None,
                 wait_s: float = 0.0, since: float = 0.0, now: float | None = None) -> dict:
    """Gather the ranks' dumps (waiting up to ``wait_s`` for all of them) into the report files.

    Only files of run ``rid`` (when given) written after ``since`` (wall clock) count. Ranks
    without a dump are described from their last heartbeat file; their stacks may be in
    ``EXP/stall/rank{R}.faulthandler.txt``.
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
        if len(dumps) >= world_size or time.time() >= deadline:
            break
        time.sleep(0.2)
    beats = {r: b for r, b in read_heartbeats(exp, rid).items() if b.get("time", 0) >= since}
    snaps = {**beats, **dumps}
    if now is None:  # when the stall was seen: the first dump, else now
        now = min([s.get("time", 0.0) for s in dumps.values()] or [time.time()])
    report = {"verdict": verdict(snaps, world_size, now), "time": now, "timeout_s": timeout_s,
              "world_size": world_size, "ranks": []}
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
        report["ranks"].append(entry)
    (exp / "stall_report.json").write_text(json.dumps(report, indent=1))
    (exp / "stall_report.txt").write_text(format_report(report))
    return report


def format_report(report: dict) -> str:
    lines = [report["verdict"], "",
             f"No rank made progress for {report['timeout_s']:g} s; the watchdog stopped the job.", ""]
    for e in report["ranks"]:
        if e.get("phase") is None:
            lines.append(f"rank {e['rank']}: no heartbeat")
            continue
        lines.append(f"rank {e['rank']} ({e.get('host')}, pid {e.get('pid')}): step {e['step']}, "
                     f"{e['phase']} for {e['in_phase_s']:g} s" + (f"; {e['detail']}" if e.get("detail") else ""))
    for e in report["ranks"]:
        if e.get("stacks"):
            lines += ["", f"--- rank {e['rank']}: Python stacks ---"]
            for name, frames in sorted(e["stacks"].items(), key=lambda kv: "MainThread" not in kv[0]):
                lines.append(f"[{name}]")
                lines += frames[-12:]
        elif e.get("faulthandler"):
            lines += ["", f"--- rank {e['rank']}: faulthandler dump ---", e["faulthandler"]]
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
        return idle if idle > (self.timeout_s if started else self.first_step_s) + extra_s else None


class Watchdog(threading.Thread):
    """Watches every rank's heartbeat from this rank; see the module docstring."""

    def __init__(self, hb: Heartbeat, exp: str | Path, world_size: int, timeout_s: float,
                 first_step_s: float, poll_s: float = 1.0, exit_on_stall: bool = True):
        super().__init__(name="asrlab-watchdog", daemon=True)
        self.hb, self.exp, self.world_size = hb, Path(exp), world_size
        self.timeout_s, self.first_step_s, self.poll_s = timeout_s, max(first_step_s, timeout_s), poll_s
        self.exit_on_stall = exit_on_stall
        self.rid = run_id()
        self.stalled = threading.Event()
        self._halt = threading.Event()
        self._fh_file = None
        for path in (self.exp / "heartbeat" / f"rank{hb.rank}.json",
                     self.exp / "heartbeat" / f"rank{hb.rank}.timeline.jsonl", stall_dir(self.exp) / f"rank{hb.rank}.json"):
            path.unlink(missing_ok=True)
        if hb.rank == 0:
            for name in ("stall_report.json", "stall_report.txt"):
                (self.exp / name).unlink(missing_ok=True)

    def _arm_faulthandler(self) -> None:
        """Last resort if this thread itself cannot run: dump stacks and exit after 4 x timeout."""
        if self._fh_file is None:
            stall_dir(self.exp).mkdir(parents=True, exist_ok=True)
            self._fh_file = open(stall_dir(self.exp) / f"rank{self.hb.rank}.faulthandler.txt", "w")
        faulthandler.dump_traceback_later(4 * self.first_step_s if not self.hb.completed else 4 * self.timeout_s,
                                          exit=self.exit_on_stall, file=self._fh_file)

    def run(self) -> None:
        try:
            self._watch()
        except Exception:  # never take training down; say so loudly
            log.exception("rank %d: the stall watchdog failed and is off", self.hb.rank)

    def _watch(self) -> None:
        clock = ProgressClock(self.world_size, self.timeout_s, self.first_step_s)
        while not self._halt.wait(self.poll_s):
            self.flush()
            if self.exit_on_stall:
                self._arm_faulthandler()
            if clock.overdue(read_heartbeats(self.exp, self.rid)) is not None:
                self._on_stall()
                return

    def flush(self) -> None:
        write_heartbeat(self.exp, self.hb.snapshot(), self.rid)
        append_timeline(self.exp, self.hb.rank, self.hb.take_events())

    def _on_stall(self) -> None:
        self.stalled.set()
        faulthandler.cancel_dump_traceback_later()
        write_dump(self.exp, {**self.hb.snapshot(), "run": self.rid})
        log.error("rank %d: no rank made progress for %g s; writing stacks to %s",
                  self.hb.rank, self.timeout_s, stall_dir(self.exp))
        report_path = self.exp / "stall_report.json"
        if self.hb.rank == 0:
            report = write_report(self.exp, self.world_size, self.timeout_s, self.rid, wait_s=COLLECT_S)
            log.error("STALL: %s (report: %s)", report["verdict"], self.exp / "stall_report.txt")
            print(f"STALL: {report['verdict']}\nfull report: {self.exp / 'stall_report.txt'}", file=sys.stderr, flush=True)
        else:  # let rank 0 finish the report before this rank's exit makes torchrun stop everyone
            deadline = time.time() + COLLECT_S + 4
            while not report_path.exists() and time.time() < deadline:
                time.sleep(0.2)
        if self.exit_on_stall:
            kill_children()
            logging.shutdown()
            os._exit(STALL_EXIT)

    def stop(self) -> None:
        """End watching (training is over); writes the final heartbeat and timeline."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        faulthandler.cancel_dump_traceback_later()
        if self._fh_file is not None:
            self._fh_file.close()
            Path(self._fh_file.name).unlink(missing_ok=True)
        if not self.stalled.is_set():
            self.flush()


__all__ = ["STALL_EXIT", "Watchdog", "verdict", "write_report", "format_report", "ranks_text", "stall_dir"]

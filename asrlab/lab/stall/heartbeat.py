"""Each rank's heartbeat: the step it is on, the phase of the step it is in, and since when.

The trainer calls ``hb.enter(phase)`` at every phase boundary (about eight times a step) and
``hb.tick()`` for progress inside a long phase (an evaluation batch, a checkpoint's bytes).
Both are a few attribute stores in memory (well under a microsecond); the file
``EXP/heartbeat/rank{R}.json`` is written by the watchdog thread once a second, off the
training path. With ``timeline=True`` every phase change is also kept and flushed to
``EXP/heartbeat/rank{R}.timeline.jsonl`` (wall-clock seconds), for the per-rank timeline figure.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import psutil

from .. import layout
from ..layout import HEARTBEAT
from ...files import append_jsonl, atomic_write, read_jsonl
from .relay import node_rank

# a heartbeat this much older than now: its rank's process is frozen or gone (the watchdog writes one a
# second; a copy relayed from another node is up to about 2 s old)
STALE_S = 4.0

# torch.compile's compilation (the first step's, a new shape's): not a stall until this long. Inductor's code
# generation takes minutes for a large model on a few CPU cores
COMPILE_ALLOW_S = 1800.0

# phase -> how a verdict says it ("rank 1 {text} of step 17")
PHASES = {
    "start": "starting up",
    "index": "reading the data's index (lengths and transcripts, before the first step)",
    "data": "waiting for data",
    "sync": "blocked in the data check",  # uneven=stop: does every rank have a batch?
    "copy": "copying a batch to the device",
    "compute": "in the step's computation",
    "features": "computing fbank on the device",
    "forward": "in the forward pass",
    "compile": "compiling the model (torch.compile)",
    "backward": "in the backward pass",
    "allreduce": "blocked in the gradient all-reduce",
    "ddp_allreduce": "waiting in DDP's gradient all-reduce (backward)",  # read from a stack that stays in backward
    "collective": "waiting in a collective (torch.distributed)",
    "other": "in the loop's own code",
    "optimizer": "in the optimizer step",
    "checkpoint": "in a checkpoint (gathering every rank's state, then writing)",
    "eval": "evaluating",
    "epoch_end": "waiting at epoch end",
    "left_loop": "past the training loop (its data ran out)",  # read from a stack after the loop's last line
    # read from a stack at the loop's own line, in a collective its loader's iteration calls (Accelerate's
    # seed broadcast as an epoch begins) while another rank is inside a step
    "next_epoch": "back at the head of the training loop (its data ran out)",
    "done": "finished",
    "exited": "ended (a process the watch numbered: how, it cannot see from outside)",
}


def run_id() -> str:
    """Identifies one launch, so files left by an earlier run in the same EXP are ignored."""
    rid = os.environ.get("TORCHELASTIC_RUN_ID")
    if rid:
        return f"{rid}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"{socket.gethostname()}.{os.getpid()}"


class Heartbeat:
    """What one rank is doing now. ``step`` is the optimizer step being worked on (1-based)."""

    def __init__(self, rank: int, timeline: bool = False):
        self.rank = rank
        self.phase, self.step, self.since = "start", 0, time.time()
        self.started = self.since  # the launch's time in the heartbeat itself: a copied folder's mtimes are not it
        self.beats = 0  # grows with every phase change or tick: progress of any kind
        self.completed = 0  # steps finished by this process (the first one has its own allowance)
        self.describe = None  # optional callable -> str, asked only when reporting (e.g. which shard)
        self.allow_s = 0.0  # a longer allowance for the current phase (a marked slow evaluation)
        self.phase_s: dict[str, float] = {}  # seconds spent in each phase so far (time shares, any loop)
        self.ahead = 0  # in "data": batches a reader holds beyond the awaited one (it reads step + ahead's)
        self.per_step, self.micro = 1, 0  # batches per step (gradient accumulation), and the awaited one's place in it
        self.events: list | None = [] if timeline else None

    def enter(self, phase: str, step: int | None = None, allow_s: float = 0.0) -> None:
        now = time.time()
        if step is not None:
            self.step = step
        self.phase_s[self.phase] = self.phase_s.get(self.phase, 0.0) + (now - self.since)
        self.phase, self.since, self.allow_s = phase, now, allow_s
        self.beats += 1
        if self.events is not None:
            self.events.append((now, phase, self.step))

    def tick(self) -> None:
        self.beats += 1

    def snapshot(self) -> dict:
        phase, step, since, beats, allow_s = self.phase, self.step, self.since, self.beats, self.allow_s
        detail = ""
        if self.describe is not None and phase == "data":
            try:
                detail = self.describe()
            except Exception as e:  # a report must never fail because of a description
                detail = f"(no description: {e})"
        return {
            "rank": self.rank,
            "phase": phase,
            "step": step,
            "since": since,
            "beats": beats,
            "detail": detail,
            "completed": self.completed,
            "ahead": (self.micro + self.ahead) // self.per_step if phase == "data" else 0,  # in steps
            "allow_s": allow_s,
            "phase_s": dict(self.phase_s),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node": node_rank(),
            "time": time.time(),
            "started": self.started,
        }

    def take_events(self) -> list:
        """Phase changes since the last call (the timeline), oldest first."""
        if not self.events:
            return []
        n = len(self.events)
        out, self.events[:n] = self.events[:n], []
        return out


_compiling: dict = {}  # the heartbeat torch.compile's compilations are said to, and the phase they interrupted


def _compile_started(args) -> None:
    hb = _compiling.get("hb")
    if hb is not None:
        _compiling["was"] = (hb.phase, hb.allow_s)
        hb.enter("compile", allow_s=COMPILE_ALLOW_S)


def _compile_ended(args) -> None:
    hb, was = _compiling.get("hb"), _compiling.pop("was", None)
    if hb is not None and was is not None and hb.phase == "compile":
        hb.enter(was[0], allow_s=was[1])


def say_compiles(hb: Heartbeat | None) -> None:
    """torch.compile's compilations (the first step's, and again for each new shape: minutes, not a stall) as the
    phase ``compile`` of ``hb``, with its long allowance; ``None``: no more. One heartbeat at a time: dynamo's
    callbacks are the process's."""
    from torch._dynamo.callback import callback_handler

    if "hb" not in _compiling:
        callback_handler.register_start_callback(_compile_started)
        callback_handler.register_end_callback(_compile_ended)
    _compiling["hb"] = hb


def write_heartbeat(exp: Path, snap: dict, rid: str) -> None:
    atomic_write(Path(exp) / HEARTBEAT / f"rank{snap['rank']}.json", json.dumps({**snap, "run": rid}))


def read_heartbeats(exp: Path, rid: str | None = None) -> dict[int, dict]:
    """Every rank's last written heartbeat (of run ``rid`` only, when given)."""
    out = {}
    for path in (Path(exp) / HEARTBEAT).glob("rank*.json"):
        try:
            snap = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now; the next poll sees it
        if rid is None or snap.get("run") == rid:
            out[int(snap["rank"])] = snap
    return out


def append_timeline(exp: Path, rank: int, events: list) -> None:
    if not events:
        return
    append_jsonl(
        Path(exp) / HEARTBEAT / f"rank{rank}.timeline.jsonl", [{"t": t, "phase": p, "step": s} for t, p, s in events]
    )


def read_timeline(exp: str | Path) -> dict[int, list[dict]]:
    """``{rank: [{"t", "phase", "step"}, ...]}`` from the timeline files of an experiment."""
    out = {}
    for path in sorted((Path(exp) / HEARTBEAT).glob("rank*.timeline.jsonl")):
        rank = int(path.name[4:].split(".")[0])
        out[rank] = read_jsonl(path)
    return out


def phase_at(timeline: list[dict], when: float) -> dict | None:
    """A rank's timeline entry in force at ``when`` (``{"t", "phase", "step"}``: the last at or before it), None
    where its timeline holds none by then: where it was at a moment its heartbeat has moved on from."""
    then = [e for e in timeline if e["t"] <= when]
    return then[-1] if then else None


def phase_intervals(timelines: dict[int, list[dict]], exp: Path | None = None) -> dict[int, list[tuple]]:
    """``{rank: [(phase, start_s, length_s), ...]}``, times relative to the earliest event.

    A phase lasts until the rank's next event; the last one until the stall report's time
    (when ``exp`` has a report) or the latest event of any rank.
    """
    events = [e for evs in timelines.values() for e in evs]
    if not events:
        return {}
    t0 = min(e["t"] for e in events)
    end = max(e["t"] for e in events)
    report = Path(exp) / layout.STALL_REPORT if exp is not None else None
    if report is not None and report.exists():
        end = max(end, json.loads(report.read_text())["time"])
    out = {}
    for rank, evs in sorted(timelines.items()):
        rows = []
        for e, nxt in zip(evs, evs[1:] + [None]):
            stop = nxt["t"] if nxt is not None else (end if e["phase"] != "done" else e["t"])
            rows.append((e["phase"], e["t"] - t0, max(0.0, stop - e["t"])))
        out[rank] = rows
    return out


def phase_shares(timelines: dict[int, list[dict]]) -> dict[int, dict[str, float]]:
    """Per rank, the share of its time in each phase (from its timeline)."""
    out = {}
    for rank, rows in phase_intervals(timelines).items():
        total = sum(length for _, _, length in rows) or 1.0
        shares: dict[str, float] = {}
        for phase, _, length in rows:
            shares[phase] = shares.get(phase, 0.0) + length / total
        out[rank] = shares
    return out


# --------------------------------------------------------------------------- judging a heartbeat


def process_state(pid: int | None, host: str | None, seen: float) -> str:
    """``"alive"``, ``"gone"``, or ``"unknown"`` (another host, or no pid) for the process of a heartbeat
    last written at ``seen``; a pid now held by a process started after that is someone else's."""
    if not pid or host != socket.gethostname():
        return "unknown"
    try:
        p = psutil.Process(pid)
        return "alive" if p.create_time() <= seen and p.status() != psutil.STATUS_ZOMBIE else "gone"
    except psutil.Error:
        return "gone"


def rank_state(b: dict, now: float) -> dict:
    """One rank from its heartbeat: phase, step, how long, and whether its process is still there.

    ``state``: ``done``; ``alive`` (heartbeat fresh); ``frozen`` (stale, process still there: stopped, or
    a C call holding the GIL); ``gone`` (stale or not, the process has ended without finishing);
    ``silent`` (stale, on another host: which of the two cannot be told from here).
    """
    age = now - b.get("time", now)
    proc = process_state(b.get("pid"), b.get("host"), b.get("time", now))
    if b.get("phase") == "done":
        state = "done"
    elif proc == "gone":
        state = "gone"
    elif age <= STALE_S:
        state = "alive"
    else:
        state = "frozen" if proc == "alive" else "silent"
    return {
        "rank": b["rank"],
        "rank_known": b.get("rank_known") is not False,
        "phase": b.get("phase"),
        "step": b.get("step"),
        "in_phase_s": round(max(0.0, (now if state == "alive" else b.get("time", now)) - b.get("since", now)), 1),
        "heartbeat_age_s": round(age, 1),
        "state": state,
        "detail": b.get("detail") or "",
        "pid": b.get("pid"),
        "host": b.get("host"),
        "completed": b.get("completed"),
    }


def latest_heartbeats(exp: Path) -> tuple[str | None, dict[int, dict]]:
    """The heartbeats of the newest launch (the run id of the newest file): ranks an earlier, wider launch
    left behind are not this run's."""
    beats = read_heartbeats(exp)
    if not beats:
        return None, {}
    rid = max(beats.values(), key=lambda b: b.get("time", 0)).get("run")
    return rid, {r: b for r, b in beats.items() if b.get("run") == rid}

"""``asrlab doctor --pid PID``: a job that is hung now and was not started under ``asrlab watch``, looked at
once from outside: a few samples of every rank's and DataLoader worker's stacks, read as the watch reads
them, and the verdict of the stall report."""

from __future__ import annotations

import time

import psutil

from ..lab.stall.verdict import WAITING, phase_text
from .procs import job_ranks, job_root, world_of
from .sample import PySpy, format_stack
from .ranks import Loops, RankView


def look(pid: int, samples: int = 4, interval_s: float = 0.5) -> dict:
    """``{"verdict", "moved", "busy", "root", "ranks": [...]}`` of the job that process ``pid`` belongs to (its
    torchrun agent, any rank or worker). ``moved``: some rank's stacks changed between the samples, or its
    loop's own count did (the job is slow, not stuck); ``busy``: the ranks not waiting on the others that used
    :data:`BUSY` of a CPU or more meanwhile (computing, not blocked). Raises ValueError when there is nothing to read or py-spy
    cannot read it."""
    root = job_root(pid)
    procs = job_ranks(root)
    if not procs:
        raise ValueError(f"no Python process of a job under pid {root}")
    spy = PySpy()
    for _ in range(3):  # a process a second old may not be readable yet: a failure that is no permission's, again
        why = spy.works_on(next(iter(procs.values())).pid)
        if why is None or _refused(why) or "not installed" in why:
            break
        time.sleep(0.5)
    if why is not None:
        raise ValueError(
            f"py-spy cannot read the job's stacks ({why})"
            + (
                ": run as the job's user with the ptrace permission (root, or kernel.yama.ptrace_scope=0), or start "
                "the job under asrlab watch, whose fallback needs none"
                if _refused(why)
                else ""
            )
        )
    t0 = time.time()
    views = {r: RankView(p, t0) for r, p in procs.items()}
    loops = Loops()
    cpu0, counted = _cpu(procs), {}
    i = 0
    # every rank still and in its own code after the samples (a validation pass, a save, a sleep of its own, or a
    # hang: 2 s cannot tell them apart): looked at on, up to QUIET_S, until one moves
    while i < samples or (time.time() - t0 < QUIET_S and _quiet(views, cpu0, procs, t0)):
        if i:
            time.sleep(interval_s)
        for r, p in sorted(procs.items()):
            stacks = spy.sample(p.pid)
            if stacks is not None:
                views[r].update(stacks, {w: s for w in p.workers if (s := spy.sample(w)) is not None}, time.time())
                loops.learn(views[r])
        if i == 0:
            counted = loops.counts(list(views.values()), spy)
        i += 1
    now = time.time()
    world = world_of(procs.values())
    counts = loops.counts(list(views.values()), spy)
    moved = _stacks_moved(views) or any(counts.get(r, c) != c for r, c in counted.items())
    cpu = _cpu_shares(procs, cpu0, t0)
    uneven = {} if moved else loops.uneven(list(views.values()), world, spy)
    snaps = {}
    for r, v in views.items():
        snaps[r] = {
            **v.snapshot(now, v.phase if moved else v.held_phase(world)),
            "step": counts.get(r),
            "stacks": {n: format_stack(s) for n, s in v.stacks.items()},
            "workers": {w: format_stack(s.get("MainThread") or []) for w, s in v.workers.items()},
            **uneven.get(r, {}),
        }
    busy = {r: round(c, 2) for r, c in cpu.items() if c >= BUSY and snaps[r]["phase"] not in WAITING}
    return {
        "verdict": said(snaps, moved, now - t0, {} if moved else busy),
        "moved": moved,
        "busy": {} if moved else busy,
        "root": root,
        "world_size": world,
        "ranks": [snaps[r] for r in sorted(snaps)],
    }


# of a CPU, over the look: a rank in its own code that used this much is working, not blocked (one blocked uses
# next to none; a loaded machine gives a busy one well under a whole CPU)
BUSY = 0.2
QUIET_S = 12.0  # seconds a look goes on while every rank is still in its own code, neither moving nor computing


def _quiet(views: dict, cpu0: dict, procs: dict, t0: float) -> bool:
    """Every rank seen, none moved, each in its own code (not waiting on data or its peers), none computing."""
    if any(v.first_seen is None or v.phase in WAITING + ("data",) for v in views.values()) or _stacks_moved(views):
        return False
    return all(c < BUSY for c in _cpu_shares(procs, cpu0, t0).values())


def _stacks_moved(views: dict) -> bool:
    """Whether some rank's stacks changed since its first sample."""
    return any(v.first_seen is not None and v.moved > v.first_seen for v in views.values())


def _cpu_shares(procs: dict, cpu0: dict, t0: float) -> dict[int, float]:
    """Each rank's share of a CPU since ``t0`` (its CPU seconds then: ``cpu0``)."""
    now = time.time()
    return {r: (t - cpu0[r]) / max(now - t0, 1e-9) for r, t in _cpu(procs).items() if r in cpu0}


def _refused(why: str) -> bool:
    """Whether py-spy's error is the system's refusal to let it read another process (ptrace)."""
    return any(w in why for w in ("ermission", "not permitted", "ptrace"))


def _cpu(procs: dict) -> dict[int, float]:
    """Each rank's CPU seconds so far (those that have ended, none)."""
    out = {}
    for r, p in procs.items():
        try:
            t = psutil.Process(p.pid).cpu_times()
            out[r] = t.user + t.system
        except psutil.Error:
            pass
    return out


def said(snaps: dict[int, dict], moved: bool, over_s: float, busy: dict[int, float] | None = None) -> str:
    """The ranks that are not waiting on the others first (with where they are), then the ones that wait."""
    lead = [s for _, s in sorted(snaps.items()) if s["phase"] not in WAITING] or [snaps[r] for r in sorted(snaps)]
    rest = [s for _, s in sorted(snaps.items()) if s not in lead]

    def line(s: dict) -> str:
        return f"rank {s['rank']} is {phase_text(s['phase'], s['step'])}" + (f" ({s['detail']})" if s["detail"] else "")

    parts = [line(s) for s in lead] + [line(s) for s in rest]
    how = (
        f"stacks or the loop's own count moved during {over_s:.0f} s of samples: running (slowly, perhaps), not stuck"
        if moved
        else f"no rank's stacks moved during {over_s:.0f} s of samples, but "
        + ", ".join(f"rank {r} used {100 * c:.0f}% of a CPU" for r, c in sorted(busy.items()))
        + ": computing, not blocked (look again later)"
        if busy
        else f"no rank's stacks moved during {over_s:.0f} s of samples"
    )
    return "; ".join(parts) + f" ({how})"


__all__ = ["look", "said"]

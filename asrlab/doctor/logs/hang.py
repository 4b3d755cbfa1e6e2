"""A hang as the logs tell it: the collective that timed out, the ranks that reported it, and the rank that held the
others up (told, in turn, by a monitored barrier, the ranks' collective numbers, their last completed collective, the
ranks that reported no timeout, their last logged step)."""

from __future__ import annotations

from .progress import where
from .run import LogRun, position


def hang(run: LogRun, timeouts: list[dict]) -> dict:
    # the first that names its collective: NCCL's generic words ("Some NCCL operations have failed or timed out")
    # often come a line before the watchdog's own, which says which collective
    first = next((t for t in timeouts if t.get("op") or t.get("seq") is not None), timeouts[0])
    reported = sorted({t["rank"] for t in timeouts if t.get("rank") is not None})
    ranks = run.ranks()
    world = run.world or (max(ranks) + 1 if ranks else None)
    behind, basis = [], ""
    monitored = [t for t in timeouts if t.get("behind") is not None]
    progress = [e for e in run.events if e["kind"] == "progress" and e.get("rank") is not None]
    last = {r: rec for r, rec in run.last_steps().items() if r is not None}
    # only ranks the log shows doing something else: a rank absent from an excerpt proves nothing
    silent = [r for r in range(world or 0) if r not in reported and r in ranks]
    if monitored:
        # the barrier's root names the rank that did not come; the others can only name the root
        named = [t for t in monitored if "failed to pass" in t["text"]] or monitored
        behind = sorted({t["behind"] for t in named})
        basis = named[0].get("basis", "did not reach the monitored barrier")
    elif steps := out_of_step(timeouts):
        # the ranks timed out in different collectives: the one (or few) whose number differs from the rest is
        # out of step (behind, or ahead in a collective the others never call); a tie: the lowest number
        groups: dict[int, list[int]] = {}
        for r, q in steps.items():
            groups.setdefault(q, []).append(r)
        odd = min(groups.items(), key=lambda g: (len(g[1]), g[0]))
        others = "/#".join(str(q) for q in sorted(groups) if q != odd[0])
        behind, basis = sorted(odd[1]), f"timed out in collective #{odd[0]}, the others in #{others}"
    elif len({p["rank"] for p in progress}) > 1:  # one rank's count alone is behind no one
        low = min(p["completed"] for p in progress)
        behind = sorted({p["rank"] for p in progress if p["completed"] == low})
        basis = f"last completed collective #{low}"
    elif reported and len(reported) < (world or 0) and silent:
        behind, basis = silent, "reported no timeout: it never entered the collective"
    elif len(last) > 1 and len({position(r) for r in last.values()}) > 1:
        low = min(position(r) for r in last.values())
        behind = sorted(r for r, rec in last.items() if position(rec) == low)
        basis = f"its last logged {where(last[behind[0]])}, the others further"
    seq, op, tmo = first.get("seq"), first.get("op"), first.get("timeout_ms")
    coll = (f"{op}" if op else "a collective") + (f" #{seq}" if seq is not None else "")
    coll += f" (timeout {tmo / 1000:g} s)" if tmo else ""
    who = f"rank{'s' * (len(reported) > 1)} {', '.join(map(str, reported))}" if reported else "the job"
    reported_text = f"{who} timed out in {coll}"
    if behind:
        b = ", ".join(map(str, behind))
        text = f"rank{'s' * (len(behind) > 1)} {b} held the others up ({basis}): {reported_text}"
        if last:
            text += "; last logged: " + "; ".join(f"rank {r} at {where(rec)}" for r, rec in sorted(last.items()))
    else:
        text = f"{reported_text}; the log does not say which rank is behind"
        gaps = sorted(set(range(max(reported))) - set(reported)) if len(reported) > 1 else []
        if gaps:  # a hint, not a culprit: the world may be larger, its other ranks as silent
            text += f" (rank{'s' * (len(gaps) > 1)} {', '.join(map(str, gaps))}, among them, printed no timeout)"
    said = {"collective": {"seq": seq, "op": op, "timeout_ms": tmo}, "reported_by": reported, "behind": behind}
    return {**said, "basis": basis, "reported": reported_text, "text": text}


def out_of_step(timeouts: list[dict]) -> dict[int, int]:
    """Each rank's collective number where the ranks timed out in neighbouring collectives of one group (one number
    each, a step apart); else empty: numbers far apart are other process groups' (tensor-, pipeline-parallel)."""
    seqs: dict[int, set] = {}
    for t in timeouts:
        if t.get("seq") is not None and t.get("rank") is not None:
            seqs.setdefault(t["rank"], set()).add(t["seq"])
    one = {r: next(iter(q)) for r, q in seqs.items() if len(q) == 1}
    if len(one) < 2 or len(one) < len(seqs) or len(set(one.values())) < 2:
        return {}
    return one if max(one.values()) - min(one.values()) <= 2 else {}


__all__ = ["hang", "out_of_step"]

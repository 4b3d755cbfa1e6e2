"""The verdict: what every rank's last heartbeat says, in one sentence a person can act on.

``verdict`` names the odd rank out first (a frozen process, a rank waiting for data, one already at epoch
end or past the training loop, one that never started, else the smallest group stuck in the same phase),
then where the others are;
``failure_verdict`` does the same when a rank raised. ``rank_line`` says one rank as every report, the
doctor and the stall explorer say it.
"""

from __future__ import annotations

import re

from .errors import error_line
from .heartbeat import PHASES, STALE_S


def ranks_text(ranks: list[int]) -> str:
    """``[1]`` -> "rank 1"; ``[1, 2, 3]`` -> "ranks 1-3"; ``[0, 2, 3]`` -> "ranks 0, 2, 3"."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def ranks_named(group: list[dict]) -> str:
    """``"ranks 1-3"``; a process no launcher named by its pid: ``"process 4242 (rank unknown)"``."""
    known = [s["rank"] for s in group if s.get("rank_known") is not False]
    unknown = [f"process {s.get('pid')} (rank unknown)" for s in group if s.get("rank_known") is False]
    return " and ".join(([ranks_text(known)] if known else []) + unknown)


def _who(group: list[dict], nodes: bool) -> str:
    """The ranks of ``group``, and (``nodes``: the job spans several) the node and host of each."""
    text = ranks_named(group)
    if not nodes:
        return text
    where = sorted({(s.get("node", 0), s.get("host")) for s in group})
    return f"{text} on " + ", ".join(f"node {n} ({h})" for n, h in where)


WAITING = ("allreduce", "ddp_allreduce", "collective")  # phases of a rank that waits for its peers


def _groups(snaps: list[dict]) -> list[tuple[str, int, list[dict]]]:
    """The ranks grouped by (phase, step): the smallest group first, then one not waiting for its peers (a rank
    in its own code holds up the one waiting for it in the all-reduce, or starting up in its process group's
    rendezvous), then the one stuck longest."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for s in snaps:
        groups.setdefault((s["phase"], s["step"]), []).append(s)
    return sorted(
        ((p, st, g) for (p, st), g in groups.items()),
        key=lambda x: (len(x[2]), x[0] in WAITING or x[0] == "start", min(s["since"] for s in x[2])),
    )


def _is(group: list) -> str:
    return "is" if len(group) == 1 else "are"


def _elsewhere(snaps: list[dict]) -> list[str]:
    """``["rank 0 is in the gradient all-reduce of step 7", ...]``: where the ranks not named first are."""
    return [
        f"{ranks_named(g)} {_is(g)} {phase_text(phase, step)}"
        for phase, step, g in sorted(_groups(snaps), key=lambda x: min(s["rank"] for s in x[2]))
    ]


ENDED = ("epoch_end", "left_loop", "next_epoch", "done")  # phases of a rank whose data ran out
# how a rank left in a collective by one that ran out of data waits for it
WAITS_IN = {
    "ddp_allreduce": "in DDP's gradient all-reduce (backward)",
    "allreduce": "in the gradient all-reduce",
    "collective": "in a collective",
}


def _left_loop(ended: list[dict], rest: list[dict], nodes: bool) -> list[str]:
    """``["rank 0 ran out of data after step 9 and left the loop (at train.py:80 in main)",
    "rank 1 still trains (step 10) and waits for it in DDP's gradient all-reduce (backward)"]``."""
    parts = []
    for phase, step, g in sorted(_groups(ended), key=lambda x: min(s["rank"] for s in x[2])):
        after = "" if step is None else f" after step {step}"
        at = f" ({g[0]['detail']})" if g[0].get("detail") else ""
        went = (
            f"{'is' if len(g) == 1 else 'are'} back at the loop's head, in a collective its next epoch begins with"
            if phase == "next_epoch"
            else "left the loop"
        )
        parts.append(f"{_who(g, nodes)} ran out of data{after} and {went}{at}")
    them = "it" if len(ended) == 1 else "them"
    for phase, step, g in sorted(_groups(rest), key=lambda x: min(s["rank"] for s in x[2])):
        one = len(g) == 1
        trains = f"{_who(g, nodes)} still {'trains' if one else 'train'}" + ("" if step is None else f" (step {step})")
        at = f" ({g[0]['detail']})" if phase == "collective" and g[0].get("detail") else ""
        parts.append(
            f"{trains} and {'waits' if one else 'wait'} for {them} {WAITS_IN[phase]}{at}"
            if phase in WAITS_IN
            else f"{trains}, {PHASES.get(phase, phase)}"
        )
    return parts


def phase_text(phase: str, step: int) -> str:
    """``"in the forward pass of step 7"``: a phase as the verdicts say it."""
    if phase == "epoch_end" and step is not None:
        return f"{PHASES[phase]} (after step {step})"
    if phase == "left_loop" and step is not None:
        return f"past the training loop after step {step} (its data ran out)"
    if phase == "next_epoch" and step is not None:
        return f"back at the head of the training loop after step {step} (its data ran out)"
    if phase in ("start", "index", "done") or step is None:  # no step: a run seen from outside
        return PHASES.get(phase, phase)
    return f"{PHASES.get(phase, phase)} of step {step}"


def rank_line(e: dict) -> str:
    """``rank 1 (host, pid 42): waiting for data of step 7 for 12 s; detail``: one rank, as every report,
    the doctor and the stall explorer say it (``e``: a heartbeat entry with ``in_phase_s``)."""
    if e.get("phase") is None:
        return f"rank {e['rank']}: {e.get('note') or 'no heartbeat'}"
    took = "" if e["phase"] == "done" else f" for {e.get('in_phase_s') or 0:g} s"
    detail = f"; {e['detail']}" if e.get("detail") else ""
    name = f"rank {e['rank']}" if e.get("rank_known") is not False else "a process of unknown rank"
    return f"{name} ({e.get('host')}, pid {e.get('pid')}): {phase_text(e['phase'], e['step'])}{took}{detail}"


def verdict(snaps: dict[int, dict], world_size: int, now: float, elsewhere: tuple = ()) -> str:
    """One sentence a person can act on, from every rank's last heartbeat; ``elsewhere``: the ranks of other
    nodes, which a node's own watch cannot see (their node's watch reports them), named last, never as missing."""
    exited = [snaps[r] for r in sorted(snaps) if snaps[r]["phase"] == "exited"]
    if exited:  # processes of unknown rank that ended while others went on: said last, not as the cause
        rest = {r: s for r, s in snaps.items() if s["phase"] != "exited"}
        said = verdict(rest, 0, now) if rest else "no process left running"
        return f"{said}; {ranks_named(exited)} ended before"
    present = [snaps[r] for r in sorted(snaps)]
    missing = [r for r in range(world_size) if r not in snaps and r not in elsewhere]
    waited = {s["rank"]: int(now - s["since"]) for s in present}
    frozen = [s for s in present if now - s.get("time", now) > STALE_S]
    data = [s for s in present if s["phase"] == "data"]
    ended = [s for s in present if s["phase"] in ENDED]
    nodes = len({s.get("node", 0) for s in present}) > 1
    if frozen:  # its watchdog thread stopped writing: the process itself is stopped, frozen or dead
        lead = frozen
        r = min(frozen, key=lambda s: s["time"])
        first = (
            f"{_who(frozen, nodes)} stopped responding {int(now - r['time'])} s ago "
            f"(process frozen or gone; last seen {phase_text(r['phase'], r['step'])})"
        )
    elif data:
        lead = data
        r = min(data, key=lambda s: s["since"])
        at = "" if r["step"] is None else f" at step {r['step']}"
        notes = (
            [f"reading step {r['step'] + r['ahead']}'s batch ahead"] if r["step"] is not None and r.get("ahead") else []
        )
        notes += (
            [r["detail"]] if r.get("detail") else []
        )  # ahead: a reader holds this step's batch, hangs on a later one
        detail = f" ({'; '.join(notes)})" if notes else ""
        first = (
            f"{_who(data, nodes)} {'has' if len(data) == 1 else 'have'} waited "
            f"{waited[r['rank']]} s for data{at}{detail}"
        )
    elif ended and len(ended) < len(present) and any(s["phase"] in ("left_loop", "next_epoch") for s in ended):
        parts = _left_loop(ended, [s for s in present if s not in ended], nodes)
        return "; ".join(parts + ([f"{ranks_text(missing)} never wrote a heartbeat"] if missing else []))
    elif ended and len(ended) < len(present):
        lead = ended
        r = ended[0]
        first = (
            f"{_who(ended, nodes)} finished {'its' if len(ended) == 1 else 'their'} data "
            f"at step {r['step']} and {'waits' if len(ended) == 1 else 'wait'} at epoch end"
        )
    elif missing:
        lead = []
        first = f"{ranks_text(missing)} never wrote a heartbeat (not started, or frozen before its watchdog ran)"
    elif present:
        phase, step, lead = _groups(present)[0]  # the odd one out, the longest stuck first
        r = min(lead, key=lambda s: s["since"])
        at = f" ({r['detail']})" if r.get("detail") else ""
        first = f"{_who(lead, nodes)} {_is(lead)} {phase_text(phase, step)} for {waited[r['rank']]} s{at}"
    else:
        return "no rank wrote a heartbeat"
    lead_ranks = {s["rank"] for s in lead}
    parts = [first] + _elsewhere([s for s in present if s["rank"] not in lead_ranks])
    if missing and lead:
        parts.append(f"{ranks_text(missing)} never wrote a heartbeat")
    if elsewhere:
        parts.append(f"{ranks_text(sorted(elsewhere))} on other nodes, not watched here")
    return "; ".join(parts)


def culprit_of(said: str) -> int | None:
    """The rank a verdict (:func:`verdict`) names first, the one that holds the others up; None where the
    ranks it names wait for a peer (the one they wait for is not among those seen), where it names several
    together ("ranks 0, 1 are in the loop's own code": none of them alone holds the others), or a process of
    unknown rank."""
    m = re.match(r"rank (\d+)", said or "")
    if m is None or re.match(r"ranks? [\d, and]+ (?:is|are) waiting in a collective", said):
        return None
    return int(m.group(1))


def failure_verdict(failure: dict, snaps: dict[int, dict]) -> str:
    """The rank that raised first (``failure``: its recorded error), then where it left the others."""
    return "; ".join([error_line(failure)] + _elsewhere([s for r, s in sorted(snaps.items()) if r != failure["rank"]]))


__all__ = ["ENDED", "culprit_of", "failure_verdict", "phase_text", "rank_line", "ranks_text", "verdict", "ranks_named"]

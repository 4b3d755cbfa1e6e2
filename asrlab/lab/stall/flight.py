"""PyTorch's Flight Recorder, read back: the collectives each rank took part in, last ones first.

With ``TORCH_FR_BUFFER_SIZE`` set (``asrlab watch`` sets it for the job), every process group records its
collectives (gloo and NCCL) in a ring buffer. A stalled job's ranks write it out (``asrlab watch`` asks them
through a file, since a rank stuck in a collective runs no handler; NCCL also dumps on its own timeout with
``TORCH_NCCL_DUMP_ON_TIMEOUT``) to ``EXP/flight/rank{R}.json``. Each rank's last collective, by its sequence
number in its group, says which ranks are behind: a rank that never entered the collective the others wait in;
ranks whose last collectives share a number but not an operation or its sizes called different collectives
(one branch of the code calls a barrier that the others never reach, say): a mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..layout import FLIGHT
from .heartbeat import PHASES

IN_COLLECTIVE = ("collective", "allreduce", "ddp_allreduce", "sync")  # phases whose stack is in the call itself


def last_collectives(exp: str | Path) -> dict | None:
    """``{"ranks": {rank: {"seq", "op", "state", "group", "sizes"}}, "behind": [ranks], "mismatch", "group"}`` from
    the ranks' dumps, or None without dumps. Each process group is compared apart (its sequence numbers are its
    own): in one where a rank's last collective is behind the others', it never entered the one they wait in.
    Where ranks lag in several groups (each waits for the other in a different one: a collective one rank
    skipped on a group of its own), the group whose awaited collective was made first is the cause; with no lag,
    the default group (the one with most entries)."""
    dumps: dict[int, dict[str, list]] = {}
    for path in sorted((Path(exp) / FLIGHT).glob("rank*.json")):
        if not path.stem[4:].isdigit():
            continue
        try:
            entries = json.loads(path.read_text()).get("entries") or []
        except (OSError, ValueError):
            continue
        groups: dict[str, list] = {}
        for e in entries:
            pg = e.get("process_group") or ["?", "?"]
            groups.setdefault(str(pg[1] if len(pg) > 1 and pg[1] != "undefined" else pg[0]), []).append(e)
        dumps[int(path.stem[4:])] = groups
    if not dumps:
        return None
    last = {  # (rank, group) -> its last collective there
        (r, g): max(es, key=lambda e: e.get("collective_seq_id") or 0)
        for r, gs in dumps.items()
        for g, es in gs.items()
    }
    lags = []  # (when the awaited collective was made, group, ranks behind)
    for g in {g for _, g in last}:
        tops = {r: e.get("collective_seq_id") or 0 for (r, gg), e in last.items() if gg == g}
        hi = max(tops.values())
        if any(t < hi for t in tops.values()):
            made = min(last[r, g].get("time_created_ns") or 0 for r, t in tops.items() if t == hi)
            lags.append((made, g, sorted(r for r, t in tops.items() if t < hi)))
    sizes = {g: sum(len(gs.get(g, ())) for gs in dumps.values()) for g in {g for _, g in last}}
    _, group, behind = min(lags) if lags else (0, max(sizes, key=sizes.get) if sizes else None, [])
    ranks = {}
    for r in sorted(dumps):
        e = last.get((r, group))
        ranks[r] = (
            {"seq": None, "op": None, "state": None, "group": None}
            if e is None
            else {"seq": e.get("collective_seq_id"), "op": e.get("profiling_name"), "state": e.get("state"),
                  "group": group, "sizes": e.get("input_sizes")}
        )  # fmt: skip
    seqs = [x["seq"] for x in ranks.values() if x["seq"] is not None]
    front = {r: x for r, x in ranks.items() if seqs and x["seq"] == max(seqs)}
    calls = {(x["op"], json.dumps(x["sizes"])) for x in front.values()}
    mismatch = (
        {"seq": max(seqs), "ops": {str(r): x["op"] for r, x in sorted(front.items())}} if len(calls) > 1 else None
    )
    several = len(sizes) > 1  # more than one process group: say which one
    return {"ranks": {str(r): x for r, x in ranks.items()}, "behind": behind, "mismatch": mismatch,
            "group": group if several else None}  # fmt: skip


def mismatch_text(summary: dict | None, snaps: dict[int, dict]) -> str | None:
    """``"ranks disagree on collective #22: rank 0 called barrier (at train.py:24 in save), rank 1 called
    all_reduce (...)"``: the verdict when the ranks' same collective is not the same call."""
    m = (summary or {}).get("mismatch")
    if not m:
        return None

    def one(r: str, op: str) -> str:
        snap = snaps.get(int(r)) or {}
        where, phase = snap.get("detail"), snap.get("phase")
        said = f"rank {r} called {str(op).split(':')[-1]}"
        if not where:
            return said
        if phase in (None, *IN_COLLECTIVE):
            return f"{said} ({where})"
        # its collective was answered (gloo may pair mismatched calls) and it went on: where it is now is not
        # where it made that call
        return f"{said} (now {PHASES.get(phase, phase)}: {where})"

    calls = ", ".join(one(r, op) for r, op in m["ops"].items())
    return (
        f"ranks disagree on collective #{m['seq']}: {calls}; a collective that not every rank calls the "
        "same way (a branch on the rank, a different tensor shape) waits forever"
    )


def behind_text(summary: dict | None, snaps: dict[int, dict]) -> str | None:
    """``"rank 1 never entered collective #9 (all_reduce, process group 1) that rank 0 waits in"``: the verdict's
    lead where every rank waits in a collective (each for another: no heartbeat tells which holds the others) and
    the Flight Recorder names the one rank behind."""
    behind = (summary or {}).get("behind") or []
    if len(behind) != 1 or not snaps or any(s.get("phase") not in IN_COLLECTIVE for s in snaps.values()):
        return None
    ranks = summary["ranks"]
    ahead = [r for r, x in ranks.items() if int(r) not in behind and x["seq"] is not None]
    if not ahead:
        return None
    top = ranks[ahead[0]]
    group = f", process group {summary['group']}" if summary.get("group") else ""
    waits = f"{'rank' if len(ahead) == 1 else 'ranks'} {', '.join(ahead)} {'waits' if len(ahead) == 1 else 'wait'}"
    return f"rank {behind[0]} never entered collective #{top['seq']} ({str(top['op']).split(':')[-1]}{group}) that {waits} in"


def collectives_text(summary: dict | None) -> list[str]:
    """The summary as the stall report and the doctor print it."""
    if not summary:
        return []
    group = f" in process group {summary['group']}" if summary.get("group") else ""
    lines = [f"collectives (PyTorch's Flight Recorder, each rank's last{group}):"]
    for r, x in summary["ranks"].items():
        said = f"#{x['seq']} {x['op']} ({x['state']})" if x["seq"] is not None else "none recorded"
        lines.append(f"  rank {r}: {said}" + ("  <- behind the others" if int(r) in summary["behind"] else ""))
    if summary.get("mismatch"):
        lines.append(f"  #{summary['mismatch']['seq']} is not the same call on every rank (operation or sizes)")
    return lines


__all__ = ["collectives_text", "last_collectives", "mismatch_text"]

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
    """``{"ranks": {rank: {"seq", "op", "state", "group"}}, "behind": [ranks]}`` from the ranks' dumps, per the
    default group (the one with most entries), or None without dumps."""
    ranks: dict[int, dict] = {}
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
            groups.setdefault(str(pg[1] if len(pg) > 1 else pg[0]), []).append(e)
        if not groups:
            ranks[int(path.stem[4:])] = {"seq": None, "op": None, "state": None, "group": None}
            continue
        group, mine = max(groups.items(), key=lambda kv: len(kv[1]))
        last = max(mine, key=lambda e: e.get("collective_seq_id") or 0)
        ranks[int(path.stem[4:])] = {
            "seq": last.get("collective_seq_id"),
            "op": last.get("profiling_name"),
            "state": last.get("state"),
            "group": group,
            "sizes": last.get("input_sizes"),
        }
    if not ranks:
        return None
    seqs = [r["seq"] for r in ranks.values() if r["seq"] is not None]
    behind = sorted(r for r, x in ranks.items() if seqs and x["seq"] is not None and x["seq"] < max(seqs))
    front = {r: x for r, x in ranks.items() if seqs and x["seq"] == max(seqs)}
    calls = {(x["op"], json.dumps(x["sizes"])) for x in front.values()}
    mismatch = (
        {"seq": max(seqs), "ops": {str(r): x["op"] for r, x in sorted(front.items())}} if len(calls) > 1 else None
    )
    return {"ranks": {str(r): x for r, x in sorted(ranks.items())}, "behind": behind, "mismatch": mismatch}


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


def collectives_text(summary: dict | None) -> list[str]:
    """The summary as the stall report and the doctor print it."""
    if not summary:
        return []
    lines = ["collectives (PyTorch's Flight Recorder, each rank's last):"]
    for r, x in summary["ranks"].items():
        said = f"#{x['seq']} {x['op']} ({x['state']})" if x["seq"] is not None else "none recorded"
        lines.append(f"  rank {r}: {said}" + ("  <- behind the others" if int(r) in summary["behind"] else ""))
    if summary.get("mismatch"):
        lines.append(f"  #{summary['mismatch']['seq']} is not the same call on every rank (operation or sizes)")
    return lines


__all__ = ["collectives_text", "last_collectives", "mismatch_text"]

"""What NCCL says of a rank, line by line (a collective that timed out, how far each rank's collectives got, a hang,
an error its watchdog ended the process on), and Horovod's stall inspector (the ranks a collective waits for)."""

from __future__ import annotations

import re

from .tracebacks import COLLECTIVE_TIMEOUT, OOM
from .words import HOROVOD_MISSING, HOROVOD_STALL, NCCL_HANG, NCCL_SEQ, NCCL_TIMEOUT, WATCHDOG, WATCHDOG_EXC


# NCCL_DEBUG=INFO's trace of a call that returned an error ("host:pid:tid [dev] NCCL INFO init.cc:916 -> 5"), printed
# only then, under the WARN of the same process that says why ("... NCCL WARN Duplicate GPU detected : rank 2 and ...")
_RETURNED = re.compile(r"([\w.-]+):(\d+):\d+ \[\d+\] NCCL INFO [\w/.]+\.cc:\d+ -> (\d+)")
_WARNED = re.compile(r"([\w.-]+):(\d+):\d+ \[\d+\] (?:[\w/.]+\.cc:\d+ )?NCCL WARN (.*?)\s*$")
# the flight recorder's dump, asked for by the rank whose watchdog saw a collective time out
_DUMPED = re.compile(r"dump signal due to a collective timeout from\s+rank (\d+)")
_RESULTS = {1: "unhandled cuda error", 2: "unhandled system error", 3: "internal error", 4: "invalid argument",
            5: "invalid usage", 6: "remote error"}  # fmt: skip  # 6: a peer's going, a consequence


def _timeout(**said) -> tuple:
    """A timeout event of NCCL's: what its line does not say, None."""
    return "timeout", None, {"seq": None, "op": None, "timeout_ms": None, "source": "nccl", **said}


def nccl_events(text: str, said: dict) -> list[tuple[str, str | None, dict]]:
    """The events a line of NCCL's says: ``(kind, text, fields)`` each (``text`` None: the line's own), or none.
    ``said``: each process's last WARN, and whether its error was said (a call's error is traced at every level)."""
    if "NCCL WARN" in text and (m := _WARNED.search(text)):
        said[m[1], m[2]] = m[3]
        return []
    if " -> " in text and (m := _RETURNED.search(text)) and int(m[3]) in _RESULTS:
        code, why = int(m[3]), said.get((m[1], m[2]))
        if why is not True:
            said[m[1], m[2]] = True
            words = f"NCCL error {code} ({_RESULTS[code]})" + (f": {why}" if why else "")
            more = dict(type="NCCL error", message=words[:300], where=None, raised=None, frames=0, source="nccl")
            return [("consequence" if code == 6 else "exception", words, more)]
    if "Watchdog caught" in text and (m := WATCHDOG.search(text)):
        seq, timeout = m.group(1), m.group(3)
        return [_timeout(seq=int(seq) if seq else None, op=m.group(2), timeout_ms=int(timeout) if timeout else None)]
    if "watchdog thread terminated" in text and (m := WATCHDOG_EXC.search(text)):
        exc = m.group(1).strip()
        if not COLLECTIVE_TIMEOUT.search(exc):  # a timeout is read from the same line, as a hang
            etype, _, message = exc.partition(": ")
            kind = "oom" if OOM.search(exc) else "exception"
            more = dict(type=etype if message else None, message=(message or exc)[:300], where=None, raised=None,
                        frames=0, source="nccl")  # fmt: skip
            return [(kind, f"{exc} (its NCCL watchdog ended the process on it)", more)]
    if ("stuck" in text or "NCCL operations" in text) and NCCL_HANG.search(text):
        # the heartbeat's seconds are not a collective's timeout: none is said
        return [_timeout()]
    if ("missing ranks" in text or "ready ranks" in text) and (m := HOROVOD_MISSING.search(text)):
        listed = [int(r) for r in m.group(3).split(",")]
        # the world's size is not said: a rank below the highest ready one and not among them is missing whatever it is
        missing = listed if m.group(2) == "missing" else sorted(set(range(max(listed) + 1)) - set(listed))
        more = dict(seq=None, op=m.group(1), timeout_ms=None, source="horovod", basis="never submitted the tensor")
        if HOROVOD_STALL.search(text):  # the stall inspector's warning: a wait the steps after it may end
            more["waiting"] = True
        return [("timeout", None, {**more, "behind": missing[0]} if len(missing) == 1 else more)]
    if "subset of ranks" in text and HOROVOD_STALL.search(text):  # a wait the steps after it may end
        return [_timeout(source="horovod", waiting=True)]
    out = []
    if "collective timeout from" in text and (m := _DUMPED.search(text)):  # another rank's watchdog timed out first
        out.append(_timeout(rank=int(m[1])))
    if "NCCL work" in text:
        if m := NCCL_SEQ.search(text):
            out.append(("progress", None, dict(enqueued=int(m.group(1)), completed=int(m.group(2)))))
        if t := NCCL_TIMEOUT.search(text):
            out.append(_timeout(seq=int(t.group(1))))
    return out

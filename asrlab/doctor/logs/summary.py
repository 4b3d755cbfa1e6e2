"""torchrun's failure summary: "Failures:" / "Root Cause (first observed failure):", then a record per rank ("[0]:",
"time :", "host :", "rank : 1 (local_rank: 1)", "exitcode : -9 (pid: 123)", "error_file :", "traceback :"), each read
into the rank's exit: its code, its signal and, from the error file's traceback, its exception."""

from __future__ import annotations

import re

from .marks import Clock
from .tracebacks import Traceback
from .words import SIGNAL, exit_signal, summary_fields

_CUT_RECORD = re.compile(r"^rank\s*:\s*\d+ \(local_rank: \d+\)$")
_RECORD = re.compile(r"^\[\d+\]:$")


class TorchrunSummary:
    """Fed the lines of a log while :attr:`kind` is set (or a line opens a summary); :meth:`take` gives each rank's
    record read to its end as ``(rank, time, said, fields)`` of an exit event."""

    def __init__(self):
        self.kind: str | None = None  # "root" or "failure": the block being read
        self._record: dict | None = None
        self._done: list[tuple] = []

    def take(self) -> list[tuple]:
        done, self._done = self._done, []
        return done

    def feed(self, text: str) -> bool:
        """Whether ``text`` belongs to the summary (read here, nothing more to read in it)."""
        s = text.strip()
        if s.startswith("Root Cause") or s in ("Failures:", "Other Failures:"):  # "Root Cause:": older torch
            self.close()
            self.kind = "root" if s.startswith("Root") else "failure"
            return True
        if self.kind is None and s.startswith("rank") and _CUT_RECORD.match(s):
            self.kind, self._record = "failure", {"root": False}  # a record whose header was cut off above
        if self.kind is None:
            return False
        if _RECORD.match(s):
            self.close()
            self._record = {"root": self.kind == "root"}
            return True
        if s.startswith("<NO_OTHER_FAILURES>"):
            return True
        r = self._record
        fields = summary_fields(s, "rank" not in r) if r and "tb" not in r else None
        if fields is not None:
            r.update(fields)
            return True
        if s.startswith(("---", "===")) or not s:
            self.close()
            if s.startswith("==="):
                self.kind = None
            return True
        if r is not None and "tb" in r:
            r["tb"].append(text[4:] if text.startswith("    ") else text)
            return True
        self.close()
        self.kind = None
        return False

    def close(self) -> None:
        """The record being read, ended: its exit, for :meth:`take` (none for a record with no rank)."""
        r, self._record = self._record, None
        if not r or "rank" not in r:
            return
        rank = int(m[1]) if (m := re.match(r"\s*(\d+)", r["rank"])) else None
        code = int(m[1]) if (m := re.match(r"\s*(-?\d+)", r.get("exitcode", ""))) else None
        pid = int(m[1]) if (m := re.search(r"\(pid: (\d+)\)", r.get("exitcode", ""))) else None
        sig = SIGNAL.search(r.get("traceback", ""))
        signame = sig.group(2) if sig else exit_signal(code)
        more = {}
        if len(r.get("tb", [])) > 1:  # the rank's traceback, from its error file
            tb = Traceback(rank, None)
            for line in r["tb"][1:]:
                tb.feed(line)
            e = tb.event()
            more = {k: e.get(k) for k in ("type", "message", "where")}
            if e["kind"] == "exit":  # the rank ran mp.spawn, whose word on the process that ended its traceback ends
                more["type"], _, more["message"] = e["text"].partition(": ")
        said = " ".join(r.get("tb", [])) or r.get("traceback", "")
        if more.get("type"):
            said = f"{more['type']}: {more.get('message') or ''}".rstrip(": ")
        elif more.get("where"):
            said = "a traceback that the log cuts off before its exception line"
        elif (not said or said.startswith("To enable traceback")) and code is None:
            said = "torchrun's root cause (the log ends before its exit code)"
        elif not said or said.startswith("To enable traceback"):
            said = f"exit code {code}" + (f" ({signame})" if signame else "")
        fields = dict(exitcode=code, signal=signame, root=r["root"], host=r.get("host"), source="torchrun", pid=pid)
        self._done.append((rank, Clock().of(r.get("time", "")), said, {**fields, **more}))


__all__ = ["TorchrunSummary"]

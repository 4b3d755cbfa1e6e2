"""``asrlab doctor LOG [LOG ...]``: what a job's own logs say happened, after the fact, with no re-run.

Reads the per-step lines of WeNet, ESPnet, icefall, NeMo/Lightning, SpeechBrain and plain loops, and in
any of them torchrun's failure summary, NCCL's and gloo's timeouts, Python tracebacks, out-of-memory,
killed DataLoader workers, loss-scale messages and resumes (:mod:`.toolkits`, :mod:`.events`); the
format is recognised from the lines themselves. :func:`diagnose_logs` returns a JSON-ready dict with
``verdict`` (one of :data:`.verdict.VERDICTS`) and ``culprit`` (``{"rank", "step"}``).
"""

from __future__ import annotations

import time

from ...errors import UsageError
from .reader import read_logs
from .run import log_files
from .verdict import VERDICTS, judge


def diagnose_logs(paths: list[str]) -> dict:
    return read_and_diagnose(paths)[1]


def read_and_diagnose(paths: list[str]) -> tuple:
    """``(LogRun, diagnosis)``: the step records themselves (for plots) and what the doctor says of them."""
    from ..sources import read_sources

    t0 = time.perf_counter()
    readings = read_sources(paths)
    owned = {f for r in readings for f in r.files}
    files = [f for f in log_files(paths) if f not in owned]  # a metrics.csv is read as a table, not a log
    missing = [p for p in files if p != "-" and not _exists(p)]
    if missing:
        raise UsageError(f"no such file: {missing[0]}")
    if not files and not readings:
        raise UsageError(
            f"no log files in {', '.join(paths)} (names like *.log, *.txt, log-train-*, rank*), and no TensorBoard "
            "event files, trainer_state.json or metrics.csv"
        )
    run = read_logs(files)
    d = judge(run)
    join(d, readings)
    d.update(
        files=run.files,
        lines=run.lines,
        formats=dict(run.formats),
        world_size=run.world or (max(run.ranks()) + 1 if run.ranks() else None),
        read_s=round(time.perf_counter() - t0, 3),
    )
    d["ok"] = d["verdict"] == "no_failure_seen"
    d["events"] = dict(run.event_counts)
    from .checkpoints import checkpoints  # torch, only where there are checkpoints to open

    d["checkpoints"] = checkpoints(paths)
    return run, d


def join(d: dict, readings: list) -> None:
    """The sources' series beside the log: their first failure is the verdict where it came before the log's own
    (by wall clock where both have one, else by step), or where the log names none; their warnings are kept."""
    from ..timeline import culprit as place_of

    d["series"] = {r.source: {k: {"steps": [s for s, _ in p], "values": [v for _, v in p]} for k, p in r.series.items()}
                   for r in readings}  # fmt: skip
    d["warnings"] = [w for r in readings for w in r.warnings]
    d["sources"] = [{"source": r.source, "files": r.files, "notes": r.notes} for r in readings]
    found = sorted(
        (e for r in readings for e in r.events),
        key=lambda e: (e.get("transient", False), e["at"]["step"] if e["at"]["step"] is not None else float("inf")),
    )
    if not found:
        return
    e = found[0]
    log_failed = d["verdict"] not in ("no_failure_seen", "unknown")
    first, c = d.get("first") or {}, d["culprit"]
    if log_failed:
        if e.get("transient"):
            return
        if e["time"] is not None and first.get("time") is not None:
            if e["time"] >= first["time"]:
                return
        elif c["step"] is None or e["at"]["step"] is None or e["at"]["step"] >= c["step"]:
            return
    said = e["text"] + (f"; then, in the log: {d['summary']}" if log_failed else "")
    d.update(verdict=e["verdict"], summary=said, culprit={**place_of(e), "rank": c["rank"] if log_failed else None})
    d["first"] = {k: v for k, v in e.items() if k != "at"}


def _exists(p: str) -> bool:
    from pathlib import Path

    return Path(p).exists()


__all__ = ["VERDICTS", "diagnose_logs", "join", "read_and_diagnose"]

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
    files = log_files(paths)
    missing = [p for p in files if p != "-" and not _exists(p)]
    if missing:
        raise UsageError(f"no such file: {missing[0]}")
    if not files:
        raise UsageError(f"no log files in {', '.join(paths)} (names like *.log, *.txt, log-train-*, rank*)")
    t0 = time.perf_counter()
    run = read_logs(files)
    d = judge(run)
    d.update(
        source="logs",
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


def _exists(p: str) -> bool:
    from pathlib import Path

    return Path(p).exists()


def format_log_diagnosis(d: dict) -> str:
    lines = [f"{d['verdict'].upper()}: {d['summary']}"]
    c = d["culprit"]
    said = [f"{k} {c[k]}" for k in ("rank", "step") if c[k] is not None]
    if said:
        lines.append("  culprit: " + ", ".join(said))
    fmts = ", ".join(f"{k} ({v} step lines)" for k, v in sorted(d["formats"].items(), key=lambda kv: -kv[1]))
    lines.append(
        f"read: {len(d['files'])} file{'s' if len(d['files']) != 1 else ''}, {d['lines']} lines in "
        f"{d['read_s']:.2f} s; formats: {fmts or 'no training-step lines of a known format'}"
    )
    if d["events"]:
        lines.append("recognised: " + ", ".join(f"{k} {v}" for k, v in sorted(d["events"].items())))
    for h in d.get("history") or []:
        lines.append(f"history: {h}")
    if d["hang"]:
        lines.append(f"hang: {d['hang']['text']}")
    if d["nonfinite"] and d["nonfinite"].get("first"):
        lines.append(f"non-finite: {d['nonfinite']['text']} ({d['nonfinite']['count']} non-finite step lines)")
    for r in d["resumes"]:
        lines.append(
            f"resume (rank {r['rank']}): {r['text']}" + (f"; from {r['checkpoint']}" if r.get("checkpoint") else "")
        )
    ck = d.get("checkpoints")
    if ck:
        lines.append(
            f"checkpoints ({len(ck['files'])}): newest {ck['newest'] or 'none intact'}"
            + (f"; not intact: {', '.join(ck['broken'])}" if ck["broken"] else "")
        )
        for r in ck["files"][:8]:
            held = ", ".join(f"{k} {r[k]}" for k in ("epoch", "step") if r[k] is not None) or "no epoch or step in it"
            lines.append(f"  {r['file']}: {held}" + ("" if r["intact"] else f" (NOT INTACT: {r['why']})"))
    if d["ranks"]:
        lines.append("ranks (last logged step):")
        for r in d["ranks"]:
            rate = (
                f", {r['s_per_step']:.3g} s/step"
                if r["s_per_step"]
                else f", {r['steps_per_s']:.2f} steps/s"
                if r["steps_per_s"]
                else ""
            )
            who = f"rank {r['rank']}" if r["rank"] is not None else "lines naming no rank"
            lines.append(f"  {who}: {r['last']}{rate}")
        sp = d.get("step_spread")
        if sp and sp["ratio"] >= 1.2:
            lines.append(
                f"  rank {sp['slowest']} takes {sp['ratio']:.2f}x the seconds per step of rank {sp['fastest']}"
            )
    return "\n".join(lines)


__all__ = ["VERDICTS", "diagnose_logs", "format_log_diagnosis", "read_and_diagnose"]

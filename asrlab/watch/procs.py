"""The processes of a watched job: its ranks (a ``RANK`` in their environment) and each rank's
DataLoader workers (a rank's Python children), found anew at every look, so restarts of torchrun's
workers and workers of each new epoch are seen."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil


@dataclass
class Proc:
    pid: int
    rank: int | None                  # None: not a rank (the agent, a shell, a worker)
    run: str                          # the launch it belongs to (torch elastic's run id and restart count)
    started: float                    # its create time: a pid reused later is another process
    workers: list[int] = field(default_factory=list)


def _is_python(p: psutil.Process) -> bool:
    try:
        return "python" in os.path.basename(p.exe() or p.name()).lower() or "python" in p.name().lower()
    except psutil.Error:
        return False


def job_ranks(root: int) -> dict[int, Proc]:
    """``{rank: Proc}`` of every rank under process ``root`` (the command's process), with its workers. A
    rank is a Python process whose environment has ``RANK`` and whose parent has not the same ``RANK``
    (a DataLoader worker inherits its rank's environment)."""
    try:
        everyone = [psutil.Process(root)] + psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return {}
    env: dict[int, dict] = {}
    for p in everyone:
        try:
            env[p.pid] = p.environ()
        except psutil.Error:
            env[p.pid] = {}
    ranks: dict[int, Proc] = {}
    for p in everyone:
        e = env[p.pid]
        rank = e.get("RANK")
        if rank is None or not rank.isdigit() or not _is_python(p):
            continue
        try:
            parent = p.ppid()
            started = p.create_time()
        except psutil.Error:
            continue
        if env.get(parent, {}).get("RANK") == rank:
            continue  # a worker of that rank
        rid = e.get("TORCHELASTIC_RUN_ID")
        run = f"{rid}.{e.get('TORCHELASTIC_RESTART_COUNT', '0')}" if rid else f"pid{p.pid}"
        proc = Proc(p.pid, int(rank), run, started)
        try:
            proc.workers = [c.pid for c in p.children(recursive=True) if _is_python(c)]
        except psutil.Error:
            pass
        old = ranks.get(proc.rank)
        if old is None or old.started < started:  # a restarted rank replaces the one before it
            ranks[proc.rank] = proc
    return ranks


def family(root: int) -> list[psutil.Process]:
    """``root`` and every process under it now."""
    try:
        p = psutil.Process(root)
        return [p] + p.children(recursive=True)
    except psutil.Error:
        return []


__all__ = ["Proc", "family", "job_ranks"]

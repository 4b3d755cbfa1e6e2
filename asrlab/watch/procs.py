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
    by_env: bool = True               # a RANK in its environment (else: the one process of a plain job)


def _is_python(p: psutil.Process) -> bool:
    try:
        return "python" in os.path.basename(p.exe() or p.name()).lower() or "python" in p.name().lower()
    except psutil.Error:
        return False


LAUNCHERS = ("torchrun", "torch.distributed.run", "torch/distributed/run.py", "torch.distributed.launch")


def _launcher(p: psutil.Process) -> bool:
    try:
        return any(x in " ".join(p.cmdline()) for x in LAUNCHERS)
    except psutil.Error:
        return True


def job_ranks(root: int, single: bool = True) -> dict[int, Proc]:
    """``{rank: Proc}`` of every rank under process ``root`` (the command's process), with its workers. A
    rank is a Python process whose environment has ``RANK`` and whose parent has not the same ``RANK``
    (a DataLoader worker inherits its rank's environment). With ``single``, a job of one Python process
    that no launcher started (no ``RANK`` anywhere) is rank 0."""
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
    if not ranks and single:  # one process, no launcher (``python train.py``): the first Python one is rank 0
        for p in everyone:
            if _is_python(p) and not _launcher(p):
                try:
                    proc = Proc(p.pid, 0, f"pid{p.pid}", p.create_time(), by_env=False)
                    proc.workers = [c.pid for c in p.children(recursive=True) if _is_python(c)]
                except psutil.Error:
                    continue
                ranks[0] = proc
                break
    return ranks


def job_root(pid: int) -> int:
    """The process a job hangs from, given any of its processes: a rank's or a worker's launcher (the
    torchrun agent: a parent without ``RANK``), else ``pid`` itself."""
    try:
        p = psutil.Process(pid)
        rank = p.environ().get("RANK")
        while rank is not None:
            parent = p.parent()
            if parent is None or not _is_python(parent):
                return p.pid
            try:
                if parent.environ().get("RANK") is None:
                    return parent.pid
            except psutil.Error:
                return p.pid
            p = parent
    except psutil.Error as e:
        raise ValueError(f"no process {pid} to look at: {e}") from None
    return pid


def family(root: int) -> list[psutil.Process]:
    """``root`` and every process under it now."""
    try:
        p = psutil.Process(root)
        return [p] + p.children(recursive=True)
    except psutil.Error:
        return []


__all__ = ["Proc", "family", "job_ranks", "job_root"]

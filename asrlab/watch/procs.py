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
    rank: int | None  # None: not a rank (the agent, a shell, a worker)
    run: str  # the launch it belongs to (torch elastic's run id and restart count)
    started: float  # its create time: a pid reused later is another process
    workers: list[int] = field(default_factory=list)
    by_env: bool = True  # a RANK in its environment (else: the one process of a plain job)
    world: int = 0  # its WORLD_SIZE (every node's ranks), 0 where not given


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


class Table:
    """What the watch knows of the processes under a job's root. A look reads the process tree once
    (every parent link, one pass over ``/proc``); what a process started with (its environment, whether it
    runs Python) is read once per process and kept, since it does not change: a watcher that looks a few
    times a second costs the job little."""

    def __init__(self):
        self._facts: dict[tuple[int, float], tuple[dict, bool, bool]] = {}  # (pid, started): env, python, launcher

    def under(self, root: int) -> list[tuple[int, int, float]]:
        """``(pid, parent, started)`` of ``root`` and every process below it, parents first."""
        try:
            links = psutil._ppid_map()  # one pass over /proc: psutil's own for Process.children
        except (AttributeError, OSError):
            links = {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}
        kids: dict[int, list[int]] = {}
        for pid, parent in links.items():
            kids.setdefault(parent, []).append(pid)
        out, todo = [], [(root, links.get(root, 0))]
        while todo:
            pid, parent = todo.pop(0)
            try:
                started = psutil.Process(pid).create_time()
            except psutil.Error:
                continue
            out.append((pid, parent, started))
            todo.extend((c, pid) for c in sorted(kids.get(pid, ())))
        return out

    def facts(self, pid: int, started: float) -> tuple[dict, bool, bool]:
        key = (pid, started)
        if key not in self._facts:
            try:
                p = psutil.Process(pid)
                env = p.environ()
            except psutil.Error:
                return {}, False, False
            self._facts[key] = (env, _is_python(p), _launcher(p))
        return self._facts[key]

    def ranks(self, root: int, single: bool = True) -> tuple[dict[int, Proc], list[tuple[int, float]]]:
        """``({rank: Proc}, [(pid, started) of every process under root])``: see ``job_ranks``."""
        tree = self.under(root)
        alive = {(pid, started) for pid, _, started in tree}
        self._facts = {k: v for k, v in self._facts.items() if k in alive}
        env = {pid: self.facts(pid, started)[0] for pid, _, started in tree}
        python = {pid: self.facts(pid, started)[1] for pid, _, started in tree}
        below: dict[int, list[int]] = {}
        for pid, parent, _ in tree:
            below.setdefault(parent, []).append(pid)

        def workers(pid: int) -> list[int]:
            out, todo = [], list(below.get(pid, ()))
            while todo:
                c = todo.pop(0)
                if python[c]:
                    out.append(c)
                todo.extend(below.get(c, ()))
            return out

        ranks: dict[int, Proc] = {}
        for pid, parent, started in tree:
            rank = env[pid].get("RANK")
            if rank is None or not rank.isdigit() or not python[pid]:
                continue
            if env.get(parent, {}).get("RANK") == rank:
                continue  # a worker of that rank: it inherited the rank's environment
            e = env[pid]
            rid = e.get("TORCHELASTIC_RUN_ID")
            run = f"{rid}.{e.get('TORCHELASTIC_RESTART_COUNT', '0')}" if rid else f"pid{pid}"
            world = e.get("WORLD_SIZE", "")
            proc = Proc(pid, int(rank), run, started, workers(pid), world=int(world) if world.isdigit() else 0)
            old = ranks.get(proc.rank)
            if old is None or old.started < started:  # a restarted rank replaces the one before it
                ranks[proc.rank] = proc
        if not ranks and single:  # one process, no launcher (``python train.py``): the first Python one is rank 0
            for pid, _, started in tree:
                _, py, launcher = self.facts(pid, started)
                if py and not launcher:
                    ranks[0] = Proc(pid, 0, f"pid{pid}", started, workers(pid), by_env=False)
                    break
        return ranks, sorted(alive)


def world_of(procs) -> int:
    """The job's number of ranks: their WORLD_SIZE (which counts other nodes' ranks), else those seen."""
    procs = list(procs)
    return max([p.world for p in procs] + [max((p.rank for p in procs), default=-1) + 1])


def job_ranks(root: int, single: bool = True) -> dict[int, Proc]:
    """``{rank: Proc}`` of every rank under process ``root`` (the command's process), with its workers. A
    rank is a Python process whose environment has ``RANK`` and whose parent has not the same ``RANK``
    (a DataLoader worker inherits its rank's environment). With ``single``, a job of one Python process
    that no launcher started (no ``RANK`` anywhere) is rank 0."""
    return Table().ranks(root, single)[0]


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


__all__ = ["Proc", "Table", "family", "job_ranks", "job_root", "world_of"]

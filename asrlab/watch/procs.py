"""The processes of a watched job: its ranks, whoever started them, and each rank's DataLoader workers (a rank's
Python children), found anew at every look, so restarts of torchrun's workers and workers of each new epoch are
seen. A rank is named by what its launcher leaves: ``RANK`` (torchrun, torchelastic, Accelerate, DeepSpeed's
launcher), ``SLURM_PROCID`` (``srun``), an MPI launcher's (``mpirun``'s ``OMPI_COMM_WORLD_RANK``, hydra's
``PMI_RANK``, PMIx's, ``horovodrun``'s), ``--local_rank=N`` on its command line (older launchers), or Lightning's
(and NeMo's) own launcher, which starts ranks 1.. as children of the user's process with ``LOCAL_RANK``,
``NODE_RANK`` and ``WORLD_SIZE`` and no ``RANK``: that process is the node's local rank 0."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    local_world: int = 0  # the ranks of its node (LOCAL_WORLD_SIZE, or Lightning's count), 0 where not known
    known: bool = True  # False: one of several Python processes no launcher named; ``rank`` is the watch's count


def _is_python(p: psutil.Process) -> bool:
    try:
        return "python" in os.path.basename(p.exe() or p.name()).lower() or "python" in p.name().lower()
    except psutil.Error:
        return False


LAUNCHERS = (
    "torchrun",
    "torch.distributed.run",
    "torch/distributed/run.py",
    "torch.distributed.launch",
    "asrlab.train.launch",
    "bin/papermill",  # a notebook's runner: its kernel (python -m ipykernel_launcher) is the job's one rank
    "-m papermill",
)


def _launcher(p: psutil.Process) -> bool:
    try:
        return any(x in " ".join(p.cmdline()) for x in LAUNCHERS)
    except psutil.Error:
        return True


_LOCAL_RANK_ARG = re.compile(r"--local[_-]rank[= ](\d+)")
# an MPI launcher's rank and world: Open MPI's mpirun, MPICH's and Intel MPI's hydra, PMIx (srun --mpi=pmix), horovodrun
MPI = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"), ("PMIX_RANK", ""),
       ("HOROVOD_RANK", "HOROVOD_SIZE"))  # fmt: skip
LOCAL_SIZES = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "HOROVOD_LOCAL_SIZE")
# a young process showing its parent's command line may be a fork not yet exec'd (subprocess.Popen's child: a
# launcher's rank): read again at each look for this long, not kept as its parent's copy
FORK_S = 10.0


def rank_key(env: dict, cmdline: str = "") -> tuple[str, int] | None:
    """``(how, number)`` a launcher left on a process: ``("RANK", r)``, ``("SLURM_PROCID", r)``, an MPI launcher's
    (``("OMPI_COMM_WORLD_RANK", r)``, ...), ``("LOCAL_RANK", l)`` (Lightning's children: global rank from NODE_RANK
    and the node's count), ``("--local_rank", l)``."""
    for name in ("RANK", "SLURM_PROCID"):
        v = env.get(name)
        if v is not None and v.isdigit() and (name == "RANK" or env.get("SLURM_NTASKS", "1") != "1"):
            return name, int(v)
    for name, _ in MPI:
        if (v := env.get(name)) is not None and v.isdigit():
            return name, int(v)
    v = env.get("LOCAL_RANK")
    if v is not None and v.isdigit() and env.get("WORLD_SIZE"):
        return "LOCAL_RANK", int(v)
    m = _LOCAL_RANK_ARG.search(cmdline)
    return ("--local_rank", int(m.group(1))) if m else None


class Table:
    """What the watch knows of the processes under a job's root. A look reads the process tree once
    (every parent link, one pass over ``/proc``); what a Python process started with (its environment, its
    command line) is read once per process and kept, since it does not change: a watcher that looks a few
    times a second costs the job little."""

    def __init__(self, records: Path | None = None):
        # (pid, started): env, python, launcher, command line
        self._facts: dict[tuple[int, float], tuple[dict, bool, bool, str]] = {}
        self.records = records  # where a rank no launcher named records its process group's rank (ranks/{pid}.json)
        self.unranked: list[int] = []  # at the last look: Python processes no rule names, when there are several
        self._slots: dict[tuple[int, float], int] = {}  # each such process's number, kept while it lives
        self._several = False  # several were seen: the last one left is still one of them, not rank 0

    def record(self, pid: int, started: float) -> dict:
        """What the watch's sitecustomize recorded in the process (not a reused pid's): ``{"rank", "world"}`` its
        process group gave it, or ``{"launcher"}`` where it is in torch.multiprocessing.spawn; else ``{}``."""
        try:
            r = json.loads((self.records / f"{pid}.json").read_text()) if self.records is not None else {}
        except (OSError, ValueError):
            return {}
        return r if r.get("time", 0) >= started else {}

    def recorded(self, pid: int, started: float) -> tuple[int, int] | None:
        """``(rank, world)`` the process's group gave it."""
        r = self.record(pid, started)
        return (int(r["rank"]), int(r["world"])) if "rank" in r else None

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

    def facts(self, pid: int, started: float) -> tuple[dict, bool, bool, str]:
        key = (pid, started)
        if key not in self._facts:
            try:
                p = psutil.Process(pid)
                env, cmd = p.environ(), " ".join(p.cmdline())
            except psutil.Error:
                return {}, False, False, ""
            facts = (env, _is_python(p), _launcher(p), cmd)
            if not facts[1]:  # a shell that may yet exec Python (pyenv's and conda's shims, run.sh's `exec python`):
                return facts  # read again at the next look, in the same pid
            self._facts[key] = facts
        return self._facts[key]

    def ranks(self, root: int, single: bool = True) -> tuple[dict[int, Proc], list[tuple[int, float]]]:
        """``({rank: Proc}, [(pid, started) of every process under root])``: see ``job_ranks``."""
        tree = self.under(root)
        alive = {(pid, started) for pid, _, started in tree}
        self._facts = {k: v for k, v in self._facts.items() if k in alive}
        facts = {pid: self.facts(pid, started) for pid, _, started in tree}
        now = time.time()
        for pid, parent, started in tree:
            if parent in facts and facts[pid][3] == facts[parent][3] and now - started < FORK_S:
                self._facts.pop((pid, started), None)
        env = {pid: f[0] for pid, f in facts.items()}
        python = {pid: f[1] for pid, f in facts.items()}
        parents = {pid: parent for pid, parent, _ in tree}
        below: dict[int, list[int]] = {}
        for pid, parent, _ in tree:
            below.setdefault(parent, []).append(pid)
        # a launcher (torchrun's agent, one per node that srun or mpirun started) is no rank: its children are
        # nor is spawn's resource tracker, which inherits the variables its starter had set for a rank it started
        keys = {pid: rank_key(env[pid], f[3]) if f[1] and not f[2] and not _tracker(f[3]) else None
                for pid, f in facts.items()}  # fmt: skip
        for pid, f in facts.items():  # a worker multiprocessing started inherits LOCAL_RANK: not a rank of its own
            if keys[pid] and keys[pid][0] == "LOCAL_RANK" and "multiprocessing" in f[3]:
                keys[pid] = None
        for pid, _, started in tree:  # no launcher's word: the process group's own (torch.multiprocessing.spawn)
            if keys[pid] is None and python[pid] and (got := self.recorded(pid, started)):
                keys[pid] = ("group", got[0])
                env[pid] = {**env[pid], "WORLD_SIZE": str(got[1])}
        # a process with its parent's key is a worker of that rank: it inherited the rank's environment
        named = {pid for pid, k in keys.items() if k is not None and keys.get(parents[pid]) != k}
        # Lightning's launcher: ranks 1.. with LOCAL_RANK are children of the node's local rank 0, which has none
        local0 = {
            parents[pid]: env[pid]
            for pid in named
            if keys[pid][0] == "LOCAL_RANK" and keys[pid][1] > 0 and keys.get(parents[pid]) is None
            and python.get(parents[pid])
        }  # fmt: skip
        # rank 0's own workers: spawned after Lightning set LOCAL_RANK=0 in rank 0's environment
        named -= {pid for pid in named if parents[pid] in local0 and keys[pid] == ("LOCAL_RANK", 0)}

        def workers(pid: int) -> list[int]:
            out, todo = [], list(below.get(pid, ()))
            while todo:
                c = todo.pop(0)
                if c in named or c in local0:
                    continue  # another rank (Lightning's children of rank 0), and its workers are its own
                if python[c]:
                    out.append(c)
                todo.extend(below.get(c, ()))
            return out

        ranks: dict[int, Proc] = {}
        for pid, parent, started in tree:
            if pid not in named and pid not in local0:
                continue
            e = env[pid] if pid in named else local0[pid]
            how, number = keys[pid] if pid in named else ("LOCAL_RANK", 0)
            local = next((e[k] for k in LOCAL_SIZES if e.get(k)), "")
            local = int(local) if local.isdigit() else 0
            if how == "LOCAL_RANK":  # global rank: the node's rank times its count of ranks, plus the local one
                node = int(e.get("NODE_RANK") or e.get("GROUP_RANK") or 0)
                local = local or 1 + sum(1 for c in below.get(parent if pid in named else pid, ()) if c in named)
                number += node * local
            rid = e.get("TORCHELASTIC_RUN_ID")
            # no torch elastic: the watch's launch, which every process under it shares (ranks a script started)
            run = f"{rid}.{e.get('TORCHELASTIC_RESTART_COUNT', '0')}" if rid else _launch(e, pid)
            world = e.get("WORLD_SIZE") or e.get("SLURM_NTASKS") or next((e[w] for _, w in MPI if e.get(w)), "")
            proc = Proc(pid, number, run, started, workers(pid), world=int(world) if world.isdigit() else 0,
                        local_world=local)  # fmt: skip
            old = ranks.get(proc.rank)
            if old is None or old.started < started:  # a restarted rank replaces the one before it
                ranks[proc.rank] = proc
        self.unranked = []
        if not ranks and single:
            # no launcher's word: the Python processes not below another are the job's own (their Python children
            # are their workers). One (``python train.py``) is rank 0; several (a script that starts each itself)
            # are each watched, numbered by the watch, their ranks said to be unknown
            tops: list[tuple[int, float, list[int]]] = []
            # (nor one with a launcher below it, ``asrlab train``'s torchrun, nor what is below that: its ranks, still
            # starting, are named by the launcher's variables or their own records, not taken for their starter)
            launched: set[int] = set()
            for pid, _, started in tree:
                _, py, launcher, cmd = facts[pid]
                launcher = launcher or (py and "launcher" in self.record(pid, started))  # its ranks still starting
                if _tracker(cmd):
                    continue
                if py and not launcher and pid not in launched and not any(pid in w for _, _, w in tops):
                    below_it = workers(pid)
                    if any(facts[w][2] for w in below_it):
                        launched.update(below_it)
                    else:
                        tops.append((pid, started, below_it))
            self._several = self._several or len(tops) > 1
            if len(tops) == 1 and not self._several:
                pid, started, below_it = tops[0]
                ranks[0] = Proc(pid, 0, _launch(env[pid], pid), started, below_it, by_env=False)
            elif tops:
                self._slots = {k: n for k, n in self._slots.items() if k in alive}
                for pid, started, below_it in tops:
                    n = self._slots.setdefault((pid, started), max(self._slots.values(), default=-1) + 1)
                    ranks[n] = Proc(pid, n, _launch(env[pid], pid), started, below_it, by_env=False, known=False)
                self.unranked = [pid for pid, _, _ in tops] if len(tops) > 1 else []
        return ranks, sorted(alive)


def _tracker(cmd: str) -> bool:
    """multiprocessing's resource tracker: the spawn start method's helper, never a rank."""
    return "multiprocessing.resource_tracker" in cmd or "multiprocessing.semaphore_tracker" in cmd


def _launch(env: dict, pid: int) -> str:
    """The launch a process without torch elastic's run id belongs to: the watch's (``ASRLAB_WATCH_RUN``, in
    every process it started), else its own."""
    return env.get("ASRLAB_WATCH_RUN") or f"pid{pid}"


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
    torchrun agent, or Lightning's rank 0: a parent no launcher named), else ``pid`` itself."""
    try:
        p = psutil.Process(pid)
        key = rank_key(p.environ(), " ".join(p.cmdline()))
        while key is not None:
            parent = p.parent()
            if parent is None or not _is_python(parent):
                return p.pid
            try:
                if rank_key(parent.environ(), " ".join(parent.cmdline())) is None:
                    return parent.pid  # the launcher, or Lightning's rank 0 that started this rank
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


__all__ = ["Proc", "Table", "family", "job_ranks", "job_root", "rank_key", "world_of"]

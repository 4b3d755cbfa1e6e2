"""``asrlab watch -- CMD``: run a training command as it is and watch every rank of it from outside.

Every ``1 / sample_hz`` s each rank's main thread and its DataLoader workers are sampled
(:mod:`.sample`) and classified (:mod:`asrlab.lab.stall.classify`); the watcher writes, for each rank, the heartbeat and
timeline files the parts would have written (``EXP/heartbeat/``), so ``asrlab doctor``, the explorers and
notebook 06 read a watched run like any other. A stall is declared when no rank's stacks (main thread
and workers) have moved for ``stall_timeout_s``: the verdict and every process's stacks go to the
stall report (:func:`asrlab.lab.stall.report.write_report`), and with ``on_stall="kill"`` the job is
ended so its devices are free. A rank's uncaught exception is recorded by the ``sitecustomize`` the
watcher puts on the job's ``PYTHONPATH``; torchelastic's error file and the Flight Recorder of
collectives are turned on through the environment, into ``EXP``.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ..lab import layout
from ..files import append_jsonl, atomic_write
from ..lab.stall.heartbeat import COMPILE_ALLOW_S, process_state
from ..lab.stall.flight import collectives_text, last_collectives
from ..lab.stall.peers import PeerExits
from ..lab.stall.report import write_lab_status, write_report
from ..lab.stall.watchdog import STALL_EXIT
from ..lab.stop import own_session_ending_with_parent
from ..lab.stall.classify import phase_of
from ..lab.stall.verdict import WAITING
from .gpus import GpuBusy
from .keeper import KeptJob
from .ranks import Loops, RankView, all_training, counting_on, spinning
from .output import JobOutput
from .procs import Proc, Table, family, world_of
from .sample import FaultHandler, PySpy, format_stack

log = logging.getLogger(__name__)

INJECT = Path(__file__).with_name("inject")
UNRANKED_S = 30.0  # a Python process of the job no rule names a rank of this long is said to be watched without one


class JobWatch:
    def __init__(
        self,
        exp: str | Path,
        stall_timeout_s: float = 60.0,
        on_stall: str = "report",
        sample_hz: float = 2.0,
        sampler: str = "auto",
        first_step_timeout_s: float | None = None,
        yield_cpu: bool = False,
    ):
        if on_stall not in ("report", "kill"):
            raise ValueError(f"on_stall: report or kill, not {on_stall!r}")
        if sampler not in ("auto", "py-spy", "faulthandler"):
            raise ValueError(f"sampler: auto, py-spy or faulthandler, not {sampler!r}")
        if sample_hz <= 0 or stall_timeout_s <= 0:
            raise ValueError("sample_hz and stall_timeout_s must be positive")
        self.exp = Path(exp)
        self.run_id = f"watch.{socket.gethostname()}.{os.getpid()}.{int(time.time())}"
        self.stall_timeout_s, self.on_stall, self.period_s = stall_timeout_s, on_stall, 1.0 / sample_hz
        # before every rank is seen training (imports, a peer still starting, the first batches): 3x by default
        self.first_step_s = max(stall_timeout_s, first_step_timeout_s or 3 * stall_timeout_s)
        self.choice = sampler
        self.yield_cpu = yield_cpu  # lower this process's priority once the job is started (for a process of its own)
        self.fallback = FaultHandler(self.exp / layout.WATCH / "faulthandler")
        self.sampler = None
        self.sampler_note = ""
        self.ranks: dict[int, RankView] = {}
        self.output: JobOutput | None = None
        self.stalled: dict | None = None
        self.stall_passed = False  # a stall it reported that the ranks then got past, the job finishing
        self._signal: int | None = None
        self._stopped: float | None = None  # when a signal to the watch ended the job
        self._family: dict[int, float] = {}  # every process seen, by pid: its create time
        self._unranked_said: set[int] = set()  # Python processes no rule names a rank of, said once each
        self._unranked_since: dict[int, float] = {}  # when each was first seen so
        self._exited: set[int] = set()  # their pids seen ended (a job's processes of its own may end apart)
        self.table = Table(self.exp / layout.WATCH / "ranks")
        self.peers = PeerExits(self.exp, -1, 0, find=False) if PeerExits.available() else None
        self._first_try = 0.0  # when py-spy was first tried on the job
        self.loops = Loops()
        self.gpus = GpuBusy()  # NVML, where present: each rank's GPU's busy share beside its stacks
        self._cpu0 = 0.0

    # -- the job ------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The job's environment: the ``sitecustomize`` first on its path, what PyTorch records into EXP."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(INJECT)] + [p for p in [env.get("PYTHONPATH")] if p])
        env["ASRLAB_WATCH_EXP"] = str(self.exp)
        env["ASRLAB_WATCH_RUN"] = self.run_id  # one launch: ranks no torch elastic numbered share it
        env.update(self.fallback.env())
        flight = self.exp / layout.FLIGHT
        defaults = {
            "TORCHELASTIC_ERROR_FILE": str(self.exp / layout.WATCH / "torchelastic.json"),
            "TORCH_FR_BUFFER_SIZE": "2000",  # (torch 2.11 warns of the older TORCH_NCCL_TRACE_BUFFER_SIZE)
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": str(flight / "rank_"),
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(flight / "rank_"),
            # its output goes through a pipe now, not a terminal: lines as they are printed
            "PYTHONUNBUFFERED": "1",
        }
        # each line written whole (sitecustomize), also where the job's environment made it unbuffered itself (as
        # images often do): two ranks' lines glued together no reader can take apart; a flush still goes out at once
        env["ASRLAB_WATCH_LINES"] = "1"
        for k, v in defaults.items():
            env.setdefault(k, v)  # the job's own settings stay
        return env

    def run(self, cmd: list[str]) -> int:
        """Run ``cmd`` to its end under the watch; its exit code (128 + N when ended by signal N)."""
        if not cmd:
            raise ValueError("nothing to watch: asrlab watch [options] -- CMD [ARGS...]")
        for d in (self.exp / layout.ERRORS, self.exp / layout.FLIGHT, self.fallback.folder):
            d.mkdir(parents=True, exist_ok=True)
        t0, self._cpu0 = time.time(), _own_cpu()
        # cwd: where the command's relative paths (its --exp) are, for the doctor
        write_lab_status(self.exp, {"started": t0, "watched": cmd, "cwd": os.getcwd(), "host": socket.gethostname()})
        if self.peers is not None:
            self.peers.start()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        output = self.output = JobOutput(self.exp)
        try:
            proc = _start(cmd, self.env(), self.exp / layout.LAB)
        except OSError as e:
            output.close()
            for s, h in old.items():
                signal.signal(s, h)
            raise ValueError(f"cannot run {cmd[0]!r}: {e}") from None
        output.pump(proc.stdout, sys.stdout.buffer)
        output.pump(proc.stderr, sys.stderr.buffer)
        if self.yield_cpu:
            # the job keeps its priority; the watch and its py-spy samplers take what the job leaves
            os.nice(10)
        try:
            rc = self._watch(proc, t0)
        finally:
            self._end_family(proc)
            if isinstance(proc, KeptJob):
                proc.close()  # the keeper ends what the job left that the watch never saw
            output.close()
            for s, h in old.items():
                signal.signal(s, h)
        # a stall reported (not ended) that the job then got past: the job finished, the report stays as history
        self.stall_passed = passed = rc == 0 and self.stalled is not None and not self.stalled.get("ended")
        status = "finished" if rc == 0 and (self.stalled is None or passed) else "failed"
        now = time.time()
        if passed:
            write_lab_status(self.exp, {"stall_passed": self.stalled["time"]})
            log.warning(
                "asrlab watch: the ranks moved on after the stall it reported, and the job finished (exit code 0)"
            )
        if self._stopped is not None:  # ended on a signal to the watch: stopped, whatever the ranks did then
            status = "stopped"
            write_lab_status(
                self.exp,
                {"stopped_by": f"{signal.Signals(self._signal).name} to asrlab watch", "stop_time": self._stopped},
            )
        for view in self.ranks.values():  # the watcher wrote their heartbeats: it says how they ended
            if status == "finished":
                self._beat(view.snapshot(now, "done"), now, "done")
        write_lab_status(
            self.exp,
            {
                "status": status,
                "exit_code": rc,
                "ended": now,
                "world_size": self.world() if self.ranks else None,
                "sampler": self.sampler_note,
                "watch_cost": self.cost(),
            },
        )
        # a stall the watch ended: its own code (the job's, kept in lab.json, is what being ended gave it: 143,
        # 137, or 0 from a launcher that took it calmly), told apart from a signal to the job or to the watch
        return STALL_EXIT if self.stalled is not None and self.stalled.get("ended") and not self._stopped else rc

    def cost(self) -> dict:
        """CPU seconds the watch took: the watcher process itself and its py-spy dumps."""
        spy = self.sampler if isinstance(self.sampler, PySpy) else None
        return {
            "watcher_cpu_s": round(_own_cpu() - self._cpu0, 3),
            "sampler_cpu_s": round(spy.cpu_s, 3) if spy else 0.0,
            "dumps": spy.dumps if spy else 0,
        }

    def _elsewhere(self, world: int) -> tuple:
        """The ranks of other nodes: of the job's world, those outside this node's (its ranks' LOCAL_WORLD_SIZE
        from the first of them); none where the node's size is not known."""
        local = max((v.proc.local_world for v in self.ranks.values()), default=0)
        mine = [v.proc.rank for v in self.ranks.values() if v.proc.rank is not None and v.proc.known]
        if not local or not mine or local >= world:
            return ()
        base = min(mine) // local * local
        return tuple(r for r in range(world) if not base <= r < base + local)

    def world(self) -> int:
        """The job's ranks: their WORLD_SIZE (with other nodes' ranks), else those seen here."""
        return world_of(v.proc for v in self.ranks.values())

    def _on_signal(self, sig, frame) -> None:
        self._signal = sig

    def _watch(self, proc: subprocess.Popen, t0: float) -> int:
        while True:
            start = time.monotonic()
            rc = proc.poll()
            if rc is not None:
                return rc if rc >= 0 else 128 - rc
            if self._signal is not None:
                self._stopped = time.time()
                log.warning("asrlab watch: %s: ending the job", signal.Signals(self._signal).name)
                self._end_family(proc)
                return 128 + self._signal
            self._look(proc.pid, t0)
            if self.stalled is not None and self.on_stall == "kill" and not self.stalled.get("ended"):
                self.stalled["ended"] = time.time()
                log.error("asrlab watch: ending the stalled job (--on-stall kill)")  # its verdict: said above
                self._end_family(proc)
            try:
                proc.wait(max(0.0, self.period_s - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                pass

    # -- one look ----------------------------------------------------------------------
    def _choose_sampler(self, pid: int) -> None:
        if self.choice != "faulthandler":
            spy = PySpy()
            why = spy.works_on(pid)
            if why is None:
                self.sampler, self.sampler_note = spy, "py-spy"
                return
            # a process still starting has no Python stacks to read yet: try again at the next looks,
            # unless the reason is the permission itself
            first = self._first_try = self._first_try or time.monotonic()
            refused = any(w in why.lower() for w in ("permission", "not permitted", "ptrace"))
            if not refused and time.monotonic() - first < 20.0:
                return
            if self.choice == "py-spy":
                raise RuntimeError(f"py-spy cannot read pid {pid}: {why}")
            log.warning(
                "asrlab watch: py-spy cannot read the job's stacks (%s); using the faulthandler "
                "fallback (stacks on a signal, through the sitecustomize on the job's PYTHONPATH)",
                why,
            )
            self.sampler_note = f"faulthandler (py-spy: {why})"
        else:
            self.sampler_note = "faulthandler"
        self.sampler = self.fallback

    def _look(self, root: int, t0: float) -> None:
        # once ranks with RANK were seen, a process without it is not one (torchrun's agent after they ended)
        procs, everyone = self.table.ranks(root, single=not any(v.proc.by_env for v in self.ranks.values()))
        for p in self.table.unranked:
            self._unranked_since.setdefault(p, time.monotonic())
        for v in procs.values() if procs else ():
            if v.known:  # named since (by its process group)
                self._unranked_since.pop(v.pid, None)
        # said only of those still unnamed a while on: a rank torch.multiprocessing.spawn started (Lightning's
        # ddp_spawn) says its rank once it joins its process group, seconds after it started
        wait_s = min(UNRANKED_S, self.stall_timeout_s)  # (said before a stall of theirs could be)
        late = [p for p, t in self._unranked_since.items() if time.monotonic() - t >= wait_s]
        if procs and (new := [p for p in late if p not in self._unranked_said]):
            self._unranked_said.update(new)
            log.warning(
                "asrlab watch: no launcher's word for the ranks of this job's Python processes (no RANK, "
                "LOCAL_RANK, SLURM_PROCID, an MPI launcher's rank or --local_rank=N), and none joined a process "
                "group in %g s: pid %s watched, each as a process of unknown rank (give each process RANK and "
                "WORLD_SIZE to have each named by its rank)",
                wait_s,
                ", ".join(map(str, new)),
            )
        for pid, started in everyone:
            self._family.setdefault(pid, started)
        if not procs:
            return
        if self.sampler is None:
            self._choose_sampler(next(iter(procs.values())).pid)
            if self.sampler is None:
                return
        now = time.time()
        for rank, proc in sorted(procs.items()):
            view = self.ranks.get(rank)
            if view is None or view.proc.pid != proc.pid:  # new, or restarted by torchrun
                view = self.ranks[rank] = RankView(proc, now)
                if self.peers is not None:
                    self.peers.watch(rank, proc.pid)  # which rank ends first, the moment it does
                self._beat(view.snapshot(now), now, "start")
            # a process first seen alone (rank 0) is of unknown rank once another of the job's own appears
            view.proc.workers, view.proc.known = proc.workers, proc.known
            stacks = self.sampler.sample(proc.pid)
            if stacks is None:  # not read at this look (a sampler's timeout on a loaded machine): a process still
                if process_state(proc.pid, socket.gethostname(), now) == "alive":  # running (not a zombie) is
                    self._beat(view.snapshot(now), now, None)  # there all the same, not frozen; its phase as last seen
                continue
            # the workers only while the rank waits for them: they are what moves then (and half the cost)
            main = stacks.get("MainThread") or next(iter(stacks.values()), [])
            workers = (
                {}
                if phase_of(main) != "data"
                else {w: s for w in proc.workers if (s := self.sampler.sample(w)) is not None}
            )
            changed = view.update(stacks, workers, time.time())
            self.gpus.look({rank: proc}, {rank: view.phase})
            view.gpu_busy = self.gpus.busy(rank)
            self.loops.learn(view)
            self._beat(view.snapshot(now), now, changed)
        for rank, view in self.ranks.items():
            if not view.proc.known and rank not in procs and view.proc.pid not in self._exited:
                self._exited.add(view.proc.pid)  # not a stall's cause: said as ended, not as frozen
                self._beat(view.snapshot(now, "exited"), now, "exited")
        if self.stalled is None:
            self._check_stall(procs, now, t0)

    def _beat(self, snap: dict, now: float, changed: str | None) -> None:
        atomic_write(self.exp / layout.HEARTBEAT / f"rank{snap['rank']}.json", json.dumps(snap))
        if changed:
            append_jsonl(
                self.exp / layout.HEARTBEAT / f"rank{snap['rank']}.timeline.jsonl",
                [{"t": now, "phase": changed, "step": None}],
            )

    # -- a stall -----------------------------------------------------------------------
    def _check_stall(self, procs: dict[int, Proc], now: float, t0: float) -> None:
        views = [v for r, v in self.ranks.items() if r in procs and v.samples]
        if not views:
            return
        # training once every rank of this node is seen training: a rank waiting for a peer still importing (not
        # yet started, or not yet at its first step) is starting, not stalled
        node = max((v.proc.local_world for v in self.ranks.values()), default=0)
        # or seen in the job's own output: steps printed apart in time (a loop whose steps are too short to be
        # sampled computing, the rest of its time asleep or in its own code)
        training = all_training(list(self.ranks.values()), node, printed=self.output.training())
        allowance = self.stall_timeout_s if training else self.first_step_s
        if any(v.phase == "compile" for v in views):  # torch.compile's workers at a new shape: not a stall yet
            allowance = max(allowance, COMPILE_ALLOW_S)
        # moved: any rank's stacks, or a new step line in the job's output (a loop that sleeps or waits on its own
        # between steps is sampled at one line, and moves all the same)
        still = now - max(max(v.moved for v in views), self.output.stepped)
        spun = spinning(views, self.world(), now, self.first_step_s) if training and still < allowance else None
        if spun is not None:  # its stacks move and get no further: held since it began to cycle
            spun.moved = spun.since = spun.spin[2]
            still = now - max(max(v.moved for v in views), self.output.stepped)
        if still < allowance:
            return
        if counting_on(views, self.sampler):  # an evaluation that counts on, sampled asleep on one line: moving
            for v in views:
                v.moved = time.time()
            return
        world = self.world()
        uneven = self.loops.uneven(views, world, self.sampler)
        # each rank's step where it said none, from the training loop's own count in its locals (py-spy only): the
        # step a rank is in, for a rank waiting for its next batch the step that batch is for (as a heartbeat says
        # them: "waited for data at step 6" beside "the all-reduce of step 6")
        counted = {} if uneven else self.loops.counts(views, self.sampler) if self.loops.seen else {}
        for v in views:
            snap = {
                **v.snapshot(now, v.held_phase(world)),
                "since": min(v.since, v.moved),
                "stacks": {name: format_stack(s) for name, s in v.stacks.items()},
                **uneven.get(v.proc.rank, {}),
            }
            if snap.get("step") is None and v.proc.rank in counted:
                snap["step"] = counted[v.proc.rank]
            atomic_write(self.exp / layout.STALL / f"rank{v.proc.rank}.json", json.dumps(snap))
            text = "\n\n".join(
                f"[worker pid {pid}]\n" + "\n".join(format_stack(s.get("MainThread") or []))
                for pid, s in sorted(v.workers.items())
            )
            atomic_write(self.exp / layout.STALL / f"rank{v.proc.rank}.workers.txt", text)
        self._flight(list(self.ranks))
        collectives = last_collectives(self.exp)
        report = write_report(
            self.exp, world, allowance, since=t0, now=now, collectives=collectives, elsewhere=self._elsewhere(world)
        )
        flight = collectives_text(collectives)
        if flight:  # which rank never entered the collective the others wait in
            with open(self.exp / layout.STALL_TEXT, "a") as f:
                f.write("\n" + "\n".join(flight) + "\n")
        lead = [e["rank"] for e in report["ranks"] if e.get("phase") not in WAITING + ("done",)]
        self.stalled = {
            "verdict": report["verdict"],
            "time": now,
            "first": [self.ranks[r].proc.pid for r in lead if r in self.ranks],
        }
        log.error(
            "asrlab watch: no rank has moved for %.0f s%s: %s (report: %s)",
            still,
            "" if training else " (before every rank was seen training: the allowance of --first-step-timeout)",
            report["verdict"],
            self.exp / layout.STALL_TEXT,
        )

    def _flight(self, ranks: list[int], wait_s: float = 3.0) -> None:
        """Ask every rank for its Flight Recorder (the injected thread answers a request file) and wait a
        little for the answers."""
        folder = self.exp / layout.FLIGHT
        asked = time.time()
        (folder / "request").write_text(str(asked))
        deadline = asked + wait_s
        while time.time() < deadline:
            done = [
                r
                for r in ranks
                if (folder / f"rank{r}.json").exists() and (folder / f"rank{r}.json").stat().st_mtime >= asked - 0.01
            ]
            if len(done) == len(ranks):
                return
            time.sleep(0.1)

    # -- the end -----------------------------------------------------------------------
    def _end_family(self, proc: subprocess.Popen, grace_s: float = 5.0) -> None:
        """End the job and everything it started (ranks under torchrun live in sessions of their own): a
        SIGTERM, then after ``grace_s`` a SIGKILL for whatever is left. After a stall, the ranks that
        held the others up go first, so torchrun's own summary names one of them. Only processes seen
        under the job, and still the same processes (their create time), are sent anything."""
        first = (self.stalled or {}).get("first") or []
        for pid in first:
            try:
                psutil.Process(pid).terminate()
            except psutil.Error:
                pass
        if first:
            psutil.wait_procs([p for p in map(_process, first) if p is not None], timeout=1.0)
        keeper = proc.keeper.pid if isinstance(proc, KeptJob) else None
        for p in family(proc.pid) + (family(keeper)[1:] if keeper else []):  # and orphans the keeper took in
            try:
                self._family.setdefault(p.pid, p.create_time())
            except psutil.Error:
                pass
        alive = []
        for pid, created in self._family.items():
            try:
                p = psutil.Process(pid)
                if pid != keeper and p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                continue
        for p in alive:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, left = psutil.wait_procs(alive, timeout=grace_s)
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=grace_s)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass


def _start(cmd: list[str], env: dict[str, str], status: Path) -> subprocess.Popen | KeptJob:
    """The job, under a keeper that ends all of it when the watch ends, however (Linux); elsewhere the
    job's own process, ending with the watch where it can (see :mod:`.keeper`)."""
    if sys.platform.startswith("linux"):
        return KeptJob(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, status=status)
    return subprocess.Popen(
        cmd, env=env, preexec_fn=own_session_ending_with_parent(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _own_cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


__all__ = ["JobWatch"]

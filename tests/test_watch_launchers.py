"""``asrlab watch`` finds every rank whoever started it: torchrun's ``RANK``, srun's ``SLURM_PROCID``, DeepSpeed's
``--local_rank=N``, Lightning's own launcher (NeMo's too), which starts ranks 1.. as children of the user's process
with ``LOCAL_RANK`` and no ``RANK``, and ``torch.multiprocessing.spawn``'s ranks, which carry nothing (each records
the rank its process group gives it); a DataLoader worker is never its rank. Real Lightning runs
(``strategy="ddp"``, 2 CPU ranks, ``tests/loops/lightning_loop.py``) broken three ways are read back by
``asrlab doctor``; a rank still starting (a peer that takes its time before ``init_process_group``) is not a
stall."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from asrlab.watch.procs import job_ranks, rank_key

from helpers import NoStacks

ROOT = Path(__file__).resolve().parent.parent
ASRLAB = [sys.executable, "-m", "asrlab.cli"]


def test_what_each_launcher_leaves_names_the_rank():
    assert rank_key({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}) == ("RANK", 3)  # torchrun, Accelerate
    # DeepSpeed's launcher: RANK and LOCAL_RANK in the environment and --local_rank=N on the command line
    assert rank_key({"RANK": "5", "LOCAL_RANK": "1"}, "train.py --local_rank=1 --deepspeed") == ("RANK", 5)
    assert rank_key({}, "python train.py --local_rank=2 --cfg x") == ("--local_rank", 2)  # older launchers
    assert rank_key({"SLURM_PROCID": "6", "SLURM_NTASKS": "8"}) == ("SLURM_PROCID", 6)  # srun
    assert rank_key({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # one task of a batch job: no ranks
    assert rank_key({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}) == ("LOCAL_RANK", 1)  # Lightning
    # MPI launchers: Open MPI's mpirun, MPICH's hydra, PMIx, horovodrun; RANK first (torchrun under mpirun)
    assert rank_key({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "PMIX_RANK": "3"}) == (
        "OMPI_COMM_WORLD_RANK",
        3,
    )
    assert rank_key({"PMI_RANK": "2", "PMI_SIZE": "4"}) == ("PMI_RANK", 2)
    assert rank_key({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}) == ("HOROVOD_RANK", 1)
    assert rank_key({"RANK": "5", "OMPI_COMM_WORLD_RANK": "1"}) == ("RANK", 5)
    assert rank_key({"PATH": "/bin"}) is None


CHILD = "import os, subprocess, sys, time\n" + textwrap.dedent(
    """
    role = sys.argv[1]
    if role == "root":  # Lightning's launcher: it starts rank 1, then sets its own LOCAL_RANK=0 and a worker gets it
        env = {**os.environ, "LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}
        rank1 = subprocess.Popen([sys.executable, __file__, "rank1"], env=env)
        os.environ.update(LOCAL_RANK="0", NODE_RANK="0", WORLD_SIZE="2")
        worker = subprocess.Popen([sys.executable, __file__, "worker"])
        time.sleep(60)
    elif role == "rank1":  # its DataLoader worker inherits its environment
        worker = subprocess.Popen([sys.executable, __file__, "worker"])
        time.sleep(60)
    else:
        time.sleep(60)
    """
)


def test_lightnings_own_launcher_rank_0_is_the_parent_and_workers_are_not_ranks(tmp_path):
    """The process layout Lightning's launcher (and NeMo's) leaves, as the real runs in
    tests/fixtures/toolkit_runs/nemo/ recorded it: rank 0 the launched process, rank 1 its child with LOCAL_RANK,
    each with a worker of its own; rank 0's worker inherits the LOCAL_RANK=0 set after rank 1 was started."""
    script = tmp_path / "layout.py"
    script.write_text(CHILD)
    root = subprocess.Popen([sys.executable, str(script), "root"])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(psutil.Process(root.pid).children(recursive=True)) < 3:
            time.sleep(0.1)
        ranks = job_ranks(root.pid)
        kids = {p.pid: p for p in psutil.Process(root.pid).children(recursive=True)}
        rank1 = next(pid for pid, p in kids.items() if p.ppid() == root.pid and "rank1" in p.cmdline())
        assert sorted(ranks) == [0, 1] and ranks[0].pid == root.pid and ranks[1].pid == rank1, ranks
        assert len(ranks[0].workers) == 1 and len(ranks[1].workers) == 1
        assert rank1 not in ranks[0].workers  # rank 1 is not rank 0's worker, nor are its workers
        assert ranks[1].local_world == ranks[0].local_world == 2
    finally:
        for p in [psutil.Process(root.pid), *psutil.Process(root.pid).children(recursive=True)]:
            p.kill()
        root.wait(timeout=30)


# torchrun's agent of node 1, started by srun (or mpirun): its ranks 2 and 3
AGENT = """import os, subprocess, sys, time
for r in (2, 3):
    rank = [sys.executable, "-c", "import time; time.sleep(60)"]
    subprocess.Popen(rank, env={**os.environ, "RANK": str(r), "WORLD_SIZE": "4"})
time.sleep(60)
"""


def test_an_agent_srun_or_mpirun_started_is_not_a_rank(tmp_path):
    """``srun torchrun ...`` on two nodes: the agent carries srun's SLURM_PROCID (its node's task), its children
    torchrun's RANK. The ranks are the children (2 and 3 on node 1); the agent is no rank 1."""
    (tmp_path / "bin").mkdir()
    agent = tmp_path / "bin" / "torchrun"  # an agent's command line names torchrun
    agent.write_text(AGENT)
    env = {**os.environ, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "OMPI_COMM_WORLD_RANK": "1"}
    root = subprocess.Popen([sys.executable, str(agent)], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(psutil.Process(root.pid).children()) < 2:
            time.sleep(0.1)
        ranks = job_ranks(root.pid)
        assert sorted(ranks) == [2, 3] and all(p.world == 4 for p in ranks.values()), ranks
    finally:
        for p in [*psutil.Process(root.pid).children(recursive=True), psutil.Process(root.pid)]:
            p.kill()
        root.wait(timeout=30)


def test_the_injected_code_takes_no_launcher_for_a_rank(tmp_path):
    """The watch's sitecustomize in torchrun's agent that mpirun started (OMPI_COMM_WORLD_RANK=1 in its environment)
    says no rank (its errors and Flight Recorder files are no rank's); in a process of the job's own, the same
    variable is its rank."""
    inject = ROOT / "asrlab" / "watch" / "inject"
    said = "import sitecustomize; print(sitecustomize._rank())"
    (tmp_path / "torchrun").write_text(said)
    (tmp_path / "train.py").write_text(said)
    env = {**os.environ, "PYTHONPATH": str(inject), "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}
    for script, rank in (("torchrun", "None"), ("train.py", "1")):
        out = subprocess.run([sys.executable, str(tmp_path / script)], capture_output=True, text=True, env=env,
                             timeout=60)  # fmt: skip
        assert out.stdout.strip() == rank, (script, out.stdout, out.stderr[-2000:])


def test_a_shell_that_execs_python_is_read_again_once_it_runs_python(tmp_path):
    """pyenv's and conda's shims, and a run.sh that ends in ``exec python train.py``: the job's process is a shell
    at the watch's first look and Python, in the same pid, at a later one; the later looks find rank 0 there."""
    from asrlab.watch.procs import Table

    go = tmp_path / "go"
    shim = f'while [ ! -e "{go}" ]; do sleep 0.05; done; exec "{sys.executable}" -c "import time; time.sleep(60)"'
    root = subprocess.Popen(["bash", "-c", shim], env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
    try:
        table = Table()
        assert table.ranks(root.pid)[0] == {}  # a shell: no rank yet
        go.touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "python" not in psutil.Process(root.pid).name().lower():
            time.sleep(0.05)
        ranks = table.ranks(root.pid)[0]
        assert list(ranks) == [0] and ranks[0].pid == root.pid, ranks
    finally:
        root.kill()
        root.wait(timeout=30)


FORKED = textwrap.dedent(
    """
    import os, sys, time
    go, forked = sys.argv[1], sys.argv[2]
    pid = os.fork()
    if pid == 0:  # subprocess.Popen's child before its exec: its parent's command line and environment
        open(forked, "w").close()
        while not os.path.exists(go):
            time.sleep(0.02)
        env = {**os.environ, "LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)"], env)
    time.sleep(60)
    """
)


def test_a_rank_seen_before_its_exec_is_read_again_once_it_runs(tmp_path):
    """Lightning's launcher starts rank 1 with subprocess.Popen: between its fork and its exec the child shows its
    parent's command line and environment (no LOCAL_RANK). A look in that moment took it for rank 0's worker and
    kept that; a later look, once it runs, finds rank 1 and the world of 2."""
    from asrlab.watch.procs import Table

    go, forked, script = tmp_path / "go", tmp_path / "forked", tmp_path / "fork.py"
    script.write_text(FORKED)
    root = subprocess.Popen([sys.executable, str(script), str(go), str(forked)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not forked.exists():
            time.sleep(0.02)
        table = Table()
        ranks = table.ranks(root.pid)[0]
        assert list(ranks) == [0] and len(ranks[0].workers) == 1, ranks  # the fork: rank 0's, for now
        child = ranks[0].workers[0]
        go.touch()
        while time.monotonic() < deadline and "-c" not in psutil.Process(child).cmdline():
            time.sleep(0.02)
        ranks = table.ranks(root.pid)[0]
        assert sorted(ranks) == [0, 1] and ranks[1].pid == child and ranks[1].world == 2, ranks
    finally:
        for p in [*psutil.Process(root.pid).children(recursive=True), psutil.Process(root.pid)]:
            p.kill()
        root.wait(timeout=30)


def test_python_processes_no_rule_names_are_each_watched_as_a_process_of_unknown_rank(tmp_path, caplog):
    """A job of two Python processes that carry no launcher's word for their rank (a launcher of the user's own):
    each is watched, numbered by the watch and said to be of unknown rank in its heartbeat, once in the log; a
    Python process below one of them (its worker) is not watched as a process of its own."""
    from asrlab.watch.watcher import JobWatch

    sleep = f'"{sys.executable}" -c "import time; time.sleep(60)"'
    worker = f"\"{sys.executable}\" -c \"import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])\""
    job = f"{sleep} & {worker} & wait"
    root = subprocess.Popen(["bash", "-c", job], env={**os.environ, "ASRLAB_WATCH_RUN": "watch.1"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(psutil.Process(root.pid).children(recursive=True)) < 3:
            time.sleep(0.05)
        first, second = sorted(psutil.Process(root.pid).children(), key=lambda p: p.pid)  # the tree's order
        w = JobWatch(tmp_path / "exp", stall_timeout_s=600)
        w.sampler = NoStacks()
        with caplog.at_level("WARNING", logger="asrlab.watch.watcher"):
            w._look(root.pid, time.time())  # just started: a spawned rank says its rank once in its group
            assert not [r for r in caplog.records if "no launcher's word" in r.getMessage()]
            w._unranked_since = {p: t - 60 for p, t in w._unranked_since.items()}  # a minute on, still unnamed
            w._look(root.pid, time.time())
            w._look(root.pid, time.time())
        said = [r.getMessage() for r in caplog.records if "no launcher's word" in r.getMessage()]
        assert len(said) == 1 and f"pid {first.pid}, {second.pid} watched" in said[0], said
        assert {r: v.proc.pid for r, v in w.ranks.items()} == {0: first.pid, 1: second.pid}
        assert w.ranks[1].proc.workers == [p.pid for p in second.children()]  # its child: a worker
        assert {v.proc.run for v in w.ranks.values()} == {"watch.1"}  # one launch: the watch's
        beats = {
            json.loads(p.read_text())["pid"]: json.loads(p.read_text())
            for p in (tmp_path / "exp").glob("**/rank*.json")
        }
        assert {pid: b["rank_known"] for pid, b in beats.items()} == {first.pid: False, second.pid: False}
    finally:
        for p in psutil.Process(root.pid).children(recursive=True):
            p.kill()
        root.kill()
        root.wait(timeout=30)


OWN_PROCESSES = textwrap.dedent(
    """
    import sys, time
    for i in range(int(sys.argv[1])):
        if i == int(sys.argv[2]):
            while True:
                time.sleep(1)  # a read that never returns
        sum(j * j for j in range(20000))
        time.sleep(0.01)
    """
)


def test_a_process_no_launcher_named_that_hangs_is_named_by_its_pid_not_a_rank(tmp_path):
    """A script that starts two Python processes itself, with no rank in their environment: one ends, the other
    hangs. The watch names the one that hangs by its pid, its rank unknown, and the one that ended as ended
    (not frozen); the doctor says the same and claims no culprit rank."""
    (tmp_path / "own.py").write_text(OWN_PROCESSES)
    job = f'"{sys.executable}" own.py 150 -1 & "{sys.executable}" own.py 1000 40 & wait'
    out, d = watch(tmp_path, ["bash", "-c", job], 3)
    said = f"{out.returncode}: {d['verdict']}: {d['summary']}\n{out.stderr[-2000:]}"
    hung = next(e["pid"] for e in d["stall"]["ranks"] if e["phase"] != "exited")
    assert d["verdict"] == "stalled" and d["culprit"]["rank"] is None, said
    assert d["summary"].startswith(f"process {hung} (rank unknown) is in the loop's own code"), said
    assert "ended before" in d["summary"] and "stopped responding" not in d["summary"], said
    assert "watched, each as a process of unknown rank" in out.stderr, said


def watch(tmp_path: Path, cmd: list[str], stall_s: float, **env) -> tuple[subprocess.CompletedProcess, dict]:
    """``asrlab watch --on-stall kill`` of ``cmd``: the watch's process and ``asrlab doctor``'s JSON of its folder."""
    out = subprocess.run(
        [*ASRLAB, "watch", "--exp", str(tmp_path / "watch"), "--stall-timeout", str(stall_s), "--on-stall", "kill",
         "--", *cmd],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )  # fmt: skip
    doc = subprocess.run(
        [*ASRLAB, "doctor", str(tmp_path / "watch"), "--json"], capture_output=True, text=True, timeout=120
    )
    return out, json.loads(doc.stdout)


LOOPS = Path(__file__).parent / "loops"
# Lightning's own launcher (strategy="ddp": rank 1 is the user's process's child; the loop's own callback kept out
# of the way by STALL_S, the watch from outside is what is tested) and torch.multiprocessing.spawn (ranks that
# carry no launcher's variables: each records the rank its process group gives it)
LAUNCHERS = {
    "lightning": (lambda tmp: [sys.executable, str(LOOPS / "lightning_loop.py"), str(tmp / "exp")],
                  {"MP": "spawn", "STALL_S": "600"}, "hang:1:6"),
    "mp_spawn": (lambda tmp: [sys.executable, str(LOOPS / "spawn_loop.py")], {}, "hang:1:4"),
    # a script that starts its ranks itself, multiprocessing's spawn Process, RANK set in its own environment for each
    # (spawn's resource tracker inherits rank 0's; the script is no rank); its exit code the first non-zero rank's
    "mp_process": (lambda tmp: [sys.executable, str(LOOPS / "spawn_loop.py")], {"START": "process"}, "hang:1:4"),
}  # fmt: skip
FAULTS = {"hang": "hung_reader", "raise:1:3": "raise", "kill:1:3": "sigkill"}
# a rank of a script's own that is SIGKILLed leaves only the script's exit code: torch.multiprocessing.spawn's kill
# case covers what the watch can say of a vanished rank
CASES = [(launcher, fault) for launcher in sorted(LAUNCHERS) for fault in FAULTS
         if (launcher, fault) != ("mp_process", "kill:1:3")]  # fmt: skip


@pytest.mark.parametrize("launcher, fault", CASES, ids=[f"{launcher}-{FAULTS[fault]}" for launcher, fault in CASES])
def test_the_watch_names_rank_1_whoever_started_it(tmp_path, launcher, fault):
    if launcher == "lightning":
        pytest.importorskip("lightning", reason="the lightning extra is not installed (pip install -e '.[lightning]')")
    cmd, env, hang = LAUNCHERS[launcher]
    out, d = watch(tmp_path, cmd(tmp_path), 8, FAULT=hang if fault == "hang" else fault, **env)
    said = f"{out.returncode}: {d['verdict']}: {d['summary'][:400]}\n{out.stderr[-2000:]}"
    verdict = {"hang": "stalled", "raise:1:3": "crashed", "kill:1:3": "killed"}[fault]
    if fault == "kill:1:3" and "vanished" in d["summary"]:
        # Lightning's launcher did not get to print its child's -9 (rank 0's collective failed first, its
        # traceback a lost peer's): rank 1 ended without a word, a signal's end or its own (nothing says which)
        verdict = "crashed"
        assert "the job's output shows no error of it" in d["summary"], said
    assert d["verdict"] == verdict and d["culprit"]["rank"] == 1, said
    assert d["world_size"] == 2, said  # both ranks known (Lightning's rank 0: the launched process)
    if fault == "hang":
        assert "rank 1 has waited" in d["summary"] and "for data" in d["summary"], said
    if launcher == "mp_spawn":  # the ranks' own records; a DataLoader worker makes no process group; the launcher's
        records = [json.loads(f.read_text()) for f in (tmp_path / "watch" / "watch" / "ranks").glob("*.json")]
        assert sorted(str(r.get("rank", "launcher")) for r in records) == ["0", "1", "launcher"], said
    if launcher == "mp_process":  # the script that set RANK for its ranks records none of its own
        records = [json.loads(f.read_text()) for f in (tmp_path / "watch" / "watch" / "ranks").glob("*.json")]
        assert not any("rank" in r for r in records), (records, said)
        if fault == "hang":  # rank 0 is the process in the loop, not spawn's resource tracker, which inherited RANK=0
            assert "in run" in d["ranks"][0]["detail"] and "all-reduce" in d["summary"], said
        else:  # multiprocessing caught the target's exception: recorded on its way out
            assert json.loads((tmp_path / "watch" / "errors" / "rank1.json").read_text())["type"] == "RuntimeError"


DEEPSPEED = ROOT / "tests" / "fixtures" / "watched"


@pytest.mark.parametrize(
    "case, verdict",
    [("deepspeed_hang_rank1", "stalled"), ("deepspeed_raise_rank1", "crashed"), ("deepspeed_kill_rank1", "killed")],
)
def test_deepspeeds_own_launcher_watched_names_rank_1(case, verdict):
    """Real runs of DeepSpeed's launcher on 2 CPU ranks under ``asrlab watch`` (``tests/optin/ds_loop.py``, re-made by
    ``tests/optin/test_deepspeed.py``): rank 1 named for a hung reader, a raise and a SIGKILL; the raise said once
    (the job's traceback and the watch's record of the same error are one failure); the ranks' start, when
    DeepSpeed's engine imports torch._dynamo, is not read as compiling."""
    from asrlab.doctor import diagnose, format_diagnosis

    d = diagnose(DEEPSPEED / case)
    assert (d["verdict"], d["culprit"]["rank"], d["world_size"]) == (verdict, 1, 2), d["summary"]
    assert d["summary"].count("a bad batch") <= 1, d["summary"]
    assert "compile" not in format_diagnosis(d).split("step times", 1)[1].split("\n\n", 1)[0]


SLOW_START = textwrap.dedent(
    """
    import os, time
    import torch, torch.distributed as dist
    if os.environ["RANK"] == "1":
        time.sleep(float(os.environ["SLEEP_S"]))  # a rank still importing a toolkit, its peer waiting for it
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    for step in range(20):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
    dist.destroy_process_group()
    """
)


def test_a_rank_still_starting_is_not_a_stall(tmp_path):
    """Rank 0 waits in init_process_group for 8 s while rank 1 sleeps before it, under --stall-timeout 4: the
    first-step allowance (3x the timeout, until every rank is seen training) leaves the job alone."""
    script = tmp_path / "slow_start.py"
    script.write_text(SLOW_START)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    out, d = watch(tmp_path, cmd, 4, SLEEP_S="8")
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (tmp_path / "watch" / "stall_report.json").exists() and d["verdict"] == "finished", d["summary"]


SPAWNED_SLOW_START = textwrap.dedent(
    """
    import os, time
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def rank(r):
        if r == 1:
            time.sleep(8)  # a rank still importing a toolkit, its peer waiting for it
        dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=r, world_size=2)
        model = torch.nn.Linear(4, 1)
        for step in range(20):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(rank, nprocs=2)
    """
)


def test_a_stall_reported_that_the_job_then_got_past_is_history_not_the_verdict(tmp_path):
    """torch.multiprocessing.spawn, --first-step-timeout 2 --on-stall report: rank 0 waits 8 s for rank 1, still
    asleep before it joins. The stall the watch reports names the sleeping process, not the launcher (whose main
    thread is in mp.spawn: it records that it is the ranks' launcher, no rank of its own); the ranks then move on
    and the job finishes: the run finished (exit code 0), the stall said beside it, and the watch's last word in
    the console is that it finished, not a stall."""
    from asrlab.doctor import diagnose_logs

    script = tmp_path / "slow_start.py"
    script.write_text(SPAWNED_SLOW_START)
    out = subprocess.run(
        [*ASRLAB, "watch", "--exp", str(tmp_path / "watch"), "--stall-timeout", "2", "--first-step-timeout", "2",
         "--on-stall", "report", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", "STORE": str(tmp_path / "store")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "allowance of --first-step-timeout" in out.stderr and "moved on after the stall" in out.stderr, out.stderr
    launcher = [json.loads(f.read_text()) for f in (tmp_path / "watch" / "watch" / "ranks").glob("*.json")]
    assert sum(1 for r in launcher if r.get("launcher") == "torch.multiprocessing.spawn") == 1, launcher
    report = json.loads((tmp_path / "watch" / "stall_report.json").read_text())
    assert report["verdict"].startswith("process ") and "slow_start.py:7 in rank" in report["verdict"], report
    doc = subprocess.run([*ASRLAB, "doctor", str(tmp_path / "watch"), "--json"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    d = json.loads(doc.stdout)
    assert doc.returncode == 0 and d["verdict"] == "finished" and d["ok"], d["summary"]
    assert "reported a stall" in d["summary"] and "then the ranks moved on" in d["summary"], d["summary"]
    last = [ln for ln in out.stderr.splitlines() if ln.startswith("asrlab watch: ")][-1]
    assert last.startswith("asrlab watch: finished; the ranks moved on after the stall it reported ("), last
    (tmp_path / "console.log").write_text(out.stdout + out.stderr)
    assert diagnose_logs([str(tmp_path / "console.log")])["verdict"] != "stalled"


def test_the_watch_names_a_rank_asrlab_train_forked(corpus, tmp_path):
    """``asrlab train --nproc 2`` forks its ranks from a warm forkserver: their command line and environment are the
    forkserver's, so each records the rank its process group gives it. Rank 1's data hangs from its 4th batch (the
    trainer's own watchdog off): the watch names rank 1 waiting for data, rank 0 in the all-reduce."""
    from conftest import SMALL

    cmd = [*ASRLAB, "train", "--nproc", "2", "--data", str(corpus / "data.list"), "--exp", str(tmp_path / "exp"),
           "--resume", "none", "train.max_epochs=1000", "train.stall_timeout_s=0", "data.inject_delay_s=600",
           "data.inject_delay_ranks=[1]", "data.inject_delay_from_batch=3", *SMALL]  # fmt: skip
    out, d = watch(tmp_path, cmd, 4)
    said = f"{out.returncode}: {d['verdict']}: {d['summary'][:400]}\n{out.stderr[-2000:]}"
    assert d["verdict"] == "stalled" and d["culprit"]["rank"] == 1 and d["world_size"] == 2, said
    assert "rank 1 has waited" in d["summary"] and "for data" in d["summary"], said
    records = [json.loads(f.read_text()) for f in (tmp_path / "watch" / "watch" / "ranks").glob("*.json")]
    assert sorted(r["rank"] for r in records if "rank" in r) == [0, 1], said


def test_a_forked_rank_whose_launcher_sets_its_rank_after_the_fork_records_it(tmp_path):
    """A rank forked from a warm process (``asrlab train --nproc 1 --max-restarts 1``: one rank, no process group)
    has its launcher's RANK set in it after the fork, where the watch cannot read it: it records its own rank;
    the process it was forked from records none (else the watch took the launcher for rank 0)."""
    from asrlab.watch.watcher import INJECT

    script = textwrap.dedent(
        """
        import os, sys, time
        pid = os.fork()
        if pid == 0:
            os.environ.update(RANK="0", WORLD_SIZE="1")  # as torch elastic sets them in a forked rank
            time.sleep(3)
            os._exit(0)
        print(pid, flush=True)
        os.waitpid(pid, 0)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(INJECT), "ASRLAB_WATCH_EXP": str(tmp_path)}
    env.pop("RANK", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    child = int(out.stdout.split()[0])
    records = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "watch" / "ranks").glob("*.json")}
    assert list(records) == [str(child)] and {k: records[str(child)][k] for k in ("rank", "world")} == {
        "rank": 0,
        "world": 1,
    }, (records, out.stderr[-2000:])


def test_a_rank_seen_once_in_a_steps_computation_is_training():
    """The first-step allowance ends once every rank has been seen training: in a step's computation once (its
    first batch came), or in two phases of a step; a rank seen only starting, waiting for data or in a collective
    (a peer still importing, DDP's constructor) keeps it."""
    from types import SimpleNamespace as Seen

    from asrlab.watch.ranks import all_training

    backward, starting = Seen(phases_seen={"start", "backward", "other"}), Seen(phases_seen={"start", "other"})
    assert all_training([backward, Seen(phases_seen={"data", "optimizer"})], 2)
    assert not all_training([backward, starting], 2)
    assert not all_training([backward, Seen(phases_seen={"start", "data", "collective"})], 2)
    assert not all_training([backward], 2)  # a rank of the node not seen yet


def test_asrlab_trains_own_torchrun_agent_is_a_launcher_not_a_rank():
    """``asrlab train --nproc N``'s agent (``python -m asrlab.train.launch``, torchrun's own main) is a launcher: the
    process that started it is not taken for rank 0 while the forked ranks are still starting (under load, the
    watch had ended such a job at start-up as "rank 0 is in the loop's own code")."""
    from asrlab.train.launch import torchrun_command
    from asrlab.watch.procs import LAUNCHERS

    assert any(x in " ".join(torchrun_command(2, ["--data", "d"])) for x in LAUNCHERS)


def test_a_notebook_run_by_papermill_is_watched_in_its_kernel(tmp_path):
    """``asrlab watch -- papermill in.ipynb out.ipynb``: papermill is a launcher, its kernel the job's one rank. The
    cell hangs in a function of its own: the stall names rank 0 in that function, not papermill's event loop."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import time\n"
            "def stuck_in_the_cell():\n"
            "    while True:\n"
            "        time.sleep(0.5)\n"
            "for i in range(3):\n"
            "    print(f'it {i} loss=0.5', flush=True)\n"
            "stuck_in_the_cell()\n"
        )
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(tmp_path / "in.ipynb"))
    cmd = [sys.executable, "-m", "papermill", str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb")]
    out = subprocess.run(
        [*ASRLAB, "watch", "--exp", str(tmp_path / "watch"), "--stall-timeout", "5", "--first-step-timeout", "5",
         "--on-stall", "kill", "--", *cmd],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    report = json.loads((tmp_path / "watch" / "stall_report.json").read_text())
    text = (tmp_path / "watch" / "stall_report.txt").read_text()
    assert out.returncode != 0 and report["verdict"].startswith("rank 0 "), (report["verdict"], out.stderr[-2000:])
    assert "papermill" not in report["verdict"] and "stuck_in_the_cell" in text, (report["verdict"], text[-2000:])

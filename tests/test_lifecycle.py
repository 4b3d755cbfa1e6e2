"""How a run of ``asrlab train`` ends: a signal stops every rank cleanly, nothing of the job outlives
``asrlab train`` even when it is killed outright, and a process ends without an abort at exit.

The two-rank tests start the small model on the tone corpus for many epochs and act once every rank's
heartbeat (``EXP/heartbeat/rank*.json``, written each second by the stall watch) shows steps done.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from asrlab.lab import stop
from asrlab.lab.numerics.guard import HALT_EXIT
from asrlab.lab.stall.heartbeat import read_heartbeats
from asrlab.lab.state import checkpoint

from conftest import SMALL
from helpers import job_processes

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _start(corpus, exp: Path) -> subprocess.Popen:
    """``asrlab train --nproc 2`` for far longer than any test waits, its output to ``EXP.log``."""
    cmd = [
        sys.executable,
        "-m",
        "asrlab.cli",
        "train",
        "--nproc",
        "2",
        "--data",
        str(corpus / "data.list"),
        "--exp",
        str(exp),
        "--resume",
        "none",
        "train.max_epochs=100000",
        *SMALL,
    ]
    return subprocess.Popen(cmd, stdout=open(f"{exp}.log", "w"), stderr=subprocess.STDOUT, env=ENV)


def _mid_run(proc: subprocess.Popen, exp: Path, steps: int = 2, within_s: float = 180) -> None:
    deadline = time.time() + within_s
    while True:
        beats = read_heartbeats(exp)
        if len(beats) == 2 and all(b.get("completed", 0) >= steps for b in beats.values()):
            return
        assert proc.poll() is None, f"asrlab train ended early:\n{_log(exp)}"
        assert time.time() < deadline, f"the ranks did not reach step {steps}:\n{_log(exp)}"
        time.sleep(0.1)


def _log(exp: Path) -> str:
    return Path(f"{exp}.log").read_text()[-3000:]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _none_left(exp: Path, within_s: float) -> list[psutil.Process]:
    deadline = time.time() + within_s
    while (left := job_processes(exp)) and time.time() < deadline:
        time.sleep(0.1)
    for p in left:  # not to leave them to the next tests
        p.kill()
    return left


def _steps(exp: Path, rank: int) -> list[int]:
    return [json.loads(x)["step"] for x in (exp / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()]


def _stopped_cleanly(exp: Path, *how: str) -> None:
    """Both ranks ended at the same step, and the newest checkpoint is of that step, with both ranks' state, stopped
    on one of the signals ``how``."""
    last = [_steps(exp, r)[-1] for r in (0, 1)]
    state, marker = checkpoint.load_latest(exp / "checkpoints")
    assert last[0] == last[1] == marker["step"] == state["step"], (last, marker["step"])
    assert len(state["ranks"]) == 2
    log = _log(exp)
    assert any(f"stopped on {h}; checkpoint in {exp}" in log for h in how), log


def test_sigterm_stops_every_rank_with_a_checkpoint_and_leaves_nothing_running(corpus, tmp_path):
    exp = tmp_path / "exp"
    proc = _start(corpus, exp)
    try:
        _mid_run(proc, exp)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.time() - t0
        left = _none_left(exp, within_s=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + signal.SIGTERM, _log(exp)
    assert took < 30, took
    assert not left, [p.info["cmdline"] for p in left]
    _stopped_cleanly(exp, "SIGTERM")


def test_sigkill_of_asrlab_train_ends_its_agent_and_ranks(corpus, tmp_path):
    """The agent gets the parent-death signal and gives it to the ranks, which still stop cleanly."""
    exp = tmp_path / "exp"
    proc = _start(corpus, exp)
    try:
        _mid_run(proc, exp)
        proc.kill()
        proc.wait(timeout=10)
        left = _none_left(exp, within_s=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not left, [p.info["cmdline"] for p in left]
    # torch's agent passes the SIGHUP on; where the signal lands inside its metrics wrapper (before that wrapper's
    # `start` is set: an UnboundLocalError replaces the SignalException, seen once in a clean-clone run), it closes
    # the ranks with its default SIGTERM instead. The ranks stop cleanly on either
    _stopped_cleanly(exp, "SIGHUP", "SIGTERM")


def test_ranks_end_when_their_agent_is_killed_too(corpus, tmp_path):
    """``asrlab train`` and torchrun's agent both SIGKILLed (a node's job killed outright): every rank
    has the agent's death signal and ends (without a checkpoint: the agent held the store)."""
    exp = tmp_path / "exp"
    proc = _start(corpus, exp)
    try:
        _mid_run(proc, exp)
        agent = psutil.Process(proc.pid).children()[0]
        ranks = [psutil.Process(b["pid"]) for b in read_heartbeats(exp).values()]
        assert len(ranks) == 2 and all(agent in r.parents() for r in ranks)
        # forked from the agent's forkserver, which imported torch and the trainer once for both
        assert all("multiprocessing.forkserver" in " ".join(r.parent().cmdline()) for r in ranks)
        agent.kill()
        proc.kill()
        proc.wait(timeout=10)
        left = _none_left(exp, within_s=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not left, [p.info["cmdline"] for p in left]
    assert not [r for r in ranks if _alive(r)]


def test_a_rank_killed_outright_is_the_launchers_first_failure(corpus, tmp_path):
    """Rank 1 SIGKILLed (as the OOM killer would): rank 0 fails at once on the lost peer. The launcher names both,
    and its exit code is rank 1's (137), not its peer's, whichever of the two torch elastic saw end first."""
    exp = tmp_path / "exp"
    proc = _start(corpus, exp)
    try:
        _mid_run(proc, exp)
        rank1 = read_heartbeats(exp)[1]["pid"]
        os.kill(rank1, signal.SIGKILL)
        code = proc.wait(timeout=60)
        left = _none_left(exp, within_s=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + signal.SIGKILL, _log(exp)
    # the whole output: the launcher names the ranks first, then prints rank 0's error, which can run long
    assert f"torchrun: rank 1 (pid {rank1}) ended with signal SIGKILL" in Path(f"{exp}.log").read_text(), _log(exp)
    assert not left, [p.info["cmdline"] for p in left]


def test_a_signal_asks_for_a_clean_stop_and_a_second_takes_its_usual_course():
    seen = []
    before = signal.signal(signal.SIGTERM, lambda sig, frame: seen.append(sig))
    try:
        with stop.stop_on_signals():
            assert not stop.stop_requested("nowhere") and stop.stop_signal() is None
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.stop_requested("nowhere") and stop.stop_signal() == signal.SIGTERM and not seen
            os.kill(os.getpid(), signal.SIGTERM)  # the handler there before gets it
            assert seen == [signal.SIGTERM]
        assert stop.stop_signal() is None and not stop.stop_requested("nowhere")
        assert stop.stopped_by() == signal.SIGTERM  # how the body ended, for the run's record at exit
        with stop.stop_on_signals():
            assert stop.stopped_by() is None  # a new body: not asked yet
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_parent_death_signal_asks_once_however_often_it_comes():
    with stop.stop_on_signals():
        for _ in range(3):  # once per thread of an ending parent: still one request, never a kill
            os.kill(os.getpid(), stop.PARENT_GONE)
        assert stop.stop_signal() == stop.PARENT_GONE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("starter", [[], ["nohup"]], ids=["foreground", "nohup"])
def test_a_child_ends_with_its_parent(tmp_path, starter):
    """``own_session_ending_with_parent``: the child of a process that dies gets the parent-death signal,
    also when the parent was started with SIGHUP ignored (``nohup``, which the child inherits)."""
    code = (
        "import subprocess, sys, time\n"
        "from asrlab.lab.stop import own_session_ending_with_parent\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " preexec_fn=own_session_ending_with_parent())\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([*starter, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    assert child.is_running() and os.getsid(child.pid) == child.pid  # a session of its own
    parent.kill()
    parent.wait()
    try:
        child.wait(timeout=10)
    except psutil.TimeoutExpired:
        child.kill()
        raise AssertionError("the child outlived its parent") from None


# Forks pairs of ranks from one process that has imported everything (a process start costs seconds of
# imports; 20 pairs of them would cost minutes). Each child runs ``asrlab train`` as a rank would and
# leaves through SystemExit, so its interpreter exits as a rank's does, the step where the abort was.
_PAIRS = """
import json, os, socket, sys
from asrlab.cli import main
from asrlab.lab.dist import teardown  # noqa: F401 (everything a rank imports, imported once)
import asrlab.train.trainer  # noqa: F401
import torch._dynamo  # noqa: F401 (what the optimizer's constructor imports: seconds a rank)
out, n, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ended = []
for i in range(n):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kids = []
    for rank in (0, 1):
        pid = os.fork()
        if pid == 0:
            log = os.open(f"{out}/run{i}.rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            sys.exit(main([*args, "--exp", f"{out}/exp{i}"]))
        kids.append(pid)
    ended.append([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in kids])
print(json.dumps(ended))
"""


def test_two_ranks_halted_on_a_non_finite_step_exit_without_an_abort_3_times(corpus, tmp_path):
    """The halt case that once ended in "terminate called without an active exception" (SIGABRT) after
    the ranks were done: gloo's worker threads outlived the process group (DDP and the guards still held
    it) and freed their last works while the interpreter exited. 3 times two ranks: each ends with the
    halt's exit code, and says no gloo thread outlived its process group."""
    args = [
        "train",
        "--data",
        str(corpus / "data.list"),
        "--resume",
        "none",
        "--max-steps",
        "20",
        "--nonfinite",
        "halt",
        "optim.lr=1e30",
        "optim.warmup_steps=0",
        "train.stall_timeout_s=0",
        "train.preflight=false",
        *SMALL,
    ]
    run = subprocess.run(
        [sys.executable, "-c", _PAIRS, str(tmp_path), "3", *args], capture_output=True, text=True, timeout=400, env=ENV
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ended = json.loads(run.stdout.splitlines()[-1])
    for i, codes in enumerate(ended):
        for r, code in enumerate(codes):
            out = (tmp_path / f"run{i}.rank{r}.log").read_text()
            assert code == HALT_EXIT, f"run {i}, rank {r}: exit code {code}\n{out[-3000:]}"
            assert "terminate called" not in out and "outlive the process group" not in out, f"run {i}, rank {r}\n{out}"
            assert "training halted" in out
    assert len(ended) == 3


_WORKER_LOOP = """
import os, sys, time
import torch
from asrlab.lab import stop
class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.tensor([float(os.getpid())])
init = stop.workers_ignore_stop_signals() if sys.argv[1] == "ignore" else None
with stop.stop_on_signals():
    loader = torch.utils.data.DataLoader(Items(), batch_size=2, num_workers=1, worker_init_fn=init)
    for step, batch in enumerate(loader):
        if step == 0:
            print(int(batch[0, 0]), flush=True)  # the worker's pid
        if stop.stop_requested(sys.argv[2]):
            print(f"stopped cleanly after step {step}", flush=True)
            break
        time.sleep(0.05)
"""


@pytest.mark.parametrize("workers", ["ignore", "as_torch_leaves_them"])
def test_a_sigterm_to_the_ranks_process_group_stops_the_loop_cleanly_when_its_workers_ignore_it(tmp_path, workers):
    """torchrun signals each rank's whole process group. torch's DataLoader workers die of a SIGTERM their own
    rank did not send (a handler torch sets in C as each worker starts), and the rank then fails on
    "DataLoader worker ... killed by signal: Terminated" instead of stopping cleanly. Here the signal comes to the
    worker and to the loop from this test's process, as from a launcher; with
    ``stop.workers_ignore_stop_signals()`` as the loader's ``worker_init_fn`` the loop stops cleanly."""
    child = subprocess.Popen(
        [sys.executable, "-c", _WORKER_LOOP, workers, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        worker = int(child.stdout.readline())
        os.kill(worker, signal.SIGTERM)
        time.sleep(0.5)  # the worker's end, where it ends, is seen by its rank at its next batch
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    if workers == "ignore":
        assert child.returncode == 0 and "stopped cleanly" in out, err[-2000:]
    else:  # what the helper is for: without it the worker dies and takes the loop with it
        assert child.returncode != 0 and "killed by signal: Terminated" in err, (child.returncode, err[-2000:])

"""``asrlab watch -- CMD`` on a loop with no asrlab line (examples/bare_loop.py) under torchrun with gloo
ranks on 127.0.0.1: a DataLoader worker hung, a rank raising, a finished run, the fallback without ptrace."""

from __future__ import annotations

import json
import re
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from asrlab.doctor import diagnose
from asrlab.lab.stall.classify import phase_of
from asrlab.lab.stall.flight import mismatch_text
from asrlab.watch.sample import parse_faulthandler

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def in_a_clone(tmp_path: Path) -> Path:
    """The loop copied where a user's clone of asrlab keeps it (``.../asrlab/examples``): a user's code in
    a folder named ``asrlab`` is still the user's own, its lines named in the verdict."""
    where = tmp_path / "asrlab" / "examples"
    where.mkdir(parents=True)
    for name in ("bare_loop.py", "toy.py"):
        shutil.copy(EXAMPLES / name, where / name)
    return where


def watched(
    exp: Path,
    fault: str = "",
    *watch_args: str,
    nproc: int = 2,
    timeout: float = 150,
    epochs: int = 1,
    cwd: Path = EXAMPLES,
    loop: str = "bare_loop.py",
):
    """``asrlab watch`` around torchrun and the bare loop (or ``loop``, which takes the same arguments: its
    output folder ``exp.parent / "out"``, the epochs); (exit code, stderr, seconds)."""
    cmd = [
        sys.executable,
        "-m",
        "asrlab.cli",
        "watch",
        "--exp",
        str(exp),
        *watch_args,
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        loop,
        str(exp.parent / "out"),
        str(epochs),
    ]
    env = {**os.environ, "TOY_FAULT": fault, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr, time.monotonic() - t0


def left_behind(exp: Path) -> list[int]:
    """Processes of the job still running: any with the run's folder on its command line."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if str(exp.parent / "out") in " ".join(p.info["cmdline"] or []):
            out.append(p.pid)
    return out


def test_a_hung_data_worker_is_named_with_the_loops_own_line_and_doctor_pid_agrees(tmp_path):
    """The watch (py-spy) reports the hang and lets the job be; ``asrlab doctor --pid`` on the job's agent
    says the same from one look; a SIGTERM to the watch then ends everything it started."""
    exp = tmp_path / "exp"
    cmd = [
        sys.executable,
        "-m",
        "asrlab.cli",
        "watch",
        "--exp",
        str(exp),
        "--stall-timeout",
        "5",
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "bare_loop.py",
        str(tmp_path / "out"),
        "1",
    ]
    env = {**os.environ, "TOY_FAULT": "hang_data:1:6", "OMP_NUM_THREADS": "1"}
    watch = subprocess.Popen(
        cmd, cwd=in_a_clone(tmp_path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 90
        while not (exp / "stall_report.json").exists() and time.time() < deadline and watch.poll() is None:
            time.sleep(0.5)
        report = json.loads((exp / "stall_report.json").read_text())
        v = report["verdict"]
        # the rank, the phase, the blocking line of the job's own code (toy.py's dataset), the other rank's wait
        assert (
            v.startswith("rank 1 has waited ")
            and " s for data at step 6 (" in v
            and "at toy.py:" in v
            and "in _faulty" in v
        ), v  # step 6's batch hung (step 5 taken): the loop's own count, read from its locals, as rank 0's below
        assert "rank 0 is waiting in DDP's gradient all-reduce (backward) of step 6" in v, v
        rank1 = next(r for r in report["ranks"] if r["rank"] == 1)
        assert any("toy.py" in line for line in (rank1.get("workers") or "").splitlines()), rank1.get("workers")
        d = diagnose(exp)
        assert d["verdict"] == "stalled" and d["summary"] == v
        # PyTorch's Flight Recorder, written by each rank on the watch's request: rank 1 never entered the
        # all-reduce rank 0 waits in
        coll = d["stall"]["collectives"]
        assert set(coll["ranks"]) == {"0", "1"} and coll["behind"] == [1], coll
        assert "all_reduce" in coll["ranks"]["0"]["op"], coll
        assert "<- behind the others" in (exp / "stall_report.txt").read_text()

        agent = psutil.Process(watch.pid).children()[0].pid  # the torchrun agent, not started by asrlab
        out = subprocess.run(
            [sys.executable, "-m", "asrlab.cli", "doctor", "--pid", str(agent)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1, (out.stdout[-2000:], out.stderr[-2000:])
        first = out.stdout.splitlines()[0]
        # the step is the loop's own count, read from its locals
        assert (
            first.startswith("STUCK: rank 1 is waiting for data of step ") and "toy.py:" in first and "_faulty" in first
        )
        assert "rank 0 is waiting in DDP's gradient all-reduce (backward)" in first, first

        watch.send_signal(signal.SIGTERM)
        assert watch.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if watch.poll() is None:
            watch.kill()
    assert not left_behind(tmp_path / "exp")


def test_the_fallback_without_ptrace_reads_the_same_hang(tmp_path):
    exp = tmp_path / "exp"
    rc, err, _ = watched(
        exp,
        "hang_data:0:4",
        "--stall-timeout",
        "6",
        "--on-stall",
        "kill",
        "--sampler",
        "faulthandler",
        nproc=1,
        cwd=in_a_clone(tmp_path),
    )
    assert rc != 0, err[-3000:]
    v = json.loads((exp / "stall_report.json").read_text())["verdict"]
    assert v.startswith("rank 0 has waited ") and "at toy.py:" in v and "in _faulty" in v, v
    assert json.loads((exp / "lab.json").read_text())["sampler"] == "faulthandler"
    assert not left_behind(exp)


def test_a_rank_spinning_in_its_own_code_while_the_other_waits_is_a_stall_after_the_first_step_allowance(tmp_path):
    """Rank 0 spins forever in its forward pass of step 6 (its stacks move between the loop's lines, so it is never
    still) while rank 1 waits in DDP's all-reduce: held that long (three times the timeout), the watch calls it, rank
    0 named in its own code, and ends the job."""
    exp = tmp_path / "exp"
    rc, err, _ = watched(exp, "spin:0:6", "--stall-timeout", "5", "--on-stall", "kill", cwd=in_a_clone(tmp_path))
    assert rc == 3, err[-2000:]
    v = json.loads((exp / "stall_report.json").read_text())["verdict"]
    assert v.startswith("rank 0 is in the forward pass of step 6 for ") and "(at toy.py:" in v and "in forward)" in v, v
    assert "rank 1 is waiting in DDP's gradient all-reduce (backward)" in v, v
    assert not left_behind(exp)


def test_ranks_in_different_collectives_are_named_as_a_mismatch(tmp_path):
    """Rank 0 alone calls a barrier (code on one rank's branch) while rank 1 is in DDP's all-reduce: the
    Flight Recorder shows the same collective number with two calls, and the verdict says so first, with
    each rank's own line."""
    exp = tmp_path / "exp"
    rc, err, _ = watched(exp, "barrier:0:6", "--stall-timeout", "6", "--on-stall", "kill")
    assert rc == 3, err[-2000:]  # a stall the watch ended, told apart from the job's code (kept in lab.json)
    assert json.loads((exp / "lab.json").read_text())["exit_code"] != 3
    v = json.loads((exp / "stall_report.json").read_text())["verdict"]
    assert v.startswith("ranks disagree on collective #"), v
    assert "rank 0 called barrier (at toy.py:" in v, v
    # rank 1 in its all-reduce, or (gloo pairs the two calls now and then) gone on to wait for its next batch
    assert re.search(r"rank 1 called all_reduce \((at|now waiting for data: loop at) bare_loop\.py:", v), v
    assert "is not the same call on every rank" in (exp / "stall_report.txt").read_text()
    assert not left_behind(exp)


def test_a_mismatch_names_where_each_rank_called_not_where_a_rank_went_on_to():
    """A rank whose mismatched collective was answered and that went on to wait for data: its line is said as
    where it is now, not as where it made the call."""
    summary = {"mismatch": {"seq": 11, "ops": {"0": "gloo:barrier", "1": "gloo:all_reduce"}}}
    snaps = {
        0: {"phase": "collective", "detail": "at toy.py:118 in forward"},
        1: {"phase": "data", "detail": "loop at bare_loop.py:35 in main; no worker reading"},
    }
    v = mismatch_text(summary, snaps)
    assert v.startswith("ranks disagree on collective #11: rank 0 called barrier (at toy.py:118 in forward), "), v
    assert "rank 1 called all_reduce (now waiting for data: loop at bare_loop.py:35 in main; no worker reading)" in v
    assert mismatch_text({"mismatch": None}, snaps) is None


def test_a_finished_run_passes_its_exit_code_and_the_slow_reading_rank_waits_most(tmp_path):
    """Sampled from outside: the step split of notebook 02 per rank (rank 1's reads are slow, so it waits for data
    and rank 0 waits for it in the all-reduce); the run finished, exit 0. The loop is examples/lab_loop.py (the
    bare loop plus asrlab's parts: the stall watch's phase clock inside each rank), so the same run is measured
    twice: the shares sampled from outside agree with the ranks' own clocks, rank by rank."""
    exp = tmp_path / "exp"
    rc, err, _ = watched(exp, "slow_data:1:0", "--stall-timeout", "30", epochs=2, loop="lab_loop.py")
    assert rc == 0, err[-3000:]
    assert not (exp / "stall_report.json").exists()
    d = diagnose(exp)
    assert d["verdict"] == "finished" and d["ok"], d["summary"]
    shares = {r["rank"]: r["data_wait_share"] for r in d["steps"]["ranks"]}
    assert shares[1] > 0.5 and shares[1] > shares[0] + 0.3, d["steps"]
    assert d["steps"]["spread"]["most_data_wait_rank"] == 1
    cost = json.loads((exp / "lab.json").read_text())["watch_cost"]  # what watching took, for a person to weigh
    assert cost["dumps"] >= 4 and 0 < cost["sampler_cpu_s"] < 0.5 * cost["dumps"] and cost["watcher_cpu_s"] > 0, cost
    measured = {r["rank"]: r["data_wait_share"] for r in diagnose(tmp_path / "out")["steps"]["ranks"]}
    # the same order, and within 30 points: on a loaded 2-core machine the dumps from outside come late and
    # read the starved rank's wait lower than its own clock does
    assert measured[1] > measured[0] + 0.3, (shares, measured)
    assert all(abs(shares[r] - measured[r]) <= 0.3 for r in (0, 1)), (shares, measured)


def test_stacks_are_classified_by_their_frames():
    torch_file = "/x/site-packages/torch/"
    loop = [("/home/me/train.py", 40, "main")]
    assert (
        phase_of(
            loop
            + [
                (torch_file + "utils/data/dataloader.py", 741, "__next__"),
                ("/usr/lib/python3.11/selectors.py", 415, "select"),
            ]
        )
        == "data"
    )
    assert (
        phase_of(
            loop
            + [
                (torch_file + "_tensor.py", 631, "backward"),
                (torch_file + "autograd/graph.py", 869, "_engine_run_backward"),
            ]
        )
        == "backward"
    )
    assert (
        phase_of(
            loop
            + [
                (torch_file + "distributed/c10d_logger.py", 81, "wrapper"),
                (torch_file + "distributed/distributed_c10d.py", 2900, "all_reduce"),
            ]
        )
        == "collective"
    )
    assert (
        phase_of(
            loop + [(torch_file + "optim/optimizer.py", 500, "wrapper"), (torch_file + "optim/adamw.py", 200, "step")]
        )
        == "optimizer"
    )
    assert (
        phase_of(
            loop + [(torch_file + "nn/modules/module.py", 1700, "_call_impl"), ("/home/me/model.py", 12, "forward")]
        )
        == "forward"
    )
    # the same forward, data wait and sleep inside an evaluation pass are no training step's; its collective is one
    forward = [(torch_file + "nn/modules/module.py", 1700, "_call_impl"), ("/home/me/model.py", 12, "forward")]
    validating = loop + [("/home/me/train.py", 80, "validate")]
    assert phase_of(validating + forward) == "eval" and phase_of(validating) == "eval"
    reduce = [(torch_file + "distributed/distributed_c10d.py", 2900, "all_reduce")]
    assert phase_of(validating + reduce) == "collective"
    # torch.compile tracing a module's forward on fake tensors is compiling, not in the forward pass
    compiling = [
        (torch_file + "nn/modules/module.py", 1779, "_wrapped_call_impl"),
        (torch_file + "_dynamo/convert_frame.py", 1500, "_compile"),
        (torch_file + "_dynamo/symbolic_convert.py", 1200, "run"),
        (torch_file + "nn/modules/module.py", 1790, "_call_impl"),
    ]
    assert phase_of(loop + compiling) == "compile"
    assert phase_of(loop) == "other"
    # the module imported (DeepSpeed's engine imports torch._dynamo at the rank's start) is not a compilation
    importing = [("<frozen importlib._bootstrap>", 1360, "_find_and_load"), (compiling[1][0], 1, "<module>")]
    assert phase_of(loop + importing) == "start"  # importing: the rank is starting


def test_a_faulthandler_dump_is_read_innermost_last():
    text = (
        "Thread 0x00007f01 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
        "Current thread 0x00007f00 (most recent call first):\n"
        '  File "/home/me/toy.py", line 48 in _faulty\n'
        '  File "/home/me/train.py", line 44 in <module>\n'
    )
    stacks = parse_faulthandler(text)
    assert stacks["MainThread"] == [("/home/me/train.py", 44, "<module>"), ("/home/me/toy.py", 48, "_faulty")]
    assert stacks["thread 0x00007f01"][-1] == ("/usr/lib/python3.11/threading.py", 327, "wait")


@pytest.mark.parametrize("bad", [["--on-stall", "never"], ["--sample-hz", "0"]])
def test_bad_options_are_refused_clearly(tmp_path, bad):
    out = subprocess.run(
        [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(tmp_path / "e"), *bad, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and ("asrlab: error:" in out.stderr or "invalid choice" in out.stderr), out.stderr


def test_the_fallback_signals_only_a_process_that_handles_it(tmp_path):
    """A process with the dump file but no handler yet (exec'd after a registered fork) is not sent the
    signal, whose default action would end it; one that registered is, and its stack is read."""
    from asrlab.watch.sample import DUMP_SIGNAL, FaultHandler, catches

    fh = FaultHandler(tmp_path)
    code = (
        "import faulthandler, os, sys, time\n"
        "if sys.argv[1] == 'yes':\n"
        f"    faulthandler.register({int(DUMP_SIGNAL)}, file=open(os.path.join(sys.argv[2], f'{{os.getpid()}}.txt'), 'a'))\n"
        "def waiting_here():\n    print('ready', flush=True)\n    time.sleep(60)\n"
        "waiting_here()\n"
    )
    procs = {
        w: subprocess.Popen([sys.executable, "-c", code, w, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for w in ("no", "yes")
    }
    try:
        for p in procs.values():
            assert p.stdout.readline().strip() == "ready"
        (tmp_path / f"{procs['no'].pid}.txt").write_text("")  # the file, as a fork of a registered process leaves it
        assert not catches(procs["no"].pid, DUMP_SIGNAL) and catches(procs["yes"].pid, DUMP_SIGNAL)
        assert fh.sample(procs["no"].pid) is None and procs["no"].poll() is None  # not sent: still alive
        stacks = fh.sample(procs["yes"].pid)
        assert stacks and stacks["MainThread"][-1][2] == "waiting_here"
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_a_rank_killed_with_sigkill_is_named_as_the_one_that_vanished(tmp_path):
    """Rank 1 of the bare loop is SIGKILLed in step 13 (as the OOM killer would): torchrun ends rank 0 at
    once; the doctor names rank 1 and its signal, from torchrun's summary in the job's own output, not both
    ranks; without that output, from which process the watch saw end first."""
    exp = tmp_path / "exp"
    rc, err, _ = watched(exp, "vanish:1:13", "--stall-timeout", "60")
    assert rc != 0
    d = diagnose(exp)
    assert d["verdict"] == "killed", d["summary"]
    assert d["summary"].startswith("rank 1 was killed by SIGKILL"), d["summary"]
    (exp / "job.log").unlink()
    d = diagnose(exp)
    assert d["verdict"] == "crashed", d["summary"]
    assert d["summary"].startswith("rank 1 ended without recording an error: it vanished (the first to end"), d[
        "summary"
    ]
    assert not left_behind(exp)

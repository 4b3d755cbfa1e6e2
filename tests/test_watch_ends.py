"""``asrlab watch`` ended by any signal, SIGKILL included, ends the whole job: every process the job started
(a shell script's torchrun, its ranks and their DataLoader workers, ranks a ``python -m`` module spawned
itself), whatever CMD is."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from asrlab.doctor import diagnose

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the keeper is Linux's")

LOOPS = Path(__file__).parent / "loops"

# a recipe's run.sh: stages, one of them torchrun in a subshell
RUN_SH = """#!/bin/bash
set -e
stage=0
if [ $stage -le 0 ]; then echo "stage 0: nothing to prepare"; fi
if [ $stage -le 1 ]; then
  (cd "{loops}" && "{python}" -m torch.distributed.run --standalone --nproc-per-node 2 worker_loop.py)
fi
echo "stage 2: never reached"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def watched(tmp_path: Path, how: str) -> tuple[subprocess.Popen, Path, Path]:
    pids, exp = tmp_path / "pids", tmp_path / "exp"
    pids.mkdir()
    if how == "bash":
        script = tmp_path / "run.sh"
        script.write_text(RUN_SH.format(loops=LOOPS, python=sys.executable))
        cmd = ["bash", str(script)]
    else:
        cmd = [sys.executable, "-m", "worker_loop"] + (["torchrun"] if how == "python-m-torchrun" else [])
    env = {**os.environ, "PIDS": str(pids), "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    watch = subprocess.Popen(
        [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(exp), "--", *cmd],
        env=env,
        cwd=LOOPS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return watch, pids, exp


def job_of(watch: subprocess.Popen, pids: Path, exp: Path) -> list[psutil.Process]:
    """Every process of the job once both ranks and their workers train (a few steps logged)."""
    deadline = time.time() + 120
    while True:
        log = (exp / "job.log").read_text() if (exp / "job.log").exists() else ""
        marks = [p.name for p in pids.iterdir()]
        if (
            sum(m.startswith("rank") for m in marks) == 2
            and sum(m.startswith("worker") for m in marks) >= 2
            and "step 3 rank 0" in log
            and "step 3 rank 1" in log
        ):
            break
        assert watch.poll() is None, watch.stderr.read().decode()[-3000:]
        assert time.time() < deadline, f"the job never trained: {marks}\n{log[-2000:]}"
        time.sleep(0.2)
    below = psutil.Process(watch.pid).children(recursive=True)
    # what the job's own pid files name, whether the listing saw it or not
    named = {int(m.split("-")[1]) for m in marks} - {p.pid for p in below}
    return below + [psutil.Process(pid) for pid in named if psutil.pid_exists(pid)]


@pytest.mark.parametrize(
    "how,sig",
    [
        ("bash", signal.SIGKILL),
        ("bash", signal.SIGTERM),
        ("bash", signal.SIGINT),
        ("python-m-torchrun", signal.SIGKILL),
        ("python-m-spawn", signal.SIGKILL),
    ],
    ids=["run.sh-SIGKILL", "run.sh-SIGTERM", "run.sh-SIGINT", "python-m-torchrun-SIGKILL", "python-m-spawn-SIGKILL"],
)
def test_ending_the_watch_ends_every_process_of_the_job(tmp_path, how, sig):
    watch, pids, exp = watched(tmp_path, how)
    job: list[psutil.Process] = []
    try:
        job = job_of(watch, pids, exp)
        ranks = {int(m.name.split("-")[1]) for m in pids.iterdir() if m.name.startswith("rank")}
        assert ranks <= {p.pid for p in job}, (ranks, job)
        watch.send_signal(sig)
        _, left = psutil.wait_procs(job, timeout=30)
        assert not left, f"still running 30 s after {sig.name} to the watch: " + "; ".join(
            f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in left if p.is_running()
        )
        if sig != signal.SIGKILL:  # the watch itself says so and exits 128 + the signal
            assert watch.wait(30) == 128 + sig
        d = diagnose(exp)  # a stop, by what ended it: not ranks that vanished
        assert d["verdict"] == "stopped", d["summary"]
        said = "the death of asrlab watch" if sig == signal.SIGKILL else f"{sig.name} to asrlab watch"
        assert said in d["summary"], d["summary"]
    finally:  # nothing of a failed test left running
        for p in job + (psutil.Process(watch.pid).children(recursive=True) if watch.poll() is None else []):
            try:
                p.kill()
            except psutil.Error:
                pass
        watch.kill()
        watch.wait()


def _command(p: psutil.Process) -> str:
    """A process's command line; none of a child that has just ended (a py-spy dump of the watch's, not yet reaped)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def test_a_signal_to_the_keeper_is_passed_on_to_the_job(tmp_path):
    """The keeper's command line holds the job's (``pkill -f torchrun`` finds it before torchrun): SIGTERM sent to
    it reaches the job, which ends as it would unwatched; the watch passes its exit code on."""
    ready = tmp_path / "ready"
    job = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('job: got SIGTERM', flush=True), sys.exit(7)))\n"
        f"pathlib.Path({str(ready)!r}).write_text('ok')\n"
        "time.sleep(120)\n"
    )
    watch = subprocess.Popen(
        [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(tmp_path / "exp"), "--", sys.executable, "-c", job],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 60
        while not ready.exists():
            assert time.time() < deadline and watch.poll() is None, "the job did not start"
            time.sleep(0.2)
        [keeper] = [p for p in psutil.Process(watch.pid).children() if "keeper.py" in _command(p)]
        keeper.send_signal(signal.SIGTERM)
        out, _ = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 7 and "job: got SIGTERM" in out, (watch.returncode, out[-2000:])

"""Exact resume: SIGKILL a run, resume it, and get the uninterrupted run's final state, bit for bit;
the ledger shows every utterance trained on exactly once per epoch across the interruption."""

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from asrlab.train.ledger import coverage, read_ledger

from test_train import SMALL

STEPS = 20   # about 1.7 epochs of the 120-utterance corpus


def train_cmd(corpus, exp, nproc, workers, *extra):
    return [sys.executable, "-m", "asrlab.cli", "train", "--config", "tiny", "--data", str(corpus / "data.list"),
            "--exp", str(exp), "--nproc", str(nproc), "--max-steps", str(STEPS), "--save-every-steps", "3",
            "--resume", "auto", "--ledger", *SMALL, f"data.num_workers={workers}", "model.dropout=0.1",
            "data.spec_augment=true", "train.max_epochs=5", "train.stall_timeout_s=60", *extra]


def run(cmd, timeout=240):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]


def digest(exp) -> str:
    p = subprocess.run([sys.executable, "-m", "asrlab.cli", "ckpt", str(exp), "--digest"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def steps_done(exp) -> int:
    """The last step rank 0 logged (a line being written is not read)."""
    try:
        lines = (exp / "metrics" / "rank0.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        try:
            return json.loads(line)["step"]
        except json.JSONDecodeError:
            continue
    return 0


def kill_at(cmd, exp, step: int, timeout=240) -> int:
    """Start ``cmd`` and SIGKILL it and every process under it (torchrun, ranks, loader workers) once
    rank 0 logged ``step``."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    try:
        while steps_done(exp) < step:
            assert p.poll() is None, "the run ended before it could be killed"
            assert time.time() - t0 < timeout, "the run did not reach the step"
            time.sleep(0.005)
    finally:
        tree = psutil.Process(p.pid)
        for proc in [tree, *tree.children(recursive=True)]:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        p.wait()
    return steps_done(exp)


@pytest.mark.parametrize("nproc,workers,kill_step", [(1, 0, 7), (1, 2, 11), (2, 0, 8)])
def test_sigkill_then_resume_is_bitwise_identical(corpus, tmp_path, nproc, workers, kill_step):
    ref, exp = tmp_path / "ref", tmp_path / "exp"
    run(train_cmd(corpus, ref, nproc, workers))
    killed = kill_at(train_cmd(corpus, exp, nproc, workers), exp, kill_step)
    assert killed < STEPS
    run(train_cmd(corpus, exp, nproc, workers))
    resumed = [json.loads(line)["resumed_from"] for line in (exp / "ledger" / "rank0.jsonl").read_text().splitlines()
               if "resumed_from" in line]
    assert len(resumed) == 1 and resumed[0] <= killed < STEPS   # it did go back to a checkpoint
    assert digest(exp) == digest(ref)
    # the ledger: every utterance once per complete epoch, the same order as the uninterrupted run
    for rank in range(nproc):
        assert [r["keys"] for r in read_ledger(exp, rank)] == [r["keys"] for r in read_ledger(ref, rank)]
    cov = coverage(exp)
    assert set(cov[0].values()) == {1} and len(cov[0]) == 120

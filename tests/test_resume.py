"""Exact resume: SIGKILL a run, resume it, and get the uninterrupted run's final state, bit for bit;
the ledger shows every utterance trained on exactly once per epoch across the interruption."""

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asrlab.lab.state.checkpoint import load_latest, state_digest
from asrlab.lab.state.ledger import LedgerWriter, coverage, read_ledger
from asrlab.nb import train_until_killed

from conftest import SMALL

STEPS = 20  # about 1.7 epochs of the 120-utterance corpus


def train_cmd(corpus, exp, nproc, workers, *extra):
    return [
        sys.executable,
        "-m",
        "asrlab.cli",
        "train",
        "--config",
        "tiny",
        "--data",
        str(corpus / "data.list"),
        "--exp",
        str(exp),
        "--nproc",
        str(nproc),
        "--max-steps",
        str(STEPS),
        "--save-every-steps",
        "3",
        "--resume",
        "auto",
        "--ledger",
        *SMALL,
        f"data.num_workers={workers}",
        "model.dropout=0.1",
        "data.spec_augment=true",
        "train.max_epochs=5",
        "train.stall_timeout_s=60",
        *extra,
    ]


def run(cmd, timeout=240):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stderr


def digest(exp) -> tuple[str, str]:
    """What ``asrlab ckpt EXP --digest`` says: the newest complete checkpoint and its SHA-256 over the model
    and optimizer tensors (read here, without a process of its own)."""
    state, marker = load_latest(Path(exp) / "checkpoints")
    return marker["file"], state_digest(state)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The uninterrupted run of a layout (nproc, workers, extra overrides), made once for the module's tests."""
    runs = {}

    def get(nproc, workers, *extra):
        key = (nproc, workers, extra)
        if key not in runs:
            ref = tmp_path_factory.mktemp("ref") / "exp"
            run(train_cmd(corpus, ref, nproc, workers, *extra))
            runs[key] = ref
        return runs[key]

    return get


def kill_at(cmd, exp, step: int) -> int:
    return train_until_killed(cmd[cmd.index("train") + 1 :], exp, step, timeout_s=240)


# loader workers are resumed in the bucketing case (its sampler the harder one), plain samplers without
@pytest.mark.parametrize(
    "nproc,workers,seed,extra", [(1, 0, 1, ()), (2, 0, 3, ()), (1, 2, 4, ("data.bucketing=true",))]
)
def test_sigkill_then_resume_is_bitwise_identical(corpus, reference, tmp_path, nproc, workers, seed, extra):
    kill_step = random.Random(seed).randint(4, STEPS - 3)  # a step drawn per case, the same every run
    ref, exp = reference(nproc, workers, *extra), tmp_path / "exp"
    killed = kill_at(train_cmd(corpus, exp, nproc, workers, *extra), exp, kill_step)
    assert killed < STEPS
    run(train_cmd(corpus, exp, nproc, workers, *extra))
    resumed = [
        json.loads(line)["resumed_from"]
        for line in (exp / "ledger" / "rank0.jsonl").read_text().splitlines()
        if "resumed_from" in line
    ]
    assert len(resumed) == 1 and resumed[0] <= killed < STEPS  # it did go back to a checkpoint
    assert digest(exp) == digest(ref)
    # the ledger: every utterance once per complete epoch, the same order as the uninterrupted run
    for rank in range(nproc):
        assert [r["keys"] for r in read_ledger(exp, rank)] == [r["keys"] for r in read_ledger(ref, rank)]
    cov = coverage(exp)
    assert set(cov[0].values()) == {1} and len(cov[0]) == 120


def test_sigkill_during_a_checkpoint_write_then_resume_is_bitwise_identical(corpus, reference, tmp_path):
    ref, exp = reference(1, 0), tmp_path / "exp"
    cmd = train_cmd(corpus, exp, 1, 0)
    died = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("kill_mid_checkpoint.py")), "9", *cmd[cmd.index("train") :]],
        capture_output=True,
        timeout=240,
    )
    assert died.returncode == -9
    names = sorted(p.name for p in (exp / "checkpoints").iterdir())
    assert any(n.startswith("step_00000009.pt.") and n.endswith(".tmp") for n in names)  # it died mid-write
    assert "step_00000009.pt" not in names
    run(train_cmd(corpus, exp, 1, 0))
    assert digest(exp) == digest(ref)
    assert [r["keys"] for r in read_ledger(exp)] == [r["keys"] for r in read_ledger(ref)]


@pytest.mark.parametrize("first,then,extra", [((1, 0), (2, 0), ()), ((2, 1), (1, 2), ("data.bucketing=true",))])
def test_elastic_resume_covers_the_rest_of_the_epoch_exactly_once(corpus, tmp_path, first, then, extra):
    """A checkpoint from one ranks x workers layout resumes on another: each utterance of the
    interrupted epoch is trained on exactly once (bitwise equality is not expected)."""
    exp = tmp_path / "exp"
    (n1, w1), (n2, w2) = first, then
    kill_at(train_cmd(corpus, exp, n1, w1, *extra), exp, 5)  # checkpoint at step 3, steps 4-5 lost
    log = run(train_cmd(corpus, exp, n2, w2, *extra, "train.max_epochs=1", "--max-steps", "0", "--uneven", "join"))
    left_out = re.search(
        r"elastic resume: epoch 0 continues on \d ranks x \d workers without the (\d+) utterances", log
    )
    assert left_out and int(left_out.group(1)) > 0, log[-2000:]
    cov = coverage(exp)
    assert sorted(cov) == [0] and len(cov[0]) == 120 and set(cov[0].values()) == {1}


def test_a_line_torn_by_a_kill_does_not_swallow_the_next_record(tmp_path):
    w = LedgerWriter(tmp_path, 0)
    w.step(1, 0, ["a"])
    w.step(2, 0, ["b"])
    w.close()
    with open(tmp_path / "ledger" / "rank0.jsonl", "a") as f:
        f.write('{"step": 3, "epoch": 0, "ke')  # SIGKILL in the middle of step 3's line
    w = LedgerWriter(tmp_path, 0)  # the resumed run, from the checkpoint of step 1
    w.resumed(1)
    w.step(2, 0, ["c"])
    w.close()
    assert [r["keys"] for r in read_ledger(tmp_path)] == [["a"], ["c"]]

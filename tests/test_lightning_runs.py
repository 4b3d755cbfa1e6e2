"""A LightningModule of a user's own (``tests/loops/lightning_loop.py``: ``strategy="ddp"``, 2 CPU ranks, the
batch's ids under ``uid``) with ``AsrlabCallback`` as the README shows it, launched by ``python train.py``
(Lightning's own launcher) and by torchrun, and read back by ``asrlab doctor``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# the runs import Lightning, not this module: each worker's collection spares its seconds of import
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="the lightning extra is not installed (pip install -e '.[lightning]')",
)

from asrlab.doctor import diagnose, format_diagnosis  # noqa: E402

LOOP = Path(__file__).parent / "loops" / "lightning_loop.py"


def fit(tmp_path: Path, torchrun: bool = False, **env) -> subprocess.CompletedProcess:
    launch = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        if torchrun
        else [sys.executable]
    )
    return subprocess.run(
        [*launch, str(LOOP), str(tmp_path / "exp")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )


def test_ids_that_are_not_found_leave_coverage_not_measured_and_the_run_healthy(tmp_path):
    out = fit(tmp_path, IDS="clip_name", MP="spawn")  # a name no part guesses
    assert out.returncode == 0, out.stderr[-3000:]
    d = diagnose(tmp_path / "exp")
    assert d["verdict"] == "finished" and d["ok"], d["summary"]
    assert d["coverage"] is None
    assert 'keys="FIELD"' in d["coverage_not_measured"], d["coverage_not_measured"]
    assert "coverage: not measured: the batches (dict) hold no utterance ids" in format_diagnosis(d)


def test_a_rank_killed_under_torchrun_is_the_first_failure_not_the_survivors_sigterm(tmp_path):
    """torchrun ends rank 0 with SIGTERM once rank 1 died; rank 0's DataLoader worker then dies of it and
    rank 0 raises "DataLoader worker ... killed by signal: Terminated": a consequence, not the cause."""
    out = fit(tmp_path, torchrun=True, FAULT="kill:1:8", STEP_S="0.05")
    assert out.returncode != 0
    d = diagnose(tmp_path / "exp")
    assert d["verdict"] == "crashed", d["summary"]
    assert d["summary"].startswith("rank 1 ended without recording an error"), d["summary"]
    assert d["culprit"]["rank"] == 1, d["culprit"]
    if d["error"] is not None:  # rank 0's error, if it recorded one in time, is said as what followed
        assert d["error"]["rank"] == 0 and d["error"]["ended_from_outside"], d["error"]
        assert "first error:" not in format_diagnosis(d)


def test_a_lightning_resume_and_its_checkpoints_are_recorded(tmp_path):
    """Killed once step 12 is trained (in a callback of the loop's own that runs before the ledger's hook: the
    step is in the ledger all the same, written as its optimizer step returned), checkpoints after steps 5 and
    10, resumed with ``ckpt_path="last"``: one resume from step 10, Lightning's checkpoint files listed; with
    the batch's ids under ``uid`` found as they are, the rolled-back steps 11 and 12 (trained before the kill)
    count once, when trained again, and what Lightning's new pass over the epoch trained again (a plain
    DataLoader has no position) shows as repeated. The ledger and the loop's own record agree, step by step."""
    from asrlab.lab.state.ledger import coverage, read_ledger

    truth = tmp_path / "truth"
    env = {"CKPT": str(tmp_path / "ckpt"), "EPOCHS": "3", "MP": "spawn", "TRUTH": str(truth)}
    first = fit(tmp_path, FAULT="trained:all:12", **env)
    assert first.returncode != 0
    for rank in (0, 1):  # every step trained is in the ledger, the last one before the kill too
        assert read_ledger(tmp_path / "exp", rank) == read_ledger(truth, rank), rank
        assert read_ledger(tmp_path / "exp", rank)[-1]["step"] == 12
    second = fit(tmp_path, RESUME="1", **env)
    assert second.returncode == 0, second.stderr[-3000:]
    d = diagnose(tmp_path / "exp")
    assert d["verdict"] == "finished", d["summary"]
    assert d["resumes"]["resumed_from"] == [10], d["resumes"]
    files = {Path(f["file"]).name: f for f in d["checkpoints"]["files"]}
    assert "last.ckpt" in files and files["last.ckpt"]["state"] == "ok (Lightning's)", files
    assert any(f["step"] == 10 for f in files.values()), files
    assert d["checkpoints"]["newest_loadable"], d["checkpoints"]
    assert coverage(tmp_path / "exp") == coverage(truth)  # each utterance's count per epoch, as the loop saw it
    epochs = {e["epoch"]: e for e in d["coverage"]["epochs"]}
    assert epochs[0]["exactly_once"] and epochs[0]["keys"] == 64, epochs[0]
    assert epochs[2]["exactly_once"], epochs[2]
    # epoch 1: steps 9 and 10, then (after the resume) the epoch's 6 other steps from a new pass of the plain
    # loader: 8 steps of 8 utterances, the rolled-back steps 11 and 12 counted once (when trained again); what
    # the new pass trained again is repeated and what it never reached skipped
    e = epochs[1]
    assert e["once"] + 2 * e["repeated"] == 64 and e["repeated"] == e["skipped"] > 0, e
    text = format_diagnosis(d)
    assert "resumes: from step 10" in text and "checkpoints (0)" not in text, text

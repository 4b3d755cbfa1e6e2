"""asrlab doctor on real runs of real toolkits (ESPnet's own asr_train, SpeechBrain, an Accelerate loop), each
broken on purpose, as the toolkit wrote them (``tests/fixtures/toolkit_runs/``: the console, the experiment
folder's text files, and the truth caused). Re-made by the opt-in ``tests/optin/toolkit_runs.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from asrlab.doctor import diagnose_logs

RUNS = Path(__file__).parent / "fixtures" / "toolkit_runs"
CASES = sorted(p.parent for p in RUNS.glob("*/*/truth.yaml"))


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_a_real_toolkit_run_gets_the_truth_it_was_given(case):
    truth = yaml.safe_load((case / "truth.yaml").read_text())
    paths = [str(p) for p in sorted(case.glob("console*.log"))] + (
        [str(case / "exp")] if (case / "exp").is_dir() else []
    )
    d = diagnose_logs(paths)
    said = f"{case.parent.name}/{case.name}: {d['verdict']}: {d['summary'][:400]}"
    # where a line names them: the caused verdict and culprit, else what the log shows of them (truth.yaml's
    # log_shows: a hang whose lines carry no clock shows only the signal that ended it)
    want = truth.get("log_shows") or truth.get("culprit") or {}
    assert d["verdict"] == want.get("verdict", truth["verdict"]), said
    if want.get("rank") is not None:
        assert d["culprit"]["rank"] == want["rank"], f"rank {d['culprit']}; {said}"
    step = want.get("batch", want.get("step"))
    if step is not None and (truth["toolkit"] != "speechbrain" or "log_shows" in truth):  # SpeechBrain: no step lines
        assert d["culprit"]["step"] == step, f"step {d['culprit']} != {want}; {said}"
    if want.get("epoch") is not None and truth["toolkit"] == "espnet":  # ESPnet's batch counts within its epoch
        assert d["culprit"]["epoch"] == want["epoch"], f"epoch {d['culprit']}; {said}"


HF = [c for c in CASES if c.parent.name == "hf_trainer" and (c / "exp").is_dir()]


@pytest.mark.parametrize("case", HF, ids=[c.name for c in HF])
def test_a_trainer_folder_alone_is_all_clear_only_when_training_ended(case):
    """Hugging Face Trainer's output folder without its console: a run that raised, was killed, hung or was
    stopped left a checkpoint's state short of max_steps with no train summary, which is no all-clear."""
    truth = yaml.safe_load((case / "truth.yaml").read_text())
    d = diagnose_logs([str(case / "exp")])
    said = f"{case.name}: {d['verdict']}: {d['summary'][:300]}"
    if truth["verdict"] == "no_failure_seen":
        assert d["verdict"] == "no_failure_seen" and "training ended" in d["summary"], said
    else:
        assert d["verdict"] != "no_failure_seen", said


MM = [c for c in CASES if c.parent.name == "mmengine" and (c / "exp").is_dir()]


@pytest.mark.parametrize("case", MM, ids=[c.name for c in MM])
def test_an_mmengine_work_dir_alone_is_no_all_clear_where_its_log_stops_mid_epoch(case):
    """mmengine's work_dir without its console (tracebacks go to the console only): a run that raised, was killed or
    hung left a log whose last line is its logger's ``Epoch(train) [1][25/64]``, short of the epoch's end: no
    all-clear; a run that ended (its last line the checkpoint's) and a NaN the log prints are read as they are."""
    truth = yaml.safe_load((case / "truth.yaml").read_text())
    d = diagnose_logs([str(case / "exp")])
    said = f"{case.name}: {d['verdict']}: {d['summary'][:300]}"
    if truth["verdict"] in ("no_failure_seen", "nonfinite"):
        assert d["verdict"] == truth["verdict"], said
    else:
        assert d["verdict"] == "unknown" and "stops as its progress bar is at" in d["summary"], said


def test_a_ranks_unmarked_traceback_before_torchruns_summary_is_what_failed():
    """Both ranks raise before training, their lines unmarked, and torchrun names local_rank 0 first with exit code 1:
    the failure said is the exception the log printed before the launcher's word, on the rank it names."""
    d = diagnose_logs([str(RUNS / "mmengine" / "two_ranks_cuda_set_device_on_cpu" / "console.log")])
    assert d["verdict"] == "crashed" and d["culprit"]["rank"] == 0, d["summary"]
    assert "RuntimeError: Found no NVIDIA driver" in d["summary"], d["summary"]


SB = [c for c in CASES if c.parent.name == "speechbrain"]


@pytest.mark.parametrize("case", SB, ids=[c.name for c in SB])
def test_a_speechbrain_folder_alone_is_no_all_clear_where_its_log_ends_as_an_epoch_begins(case):
    """SpeechBrain's folder without its console: a run killed, hung or stopped in an epoch left a log.txt whose last
    line starts that epoch ("Going into epoch 2"), which is no all-clear; a run that ended is one."""
    truth = yaml.safe_load((case / "truth.yaml").read_text())
    d = diagnose_logs([str(case / "exp")])
    said = f"{case.name}: {d['verdict']}: {d['summary'][:300]}"
    assert (d["verdict"] == "no_failure_seen") == (truth["verdict"] == "no_failure_seen"), said


def test_a_bar_redrawn_behind_the_loggers_lines_or_another_bar_is_no_resume():
    """Ignite's console: its logger's ``Epoch[1] Iteration[2/12] Loss: ...`` and, after it, its bar redrawn at
    ``Epoch [1/3]: [1/12]  8%|...``, one iteration behind; fastai's: its validation bar ``Epoch 1/3 : ... [0/2``
    after the training bar's ``[12/12``: each goes back only against its own kind and total, so no resume."""
    for case in ("ignite/healthy_ddp2", "ignite/healthy_single", "fastai/healthy"):
        d = diagnose_logs([str(RUNS / case / "console.log")])
        assert d["verdict"] == "no_failure_seen" and not d["resumes"]["from_output"], d["summary"]

"""Trainer: precision per hardware, skipped non-finite steps, safe checkpoints, resume, config errors."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from asrlab.data.sources import DataError
from asrlab.doctor import diagnose_logs
from asrlab.config import load_config
from asrlab.lab.state import checkpoint
from asrlab.lab.dist import DistInfo
from asrlab.lab.precision import choose_precision
from asrlab.lab.metrics import read_metrics
from asrlab.train.schedule import RunClock, lr_lambda
from asrlab.train.trainer import Trainer

from conftest import SMALL
from helpers import CPU, make_trainer

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize(
    "requested,cap,native,expect",
    [
        ("auto", (9, 0), True, ("bf16", False)),  # H100
        ("auto", (8, 6), True, ("bf16", False)),  # A5000
        ("auto", (7, 0), False, ("fp16", True)),  # V100: fp16 with loss scaling
        ("auto", (7, 5), False, ("fp16", True)),  # 2080 Ti
        ("auto", (6, 1), False, ("fp32", False)),  # Pascal
        ("fp32", (9, 0), True, ("fp32", False)),
        ("fp16", (8, 0), True, ("fp16", True)),
    ],
)
def test_precision_follows_the_hardware(requested, cap, native, expect):
    p = choose_precision(requested, CUDA, capability=cap, bf16_native=native)
    assert (p.name, p.scaler) == expect and p.reason


def test_precision_on_cpu_and_refusals():
    assert choose_precision("auto", torch.device("cpu")).name == "fp32"
    with pytest.raises(ValueError, match="does not compute in bf16"):
        choose_precision("bf16", CUDA, capability=(7, 0), bf16_native=False)
    with pytest.raises(ValueError, match="precision must be"):
        choose_precision("fp8", torch.device("cpu"))


def test_fp16_on_cpu_finishes_a_batch_of_3():
    """oneDNN's fp16 depthwise conv1d never returns for some batch sizes (3 among them) on CPUs with
    AVX512-FP16 (torch 2.11); inside cpu_fp16_kernels, forward and backward finish. In a subprocess, so that a hang
    is cut off by the timeout, not left in the suite."""
    code = """
import torch
from asrlab.lab.precision import cpu_fp16_kernels
conv = torch.nn.Conv1d(144, 144, 15, padding=7, groups=144)
x = torch.randn(3, 144, 50, requires_grad=True)
with cpu_fp16_kernels(torch.device("cpu"), torch.float16):
    assert not torch.backends.mkldnn.enabled
    with torch.autocast("cpu", dtype=torch.float16):
        y = conv(x)
    y.float().sum().backward()
assert y.dtype == torch.float16 and torch.isfinite(x.grad).all() and torch.backends.mkldnn.enabled
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_config_overrides_and_unknown_keys():
    cfg = load_config("tiny", ["optim.lr=0.01", "data.num_workers=3"])
    assert cfg.optim.lr == 0.01 and cfg.data.num_workers == 3 and cfg.model.subsampling == 2
    with pytest.raises(ValueError, match="unknown config key.*optim.lrr"):
        load_config("tiny", ["optim.lrr=0.01"])
    with pytest.raises(ValueError, match="SECTION.KEY=VALUE"):
        load_config("tiny", ["lr=0.01"])
    with pytest.raises(ValueError, match="no config"):
        load_config("nonexistent")
    assert load_config("base").model.n_layers == 12
    assert load_config("tiny", ["optim.lr=1e-3"]).optim.lr == 0.001  # YAML 1.1 reads 1e-3 as a string
    with pytest.raises(ValueError, match="optim.lr must be a number"):
        load_config("tiny", ["optim.lr=fast"])


def test_non_finite_step_is_skipped_and_counted(corpus, tmp_path):
    tr = make_trainer(corpus, tmp_path / "exp")
    batch = next(iter(tr.loader))
    before = [p.detach().clone() for p in tr.model.parameters()]
    bad = dict(batch, feats=batch["feats"].clone())
    bad["feats"][0, 0, 0] = float("nan")
    assert tr.train_step([bad]) is None  # the step is read with the next one, or when settled
    r = tr.settle()
    assert r.skipped and r.step == 1 and tr.skipped == 1 and tr.step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))  # nothing was applied
    assert tr.train_step([batch]) is None
    r = tr.settle()
    assert not r.skipped and tr.skipped == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    tr.close()


def test_metrics_lines_have_every_field(corpus, tmp_path):
    tr = make_trainer(corpus, tmp_path / "exp", "train.max_steps=3", "train.tensorboard=true")
    tr.fit()
    tr.close()
    assert list((tmp_path / "exp" / "tensorboard").glob("events.out.tfevents.*"))  # the option works too
    lines = [json.loads(x) for x in (tmp_path / "exp" / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    for field in (
        "step",
        "epoch",
        "loss",
        "grad_norm",
        "loss_scale",
        "lr",
        "skipped",
        "utts",
        "frames",
        "data_wait_s",
        "step_s",
        "time",
    ):
        assert field in lines[0]


def test_cosine_decay_follows_the_steps_or_the_clock_whichever_is_further():
    cfg = load_config("tiny", ["optim.warmup_steps=10", "optim.min_lr=0", "optim.decay_by_clock=true"])
    clock = RunClock(budget_s=100.0)
    f = lr_lambda(cfg.optim, max_steps=1010, clock=clock)
    assert f(4) == 0.5  # warm-up: step 5 of 10
    clock.seen_s = 20.0
    assert f(10) == pytest.approx(1.0, abs=1e-4)  # warm-up ended at 20% of the budget
    assert clock.warm_end == 0.2
    assert f(509) == pytest.approx(0.5)  # half the steps, 20% of the time: steps lead
    clock.seen_s = 60.0  # half of the rest of the time: 0.5 too
    assert f(110) == pytest.approx(0.5)  # ... though only a tenth of the steps
    clock.seen_s = 100.0
    assert f(110) == pytest.approx(0.0)  # budget spent: the floor
    assert lr_lambda(cfg.optim, max_steps=1010)(509) == pytest.approx(0.5)  # no clock: steps alone
    steps_only = load_config("tiny", ["optim.warmup_steps=10", "optim.min_lr=0"])  # the default
    assert lr_lambda(steps_only.optim, max_steps=1010, clock=clock)(110) == pytest.approx(
        0.5 * (1 + math.cos(0.101 * math.pi))
    )


def lrs_of_a_run_decaying_by_its_limits(corpus, exp, *limits) -> list[float]:
    """Each step's LR of a run with ``optim.decay_by_clock`` (cosine to 0) that stops at ``limits``."""
    tr = make_trainer(corpus, exp, *limits, "optim.min_lr=0", "optim.decay_by_clock=true")
    tr.fit()
    tr.close()
    return [x["lr"] for x in read_metrics(exp)]


class SteadyClock:
    """``time.perf_counter`` for the schedule that moves 0.2 s per read: one read per step, so a step takes
    0.2 s of training time however loaded the machine is."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self) -> float:
        self.t += 0.2
        return self.t


def test_a_time_budget_stops_the_run_at_the_lr_floor_and_resume_keeps_it(corpus, tmp_path, monkeypatch):
    from asrlab.train import schedule

    monkeypatch.setattr(schedule, "time", SteadyClock())
    exp = tmp_path / "exp"
    lrs = lrs_of_a_run_decaying_by_its_limits(corpus, exp, "train.max_minutes=0.05", "train.max_epochs=1000")
    assert len(lrs) >= 5 and lrs[-1] < 0.05 * max(lrs)  # the clock, not max_steps (0), ended the decay
    assert all(b <= a for a, b in zip(lrs[2:], lrs[3:]))  # after the 2 warm-up steps: only down
    state, _ = checkpoint.load_latest(exp / "checkpoints")
    assert state["extra"]["clock"]["elapsed_s"] >= 3.0
    again = make_trainer(corpus, exp, "train.max_minutes=0.05", "train.max_epochs=1000")
    assert again.resume() and again.clock.before_s >= 3.0
    again.fit()  # the budget is spent: no more steps
    again.close()
    assert len(read_metrics(exp)) == len(lrs)


def test_a_run_its_epochs_end_before_its_clock_still_decays_to_the_floor(corpus, tmp_path):
    """A fast machine (a GPU) ends the quickstart by max_epochs long before its clock: the LR must be low by then."""
    lrs = lrs_of_a_run_decaying_by_its_limits(corpus, tmp_path / "exp", "train.max_minutes=30", "train.max_epochs=2")
    assert len(lrs) >= 8 and lrs[-1] < 0.05 * max(lrs)  # the epochs, not the 30-minute clock, ended the decay
    assert all(b <= a for a, b in zip(lrs[2:], lrs[3:]))


def test_interrupted_checkpoint_write_leaves_the_previous_one(tmp_path, caplog):
    d = tmp_path / "ck"
    checkpoint.save_checkpoint(d, {"model": {"w": torch.ones(3)}, "optimizer": {}}, 10, {"epoch": 0})
    # a crash while writing step 20: the data file is half written and has no completion marker
    good = (d / "step_00000010.pt").read_bytes()
    (d / "step_00000020.pt").write_bytes(good[: len(good) // 2])
    state, marker = checkpoint.load_latest(d)
    assert marker["step"] == 10 and torch.equal(state["model"]["w"], torch.ones(3))
    assert "no completion marker" in caplog.text
    # a newest checkpoint truncated after its marker was written (disk trouble) is caught by its hash
    checkpoint.save_checkpoint(d, {"model": {"w": torch.zeros(3)}, "optimizer": {}}, 30, {"epoch": 0})
    data = (d / "step_00000030.pt").read_bytes()
    (d / "step_00000030.pt").write_bytes(data[:-100])
    state, marker = checkpoint.load_latest(d)
    assert marker["step"] == 10 and "SHA-256" in caplog.text


def test_keep_last_removes_the_oldest(tmp_path):
    for step in (1, 2, 3, 4):
        checkpoint.save_checkpoint(tmp_path, {"model": {}, "optimizer": {}}, step, {}, keep_last=2)
    assert [c["step"] for c in checkpoint.list_checkpoints(tmp_path)] == [3, 4]


def test_resume_auto_continues_from_the_newest_complete_checkpoint(corpus, tmp_path):
    exp = tmp_path / "exp"
    tr = make_trainer(corpus, exp, "train.max_steps=4", "train.save_every_steps=2")
    tr.fit()
    tr.close()
    # step 4 (saved at the max_steps stop) is newest; make it incomplete: resume must take step 2
    (exp / "checkpoints" / "step_00000004.done").unlink()
    again = make_trainer(corpus, exp, "train.max_steps=6")
    assert again.resume() and again.step == 2
    again.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/on_gpu.sh gputests runs it on one)")
def test_resume_on_a_gpu_restores_every_rng(corpus, tmp_path):
    """A checkpoint read onto the GPU would put the CPU RNG state there, which torch.set_rng_state refuses."""
    exp, gpu = tmp_path / "exp", DistInfo(0, 1, 0, CUDA, None)
    tr = Trainer(load_config("tiny", SMALL + ["train.max_steps=2"]), str(corpus / "data.list"), None, exp, gpu)
    tr.fit()
    tr.close()
    rng = checkpoint.load_latest(exp / "checkpoints")[0]["ranks"][0]["rng"]
    again = Trainer(load_config("tiny", SMALL + ["train.max_steps=4"]), str(corpus / "data.list"), None, exp, gpu)
    torch.manual_seed(123)
    assert again.resume() and again.step == 2
    assert torch.equal(torch.get_rng_state(), rng["torch"]) and torch.equal(torch.cuda.get_rng_state(CUDA), rng["cuda"])
    again.fit()
    again.close()


def test_ckpt_command_lists_checkpoints_and_digests_the_newest(corpus, tmp_path, capsys):
    from asrlab.cli import main

    exp = tmp_path / "exp"
    tr = make_trainer(corpus, exp, "train.max_steps=4", "train.save_every_steps=2")
    tr.fit()
    tr.close()
    (exp / "checkpoints" / "step_00000004.done").unlink()  # the newest is incomplete
    assert main(["ckpt", str(exp), "--digest"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == ["2", "0", "complete"] and "w0: " in out[1]
    assert out[2].split()[:3] == ["4", "?", "INCOMPLETE"]  # no marker: its epoch is unknown
    state, marker = checkpoint.load_latest(exp / "checkpoints")
    assert (
        marker["step"] == 2
        and out[3] == f"{checkpoint.state_digest(state)}  step_00000002.pt (model and optimizer tensors)"
    )
    assert main(["ckpt", str(tmp_path / "nothing")]) == 2


def test_decode_command_greedy_and_with_a_lexicon(corpus, tmp_path, capsys):
    from asrlab.cli import main
    from conftest import WORDS

    exp = tmp_path / "exp"
    tr = make_trainer(corpus, exp, "train.max_steps=3")
    tr.fit()
    tr.close()
    data = str(corpus / "data.list")
    assert main(["decode", "--exp", str(exp), "--data", data, "--lexicon", data, "--beam", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    # one tone of the test corpus is too short for its label: decoded and counted, but not in the loss
    assert "over 120 utterances (checkpoint step 3, greedy, 1 of them too short for CTC to align)" in out[0]
    assert out[0].endswith("train.txt")
    assert "(beam 4, LM weight 1.0, word bonus 3.0)" in out[1] and out[1].endswith("train_lexicon.txt")
    greedy = [line.split("\t") for line in (exp / "decode" / "train.txt").read_text().splitlines()]
    lexicon = [line.split("\t") for line in (exp / "decode" / "train_lexicon.txt").read_text().splitlines()]
    assert [r[:2] for r in greedy] == [r[:2] for r in lexicon] and len(lexicon) == 120
    assert all(set(hyp.split()) <= set(WORDS) for _, _, hyp in lexicon)  # only words of the train transcripts
    assert (
        main(
            [
                "decode",
                "--exp",
                str(exp),
                "--data",
                data,
                "--lexicon",
                data,
                "--beam",
                "4",
                "--speeds",
                "0.9,1.0,1.1",
                "--name",
                "warped",
            ]
        )
        == 0
    )
    assert "speeds 0.9,1,1.1)" in capsys.readouterr().out
    warped = [line.split("\t") for line in (exp / "decode" / "warped_lexicon.txt").read_text().splitlines()]
    assert [r[:2] for r in warped] == [r[:2] for r in lexicon]
    with pytest.raises(SystemExit):
        main(["decode", "--exp", str(exp), "--data", data, "--speeds", "fast"])
    assert main(["decode", "--exp", str(exp), "--data", data, "--speeds", "0.9,1.1"]) == 2  # no lexicon
    assert "give a lexicon" in capsys.readouterr().err
    assert main(["decode", "--exp", str(exp), "--data", data, "--lexicon", data, "--speeds", "0.2,1.0"]) == 2
    assert "data.speed is a tempo factor" in capsys.readouterr().err
    assert main(["decode", "--exp", str(exp), "--data", data, "--device", "gpu0"]) == 2
    assert "'gpu0' is not a device name" in capsys.readouterr().err
    assert main(["decode", "--exp", str(exp), "--data", data, "--device", f"cuda:{torch.cuda.device_count()}"]) == 2
    assert "GPU(s)" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/on_gpu.sh gputests runs it on one)")
def test_decode_runs_on_the_gpu_when_there_is_one(corpus, tmp_path):
    """It ran on the CPU: a 33M-parameter model took minutes for 2,000 utterances on a GPU box."""
    from asrlab.decode import decode_exp, load_model

    exp = tmp_path / "exp"
    tr = make_trainer(corpus, exp, "train.max_steps=3")
    tr.fit()
    tr.close()
    assert next(load_model(exp)[0].parameters()).device.type == "cuda"
    data = corpus / "data.list"
    on_gpu, on_cpu = decode_exp(exp, data, "gpu"), decode_exp(exp, data, "cpu", device="cpu")
    assert on_gpu["utts"] == on_cpu["utts"] and abs(on_gpu["cer"] - on_cpu["cer"]) < 0.02
    assert len((exp / "decode" / "gpu.txt").read_text().splitlines()) == 120


def test_train_cli_refuses_missing_data_before_any_work(tmp_path):
    t0 = time.time()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "asrlab.cli",
            "train",
            "--data",
            str(tmp_path / "none.list"),
            "--exp",
            str(tmp_path / "exp"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "no such data list" in out.stderr and not (tmp_path / "exp").exists()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "asrlab.cli",
            "train",
            "--data",
            str(tmp_path),
            "--exp",
            str(tmp_path / "exp"),
            "optim.nope=1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "optim.nope" in out.stderr
    assert time.time() - t0 < 60


def test_a_rank_that_aborts_prints_its_python_stack():
    """A C++ std::terminate in a rank (SIGABRT) leaves the Python stacks of its threads in stderr."""
    code = (
        "from asrlab.lab import dist; dist.setup()\ndef where_it_died():\n    import os; os.abort()\nwhere_it_died()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in p.stderr and "where_it_died" in p.stderr


def test_train_with_2_gloo_ranks(corpus, tmp_path):
    exp = tmp_path / "exp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
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
            "--max-steps",
            "3",
            *SMALL,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for rank in (0, 1):
        lines = (exp / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    assert checkpoint.load_latest(exp / "checkpoints")[1]["step"] == 3


def test_every_evaluation_sees_the_whole_cv_set(corpus, tmp_path):
    cfg = load_config("tiny", SMALL)
    tr = Trainer(cfg, str(corpus / "data.list"), str(corpus / "data.list"), tmp_path / "exp", CPU)
    first, second = tr.evaluate_and_log(), tr.evaluate_and_log()
    assert first["utts"] == second["utts"] > 100  # (utterances CTC can align; a few tones are too short)
    tr.close()


def test_a_rank_without_data_is_refused_before_any_work(corpus, tmp_path):
    one = tmp_path / "one.list"
    one.write_text((corpus / "data.list").read_text().splitlines()[0] + "\n")
    two_ranks = DistInfo(0, 2, 0, torch.device("cpu"), "gloo")  # no process group: the check comes first
    for uneven, why in (("stop", "no rank would ever take a step"), ("none", "the first all-reduce would hang")):
        cfg = load_config("tiny", SMALL + [f"train.uneven={uneven}"])
        with pytest.raises(DataError, match=rf"1 source\(s\) for 2 ranks, so 1 of them get no data and {why}"):
            Trainer(cfg, str(one), None, tmp_path / uneven, two_ranks)
        assert not (tmp_path / uneven / "config.yaml").exists()


def test_an_epoch_without_a_step_is_an_error_not_a_silent_loop(corpus, tmp_path):
    """Every utterance filtered out: before, each of max_epochs epochs ended at step 0 and training 'finished'."""
    cfg = load_config("tiny", SMALL + ["data.min_duration_s=1000", "train.max_epochs=50"])
    tr = Trainer(cfg, str(corpus / "data.list"), None, tmp_path / "exp", CPU)
    with pytest.raises(DataError, match="epoch 0 ended before its first step"):
        tr.fit()
    tr.close()


def test_a_stop_request_ends_the_run_cleanly_after_the_current_step(corpus, tmp_path):
    """EXP/STOP (a notebook's Stop button, ``asrlab stop``): checkpoint, evaluation, the file cleared, resumable."""
    from asrlab.lab.stop import request_stop, stop_requested

    exp = tmp_path / "exp"
    cfg = load_config("tiny", SMALL + ["train.max_epochs=50"])
    tr = Trainer(cfg, str(corpus / "data.list"), str(corpus / "data.list"), exp, CPU)
    request_stop(exp)
    result = tr.fit()
    tr.close()
    assert tr.stopped_on_request and [m["step"] for m in read_metrics(exp)] == [1]
    assert result["step"] == 1 and checkpoint.load_latest(exp / "checkpoints")[1]["step"] == 1
    assert not stop_requested(exp)  # cleared: a resume trains on
    again = Trainer(
        load_config("tiny", SMALL + ["train.max_epochs=50", "train.max_steps=3"]),
        str(corpus / "data.list"),
        None,
        exp,
        CPU,
    )
    assert again.resume()
    again.fit()
    again.close()
    assert [m["step"] for m in read_metrics(exp)] == [1, 2, 3]


def test_asrlab_stop_ends_2_gloo_ranks_at_the_same_step(corpus, tmp_path):
    from asrlab.nb import last_step

    exp = tmp_path / "exp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
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
            "train.max_epochs=1000",
            *SMALL,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.time() + 180
        while last_step(exp) < 2:
            assert proc.poll() is None and time.time() < deadline, "the run ended or did not reach step 2"
            time.sleep(0.1)
        out = subprocess.run(
            [sys.executable, "-m", "asrlab.cli", "stop", str(exp)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0 and "stop after its current step" in out.stdout
        assert proc.wait(timeout=120) == 0, proc.stdout.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    steps = [
        [json.loads(x)["step"] for x in (exp / "metrics" / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)
    ]
    assert steps[0] == steps[1] and steps[0][-1] >= 2
    assert checkpoint.load_latest(exp / "checkpoints")[1]["step"] == steps[0][-1]
    assert not (exp / "STOP").exists()


def test_asrlab_stop_refuses_a_folder_without_a_run(tmp_path, capsys):
    from asrlab.cli import main

    assert main(["stop", str(tmp_path / "nothing")]) == 2
    assert "no run there" in capsys.readouterr().err


def test_grad_clip_0_means_no_clipping(corpus, tmp_path):
    """clip_grad_norm_(params, 0) would scale every gradient to zero; 0 must train as an infinite clip does."""
    batch = None
    after = {}
    for clip in ("0", "1e12"):
        tr = make_trainer(corpus, tmp_path / f"clip{clip}", f"optim.grad_clip={clip}")
        batch = batch or next(iter(tr.loader))
        tr.train_step([batch])
        r = tr.settle()
        after[clip] = [p.detach().clone() for p in tr.model.parameters()]
        assert r.grad_norm > 0
        tr.close()
    assert all(torch.equal(a, b) for a, b in zip(after["0"], after["1e12"]))


def test_the_loss_scale_logged_is_the_one_the_step_used(corpus, tmp_path):
    """fp16 with a scaler: an overflowing step halves the scale for the next one; its own line keeps its scale."""
    tr = make_trainer(corpus, tmp_path / "exp", "train.precision=fp16", "train.max_steps=3")
    target = dict(tr.model.named_modules())["blocks.0.ff1.net.0"]
    forward = target.forward

    def planted(*a, **k):  # the first step's gradients overflow here; its loss stays finite
        out = forward(*a, **k)
        if tr.step == 0:
            out = out.clone()
            out.register_hook(lambda g: torch.full_like(g, math.inf))
        return out

    target.forward = planted
    tr.fit()
    tr.close()
    m = read_metrics(tmp_path / "exp")
    assert m[0]["nonfinite"] == "scaler" and m[0]["loss_scale"] == 65536.0  # the scaler's initial scale
    for before, now in zip(m, m[1:]):  # halved after each overflow (fp16 on CPU overflows on its own too)
        assert now["loss_scale"] == before["loss_scale"] * (0.5 if before["nonfinite"] == "scaler" else 1.0)


def test_nproc_relaunches_the_arguments_it_was_given(monkeypatch, tmp_path):
    """Called as main([...]) (a notebook, a test), not from the shell: torchrun gets those, not sys.argv."""
    from asrlab import cli
    from asrlab.train import launch

    seen = {}
    monkeypatch.setattr(launch, "launch", lambda nproc, args, *rest, **kw: seen.update(nproc=nproc, args=args) or 0)
    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "something"])
    assert cli.main(["train", "--nproc", "2", "--data", "d.list", "--exp", str(tmp_path), "optim.lr=0.1"]) == 0
    assert seen == {"nproc": 2, "args": ["--data", "d.list", "--exp", str(tmp_path), "optim.lr=0.1"]}


def test_failing_ranks_say_the_first_error_once_and_last(corpus, tmp_path):
    """2 ranks on a one-shard list: the clear message once, as the last line, not torchrun's report under it."""
    one = tmp_path / "one.list"
    one.write_text((corpus / "data.list").read_text().splitlines()[0] + "\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "asrlab.cli",
            "train",
            "--nproc",
            "2",
            "--data",
            str(one),
            "--exp",
            str(tmp_path / "exp"),
            *SMALL,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("asrlab: error: rank ") and "1 source(s) for 2 ranks" in lines[-1]
    assert "each error in" in lines[-1]  # both ranks failed; one is said
    assert out.stderr.count("1 source(s) for 2 ranks") == 1 and "ChildFailedError" not in out.stderr
    assert len(lines) < 25, out.stderr
    (tmp_path / "train.log").write_text(out.stderr)  # what a person keeps of the run: its output, read after the fact
    d = diagnose_logs([str(tmp_path / "train.log")])
    assert d["verdict"] == "crashed" and d["culprit"]["rank"] in (0, 1) and "1 source(s) for 2 ranks" in d["summary"], d


def test_a_bug_keeps_its_traceback_and_a_usage_error_is_one_line(monkeypatch, tmp_path, capsys):
    from asrlab import cli

    assert cli.main(["train", "--config", "no-such-config", "--data", "d.list", "--exp", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().startswith("asrlab: error: no config 'no-such-config'")

    def bug(a):
        raise ValueError("an internal mistake")

    monkeypatch.setattr(cli.runs, "cmd_ckpt", bug)
    with pytest.raises(ValueError, match="an internal mistake"):
        cli.main(["ckpt", str(tmp_path)])


def _one_step_with_rank1_loss_infinite(rank: int, data: str, out: str, port: int) -> None:
    """A rank of the test below: a step in which only rank 1's loss is infinite (its gradients are not), then one more."""
    import torch.distributed as tdist

    from asrlab.lab import dist as adist
    from asrlab.train import step as step_module

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    info = adist.setup("gloo")
    real = step_module.mean_ctc_loss
    if rank == 1:

        def infinite(*args, **kw):
            loss, bad = real(*args, **kw)
            return loss + torch.tensor(math.inf), bad  # a constant: the gradients stay finite

        step_module.mean_ctc_loss = infinite
    tr = Trainer(load_config("tiny", SMALL + ["train.nonfinite=halt"]), data, None, f"{out}/exp", info)
    batches = iter(tr.loader)
    tr.train_step([next(batches)])
    total = float(sum(p.detach().double().sum() for p in tr.model.parameters()))
    r = tr.train_step([next(batches)])  # step 1, read (and located) before step 2 is taken
    step_module.mean_ctc_loss = real
    r2 = tr.settle()
    with open(f"{out}/result{rank}.json", "w") as f:
        json.dump(
            {
                "skipped": r.skipped,
                "kind": r.nonfinite,
                "halt1": r.halt is not None,
                "weights": total,
                "halt2": str(r2.halt) if r2.halt else None,
            },
            f,
        )
    tr.close()
    tdist.barrier()  # neither rank closes its connections while the other may still read from them
    adist.teardown()


def test_every_rank_decides_alike_on_a_step_that_one_rank_found_non_finite(corpus, tmp_path):
    """Each rank decided on its own loss: rank 0 stepped, rank 1 skipped, and the replicas' weights parted.
    Now every rank decides on the all-reduced gradients (finite here: all step), and the policy (halt)
    answers rank 1's finding on every rank at the next step."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(
        _one_step_with_rank1_loss_infinite, args=(str(corpus / "data.list"), str(tmp_path), port), nprocs=2, join=True
    )
    results = [json.loads((tmp_path / f"result{r}.json").read_text()) for r in (0, 1)]
    assert [r["skipped"] for r in results] == [False, False] and [r["kind"] for r in results] == [None, "loss"]
    assert results[0]["weights"] == results[1]["weights"]
    assert [r["halt1"] for r in results] == [False, False]
    for r in results:  # both halt at step 2, naming rank 1's step 1
        assert r["halt2"] and r["halt2"].startswith("halted at step 2 after step 1 (policy halt)"), r["halt2"]
        assert "rank 1: first non-finite value in" in r["halt2"]

"""Numerics diagnostics: exact headroom, the first non-finite value named, replay per precision,
and the trainer's skip / rollback / halt policies on a planted overflow."""

import json
import math
from collections import OrderedDict

import pytest
import torch
from torch import nn

from asrlab.cli import main
from asrlab.config import load_config
from asrlab.lab.numerics.stats import FP16_MAX, Diagnostics, headroom, locate, read_traces, save_bundle, tensor_stats
from asrlab.train.replay import replay
from asrlab.model import ConformerCTC
from asrlab.lab.metrics import read_metrics
from asrlab.lab.numerics.guard import HALT_EXIT, NonFiniteHalt

from conftest import SMALL
from helpers import make_trainer

KNOWN = torch.tensor([1000.0, -2.0, 0.5, 3e-5, 0.0, -1e-6])  # two non-zero values below 2**-14


class Const(nn.Module):
    def forward(self, x):
        return KNOWN.clone()


def test_headroom_of_known_activations_is_exact():
    m = nn.Sequential(OrderedDict(inp=nn.Identity(), known=Const()))
    d = Diagnostics(m, sample=None)
    with d.recording():
        m(torch.ones(1))
    max_abs, rms, nonfinite, tiny = d.summary()["forward"]["known"]
    assert max_abs == 1000.0 and headroom(max_abs) == FP16_MAX / 1000.0 == 65.504
    assert tiny == pytest.approx(2 / 6) and nonfinite == 0.0
    assert rms == pytest.approx(math.sqrt(sum(v * v for v in KNOWN.tolist()) / 6), rel=1e-6)
    assert headroom(0.0) == math.inf and headroom(math.inf) == 0.0 and headroom(math.nan) == 0.0
    # in fp16 the same values have the same headroom; a sampled count still sees a lone inf
    assert tensor_stats(KNOWN.half())[0].item() == 1000.0
    big = torch.zeros(1_000_000)
    big[123_457] = math.inf
    s = tensor_stats(big, sample=1000).tolist()
    assert s[0] == math.inf and s[2] > 0


class Boom(torch.autograd.Function):
    """Identity forward; an infinite gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * math.inf


def plant(module: nn.Module, when, direction: str = "forward"):
    """Make ``module`` produce inf (forward) or send back an infinite gradient (backward) while ``when()``."""
    forward = module.forward

    def planted(*args, **kwargs):
        out = forward(*args, **kwargs)
        if not when():
            return out
        return out * math.inf if direction == "forward" else Boom.apply(out)

    module.forward = planted


def running(tr) -> int:
    """The step the model runs: the one being trained, or the one the numerics guard replays (a step is
    read, and a non-finite one replayed, while the next one is taken)."""
    return tr.guard.replaying or tr.step + 1


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_planted_overflow_is_named_with_its_step(corpus, tmp_path, direction):
    tr = make_trainer(corpus, tmp_path / "exp", "train.max_steps=5", "train.diagnostics_every=2")
    target = "blocks.0.ff1.net.0"
    plant(dict(tr.model.named_modules())[target], lambda: running(tr) == 3, direction)
    tr.fit()
    tr.close()
    report = json.loads((tmp_path / "exp" / "nonfinite" / "step00000003-rank0" / "report.json").read_text())
    assert (report["module"], report["direction"], report["step"]) == (target, direction, 3)
    assert report["kind"] == ("loss" if direction == "forward" else "grad")
    batch = torch.load(tmp_path / "exp" / "nonfinite" / "step00000003-rank0" / "batch.pt", weights_only=True)
    assert len(report["keys"]) == len(batch["feats"]) > 0 and all(k.startswith("utt") for k in report["keys"])
    m = read_metrics(tmp_path / "exp")
    assert [r["nonfinite"] for r in m] == [None, None, report["kind"], None, None]  # skip: counted, goes on
    assert m[-1]["skipped"] == 1 and m[-1]["step"] == 5
    traces = read_traces(tmp_path / "exp")
    assert [t["step"] for t in traces] == [2, 4] and target in traces[0]["forward"] and traces[0]["backward"]


def test_locate_names_the_innermost_module():
    m = nn.Sequential(OrderedDict(a=nn.Linear(4, 4), b=nn.Sequential(nn.Linear(4, 4), nn.ReLU()), c=nn.Linear(4, 1)))
    x = torch.randn(3, 4)
    assert locate(m, lambda: m(x).sum().backward())[0] is None
    plant(m.b[0], lambda: True)
    first, _ = locate(m, lambda: m(x).sum().backward())
    assert (first["module"], first["direction"], first["first_seen"]) == ("b.0", "forward", "b.0")


class ScaledDropout(nn.Module):
    """Overflows in its own code (``x * scale``), before its submodule: the pattern of ``pos_enc``."""

    def __init__(self, scale):
        super().__init__()
        self.scale, self.dropout = scale, nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(x * self.scale)


def test_an_overflow_between_submodules_is_placed_in_the_parent():
    m = nn.Sequential(OrderedDict(a=nn.Linear(4, 4), enc=ScaledDropout(1e39), c=nn.Linear(4, 1)))
    first, _ = locate(m, lambda: m(torch.randn(3, 4)).sum().backward())
    assert (first["module"], first["first_seen"]) == ("enc", "enc.dropout")


def test_replay_shows_which_precision_breaks(tmp_path):
    """Attention logits pushed past 65504: finite in fp32 and bf16, not in fp16, named in the replay."""
    cfg = load_config("tiny", SMALL).model
    torch.manual_seed(0)
    model = ConformerCTC(cfg, 8)
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(250.0)
    feats = torch.randn(2, 40, cfg.input_dim)
    inputs = {
        "feats": feats,
        "feat_lens": torch.tensor([40, 30]),
        "targets": torch.tensor([[1, 2, 3], [4, 5, 0]]),
        "target_lens": torch.tensor([3, 2]),
        "keys": ["a", "b"],
    }
    from dataclasses import asdict

    save_bundle(tmp_path / "b", model, inputs, {"step": 7, "model": asdict(cfg), "vocab_size": 8, "loss_scale": 1.0})
    rows = {r["precision"]: r for r in replay(tmp_path / "b")}
    assert rows["fp32"]["finite"] and rows["bf16"]["finite"]
    assert rows["fp32"]["max_abs"] > FP16_MAX and rows["fp32"]["tightest_module"] == "blocks.0.attn.logits"
    # the q.k product overflowed inside the attention module's own code; its logits probe saw it first
    assert not rows["fp16"]["finite"]
    assert rows["fp16"]["first_nonfinite"] == "blocks.0.attn (forward), first seen at blocks.0.attn.logits"


def test_rollback_goes_back_and_lowers_the_lr(corpus, tmp_path):
    tr = make_trainer(
        corpus,
        tmp_path / "exp",
        "train.max_steps=7",
        "train.save_every_steps=2",
        "train.nonfinite=rollback",
        "optim.decay=none",
    )
    fired = []

    def once():
        if tr.step + 1 == 5 and not fired:
            fired.append(tr.step)
            return True
        return False

    plant(dict(tr.model.named_modules())["blocks.0.conv"], once)
    tr.fit()
    tr.close()
    m = read_metrics(tmp_path / "exp")
    assert [r["step"] for r in m] == [1, 2, 3, 4, 5, 5, 6, 7]  # step 5 failed, back to checkpoint 4
    assert m[4]["nonfinite"] == "loss" and m[4]["rollbacks"] == 0
    assert all(r["rollbacks"] == 1 and r["nonfinite"] is None for r in m[5:])
    lr = tr.cfg.optim.lr
    assert m[3]["lr"] == pytest.approx(lr) and m[-1]["lr"] == pytest.approx(lr * 0.5)
    assert tr.step == 7 and tr.rollbacks == 1


def test_rollbacks_are_bounded_then_halt(corpus, tmp_path):
    tr = make_trainer(
        corpus,
        tmp_path / "exp",
        "train.max_steps=8",
        "train.save_every_steps=2",
        "train.nonfinite=rollback",
        "train.max_rollbacks=2",
    )
    plant(dict(tr.model.named_modules())["blocks.0.conv"], lambda: running(tr) >= 3)
    with pytest.raises(NonFiniteHalt, match="2 rollbacks used up"):
        tr.fit()
    tr.close()
    assert [r["step"] for r in read_metrics(tmp_path / "exp")] == [1, 2, 3, 3, 3]
    halt = json.loads((tmp_path / "exp" / "nonfinite" / "halt.json").read_text())
    assert halt["module"] == "blocks.0.conv" and halt["rollbacks"] == 2


def test_halt_saves_state_and_batch_and_stops(corpus, tmp_path):
    tr = make_trainer(corpus, tmp_path / "exp", "train.max_steps=8", "train.nonfinite=halt")
    plant(dict(tr.model.named_modules())["blocks.0.conv"], lambda: running(tr) == 3)
    with pytest.raises(NonFiniteHalt, match=r"halted at step 3 .*blocks\.0\.conv \(forward\)"):
        tr.fit()
    tr.close()
    assert tr.step == 3 and [r["step"] for r in read_metrics(tmp_path / "exp")] == [1, 2, 3]
    bundle = tmp_path / "exp" / "nonfinite" / "step00000003-rank0"
    assert (bundle / "model.pt").exists() and (bundle / "batch.pt").exists()


def test_cli_halts_with_exit_code_4(corpus, tmp_path, capsys):
    """A real divergence, no planting: an absurd LR makes the weights, then the activations, overflow."""
    exp = tmp_path / "exp"
    code = main(
        [
            "train",
            "--config",
            "tiny",
            "--data",
            str(corpus / "data.list"),
            "--exp",
            str(exp),
            "--max-steps",
            "20",
            "--nonfinite",
            "halt",
            "optim.lr=1e30",
            "optim.warmup_steps=0",
            *SMALL,
        ]
    )
    assert code == HALT_EXIT == 4
    assert "training halted" in capsys.readouterr().err
    assert json.loads((exp / "nonfinite" / "halt.json").read_text())["direction"] == "forward"


def test_replay_draws_the_failing_steps_own_dropout_masks(corpus, tmp_path):
    """With dropout, the fp32 replay of a saved step gives that step's loss (it used to seed by the step number)."""
    tr = make_trainer(corpus, tmp_path / "exp", "train.max_steps=3", "model.dropout=0.3")
    target = "blocks.0.ff1.net.0"
    plant(dict(tr.model.named_modules())[target], lambda: running(tr) == 3, "backward")  # the loss stays finite
    tr.fit()
    tr.close()
    bundle = tmp_path / "exp" / "nonfinite" / "step00000003-rank0"
    report = json.loads((bundle / "report.json").read_text())
    assert report["kind"] == "grad" and math.isfinite(report["loss"])
    fp32 = replay(bundle, precisions=("fp32",))[0]
    assert fp32["loss"] == pytest.approx(report["loss"], rel=1e-6)


def test_an_accumulated_step_is_replayed_micro_batch_by_micro_batch(corpus, tmp_path):
    """Two micro-batches, the second goes non-finite: its bundle holds that micro-batch, and a replay of
    it draws its own dropout masks (the loss it had in training)."""
    from asrlab.train import step as step_module

    tr = make_trainer(corpus, tmp_path / "exp", "optim.accum_steps=2", "model.dropout=0.3")
    losses, real = [], step_module.mean_ctc_loss

    def recorded(*args, **kw):
        out = real(*args, **kw)
        losses.append(float(out[0].detach()))
        return out

    step_module.mean_ctc_loss = recorded
    calls = []
    try:  # the second micro-batch's backward in training (call 2), and in its replay (call 4)
        plant(
            dict(tr.model.named_modules())["blocks.0.ff1.net.0"],
            lambda: calls.append(1) or len(calls) in (2, 4),
            "backward",
        )
        it = iter(tr.loader)
        first, second = next(it), next(it)
        tr.train_step([first, second])
        assert tr.settle().nonfinite == "grad"
    finally:
        step_module.mean_ctc_loss = real
        tr.close()
    bundle = tmp_path / "exp" / "nonfinite" / "step00000001-rank0"
    report = json.loads((bundle / "report.json").read_text())
    assert report["keys"] == list(second["keys"]) and report["module"] == "blocks.0.ff1.net.0"
    assert losses[2:] == losses[:2]  # the replay ran each micro-batch as training did
    assert replay(bundle, precisions=("fp32",))[0]["loss"] == pytest.approx(losses[1], rel=1e-6)

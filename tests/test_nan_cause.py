"""Non-finite steps told apart by cause on a CTC loop of the user's own (not asrlab's example): a
transcript longer than its output frames, an fp16 overflow that fp32 does not have, bad data that fp32
has too, a loss that is not finite while every activation is."""

from __future__ import annotations

import json
import math

import torch
from torch import nn

from asrlab import lab
from asrlab.doctor import diagnose, format_diagnosis


class Encoder(nn.Module):
    """Frames in, CTC log-probabilities out at a quarter of the frame rate."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.out = nn.Linear(16, 5)

    def forward(self, x):
        h = self.inp(x[:, ::4]).tanh()
        return self.out(h).log_softmax(-1)


def ctc(model, batch):
    logp = model(batch["feats"]).transpose(0, 1)  # (T/4, N, C)
    out_lens = batch["feat_lens"] // 4
    return nn.CTCLoss(reduction="mean")(logp.float(), batch["text"], out_lens, batch["text_lens"])


def batch_of(frames: list[int], labels: list[int], scale: float = 1.0):
    g = torch.Generator().manual_seed(0)
    n, t, s = len(frames), max(frames), max(max(labels), 1)
    text = torch.randint(1, 5, (n, s), generator=g)
    return {
        "uttid": [f"spk1-utt{i}" for i in range(n)],
        "feats": torch.randn(n, t, 8, generator=g) * scale,
        "feat_lens": torch.tensor(frames),
        "text": text,
        "text_lens": torch.tensor(labels),
    }


def run_step(exp, batch, dtype=None, loss=ctc, model_class=Encoder):
    torch.manual_seed(0)
    model = model_class()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = lab.NumericsGuard(model, exp)
    with guard.step(1, batch):
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            value = loss(model, batch)
        value.backward()
    check = guard.optimizer_step(opt, value, replay=lambda: loss(model, batch))
    assert check.kind == "loss"
    return json.loads(next((exp / "nonfinite").glob("*/report.json")).read_text())["cause"]


def test_a_transcript_longer_than_its_frames_is_named(tmp_path):
    # 40 frames become 10 outputs: 12 labels cannot align; the others can
    cause = run_step(tmp_path, batch_of([40, 40, 32], [3, 12, 4]))
    assert cause["cause"] == "ctc_no_alignment" and cause["utterances"] == ["spk1-utt1"], cause
    assert "spk1-utt1 (12 labels, 10 frames)" in cause["text"]
    d = diagnose(tmp_path)
    assert "cause: CTC targets longer than the model's output frames: spk1-utt1" in format_diagnosis(d)


class Loud(Encoder):
    """Activations past fp16's 65504 in the model's own forward."""

    def forward(self, x):
        return (self.inp(x) * 1e5).pow(2).mean()


def test_an_fp16_overflow_is_told_from_bad_data(tmp_path):
    def loud(model, batch):
        return model(batch["feats"])

    assert run_step(tmp_path / "a", batch_of([8], [1]), torch.float16, loud, Loud)["cause"] == "overflow"
    bad = batch_of([8], [1])
    bad["feats"][0, 3, 2] = math.nan  # a corrupt frame: not finite in any precision
    cause = run_step(tmp_path / "b", bad, torch.float16, loud, Loud)
    assert cause["cause"] == "data_or_model", cause


def test_a_loss_that_is_not_finite_while_every_activation_is(tmp_path):
    def log_of_zero(model, batch):
        return -torch.log(model(batch["feats"]).exp().sum() * 0)

    cause = run_step(tmp_path, batch_of([8], [1]), None, log_of_zero)
    assert cause["cause"] == "loss", cause

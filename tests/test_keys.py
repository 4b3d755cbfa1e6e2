"""Utterance ids found whatever a loop's batch calls them, kept in the NaN report and its replay bundle."""

import json
import logging
import math
from dataclasses import dataclass

import pytest
import torch

from asrlab import lab
from asrlab.lab.keys import find_keys
from asrlab.lab.numerics.stats import load_bundle


@dataclass
class Batch:  # a loop's own batch object
    feats: torch.Tensor
    utt_id: list


@pytest.mark.parametrize(
    "batch, keys, want",
    [
        ({"x": 1, "keys": ["a", "b"]}, None, ["a", "b"]),
        ({"x": 1, "key": ["a", "b"]}, None, ["a", "b"]),
        ({"x": 1, "uttids": ("a", "b")}, None, ["a", "b"]),
        ({"x": 1, "ids": ["a"]}, None, ["a"]),
        (Batch(torch.zeros(1), ["u1"]), None, ["u1"]),
        ((torch.zeros(2, 3), torch.ones(2), ["a", "b"]), None, ["a", "b"]),
        ([{"keys": ["a"]}, {"keys": ["b", "c"]}], None, ["a", "b", "c"]),  # micro-batches of one step
        ({"x": 1, "wav_name": ["a"]}, "wav_name", ["a"]),
        ({"x": 1, "meta": [{"id": "a"}]}, lambda b: [m["id"] for m in b["meta"]], ["a"]),
        ({"x": torch.zeros(2), "y": [1, 2]}, None, None),
        (torch.zeros(3), None, None),
    ],
)
def test_ids_are_found_whatever_the_batch_calls_them(batch, keys, want):
    assert find_keys(batch, keys) == want


class Scale(torch.nn.Module):
    factor = 1.0

    def forward(self, x):
        return x * self.factor


def _nan_step(tmp_path, batch, x, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Scale(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = lab.NumericsGuard(model, tmp_path, policy="skip", **kw)

    def loss_of():
        model[1].factor = math.inf
        return model(x).pow(2).mean()

    with guard.step(1, batch):
        loss = loss_of()
        loss.backward()
    guard.optimizer_step(opt, loss, replay=loss_of)
    bundle = next((tmp_path / "nonfinite").glob("*/report.json")).parent
    return json.loads((bundle / "report.json").read_text()), load_bundle(bundle)[1]


def test_a_tuple_batch_with_key_names_its_utterances_in_the_report_and_bundle(tmp_path):
    x = torch.randn(2, 4)
    meta, inputs = _nan_step(tmp_path, (x, ["utt-7", "utt-9"]), x)
    assert meta["keys"] == ["utt-7", "utt-9"]
    assert inputs["keys"] == ["utt-7", "utt-9"] and torch.equal(inputs["batch0"], x)


def test_a_named_field_is_used(tmp_path):
    x = torch.randn(2, 4)
    meta, inputs = _nan_step(tmp_path, {"feats": x, "wav_name": ["w1", "w2"]}, x, keys="wav_name")
    assert meta["keys"] == inputs["keys"] == ["w1", "w2"]


def test_a_batch_without_ids_is_warned_about_once(tmp_path, caplog):
    model = torch.nn.Linear(4, 1)
    guard = lab.NumericsGuard(model, tmp_path)
    with caplog.at_level(logging.WARNING, logger="asrlab"):
        for step in range(1, 4):
            with guard.step(step, {"x": torch.randn(2, 4)}):
                pass
    warned = [r for r in caplog.records if "no utterance ids" in r.getMessage()]
    assert len(warned) == 1 and "keys=" in warned[0].getMessage()

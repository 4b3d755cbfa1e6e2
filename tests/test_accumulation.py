"""Gradient accumulation and non-finite utterances in a loop of the user's own: tests/loops/accum_loop.py
(dict batches, two micro-batches per optimizer step, DDP's no_sync) on two gloo ranks, and the numerics
guard alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asrlab import lab
from asrlab.doctor import diagnose
from asrlab.doctor.render import format_diagnosis
from asrlab.lab.numerics.events import read_events
from asrlab.lab.state.ledger import read_ledger

ROOT = Path(__file__).resolve().parents[1]
LOOPS = ROOT / "tests" / "loops"


def test_the_doctor_counts_optimizer_steps_and_names_the_bad_utterance_at_each_of_its_steps(tmp_path):
    exp = tmp_path / "exp"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "BAD_UTT": "utt-0013",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "accum_loop.py",
            str(exp),
        ],
        cwd=LOOPS,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    d = diagnose(exp)
    # 104 utterances, 2 ranks, 4 a micro-batch: 13 micro-batches a rank and epoch, 7 optimizer steps (the last
    # one shorter); two epochs: 14 steps, not 26
    assert [x["steps"] for x in d["steps"]["ranks"]] == [14, 14], d["steps"]
    assert [x["step"] for x in d["ranks"]] == [14, 14]  # the phase clock's step, which a stall verdict names
    assert d["verdict"] == "finished" and all(c["exactly_once"] for c in d["coverage"]["epochs"]), d["coverage"]
    # the bad utterance broke one step in each epoch, on whichever rank drew it: both are in the doctor,
    # each at the optimizer step whose ledger line holds it, the utterance named from the loop's losses
    culprit = [e for e in d["nonfinite"]["log"] if e["kind"] == "loss"]
    assert len(culprit) == 2 and d["nonfinite"]["count"] == 2, d["nonfinite"]["log"]
    for e in culprit:
        assert e["utterances"] == ["utt-0013"] and e["found_by"] == "the loop's per-utterance losses"
        assert e["micro_batches"] == 2 and not e["stepped"] and "utt-0013" in e["keys"] and len(e["keys"]) == 8
    held = [(x["step"], r) for r in (0, 1) for x in read_ledger(exp, r) if "utt-0013" in x["keys"]]
    assert sorted(held) == [(e["step"], e["rank"]) for e in culprit]  # one step an epoch, as the ledger has it
    # the other rank's gradients came non-finite in the all-reduce: each of its utterances replays finite alone
    assert all(e["utterances"] == [] for e in d["nonfinite"]["log"] if e["kind"] == "grad")
    assert d["nonfinite"]["by_utterance"] == {"utt-0013": [e["step"] for e in culprit]}
    # the first one's bundle holds the micro-batch the replay found it in, of the two
    [bundle] = [b for b in d["nonfinite"]["events"] if b["kind"] == "loss"]
    assert "utt-0013" in bundle["keys"] and len(bundle["keys"]) == 4 and bundle["micro_batches"] == 2
    assert bundle["step"] == culprit[0]["step"] and bundle["utterances"] == ["utt-0013"]
    out = format_diagnosis(d)
    a, b = (e["step"] for e in culprit)
    assert "every non-finite step: 2" in out and f"utterances not finite: utt-0013 (steps {a}, {b})" in out, out
    assert f"asrlab.lab.replay_step('{bundle['bundle']}', model, loss_fn)" not in out  # a finished run: no hint


def test_the_guides_example_is_the_loop_the_test_runs():
    guide = (ROOT / "docs" / "guide.md").read_text()
    block = guide.split("### Gradient accumulation", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    loop = (LOOPS / "accum_loop.py").read_text()
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    assert len(lines) >= 14
    for line in lines:
        assert line in loop, line


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.out = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.proj(x)))


def loss_fn(model, batch):
    return model(batch["x"]).pow(2).mean()


def test_a_replay_of_the_batch_finds_the_utterance_alone_and_every_non_finite_step_is_logged(tmp_path):
    """No per-utterance losses: a replay that takes the batch runs each micro-batch, then each utterance alone;
    a second non-finite step is logged too (the first has the bundle)."""
    model, exp = Net(), tmp_path / "exp"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = lab.NumericsGuard(model, exp)

    def batch(ids, bad=None):
        x = torch.randn(len(ids), 5, 6)
        if bad is not None:
            x[ids.index(bad), 2, 1] = float("inf")
        return {"x": x, "uid": ids}

    checks = []
    for step, micro in enumerate(
        [
            [batch(["a", "b"]), batch(["c", "d"], bad="d")],
            [batch(["e", "f"]), batch(["g", "h"])],
            [batch(["d", "i"], bad="d"), batch(["j", "k"])],
        ],
        1,
    ):
        losses = []
        for b in micro:
            with guard.step(step, b, keys=b["uid"]):
                loss = loss_fn(model, b) / 2
                loss.backward()
            losses.append(loss.detach())
        checks.append(guard.optimizer_step(opt, losses, replay=lambda b: loss_fn(model, b) / 2))
    assert [c.kind for c in checks] == ["loss", None, "loss"] and [c.step for c in checks] == [1, 2, 3]
    log, other = read_events(exp)
    assert other == 0 and [(e["step"], e["utterances"], e["found_by"]) for e in log] == [
        (1, ["d"], "each utterance replayed alone"),
        (3, ["d"], "each utterance replayed alone"),
    ]
    assert log[0]["keys"] == ["a", "b", "c", "d"] and log[0]["bundle"] and log[1]["bundle"] is None
    meta = json.loads((Path(log[0]["bundle"]) / "report.json").read_text())
    assert (meta["micro_batch"], meta["micro_batches"], meta["keys"]) == (1, 2, ["c", "d"])
    assert meta["where"].endswith("first seen at proj"), meta["where"]  # the input itself: not finite from the start
    # a line of a later format is passed over and counted, not misread
    with open(exp / "nonfinite" / "rank0.jsonl", "a") as f:
        f.write(json.dumps({"v": 99, "step": 7}) + "\n")
    assert len(read_events(exp)[0]) == 2 and read_events(exp)[1] == 1
    assert "1 lines of another format version passed over" in format_diagnosis(diagnose(exp))
    guard.close()
    halting = lab.NumericsGuard(model, tmp_path / "halt", policy="halt")  # the halt's message names it too
    b = batch(["x", "y", "z"], bad="y")
    with pytest.raises(lab.NonFiniteHalt, match="; not finite: y;"):
        with halting.step(1, b, keys=b["uid"]):
            loss_fn(model, b).backward()
        halting.optimizer_step(opt, loss_fn(model, b).detach(), replay=lambda b: loss_fn(model, b))


def test_the_phase_clock_counts_a_step_per_accumulated_micro_batches(tmp_path):
    """Five micro-batches, two a step: steps 1, 1, 2, 2, 3 (the last one shorter), three completed; a reader
    two batches ahead of the second micro-batch of step 3 reads step 4's batch (a stall verdict's "ahead")."""
    watch = lab.StallWatch(tmp_path, timeout_s=60)  # not started: its heartbeat alone
    seen = [watch.hb.step for _ in watch.data(range(5), accumulate=2)]
    assert seen == [1, 1, 2, 2, 3] and watch.hb.completed == 3 and watch.hb.phase == "epoch_end"
    seen = [(watch.hb.step, watch.hb.completed) for _ in watch.data(range(4), accumulate=2)]  # the next epoch
    assert seen == [(4, 3), (4, 3), (5, 4), (5, 4)] and watch.hb.completed == 5
    watch.hb.step, watch.hb.micro, watch.hb.ahead = 3, 1, 2
    watch.hb.enter("data")
    assert watch.hb.snapshot()["ahead"] == 1

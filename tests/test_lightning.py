"""The Lightning callback (``asrlab.lab.lightning``) on a LightningModule of the user's own, trained with
``Trainer(strategy="ddp")`` on two gloo processes: a finished run, a hang in one rank's data, a non-finite
step; each read back by ``asrlab doctor`` as any other run."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

# the runs import Lightning, not this module: each worker's collection spares its seconds of import
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="the lightning extra is not installed (pip install -e '.[lightning]')",
)

from asrlab.doctor import diagnose  # noqa: E402

LOOP = 'import math, os, sys, time\nimport torch\nimport lightning.pytorch as pl\nfrom asrlab.lab.lightning import AsrlabCallback\n\nFAULT = os.environ.get("FAULT", "")\n\nclass Clips(torch.utils.data.Dataset):\n    def __len__(self):\n        return 64\n    def __getitem__(self, i):\n        g = torch.Generator().manual_seed(i)\n        x = torch.randn(6, generator=g)\n        rank = int(os.environ.get("LOCAL_RANK", "0"))\n        if FAULT == "hang" and rank == 1 and i == sorted(range(1, 64, 2))[5]:\n            while True:\n                time.sleep(1)\n        if FAULT == "nan" and i == 12:\n            x = x * math.inf\n        return {"key": f"clip{i:02d}", "x": x, "y": torch.randn(1, generator=g)}\n\ndef collate(items):\n    return {"key": [b["key"] for b in items], "x": torch.stack([b["x"] for b in items]),\n            "y": torch.stack([b["y"] for b in items])}\n\nclass Net(pl.LightningModule):\n    def __init__(self):\n        super().__init__()\n        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))\n    def training_step(self, batch, idx):\n        return (self.net(batch["x"]) - batch["y"]).pow(2).mean()\n    def configure_optimizers(self):\n        return torch.optim.AdamW(self.parameters(), lr=1e-2)\n    def train_dataloader(self):\n        return torch.utils.data.DataLoader(Clips(), batch_size=4, collate_fn=collate, num_workers=1)\n\nif __name__ == "__main__":\n    torch.manual_seed(0)\n    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,\n                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,\n                         callbacks=[AsrlabCallback(sys.argv[1], stall_timeout_s=5)])\n    trainer.fit(Net())\n'


def fit(tmp_path, fault: str):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    exp = tmp_path / "exp"
    out = subprocess.run(
        [sys.executable, str(script), str(exp)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "FAULT": fault, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    return out, diagnose(exp)


def test_a_finished_lightning_run_trains_every_key_once(tmp_path):
    out, d = fit(tmp_path, "")
    assert out.returncode == 0, out.stderr[-3000:]
    assert d["verdict"] == "finished" and d["ok"], d["summary"]
    (epoch,) = d["coverage"]["epochs"]
    assert epoch["exactly_once"] and epoch["keys"] == 64
    assert [r["steps"] for r in d["steps"]["ranks"]] == [8, 8]


def test_a_hang_in_one_ranks_data_is_named(tmp_path):
    out, d = fit(tmp_path, "hang")
    assert out.returncode != 0
    assert d["verdict"] == "stalled", d["summary"]
    assert d["summary"].startswith("rank 1 has waited") and "for data at step 2" in d["summary"], d["summary"]
    assert "rank 0 is waiting in a collective" in d["summary"], d["summary"]  # DDP's, before its forward
    assert "worker pid " in d["summary"] and "at loop.py:" in d["summary"] and "in __getitem__" in d["summary"], d[
        "summary"
    ]  # the line of the user's dataset its worker is stuck at


def test_a_nonfinite_step_is_located_on_its_rank_and_skipped(tmp_path):
    out, d = fit(tmp_path, "nan")
    assert out.returncode == 0, out.stderr[-3000:]
    assert d["verdict"] == "finished", d["summary"]
    events = {e["rank"]: e for e in d["nonfinite"]["events"]}
    bad = next(e for e in events.values() if "clip12" in e["keys"])  # the batch with the inf frame
    assert bad["kind"] == "loss" and bad["cause"]["cause"] == "data_or_model" and bad["module"] == "model"
    # skipped on every rank: had its NaN gradients been applied, every later step would be NaN too
    assert {e["step"] for e in d["nonfinite"]["events"]} == {bad["step"]}
    others = [e for e in events.values() if e is not bad]
    assert all(e["cause"]["cause"] == "another_rank" for e in others)

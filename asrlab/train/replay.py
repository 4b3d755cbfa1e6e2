"""A non-finite step asrlab's trainer saved, run again in each precision with asrlab's own model and CTC loss.

The parts (:func:`asrlab.lab.replay_step`) replay any loop's step through the model and loss function the
loop gives; this is that call for the trainer's bundles, whose report names the model's config.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..lab import replay_step
from ..model import ConformerCTC, ModelConfig, mean_ctc_loss


def replay(path: str | Path, precisions=("fp32", "bf16", "fp16"), device="cpu") -> list[dict]:
    """:func:`asrlab.lab.replay_step` of a step asrlab's trainer saved in ``path`` (its model and CTC loss)."""
    meta = json.loads((Path(path) / "report.json").read_text())
    model = ConformerCTC(ModelConfig(**meta["model"]), meta["vocab_size"])

    def loss_fn(m, inputs):
        log_probs, out_lens = m(inputs["feats"], inputs["feat_lens"])
        return mean_ctc_loss(log_probs, out_lens, inputs["targets"], inputs["target_lens"])[0]

    return replay_step(path, model, loss_fn, precisions, device)


__all__ = ["replay"]

"""Trainer overhead: steps/s of asrlab's training step against a bare loop, side by side.

Same model, same initial weights, same in-memory batches; the bare loop does forward, CTC,
backward, clip and AdamW step only; the trainer adds everything it does per step (autocast
context, scaler bookkeeping, finite check, LR schedule, the all-ranks data check, the metrics
line). No checkpoints in either. Rounds alternate (bare, trainer, bare, ...) so drift in the
machine's speed hits both; the first step of each run is a warm-up, not timed; the median of
the per-round ratios is reported.

    .venv/bin/python benchmarks/trainer_overhead.py data/corpus/train/data.list [--steps 30] [--rounds 3]
"""

import argparse
import itertools
import statistics
import tempfile
import time

import torch

from asrlab.config import load_config
from asrlab.model import ConformerCTC, ctc_loss
from asrlab.lab.dist import DistInfo
from asrlab.train.trainer import Trainer


def bare_loop(cfg, vocab, batches, state):
    model = ConformerCTC(cfg.model, vocab)
    model.load_state_dict(state)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.optim.lr,
        betas=tuple(cfg.optim.betas),
        weight_decay=cfg.optim.weight_decay,
        fused=True,
    )  # as the trainer's
    t0 = None
    for b in batches:
        if t0 is None and b is batches[1]:
            t0 = time.perf_counter()  # the first step (allocations, warm-up) is not timed
        log_probs, out_lens = model(b["feats"], b["feat_lens"])
        loss_sum, _, mask = ctc_loss(log_probs, out_lens, b["targets"], b["target_lens"])
        (loss_sum / max(1, int(mask.sum()))).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (len(batches) - 1) / (time.perf_counter() - t0)


def trainer_loop(cfg, data, batches, state, exp):
    tr = Trainer(cfg, data, None, exp, DistInfo(0, 1, 0, torch.device("cpu"), None))
    tr.model.load_state_dict(state)
    tr.train_epoch(iter(batches[:1]))  # the first step is not timed, as above
    t0 = time.perf_counter()
    tr.train_epoch(iter(batches[1:]))
    rate = (len(batches) - 1) / (time.perf_counter() - t0)
    tr.close()
    return rate


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--config", default="tiny")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    cfg = load_config(a.config, ["train.progress=false", "data.num_workers=0"])
    with tempfile.TemporaryDirectory() as tmp:
        probe = Trainer(cfg, a.data, None, f"{tmp}/probe", DistInfo(0, 1, 0, torch.device("cpu"), None))
        batches = list(itertools.islice(iter(probe.loader), a.steps))
        vocab, state = len(probe.tok), {k: v.clone() for k, v in probe.model.state_dict().items()}
        probe.close()
        bare, ours = [], []
        for r in range(a.rounds):
            bare.append(bare_loop(cfg, vocab, batches, state))
            ours.append(trainer_loop(cfg, a.data, batches, state, f"{tmp}/exp{r}"))
            print(f"round {r + 1}: bare {bare[-1]:.3f} steps/s, trainer {ours[-1]:.3f} steps/s", flush=True)
    b, o = statistics.median(bare), statistics.median(ours)
    slower = statistics.median(1 - x / y for x, y in zip(ours, bare))
    print(
        f"median over {a.rounds} rounds of {a.steps} steps: bare {b:.3f} steps/s, trainer {o:.3f} steps/s; "
        f"median per-round slowdown of the trainer: {100 * slower:+.1f}%"
    )


if __name__ == "__main__":
    main()

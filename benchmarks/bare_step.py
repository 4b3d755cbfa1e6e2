"""The anchor: asrlab's training step beside a bare PyTorch loop, in one process, interleaved.

The same model, initial weights, in-memory batches (the loader's, fetched once), precision (autocast and,
for fp16, a GradScaler) and optimizer (AdamW, fused where PyTorch has it); the bare loop is what a person
writes: copy the batch to the device, forward, CTC, backward, clip, step, zero the gradients, and nothing
else. asrlab's step is its trainer's (``Trainer.train_epoch`` over the same batches), with all it does per
step: the heartbeat and step timer, the numerics guard (its finite check on the device, sampled statistics
with ``train.diagnostics_every``), the LR schedule, the metrics line; no checkpoints in either. Rounds
alternate (bare, asrlab, bare, ...) so the machine's drift hits both; each run's first step (allocations,
warm-up, compilation) is not timed; the median of the per-round ratios is reported. With ``--compile`` the
pair runs a second time with ``torch.compile`` of the model (the bare loop's own, and ``train.compile=true``).

    .venv/bin/python benchmarks/bare_step.py [LIST] [--config tiny] [--steps 30] [--rounds 5] [--compile]

Without LIST it synthesizes a small corpus (``--utts``) into a temporary folder. The last line reads
``asrlab step / bare step: R`` (the eager pair's median ratio of seconds per step).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch

from asrlab.config import load_config
from asrlab.lab.dist import DistInfo
from asrlab.lab.precision import choose_precision
from asrlab.model import ConformerCTC, ctc_loss
from asrlab.train.trainer import Trainer


def bare_loop(cfg, vocab, batches, state, device, compiled: bool) -> float:
    """Steps per second of a plain loop over ``batches`` (the first step untimed)."""
    model = ConformerCTC(cfg.model, vocab).to(device)
    model.load_state_dict(state)
    net = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.optim.lr,
        betas=tuple(cfg.optim.betas),
        weight_decay=cfg.optim.weight_decay,
        fused=device.type in ("cpu", "cuda"),
    )
    precision = choose_precision(cfg.train.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.scaler)
    cast = (
        contextlib.nullcontext
        if precision.dtype is None
        else lambda: torch.autocast(device.type, dtype=precision.dtype)
    )
    t0 = None
    for i, b in enumerate(batches):
        if i == 1:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()  # the first step (allocations, warm-up, compilation) is not timed
        feats, feat_lens = b["feats"].to(device, non_blocking=True), b["feat_lens"].to(device, non_blocking=True)
        targets, target_lens = b["targets"].to(device, non_blocking=True), b["target_lens"].to(device)
        with cast():
            log_probs, out_lens = net(feats, feat_lens)
        loss_sum, _, mask = ctc_loss(log_probs.float(), out_lens, targets, target_lens)
        scaler.scale(loss_sum / mask.sum().clamp(min=1)).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (len(batches) - 1) / (time.perf_counter() - t0)


def asrlab_loop(cfg, data, batches, state, exp, device) -> float:
    """Steps per second of asrlab's trainer over the same ``batches`` (the first step untimed)."""
    tr = Trainer(cfg, data, None, exp, DistInfo(0, 1, 0, device, None))
    tr.model.load_state_dict(state)
    tr.train_epoch(iter(batches[:1]))
    tr._settle()  # the first step read: the timed ones start from an idle device
    t0 = time.perf_counter()
    tr.train_epoch(iter(batches[1:]))
    tr._settle()  # the last step's check read: the device is past every timed step
    rate = (len(batches) - 1) / (time.perf_counter() - t0)
    tr.close()
    return rate


def pair(cfg, data, batches, vocab, state, device, rounds: int, tmp: str, label: str) -> float:
    bare, ours = [], []
    for r in range(rounds):
        bare.append(bare_loop(cfg, vocab, batches, state, device, cfg.train.compile))
        ours.append(asrlab_loop(cfg, data, batches, state, f"{tmp}/{label}{r}", device))
        print(f"{label} round {r + 1}: bare {bare[-1]:.3f} steps/s, asrlab {ours[-1]:.3f} steps/s", flush=True)
    ratio = statistics.median(b / o for b, o in zip(bare, ours))  # seconds per step: asrlab's over bare's
    print(
        f"{label}: median over {rounds} rounds of {len(batches) - 1} timed steps: bare {statistics.median(bare):.3f} "
        f"steps/s, asrlab {statistics.median(ours):.3f} steps/s; per round, asrlab's step / the bare step: "
        f"{ratio:.3f} (rounds {min(b / o for b, o in zip(bare, ours)):.3f} to {max(b / o for b, o in zip(bare, ours)):.3f})",
        flush=True,
    )
    return ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="?", help="a data.list; default: a small synthesized corpus")
    p.add_argument("--config", default=None, help="default: tiny on CPU, base on a GPU")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--utts", type=int, default=300, help="utterances to synthesize without LIST")
    p.add_argument("--compile", action="store_true", help="also the pair with torch.compile")
    p.add_argument("--set", nargs="*", default=[], help="more config overrides (key=value)")
    a = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = a.config or ("base" if device.type == "cuda" else "tiny")
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data
        if data is None:
            from asrlab.data.synth import synthesize_corpus

            synthesize_corpus(Path(tmp) / "corpus", utts=a.utts, progress=False)
            data = str(Path(tmp) / "corpus" / "train" / "data.list")
        overrides = ["train.progress=false", "data.num_workers=0", "train.stall_timeout_s=0", *a.set]
        cfg = load_config(config, overrides)
        probe = Trainer(cfg, data, None, f"{tmp}/probe", DistInfo(0, 1, 0, device, None))
        batches = list(itertools.islice(itertools.cycle(list(probe.loader)), a.steps + 1))
        vocab, state = len(probe.tok), {k: v.detach().clone() for k, v in probe.model.state_dict().items()}
        probe.close()
        print(
            f"{config} on {device.type} ({torch.get_num_threads()} threads), {cfg.train.precision} precision, "
            f"{len(batches) - 1} timed steps a run",
            flush=True,
        )
        ratios = {"eager": pair(cfg, data, batches, vocab, state, device, a.rounds, tmp, "eager")}
        if a.compile:
            compiled = load_config(config, [*overrides, "train.compile=true"])
            ratios["compiled"] = pair(compiled, data, batches, vocab, state, device, a.rounds, tmp, "compiled")
    if "compiled" in ratios:
        print(f"compiled asrlab step / bare compiled step: {ratios['compiled']:.3f}")
    print(f"asrlab step / bare step: {ratios['eager']:.3f}")


if __name__ == "__main__":
    main()

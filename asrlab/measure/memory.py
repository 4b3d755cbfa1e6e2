"""The largest batch that fits: ``max_frames_in_batch`` per utterance length, from measured peak memory.

A batch's memory grows with utterances x frames (activations) and, in attention, with frames squared,
so one frame budget cannot be right for short and long utterances alike: the budget that fits a batch
of 20 s utterances wastes the GPU on 2 s ones. As NeMo's OOMptimizer does, :func:`calibrate` runs real
training steps (forward, backward, optimizer) on synthetic batches on the GPU and, for each length in
a ladder, searches the most utterances of that length whose step's peak memory stays within the GPU's
memory less a margin. The result is a table ``[[up_to_frames, max_frames], ...]`` for
``data.max_frames_by_length`` (the loader cuts a batch by the limit of its longest utterance), and
what it measured, so the choice can be read and checked.

The search itself (:func:`search`) takes any ``fits(utts, frames) -> bool`` so it can be tested
without a GPU; :func:`step_fits` is the GPU's.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from ..config import Config
from ..errors import UsageError
from ..lab.precision import choose_precision
from ..model import ConformerCTC, mean_ctc_loss

log = logging.getLogger(__name__)


def ladder(longest: int, shortest: int = 100) -> list[int]:
    """Lengths (frames) to calibrate at: doubling from ``shortest`` up to and including ``longest``."""
    out, n = [], shortest
    while n < longest:
        out.append(n)
        n *= 2
    return out + [longest]


def search(fits: Callable[[int, int], bool], lengths: list[int], max_utts: int = 4096) -> list[dict]:
    """For each length, the most utterances of it that fit (doubling, then bisection): rows of
    ``{"frames", "utts", "max_frames"}``; ``utts`` 0 where not even one fits. Longer lengths never get
    more frames than shorter ones were given room for (a batch of longer utterances costs more per frame)."""
    rows, cap = [], max_utts
    for t in sorted(lengths):
        lo, hi = 0, 1
        while hi <= cap and fits(hi, t):  # lo fits, hi does not (or is past the cap)
            lo, hi = hi, hi * 2
        hi = min(hi, cap + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid, t) else (lo, mid)
        rows.append({"frames": t, "utts": lo, "max_frames": lo * t})
        cap = max(lo, 1)
    return rows


def table(rows: list[dict]) -> list[list[int]]:
    """``data.max_frames_by_length`` from :func:`search`'s rows: a batch whose longest utterance has at most
    ``up_to`` frames gets the frame budget measured at that length."""
    return [[r["frames"], r["max_frames"]] for r in rows if r["utts"] > 0]


def step_fits(cfg: Config, vocab: int, device: torch.device, budget_bytes: int) -> Callable[[int, int], bool]:
    """``fits(utts, frames)``: one training step of ``cfg``'s model, precision and optimizer on a
    synthetic batch peaks within ``budget_bytes`` of GPU memory (an out-of-memory error: it does not)."""
    model = ConformerCTC(cfg.model, vocab).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    dtype = choose_precision(cfg.train.precision, device).dtype
    mel = cfg.data.num_mel_bins

    def fits(utts: int, frames: int) -> bool:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            feats = torch.randn(utts, frames, mel, device=device)
            lens = torch.full((utts,), frames, device=device)
            targets = torch.randint(1, vocab, (utts, max(1, frames // 8)), device=device)
            target_lens = torch.full((utts,), targets.shape[1], device=device)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                log_probs, out_lens = model(feats, lens)
            mean_ctc_loss(log_probs, out_lens, targets, target_lens)[0].backward()
            opt.step()
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
        except torch.OutOfMemoryError:
            peak = None
        finally:
            opt.zero_grad(set_to_none=True)
        ok = peak is not None and peak <= budget_bytes
        log.debug("%d x %d frames: peak %s MiB -> %s", utts, frames, None if peak is None else peak >> 20, ok)
        return ok

    return fits


def calibrate(
    cfg: Config, vocab: int, longest_frames: int, margin: float = 0.1, device: torch.device | None = None
) -> dict:
    """Measure ``data.max_frames_by_length`` for ``cfg`` on the GPU: see the module docstring."""
    if not torch.cuda.is_available():
        raise UsageError(
            "calibrating the batch from memory needs a GPU, and there is none here; on CPU the "
            "batch is limited by step time, not memory: keep data.max_frames_in_batch (asrlab bench "
            "train measures it)"
        )
    if not 0.0 <= margin < 1.0:
        raise UsageError(f"the margin is a share of GPU memory, in [0, 1), not {margin}")
    device = device or torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    budget = int(total * (1 - margin))
    rows = search(step_fits(cfg, vocab, device, budget), ladder(longest_frames))
    return {
        "device": torch.cuda.get_device_name(device),
        "total_mib": total >> 20,
        "budget_mib": budget >> 20,
        "margin": margin,
        "precision": cfg.train.precision,
        "rows": rows,
        "max_frames_by_length": table(rows),
    }


__all__ = ["calibrate", "ladder", "search", "step_fits", "table"]

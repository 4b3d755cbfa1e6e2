"""The LR schedule and the training clock it can follow.

:class:`RunClock` counts a run's training seconds across its resumes against ``train.max_minutes``;
:func:`lr_lambda` is the multiplier of the peak LR per optimizer step (linear warm-up, then noam or
cosine decay, by steps or by the clock); :func:`decay_horizon` is the step the cosine decay ends at.
"""

from __future__ import annotations

import logging
import math
import time

from ..config import OptimConfig, TrainConfig

log = logging.getLogger(__name__)


class RunClock:
    """Training seconds of a run, summed over its resumes, against its budget (``train.max_minutes``).

    ``seen_s`` is the time the ranks agreed on at the last step (the slowest rank's); the LR
    schedule reads it through ``fraction()``, so every rank computes the same LR.
    """

    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self.before_s = 0.0  # trained by earlier processes of this run (from the checkpoint)
        self.t0 = time.perf_counter()
        self.seen_s = 0.0
        self.warm_end: float | None = None  # fraction() when warm-up ended

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return self.before_s + time.perf_counter() - self.t0

    def spent(self, seconds: float) -> bool:
        """``seconds`` of training are past the budget (never, without one)."""
        return self.budget_s > 0 and seconds > self.budget_s

    def fraction(self) -> float:
        """Share of the budget used, 0..1 (0 without a budget)."""
        return min(1.0, self.seen_s / self.budget_s) if self.budget_s > 0 else 0.0

    def state_dict(self) -> dict:
        return {"elapsed_s": self.elapsed(), "warm_end": self.warm_end}

    def load_state_dict(self, state: dict) -> None:
        self.before_s = self.seen_s = float(state["elapsed_s"])
        self.warm_end = state["warm_end"]
        self.start()


def lr_lambda(o: OptimConfig, max_steps: int, clock: RunClock | None = None):
    """Multiplier of the peak LR at optimizer step ``s``: linear warm-up, then the configured decay.

    Cosine decay runs to ``min_lr`` at ``max_steps``; with ``optim.decay_by_clock`` and a time budget
    (``clock``) it follows whichever is further along, steps or training time, so a run the clock
    stops has decayed too.
    """
    warm = max(1, o.warmup_steps)

    def f(s: int) -> float:
        s = s + 1
        if s <= warm:
            return s / warm
        if o.decay == "noam":  # WeNet's WarmupLR
            return (warm / s) ** 0.5
        timed = o.decay_by_clock and clock is not None and clock.budget_s > 0
        if o.decay == "cosine" and (max_steps > warm or timed):
            t = (s - warm) / (max_steps - warm) if max_steps > warm else 0.0
            if timed:
                if clock.warm_end is None:
                    clock.warm_end = clock.fraction()
                done = clock.warm_end
                t = max(t, (clock.fraction() - done) / (1 - done) if done < 1 else 1.0)
            t = min(1.0, t)
            floor = o.min_lr / o.lr
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
        return 1.0

    return f


def decay_horizon(o: OptimConfig, t: TrainConfig, epoch_batches) -> int:
    """Optimizer steps the cosine decay spans: ``t.max_steps`` (0: none), and with ``o.decay_by_clock``
    also ``t.max_epochs`` times an epoch's steps, ``epoch_batches()`` (the fewest batches any rank gets in
    an epoch) over ``o.accum_steps``, whichever is smaller. Without the epochs, a run that a fast machine
    ends by its epochs before its clock would stop with the LR still high."""
    if not (o.decay == "cosine" and o.decay_by_clock and t.max_epochs > 0):
        return t.max_steps
    per_epoch = epoch_batches() // o.accum_steps
    horizon = min(t.max_steps, t.max_epochs * per_epoch) if t.max_steps else t.max_epochs * per_epoch
    log.info(
        "LR: cosine decay to min_lr by step %d (max_steps %d; %d epochs of ~%d steps) or by the %.1f-min "
        "clock, whichever comes first",
        horizon,
        t.max_steps,
        t.max_epochs,
        per_epoch,
        t.max_minutes,
    )
    return horizon


__all__ = ["RunClock", "decay_horizon", "lr_lambda"]

"""asrlab's diagnostics for any PyTorch training loop: the parts asrlab's own trainer is made of.

A plain DDP loop gets them with a few added lines (``examples/lab_loop.py`` next to ``examples/bare_loop.py``)::

    from asrlab import lab

    watch = lab.StallWatch(exp, timeout_s=60).start()                     # hangs: verdict + stacks
    guard = lab.NumericsGuard(model, exp, every=50, policy="skip")        # NaN/inf: module + utterances
    state = lab.RunState(exp, model, opt, scaler, loader=sampler)         # exact resume + ledger
    start = (state.load() or {"step": 0})["step"]
    for batch in watch.data(lab.UnevenGuard(loader)):                     # uneven data: all stop together
        with guard.step(step, batch):
            loss = loss_fn(model, batch); scaler.scale(loss).backward()
        guard.optimizer_step(opt, loss, scaler, replay=lambda: loss_fn(model, batch))
        state.record(step, epoch, batch["keys"])

Then ``asrlab doctor EXP`` reads what they wrote, as it reads a run of ``asrlab train``.

``StallWatch``     heartbeat phases + a watchdog on every rank (:mod:`asrlab.lab.stall.watch`; the thread
                   :mod:`~asrlab.lab.stall.watchdog`, its verdict and report :mod:`~asrlab.lab.stall.verdict`,
                   :mod:`~asrlab.lab.stall.report`)
``UnevenGuard``    every rank gets the same number of batches (:mod:`asrlab.lab.uneven`)
``NumericsGuard``  sampled module statistics, the first non-finite module, replay bundle, skip/rollback/halt
                   (:mod:`asrlab.lab.numerics.guard`; replays: :func:`asrlab.lab.numerics.stats.replay_step`)
``RunState``       atomic checkpoints of everything incl. RNGs and loader position, and the ledger
                   (:mod:`asrlab.lab.state.run_state`); ``coverage_report`` proves exactly-once per epoch
``StepTimer``      data wait vs compute per step; ``GpuSampler``/``CpuSampler`` (:mod:`asrlab.lab.timing`)
``MetricsWriter``  one JSON line per step in ``EXP/metrics/rank{R}.jsonl`` (what ``asrlab doctor`` reads)
"""

from __future__ import annotations

from pathlib import Path

from .numerics.stats import replay_step
from .timing import CpuSampler, GpuSampler, StepTimer
from .dist import cpu_group, world
from .stall.errors import record_rank_error
from .state.ledger import coverage_report, read_ledger
from .metrics import MetricsWriter
from .numerics.guard import NonFiniteHalt, NumericsGuard, StepCheck
from .stall.watch import StallWatch
from .state.run_state import RunState
from .uneven import UnevenGuard


def metrics(exp) -> MetricsWriter:
    """This rank's metrics writer (``EXP/metrics/rank{R}.jsonl``)."""
    return MetricsWriter(Path(exp), f"rank{world()[0]}")


__all__ = ["CpuSampler", "GpuSampler", "MetricsWriter", "NonFiniteHalt", "NumericsGuard", "RunState", "StallWatch",
           "StepCheck", "StepTimer", "UnevenGuard", "coverage_report", "cpu_group", "metrics", "read_ledger",
           "record_rank_error", "replay_step"]

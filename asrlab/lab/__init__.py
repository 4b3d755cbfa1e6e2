"""asrlab's diagnostics for any PyTorch training loop: the parts asrlab's own trainer is made of.

A plain DDP loop gets them with the lines the README shows (``examples/bare_loop.py`` becomes
``examples/lab_loop.py``; a test holds the three to the same lines)::

    from asrlab import lab
    watch = lab.StallWatch(exp, timeout_s=20).start()       # a hang anywhere, an error on any rank: verdict + stacks
    guard = lab.NumericsGuard(model.module, exp, every=25, watch=watch)  # non-finite steps: skipped, located
    state = lab.RunState(exp, model, opt, scaler)           # checkpoints with every RNG (fp32: scaler None); a ledger
    r = state.load() or {"step": 0, "epoch": 0}
    ...
            for batch in watch.data(lab.UnevenGuard(loader, state=state)):  # the state keeps its place
                with guard.step(step + 1, batch):
                    ...                                     # forward under your autocast, scaler.scale(loss).backward()
                guard.optimizer_step(opt, loss, scaler, replay=lambda: loss_fn(model.module, batch))
                state.record(step, epoch, batch["keys"])
                if step % 10 == 0:
                    state.save(step, epoch)                 # a collective: every rank calls it

Then ``asrlab doctor EXP`` reads what they wrote, as it reads a run of ``asrlab train``.

``StallWatch``     heartbeat phases + a watchdog on every rank (:mod:`asrlab.lab.stall.watch`; the thread
                   :mod:`~asrlab.lab.stall.watchdog`, its verdict and report :mod:`~asrlab.lab.stall.verdict`,
                   :mod:`~asrlab.lab.stall.report`)
``UnevenGuard``    every rank gets the same number of batches (:mod:`asrlab.lab.uneven`)
``NumericsGuard``  sampled module statistics, the first non-finite module, replay bundle, skip/rollback/halt
                   (:mod:`asrlab.lab.numerics.guard`; replays: :func:`asrlab.lab.numerics.stats.replay_step`)
``RunState``       atomic checkpoints of everything incl. RNGs and loader position, and the ledger
                   (:mod:`asrlab.lab.state.run_state`); ``coverage_report`` proves exactly-once per epoch
``Resumable``      a plain ``DataLoader``'s place in its epoch, for ``RunState``'s exact resume
                   (:mod:`asrlab.lab.state.position`)
``StepTimer``      data wait vs compute per step; ``GpuSampler``/``CpuSampler`` (:mod:`asrlab.lab.timing`)
``MetricsWriter``  one JSON line per step in ``EXP/metrics/rank{R}.jsonl`` (what ``asrlab doctor`` reads)

A loop that keeps its own launcher, heartbeat and watchdog (asrlab's trainer is one) builds them from the
same face: ``Heartbeat`` (``say_compiles``: torch.compile's compilations as its phase), ``Watchdog`` and
``watching``, ``tell`` (the other parts' phases told to
its heartbeat), ``ProgressClock``, ``write_report``, ``first_rank_error``, the stop requests of
:mod:`asrlab.lab.stop` and the parent-death helpers, ``choose_precision``; ``dist`` and ``layout`` are its
process-group and run-folder modules.
"""

from __future__ import annotations

import importlib
from pathlib import Path

# Each name from its module when first used: a process that needs one part (the launcher reads heartbeats
# and rank errors) does not import torch for the others.
_HOMES = {
    "replay_step": "numerics.stats",
    "CpuSampler": "timing",
    "GpuSampler": "timing",
    "StepTimer": "timing",
    "cpu_group": "dist",
    "world": "dist",
    "record_rank_error": "stall.errors",
    "coverage_report": "state.ledger",
    "read_ledger": "state.ledger",
    "MetricsWriter": "metrics",
    "NonFiniteHalt": "numerics.guard",
    "NumericsGuard": "numerics.guard",
    "StepCheck": "numerics.checks",
    "StallWatch": "stall.watch",
    "RunState": "state.run_state",
    "UnevenGuard": "uneven",
    "Resumable": "state.position",
}
# A loop that keeps its own launcher, heartbeat and watchdog, as asrlab's trainer does, builds them from these
_HOMES.update(
    {
        "Heartbeat": "stall.heartbeat",
        "read_heartbeats": "stall.heartbeat",
        "say_compiles": "stall.heartbeat",
        "Watchdog": "stall.watchdog",
        "watching": "stall.watchdog",
        "ProgressClock": "stall.watchdog",
        "STALL_EXIT": "stall.watchdog",
        "COLLECT_S": "stall.watchdog",
        "tell": "stall.watch",
        "write_report": "stall.report",
        "first_rank_error": "stall.errors",
        "format_rank_error": "stall.errors",
        "STOP_FILE": "stop",
        "request_stop": "stop",
        "clear_stop": "stop",
        "stop_requested": "stop",
        "stop_signal": "stop",
        "stopped_by": "stop",
        "stop_on_signals": "stop",
        "PARENT_GONE": "stop",
        "end_with_parent": "stop",
        "own_session_ending_with_parent": "stop",
        "workers_ignore_stop_signals": "stop",
        "after_join": "uneven",
        "HALT_EXIT": "numerics.guard",
        "choose_precision": "precision",
        "cpu_fp16_kernels": "precision",
        "PARTS": "timing",
        "trace": "timing",
    }
)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'asrlab.lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value
    return value


def metrics(exp):
    """This rank's metrics writer (``EXP/metrics/rank{R}.jsonl``)."""
    return __getattr__("MetricsWriter")(Path(exp), f"rank{__getattr__('world')()[0]}")


def __dir__():
    return sorted(set(globals()) | set(_HOMES))


__all__ = sorted({*_HOMES, "metrics"})

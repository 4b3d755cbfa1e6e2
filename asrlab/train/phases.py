"""What a rank is doing within a step, said once for two readers: its heartbeat (what the stall watch
reads: the phase and since when) and its step timer (what the metrics get: seconds per part).

The other parts (:class:`asrlab.lab.UnevenGuard`'s data check, :class:`asrlab.lab.NumericsGuard`'s optimizer
step) are handed the step phases as their watch and name their phases to :meth:`StepPhases.announced`.
"""

from __future__ import annotations

import time

import torch

from ..lab import Heartbeat, StepTimer

PART_OF_PHASE = {"sync": "comm", "allreduce": "comm"}  # heartbeat phase -> step-timer part


class StepPhases:
    """``start()`` a step, ``enter(phase)`` at each boundary, ``stop()`` -> the step timer's parts (s)."""

    def __init__(self, hb: Heartbeat, device: torch.device):
        self.hb, self.timer = hb, StepTimer(device)
        self.cpu = device.type == "cpu"
        self._last_bucket_t = 0.0  # perf_counter() of the last gradient bucket's all-reduce launch

    def start(self) -> None:
        self.timer.start("data")

    def enter(self, phase: str, step: int | None = None) -> None:
        self.hb.enter(phase, step)
        self.timer.mark(PART_OF_PHASE.get(phase, phase))

    def announced(self, phase: str, step: int | None = None) -> None:
        """A phase a part names (:func:`asrlab.lab.tell`); one the trainer is in already (the numerics
        guard's optimizer step) is not entered twice."""
        if phase != self.hb.phase:
            self.enter(phase, step)

    def stop(self, lazy: bool = False):
        """The step timer's parts, or with ``lazy`` a callable that reads them (see :meth:`StepTimer.stop`)."""
        return self.timer.stop(lazy)

    def backward(self) -> None:
        self.enter("backward")
        self._last_bucket_t = 0.0

    def backward_done(self) -> None:
        """gloo's all-reduces overlap backward: what is left after the last bucket's launch is exposed
        communication (on a GPU the all-reduce gets its own phase, see the trainer)."""
        if self.cpu and self._last_bucket_t:
            self.timer.mark("comm", at=self._last_bucket_t)

    def ddp_hook(self):
        """DDP's own all-reduce, entering its phase (a rank that hangs here waits for the others) and
        noting when the last bucket was launched (for :meth:`backward_done`)."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def hook(state, bucket):
            self._last_bucket_t = time.perf_counter()
            if self.hb.phase == "backward":
                self.hb.enter("allreduce")
            return allreduce_hook(state, bucket)

        return hook


__all__ = ["PART_OF_PHASE", "StepPhases"]

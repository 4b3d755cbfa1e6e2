"""What the numerics guard finds at a step (:class:`StepCheck`) and keeps of it until then (:class:`Taken`):
the step's loss, gradient norm and loss scale, read from the device without a sync of their own."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..stall.watch import announce


@dataclass
class StepCheck:
    """What :meth:`NumericsGuard.optimizer_step` found. ``kind``: None (finite), ``"scaler"`` (fp16
    gradients overflowed at this loss scale: routine), ``"loss"`` (this rank's loss was not finite) or
    ``"grad"`` (gradients not finite without loss scaling). ``stepped``: whether the optimizer stepped
    (the gradients were finite). ``action``: step / skip / rollback / halt (with other ranks, a rollback
    or halt answers the previous step's findings). ``skipped``: steps skipped so far; ``rollbacks``:
    those asked for before this step."""

    loss: float
    grad_norm: float
    loss_scale: float
    kind: str | None
    action: str
    skipped: int
    rollbacks: int = 0
    stepped: bool = True
    step: int = 0  # the step the check is of (a deferred check arrives with the next step)

    def metrics(self) -> dict:
        return {
            "loss": self.loss if math.isfinite(self.loss) else None,
            "grad_norm": self.grad_norm if math.isfinite(self.grad_norm) else None,
            "loss_scale": self.loss_scale,
            "skipped": self.skipped,
            "nonfinite": self.kind,
        }


@dataclass
class Taken:
    """A step as the guard keeps it until its check is read: what a replay needs, and its device values
    (loss, gradient norm, loss scale) on their way to the host."""

    step: int
    batch: object
    rng: dict | None
    dtype: torch.dtype | None
    replay: Callable | list | None
    scaled: bool
    values: torch.Tensor | None = None
    ready: object = None  # a CUDA event recorded after the copy; None: on the host already
    extra: dict = field(default_factory=dict)
    ids: list = field(default_factory=list)  # the step's utterance ids, every micro-batch's
    micro: list = field(default_factory=list)  # its micro-batches (:class:`.utterances.Micro`)

    def read(self) -> tuple[float, float, float]:
        if self.ready is not None and not self.ready.query():
            announce("sync", self.step)  # the host waits on the device: a stall here is the device's
            self.ready.synchronize()
            announce("optimizer", self.step)
        loss, norm, scale = self.values.tolist()  # one read of all three, never a sync of its own
        return loss, norm, scale


def nonfinite_kind(loss_ok: bool, grad_ok: bool, scaled: bool) -> str | None:
    """None when both are finite; ``"loss"`` when a rank's loss is not; else ``"scaler"`` with loss
    scaling (the scaler skips and lowers its scale), ``"grad"`` without."""
    if loss_ok and grad_ok:
        return None
    if not loss_ok:
        return "loss"
    return "scaler" if scaled else "grad"


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The gradients' L2 norm in one fused pass (without get_total_norm's per-tensor grouping); torch's
    own where they lie on several devices."""
    try:
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    except RuntimeError:
        return torch.nn.utils.get_total_norm(grads)

"""What the numerics guard finds at a step (:class:`StepCheck`): the step's loss, gradient norm and loss scale,
and which of them were not finite; the gradients' norm in one fused pass."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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

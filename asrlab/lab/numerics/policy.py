"""What a non-finite step leads to (skip, rollback, halt), decided alike on every rank.

Alone, a rank answers its own finding at once. With other ranks, each rank sends its finding without
waiting (one tiny all-reduce on the gloo control group) and reads every rank's one step later, when they
are long in: so every rank acts alike, one step late, and no step waits on an agreement. ``skip`` needs
no agreement at all: the step itself was decided alike (DDP's gradients are the same on every rank).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from .. import dist, layout
from ..stall.watch import tell
from .utterances import ids_text

log = logging.getLogger(__name__)

POLICIES = ("skip", "rollback", "halt")


class Policy:
    """``name``: one of :data:`POLICIES`; after ``max_rollbacks`` rollbacks a rollback becomes a halt.
    ``agree``: answer with every rank, one step late (False where ranks do not step together)."""

    def __init__(self, name: str, max_rollbacks: int, group, agree: bool, exp: Path, watch=lambda: None):
        if name not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {name!r}")
        self.name, self.max_rollbacks, self.group, self.agree, self.exp = name, max_rollbacks, group, agree, exp
        self.rank, self.world_size = dist.world()
        self.rollbacks = 0
        self.watch = watch  # the guard's stall watch, read when told (a guard may be handed one later)
        self._sent = None  # (this rank's finding at the last step, its all-reduce under way)

    def act(self, found: bool, step: int) -> str:
        """The action at this step: for this step's own finding alone, else for every rank's at the step before."""
        if self.group is None or not self.agree:
            return self._next() if found else "step"
        if self.name == "skip":
            return "step"
        import torch.distributed as tdist

        found_before = False
        if self._sent is not None:
            flag, work = self._sent
            waits = not work.is_completed()
            if waits:
                tell(self.watch(), "sync", step)
            work.wait()  # also when complete: it hands the result over (and any error)
            if waits:
                tell(self.watch(), "optimizer", step)
            found_before = bool(flag.item())
        action = self._next() if found_before else "step"
        self._sent = None
        if action == "step":  # after a rollback or a halt, the steps before it are void
            flag = torch.tensor([int(found)], dtype=torch.int32)
            self._sent = flag, tdist.all_reduce(flag, op=tdist.ReduceOp.MAX, group=self.group, async_op=True)
        return action

    def _next(self) -> str:
        if self.name == "rollback" and self.rollbacks < self.max_rollbacks:
            self.rollbacks += 1
            return "rollback"
        return "step" if self.name == "skip" else "halt"  # skip: the non-finite step was skipped; go on

    def halt_message(self, located: dict | None, step: int, loss: float, grad_norm: float) -> str:
        """The halt, said alike on every rank: where the rank that located the step found it (ranks that
        agree on finiteness halt at the same step, so they can share it); rank 0 writes ``halt.json``."""
        m = located or {}
        if self.group is not None and self.agree:
            found: list = [None] * self.world_size
            torch.distributed.all_gather_object(found, m, group=self.group)
            m = next((x for x in found if x.get("module")), next((x for x in found if x), {}))
        why = f"{self.rollbacks} rollbacks used up" if self.name == "rollback" else "policy halt"
        at = f" after step {m['step']}" if m.get("step") not in (None, step) else ""
        msg = (
            f"halted at step {step}{at} ({why}): loss {m.get('loss', loss)}, grad norm "
            f"{m.get('grad_norm', grad_norm)}; rank {m.get('rank', '?')}: first non-finite value in "
            f"{m.get('where', '?')}"
            + (f"; not finite: {ids_text(m['utterances'])}" if m.get("utterances") else "")
            + (f"; cause: {m['cause']['text']}" if m.get("cause") else "")
            + f"; weights and batch in {m.get('saved', '-')}"
        )
        if self.rank == 0:
            path = Path(self.exp) / layout.NONFINITE / layout.HALT
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"message": msg, "rollbacks": self.rollbacks, **m}, indent=2, default=str))
        log.error("%s", msg)
        return msg

    def close(self) -> None:
        """The agreement under way waited for (see :func:`asrlab.lab.dist.teardown`) and the group let go."""
        if self._sent is not None:
            dist.settle(self._sent[1])
            self._sent = None
        self.group = None


__all__ = ["POLICIES", "Policy"]

"""Non-finite steps in any training loop: find where, keep the step, apply a policy.

:class:`NumericsGuard` wraps what a loop already does around its optimizer::

    guard = NumericsGuard(model, "exp", every=100, policy="skip")
    for step, batch in enumerate(loader, 1):
        with guard.step(step, batch):                  # sampled steps record every module
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model, batch)
            scaler.scale(loss).backward()
        check = guard.optimizer_step(opt, loss, scaler, replay=lambda: loss_fn(model, batch))

``optimizer_step`` unscales, clips (``clip``; 0: measure only) and steps the optimizer through the
user's own ``GradScaler`` (or directly) when the gradients are finite. Under DDP the gradients are
all-reduced, the same on every rank, so every rank takes the same decision with no collective of its
own. An overflow the scaler handles (fp16 gradients inf at this loss scale, the loss finite) is
routine: the scaler skips and lowers its scale. A rank's non-finite loss, or non-finite gradients
without a scaler, is not: that rank replays the step once with every module hooked (the weights
before the step, the RNG state it started from, so dropout draws the same masks) to name the first
non-finite module and direction, and saves it as a bundle under ``EXP/nonfinite/`` (weights, batch,
keys, RNG) that :func:`asrlab.lab.numerics.stats.replay_step` runs again in fp32, bf16 and fp16. Then the
policy: ``skip`` goes on, ``halt`` raises :class:`NonFiniteHalt` (after ``EXP/nonfinite/halt.json``,
which ``asrlab doctor`` reads), ``rollback`` returns ``check.action == "rollback"`` (the loop reloads
its last state). With other ranks, rollback and halt answer at the next step, on every rank alike:
each rank sends what it found (one tiny all-reduce on the gloo control group, not waited for) and
reads every rank's one step later; ``skip`` needs no agreement at all. Sampled steps append fp16
headroom traces to ``EXP/diagnostics/rank{R}.jsonl``.

``optimizer_step(..., defer=True)`` never waits on the device: loss, gradient norm and loss scale
stay there, the step is skipped on the device through the fused optimizer's ``found_inf`` (or the
scaler's), and the values are copied to the host without waiting. The call returns the previous
deferred step's :class:`StepCheck`, read when the device is long past it (None at the first);
``flush()`` returns the last one. A non-finite step is located when it is read, from its own batch
and RNG state, before the next step is taken (a skipped step leaves the weights as they were); the
policy answers then, one read later with other ranks. It needs an optimizer that takes ``found_inf``
(``fused=True`` Adam, AdamW, SGD).

With gradient accumulation the step is the optimizer step: ``guard.step(step, batch)`` wraps each
micro-batch's forward and backward with the same step number, ``optimizer_step`` comes once, with the
step's loss (the micro-batches' losses summed, or their list), and ``replay=lambda batch: ...`` runs
each micro-batch again, in order, until one shows the first non-finite value (a list: one callable per
micro-batch). A callable may return ``(loss, inputs)``: the tensors (and ``"keys"``) to keep in the
bundle instead of the batch given to ``step()`` (the inputs the model saw). Every non-finite step is
logged with the utterances that were not finite (:mod:`.utterances`, :mod:`.events`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .. import layout
from .cause import classify, ctc_calls, ctc_problems
from .stats import Diagnostics, TraceWriter, describe, locate, save_bundle, tightest
from .. import dist
from ..keys import KeyFinder, KeysSpec, find_keys
from .events import NonFiniteLog
from .utterances import (
    REPLAY_STEPS,
    Micro,
    alone,
    from_losses,
    ids_text,
    replay_parts,
    rng_state,
    set_rng_state,
    takes_batch,
    tensors_of,
)
from ..stall.watch import tell
from .checks import StepCheck, nonfinite_kind, total_norm
from .policy import POLICIES, Policy

log = logging.getLogger(__name__)

HALT_EXIT = 4  # exit code of ``asrlab train`` halted by a non-finite step (policy halt, or rollbacks used up)


class NonFiniteHalt(RuntimeError):
    """Training stopped at a non-finite step (policy ``halt``, or ``rollback`` after ``max_rollbacks``):
    raised by ``optimizer_step`` on every rank at the same step, after ``EXP/nonfinite/halt.json`` is
    written. The message says where it was and what was saved; ``check``: the step's :class:`StepCheck`
    (the step is complete: the loop may still log it). Uncaught, the rank exits 1 with its traceback, as
    any exception; ``sys.exit(e.exit_code)`` in an ``except lab.NonFiniteHalt as e`` exits as
    ``asrlab train`` does (:data:`HALT_EXIT`), and a job's scheduler can tell a halt from a crash."""

    exit_code = HALT_EXIT

    def __init__(self, message: str, check: "StepCheck | None" = None):
        super().__init__(message)
        self.check = check


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
    watch: object = None  # the stall watch the guard was handed

    def read(self) -> tuple[float, float, float]:
        if self.ready is not None and not self.ready.query():
            tell(self.watch, "sync", self.step)  # the host waits on the device: a stall here is the device's
            self.ready.synchronize()
            tell(self.watch, "optimizer", self.step)
        loss, norm, scale = self.values.tolist()  # one read of all three, never a sync of its own
        return loss, norm, scale


class NumericsGuard:
    """See the module docstring. ``every``: record module statistics every ``every`` steps (0: never);
    ``max_rollbacks``: after this many, a rollback becomes a halt. ``agree``: apply the policy with
    every rank, one step late (False where ranks do not step together: DDP's Join shadows only its own
    all-reduces; each rank then answers its own findings at once).
    ``meta``: extra keys for each bundle's report; a callable value is read when a bundle is saved.
    ``keys``: where a batch carries its utterance ids (a field's name or a function ``batch -> ids``;
    default: the common names, see :mod:`asrlab.lab.keys`), for the reports and the bundle. ``watch``: the stall
    watch the loop runs under (:class:`~asrlab.lab.StallWatch`), told when the guard waits on the device or on the
    other ranks."""

    def __init__(
        self,
        model: nn.Module,
        exp: str | Path,
        every: int = 0,
        policy: str = "skip",
        max_rollbacks: int = 3,
        group=None,
        meta: dict | None = None,
        agree: bool = True,
        keys: KeysSpec = None,
        watch=None,
    ):
        self.model, self.exp, self.watch = model, Path(exp), watch
        self.rank, self.world_size = dist.world()
        group = group if group is not None or self.world_size == 1 else dist.cpu_group()
        self.policy = Policy(policy, max_rollbacks, group, agree, self.exp, lambda: self.watch)
        self.diag = Diagnostics(model, every=every)
        self.traces = TraceWriter(self.exp, self.rank) if every else None
        self.meta = meta or {}
        self._find_keys, self._ids, self._micro = KeyFinder(keys, "NumericsGuard"), [], []
        self.log, self._by_utterance = NonFiniteLog(self.exp, self.rank), 0
        self.skipped = 0
        self.located: dict | None = None
        self._pending: Taken | None = None  # the deferred step whose check is not read yet
        self.replaying: int | None = None  # the step a replay runs again, while it runs
        self._step, self._batch, self._rng, self._sampled, self._dtype = 0, None, None, False, None
        self._device = next(model.parameters()).device
        model.register_forward_pre_hook(self._note_autocast)

    @property
    def sampling(self) -> bool:
        """This step records module statistics (hooks on every module): a compiled model runs it eagerly."""
        return self._sampled

    @property
    def rollbacks(self) -> int:
        """Rollbacks so far (a resumed run sets the count it had)."""
        return self.policy.rollbacks

    @rollbacks.setter
    def rollbacks(self, n: int) -> None:
        self.policy.rollbacks = n

    @contextlib.contextmanager
    def step(self, step: int, batch=None, keys=None):
        """Around a step's forward and backward (with gradient accumulation, each micro-batch's, all with the
        optimizer step's number): remembers the batch, its utterance ids (``keys``, else found in the batch),
        the RNG state and the autocast the forward ran under, for a replay that fails the same way; records
        module statistics on sampled steps."""
        rng = rng_state(self._device)
        ids = [str(k) for k in keys] if keys is not None else self._find_keys(batch)
        if not self._micro or step != self._step:  # a new optimizer step, else its next micro-batch
            self._micro, self._rng, self._dtype, self._ids = [], rng, None, []
        self._step, self._batch = step, batch
        self._micro.append(Micro(batch, ids, rng))
        self._ids = self._ids + ids
        self._sampled = self.diag.due(step)
        with self.diag.recording(keep=len(self._micro) > 1) if self._sampled else contextlib.nullcontext():
            yield self

    def utterance_losses(self, losses: torch.Tensor) -> None:
        """Inside ``step()``: this micro-batch's loss per utterance (in the order of its ids), where the loop
        has it (``reduction="none"``). Read only when the step is not finite, to name the utterances that
        were not; nothing is read from the device otherwise."""
        if self._micro:
            self._micro[-1].losses = losses.detach()

    def _note_autocast(self, module, args) -> None:
        """Forward pre-hook: the autocast dtype the loop's forward runs under (None: none)."""
        kind = self._device.type
        self._dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None

    def autocast(self):
        """The autocast the step being replayed ran under (none in the fp32 check of a replay): for a replay
        that sets its own autocast inside, as asrlab's trainer does around its model."""
        if self._dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self._device.type, dtype=self._dtype)

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        loss: torch.Tensor,
        scaler: torch.amp.GradScaler | None = None,
        clip: float = 0.0,
        replay: Callable | list[Callable] | None = None,
        defer: bool = False,
    ) -> StepCheck | None:
        """Unscale, clip, step or skip, locate, apply the policy (see the module docstring).
        ``defer``: the previous deferred step's check (None at the first), nothing read from the device."""
        tell(self.watch, "optimizer", self._step)
        if isinstance(loss, (list, tuple)):  # the micro-batches' losses: the step's is their sum
            loss = torch.stack([x.detach().float().reshape(()) for x in loss]).sum()
        scaled = scaler is not None and scaler.is_enabled()
        taken = Taken(
            self._step, self._batch, self._rng, self._dtype, replay, scaled, ids=self._ids, micro=self._micro,
            watch=self.watch,
        )  # fmt: skip
        self._micro = []
        if not defer:
            return self._eager_step(optimizer, loss, scaler, clip, taken)
        if not getattr(optimizer, "_step_supports_amp_scaling", False):
            raise ValueError(
                "optimizer_step(defer=True) needs an optimizer that skips a step on the device "
                "(found_inf): torch.optim.Adam, AdamW or SGD with fused=True"
            )
        before = self._pending
        self._pending = None
        check = self._finish(before) if before is not None else None  # may raise the halt it answers
        if check is not None and check.action == "rollback":  # this step is void: the loop reloads
            optimizer.zero_grad(set_to_none=True)
            return check
        norm, scale = self._measure(optimizer, scaler, clip, scaled)
        if scaled:
            scaler.step(optimizer)  # fused: the scaler hands its found_inf to the optimizer, no host read
        else:
            optimizer.grad_scale, optimizer.found_inf = None, (~torch.isfinite(norm)).to(torch.float32)
            try:
                optimizer.step()
            finally:
                del optimizer.grad_scale, optimizer.found_inf
        self._keep(taken, loss, norm, scale, scaler, optimizer, scaled)
        self._pending = taken
        return check

    def flush(self) -> StepCheck | None:
        """The check of the last deferred step (waits for it); None when none is pending."""
        before, self._pending = self._pending, None
        return self._finish(before) if before is not None else None

    def _measure(self, optimizer, scaler, clip: float, scaled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Unscaled gradients' norm (clipped to ``clip`` when > 0) and the step's loss scale, on the device."""
        if scaled:
            scaler.unscale_(optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        grads = [p.grad for p in params]
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
        else:  # measure only: no pass that multiplies every gradient by one
            norm = total_norm(grads) if grads else torch.zeros((), device=self._device)
        scale = scaler._get_scale_async().detach().clone() if scaled else None  # this step's: update() comes later
        return norm, scale

    def _keep(self, taken: Taken, loss, norm, scale, scaler, optimizer, scaled: bool) -> None:
        """The step's end: scale updated, gradients dropped, values sent to the host without waiting."""
        if scaled:
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
        values = torch.stack(
            [
                loss.detach().float().reshape(()),
                norm.detach().float().reshape(()),
                scale.float().reshape(()) if scale is not None else torch.ones((), device=norm.device),
            ]
        )
        if values.device.type == "cuda":
            taken.values = values.to("cpu", non_blocking=True)  # pinned: copied as the stream gets there
            taken.ready = torch.cuda.Event()
            taken.ready.record()
        else:
            taken.values = values
        if self._sampled and self.traces is not None:  # sampled steps read their statistics (a sync, by choice)
            taken.extra["summary"] = self.diag.summary()

    def _eager_step(self, optimizer, loss, scaler, clip: float, taken: Taken) -> StepCheck:
        """The step decided on the host: read, located before the step (the weights it started from), then stepped."""
        norm, scale = self._measure(optimizer, scaler, clip, taken.scaled)
        loss_value, grad_norm = float(loss.detach()), float(norm)
        kind = nonfinite_kind(math.isfinite(loss_value), math.isfinite(grad_norm), taken.scaled)
        if kind in ("loss", "grad") and self.located is None:
            self.located = self._locate(taken, kind, loss_value, grad_norm, float(scale) if taken.scaled else 1.0)
        # Step or skip on the gradients alone: after DDP's all-reduce they are the same on every rank, so
        # every rank decides alike with no collective of its own. The scaler skips inf gradients itself.
        if math.isfinite(grad_norm) or taken.scaled:
            (scaler.step(optimizer) if taken.scaled else optimizer.step())
        self._keep(taken, loss, norm, scale, scaler, optimizer, taken.scaled)
        if taken.ready is not None:
            taken.ready.synchronize()
        return self._finish(taken, located=True)

    def _finish(self, taken: Taken, located: bool = False) -> StepCheck:
        """The step's check from its values: counted, located (unless it was), logged, the policy applied."""
        loss, grad_norm, scale = taken.read()
        kind = nonfinite_kind(math.isfinite(loss), math.isfinite(grad_norm), taken.scaled)
        stepped = math.isfinite(grad_norm)
        if not stepped:
            self.skipped += 1
        if kind in ("loss", "grad") and self.located is None and not located:
            self.located = self._locate(taken, kind, loss, grad_norm, scale)
        if kind in ("loss", "grad"):
            self._log(taken, kind, loss, grad_norm, scale, stepped)
        if kind is not None:
            log.warning(
                "step %d: loss %s, grad norm %s: not finite (%s); step %s (%d skipped so far)",
                taken.step,
                loss,
                grad_norm,
                kind,
                "taken" if stepped else "skipped",
                self.skipped,
            )
        if "summary" in taken.extra:
            self.traces.write(taken.step, scale, taken.extra["summary"])
        rollbacks = self.rollbacks
        action = self.policy.act(kind in ("loss", "grad"), taken.step)
        if action == "rollback":
            self.located = None  # a new failure after the rollback is located again
        if action == "step" and not stepped:
            action = "skip"
        check = StepCheck(loss, grad_norm, scale, kind, action, self.skipped, rollbacks, stepped, taken.step)
        if action == "halt":
            raise NonFiniteHalt(self.policy.halt_message(self.located, check.step, check.loss, check.grad_norm), check)
        return check

    def _utterances(self, taken: Taken, kind: str, scale: float) -> tuple[list | None, str | None]:
        """Which of the step's utterances were not finite, and how that was found (None, None: not told)."""
        if "utterances" not in taken.extra:
            bad, how = from_losses(taken.micro), "the loop's per-utterance losses"
            if (
                (bad is None or (not bad and kind == "grad"))
                and takes_batch(taken.replay)
                and self._by_utterance < REPLAY_STEPS
            ):
                self._by_utterance += 1
                dtype, self._dtype, self.replaying = self._dtype, taken.dtype, taken.step
                try:
                    found = alone(
                        taken.replay, taken.micro, kind == "grad", scale, self.model, self.autocast, self._device
                    )
                finally:
                    self._dtype, self.replaying = dtype, None
                if found is not None:
                    bad, how = found, "each utterance replayed alone"
            taken.extra["utterances"] = (bad, how if bad is not None else None)
        return taken.extra["utterances"]

    def _log(self, taken: Taken, kind: str, loss: float, grad_norm: float, scale: float, stepped: bool) -> None:
        """The step's line in ``EXP/nonfinite/rank{R}.jsonl``: every non-finite step, with its utterances."""
        bad, how = self._utterances(taken, kind, scale)
        located = self.located if (self.located or {}).get("step") == taken.step else {}
        self.log.write(
            {
                "step": taken.step,
                "kind": kind,
                "loss": loss if math.isfinite(loss) else str(loss),
                "grad_norm": grad_norm if math.isfinite(grad_norm) else str(grad_norm),
                "stepped": stepped,
                "micro_batches": max(1, len(taken.micro)),
                "keys": taken.ids,
                "utterances": bad,
                "found_by": how,
                "bundle": located.get("saved"),
            }
        )

    def _locate(self, taken: Taken, kind: str, loss: float, grad_norm: float, scale: float) -> dict:
        """Run the step again with every module recorded (no optimizer step, gradients not kept) and save it."""
        first = summary = None
        inputs, rng, replay = taken.batch, taken.rng, taken.replay
        calls: list = []
        fp32_finite = None
        ids, index = taken.ids, None
        if replay is not None:
            saved, dtype = rng_state(self._device), self._dtype
            set_rng_state(taken.rng, self._device)
            self._dtype = taken.dtype  # the replay runs under the autocast the step's forward ran under
            self.replaying = taken.step
            params = [p for p in self.model.parameters() if p.requires_grad]
            for index, (part, micro) in enumerate(replay_parts(replay, taken.micro)):
                if micro is not None:  # a micro-batch of its own: from the RNG state its forward started from
                    set_rng_state(micro.rng, self._device)
                    inputs, ids = micro.batch, micro.ids
                rng, got = rng_state(self._device), {}  # where this micro-batch's draws (dropout) start

                def run():
                    with self.autocast():
                        out = part()
                    part_loss, got["inputs"] = out if isinstance(out, tuple) else (out, None)
                    torch.autograd.grad(part_loss * scale, params, allow_unused=True)

                with ctc_calls() as seen:
                    first, summary = locate(self.model, run, self.diag)
                calls = seen
                inputs = got["inputs"] if got["inputs"] is not None else inputs
                if first is not None:
                    break
            if taken.dtype is not None:  # the same part once more in fp32: finite there means an overflow
                set_rng_state(rng, self._device)
                self._dtype = None
                with torch.no_grad(), torch.autocast(self._device.type, enabled=False):
                    out = part()
                fp32_finite = bool(torch.isfinite((out[0] if isinstance(out, tuple) else out).float()).all())
            set_rng_state(saved, self._device)
            self._dtype, self.replaying = dtype, None
        keys = (find_keys(inputs) if inputs is not taken.batch else None) or ids
        cause = (
            classify(first, taken.dtype, fp32_finite, ctc_problems(calls, keys), loss_finite=kind != "loss")
            if replay is not None
            else None
        )
        bad, how = self._utterances(taken, kind, scale)
        meta = {
            "step": taken.step,
            "rank": self.rank,
            "kind": kind,
            "loss": loss,
            "grad_norm": grad_norm,
            "loss_scale": scale,
            "where": describe(first)  # said after "first non-finite value in"
            or ("none of its modules: its replay was finite" if replay is not None else "a module (no replay= given)"),
            "module": first["module"] if first else None,
            "direction": first["direction"] if first else None,
            "keys": keys,
            "tightest": tightest(summary, 5) if summary else [],
            "cause": cause,
            "utterances": bad,
            "found_by": how,
            "micro_batch": index,
            "micro_batches": max(1, len(taken.micro)),
            **{k: v() if callable(v) else v for k, v in self.meta.items()},
        }
        inputs = {**tensors_of(inputs), "keys": keys}
        bundle = Path(self.exp) / layout.NONFINITE / f"step{taken.step:08d}-rank{self.rank}"
        path = save_bundle(bundle, self.model, inputs, meta, rng=rng)
        meta["saved"] = str(path)
        log.warning(
            "step %d, rank %d: first non-finite value in %s; cause: %s; batch %s; %s; saved in %s",
            taken.step,
            self.rank,
            meta["where"],
            cause["text"] if cause else "not replayed",
            ids_text(keys),
            f"not finite: {ids_text(bad) or 'none of its utterances'} ({how})"
            if bad is not None
            else "which utterance: not told",
            path,
        )
        return meta

    def close(self) -> None:
        """The agreement under way waited for and the process group let go (see
        :func:`asrlab.lab.dist.teardown`); the traces closed."""
        self.policy.close()
        if self.traces is not None:
            self.traces.close()


__all__ = [
    "HALT_EXIT",
    "NonFiniteHalt",
    "NumericsGuard",
    "POLICIES",
    "StepCheck",
    "nonfinite_kind",
    "rng_state",
    "set_rng_state",
]

"""One optimizer step of asrlab's trainer: the micro-batches of a step (gradient accumulation) copied,
turned into features, run forward under autocast and backward (scaled; DDP's all-reduce on the
last), then the numerics guard's optimizer step, which also replays a non-finite step micro-batch by
micro-batch to find where it went wrong.

The step never waits on the device: loss, gradient norm, loss scale and the skip decision stay there
(the guard's deferred step), the CTC loss takes its lengths from the batch on the host, and what a
step measured is read with the next step, when the device is long past it. So ``train_step`` returns
the step before the one it trained (:meth:`TrainStep.settle` returns the last one).

A part the trainer holds, not a base class: it sees only what it is given.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field

import torch

from ..data.features import batch_features
from ..data.plan import mix_counts
from ..model import mean_ctc_loss
from ..lab.numerics.guard import NonFiniteHalt, StepCheck


@dataclass
class StepResult:
    """A step: the numerics guard's account of it (loss, grad norm, kind, action) and what it trained on."""
    check: StepCheck
    utts: int
    frames: int
    unalignable: int
    halt: NonFiniteHalt | None = None  # raised once the step is logged
    step: int = 0
    epoch: int = 0
    lr: float = 0.0                    # the learning rate after the step
    keys: list = field(default_factory=list)
    parts: object = None               # the step timer's parts: a dict, or a callable that reads them
    corpora: dict | None = None        # in a mix: per corpus, utterances, audio and loader seconds

    loss = property(lambda self: self.check.loss)
    grad_norm = property(lambda self: self.check.grad_norm)
    loss_scale = property(lambda self: self.check.loss_scale)  # the scale this step's backward used
    nonfinite = property(lambda self: self.check.kind)         # None | "scaler" | "loss" | "grad"
    skipped = property(lambda self: not self.check.stepped)


class TrainStep:
    """Steps a model the trainer owns: it holds the model (and its DDP wrapper), the optimizer, scheduler,
    scaler, numerics guard and step timer it is given, counts the optimizer steps (``step``) and keeps
    ``unread``, the trained steps whose check is still on the device."""

    def __init__(self, model, ddp, opt, sched, scaler, guard, phases, precision, device: torch.device,
                 fbank=None, grad_clip: float = 0.0, heartbeat=None):
        self.model, self.ddp, self.opt, self.sched, self.scaler = model, ddp, opt, sched, scaler
        self.guard, self.phases, self.precision, self.device = guard, phases, precision, device
        self.fbank, self.grad_clip, self.hb = fbank, grad_clip, heartbeat
        self.step = 0
        self.unread: deque[StepResult] = deque()

    def autocast(self):
        p = self.precision
        return contextlib.nullcontext() if p.dtype is None else torch.autocast(self.device.type, dtype=p.dtype)

    def inputs(self, batch: dict, phases: bool = True) -> tuple[torch.Tensor, ...]:
        """(feats, feat_lens, targets, target_lens) of a batch on the device."""
        if phases:
            self.phases.enter("copy")
        if self.fbank is None:
            feats, feat_lens = batch_features(batch, self.device)
        else:
            wavs = batch["wavs"].to(self.device, non_blocking=True)
            if phases:
                self.phases.enter("features")
            feats, feat_lens = self.fbank(wavs, batch["wav_lens"].to(self.device, non_blocking=True))
        return (feats, feat_lens, batch["targets"].to(self.device, non_blocking=True),
                batch["target_lens"].to(self.device, non_blocking=True))

    def train_step(self, batches: list[dict], epoch: int = 0) -> StepResult | None:
        """Forward/backward over ``batches`` (gradient accumulation), then the guard's optimizer step, all
        queued without waiting on the device. Returns the step before it, now read (None at the first)."""
        net = self.ddp or self.model
        losses, unalignable = [], 0
        with self.guard.step(self.step + 1, batches):  # sampled module statistics; the RNG kept for a replay
            for i, batch in enumerate(batches):
                unalignable += self._micro_step(net, batch, i, len(batches), losses)
        if self.ddp is not None and self.device.type == "cuda":
            # DDP has made the stream wait for NCCL's all-reduce; nothing here waits on the stream
            self.phases.enter("allreduce")
        self.phases.enter("optimizer")
        replays = [self._replay(b, len(batches)) for b in batches]
        try:  # grad_clip 0: the norm is measured, not clipped
            check, halt = self.guard.optimizer_step(self.opt, torch.stack(losses).sum(), self.scaler,
                                                    self.grad_clip, replay=replays, defer=True), None
        except NonFiniteHalt as e:  # the step it answers is complete: logged before the halt
            check, halt = e.check, e
        if halt is None and not (check is not None and check.action == "rollback"):  # else this step is void
            # every step, skipped or not: whether it was is on the device (rank-alike: the gradients are)
            self.sched.step()
            self.step += 1
            if self.hb is not None:
                self.hb.completed += 1
            self.unread.append(StepResult(None, sum(len(b["keys"]) for b in batches),
                                           sum(int(b["feat_lens"].sum()) for b in batches), unalignable,
                                           step=self.step, epoch=epoch, lr=self.opt.param_groups[0]["lr"],
                                           keys=[k for b in batches for k in b["keys"]],
                                           corpora=mix_counts(batches)))
        return self._read(check, halt)

    def settle(self) -> StepResult | None:
        """The last step trained, read (waits for the device); None when every step was read."""
        try:
            check, halt = self.guard.flush(), None
        except NonFiniteHalt as e:
            check, halt = e.check, e
        return self._read(check, halt)

    def _read(self, check: StepCheck | None, halt: NonFiniteHalt | None) -> StepResult | None:
        if check is None:
            return None
        r = self.unread.popleft()
        assert r.step == check.step, (r.step, check.step)
        r.check, r.halt = check, halt
        return r

    def _micro_step(self, net, batch: dict, i: int, n: int, losses: list) -> int:
        """Forward and backward of micro-batch ``i`` of ``n``; appends its loss, returns its unalignable count."""
        feats, feat_lens, targets, target_lens = self.inputs(batch)
        sync = i + 1 == n or self.ddp is None
        self.phases.enter("forward")
        with (contextlib.nullcontext() if sync else self.ddp.no_sync()):
            with self.autocast():
                log_probs, _ = net(feats, feat_lens)
            # the lengths from the batch, on the host: nothing in the loss waits for the device
            loss, n_bad = mean_ctc_loss(log_probs, self.model.output_lengths(batch["feat_lens"]), targets,
                                        batch["target_lens"], host_targets=batch["targets"])
            loss = loss / n
            self.phases.backward()
            self.scaler.scale(loss).backward()
        if sync and self.ddp is not None:
            self.phases.backward_done()
        losses.append(loss.detach())
        return n_bad

    def _replay(self, batch: dict, n: int):
        """Micro-batch ``batch`` of ``n`` for the guard's replay of a non-finite step, with the inputs a
        bundle keeps for :func:`asrlab.lab.numerics.stats.replay`. The guard replays under the step's autocast;
        features and loss leave it, since :meth:`_micro_step` computes them outside."""
        def run():
            with torch.autocast(self.device.type, enabled=False):
                feats, feat_lens, targets, target_lens = self.inputs(batch, phases=False)
                with self.autocast():
                    log_probs, out_lens = self.model(feats, feat_lens)
                loss = mean_ctc_loss(log_probs, out_lens, targets, target_lens)[0] / n
            return loss, {"feats": feats, "feat_lens": feat_lens, "targets": targets, "target_lens": target_lens,
                          "keys": list(batch["keys"])}
        return run


__all__ = ["StepResult", "TrainStep"]

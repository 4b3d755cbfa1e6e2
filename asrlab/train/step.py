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
import logging
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Iterator

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import Config
from ..data.features import BatchFbank, batch_features
from ..data.plan import mix_counts
from ..lab import PARTS, NonFiniteHalt, NumericsGuard, StepCheck, choose_precision, say_compiles
from ..model import ConformerCTC, mean_ctc_loss
from .schedule import lr_lambda

log = logging.getLogger(__name__)


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
    lr: float = 0.0  # the learning rate after the step
    keys: list = field(default_factory=list)
    parts: object = None  # the step timer's parts: a dict, or a callable that reads them
    corpora: dict | None = None  # in a mix: per corpus, utterances, audio and loader seconds

    loss = property(lambda self: self.check.loss)
    grad_norm = property(lambda self: self.check.grad_norm)
    loss_scale = property(lambda self: self.check.loss_scale)  # the scale this step's backward used
    nonfinite = property(lambda self: self.check.kind)  # None | "scaler" | "loss" | "grad"
    skipped = property(lambda self: not self.check.stepped)

    def row(self) -> dict:
        """The step's metrics line (``metrics/rank<R>.jsonl``; :func:`asrlab.lab.metrics.read_metrics`)."""
        c = self.check
        parts = self.parts() if callable(self.parts) else self.parts
        return {
            "step": self.step,
            "epoch": self.epoch,
            "loss": c.loss,
            "grad_norm": c.grad_norm,
            "loss_scale": c.loss_scale,
            "lr": self.lr,
            "skipped": c.skipped,
            "utts": self.utts,
            "frames": self.frames,
            "unalignable": self.unalignable,
            "data_wait_s": round(parts["data"], 6),
            "step_s": round(parts["total"], 6),  # data, data check, compute, all-reduce, optimizer
            "time": round(time.time(), 3),  # wall clock when the step was read (unix s), to align with samplers
            **{f"{p}_s": round(parts[p], 6) for p in PARTS if p != "data"},
            "nonfinite": c.kind,
            "rollbacks": c.rollbacks,
            **({"corpora": self.corpora} if self.corpora else {}),
        }


class TrainStep:
    """Steps a model the trainer owns: it holds the model (and its DDP wrapper), the optimizer, scheduler,
    scaler, numerics guard and step timer it is given, counts the optimizer steps (``step``) and keeps
    ``unread``, the trained steps whose check is still on the device."""

    def __init__(
        self,
        model,
        ddp,
        opt,
        sched,
        scaler,
        guard,
        phases,
        precision,
        device: torch.device,
        fbank=None,
        grad_clip: float = 0.0,
        heartbeat=None,
        compiled=None,
        pad_frames: int = 0,
    ):
        self.model, self.ddp, self.opt, self.sched, self.scaler = model, ddp, opt, sched, scaler
        self.guard, self.phases, self.precision, self.device = guard, phases, precision, device
        self.fbank, self.grad_clip, self.hb = fbank, grad_clip, heartbeat
        self.compiled = compiled  # torch.compile of the model (or its DDP wrapper); None: eager
        self.pad_frames = pad_frames  # compiled batches' frames padded to a multiple of this (0: lengths dynamic)
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
        return (
            feats,
            feat_lens,
            batch["targets"].to(self.device, non_blocking=True),
            batch["target_lens"].to(self.device, non_blocking=True),
        )

    def train_step(self, batches: list[dict], epoch: int = 0) -> StepResult | None:
        """Forward/backward over ``batches`` (gradient accumulation), then the guard's optimizer step, all
        queued without waiting on the device. Returns the step before it, now read (None at the first)."""
        losses, unalignable = [], 0
        with self.guard.step(self.step + 1, batches):  # sampled module statistics; the RNG kept for a replay
            # a sampled step hooks every module: eager, so the compiled graph is not traced again with hooks
            net = self.compiled if self.compiled is not None and not self.guard.sampling else self.ddp or self.model
            for i, batch in enumerate(batches):
                unalignable += self._micro_step(net, batch, i, len(batches), losses)
        if self.ddp is not None and self.device.type == "cuda":
            # DDP has made the stream wait for NCCL's all-reduce; nothing here waits on the stream
            self.phases.enter("allreduce")
        self.phases.enter("optimizer")
        replays = [self._replay(b, len(batches)) for b in batches]
        try:  # grad_clip 0: the norm is measured, not clipped
            check, halt = (
                self.guard.optimizer_step(
                    self.opt, torch.stack(losses).sum(), self.scaler, self.grad_clip, replay=replays, defer=True
                ),
                None,
            )
        except NonFiniteHalt as e:  # the step it answers is complete: logged before the halt
            check, halt = e.check, e
        if halt is None and not (check is not None and check.action == "rollback"):  # else this step is void
            # every step, skipped or not: whether it was is on the device (rank-alike: the gradients are)
            self.sched.step()
            self.step += 1
            if self.hb is not None:
                self.hb.completed += 1
            self.unread.append(
                StepResult(
                    None,
                    sum(len(b["keys"]) for b in batches),
                    sum(int(b["feat_lens"].sum()) for b in batches),
                    unalignable,
                    step=self.step,
                    epoch=epoch,
                    lr=self.opt.param_groups[0]["lr"],
                    keys=[k for b in batches for k in b["keys"]],
                    corpora=mix_counts(batches),
                )
            )
        return self._read(check, halt)

    def groups(self, batches: Iterator[dict], accum_steps: int) -> Iterator[list[dict]]:
        """Micro-batch groups of ``accum_steps`` (the last one may be shorter); the step timer starts when
        fetching a group begins, and each fetch is the phase ``data`` of the step it is for."""
        while True:
            group = []
            self.phases.start()
            for _ in range(accum_steps):
                self.phases.enter("data", self.step + 1)
                batch = next(batches, None)
                if batch is None:
                    if group:
                        yield group
                    return
                group.append(batch)
            yield group

    def timed_step(self, batches: list[dict], epoch: int = 0) -> StepResult | None:
        """:meth:`train_step`, then the step timer stopped: its parts go with the step just trained, read
        when that step is."""
        r = self.train_step(batches, epoch)
        if self.unread and self.unread[-1].parts is None:
            self.unread[-1].parts = self.phases.stop(lazy=True)
        else:
            self.phases.stop()
        return r

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
        with contextlib.nullcontext() if sync else self.ddp.no_sync():
            with self.autocast():
                log_probs = self._forward(net, feats, feat_lens)
            # the lengths from the batch, on the host: nothing in the loss waits for the device
            loss, n_bad = mean_ctc_loss(
                log_probs,
                self.model.output_lengths(batch["feat_lens"]),
                targets,
                batch["target_lens"],
                host_targets=batch["targets"],
            )
            loss = loss / n
            self.phases.backward()
            self.scaler.scale(loss).backward()
        if sync and self.ddp is not None:
            self.phases.backward_done()
        losses.append(loss.detach())
        return n_bad

    def _forward(self, net, feats: torch.Tensor, feat_lens: torch.Tensor) -> torch.Tensor:
        """The model's log-probabilities; where torch.compile's backend fails to compile (inductor on a new shape,
        say), said once and the run goes on eagerly: a compiler's failure is no reason to lose the run."""
        try:
            if net is self.compiled and self.pad_frames:
                return net(*_bucketed(feats, feat_lens, self.pad_frames))[0]
            return net(feats, feat_lens)[0]
        except Exception as e:
            from torch._dynamo.exc import BackendCompilerFailed  # inductor's InductorError is one

            if net is not self.compiled or not isinstance(e, BackendCompilerFailed):
                raise
            why = getattr(e, "inner_exception", None) or e
            said = f"{type(why).__name__}: {(str(why).strip().splitlines() or [''])[0][:300]}"
            log.warning("step %d: torch.compile failed (%s); training on eagerly", self.step + 1, said)
            self.compiled = None
            return (self.ddp or self.model)(feats, feat_lens)[0]

    def _replay(self, batch: dict, n: int):
        """Micro-batch ``batch`` of ``n`` for the guard's replay of a non-finite step, with the inputs a
        bundle keeps for :func:`asrlab.train.replay.replay`. The guard replays under the step's autocast;
        features and loss leave it, since :meth:`_micro_step` computes them outside."""

        def run():
            with torch.autocast(self.device.type, enabled=False):
                feats, feat_lens, targets, target_lens = self.inputs(batch, phases=False)
                with self.guard.autocast():  # the step's own, or none in the guard's fp32 check
                    log_probs, out_lens = self.model(feats, feat_lens)
                loss = mean_ctc_loss(log_probs, out_lens, targets, target_lens)[0] / n
            return loss, {
                "feats": feats,
                "feat_lens": feat_lens,
                "targets": targets,
                "target_lens": target_lens,
                "keys": list(batch["keys"]),
            }

        return run


def build_step(
    cfg: Config, vocab_size: int, info, exp, phases, hb=None, horizon: int = 0, clock=None, meta: dict | None = None
) -> TrainStep:
    """A rank's model, features, optimizer, LR schedule, scaler, numerics guard and DDP wrapper, held by the
    :class:`TrainStep` it returns: what asrlab's trainer steps with, and all a throughput sweep needs.

    ``info`` is the rank (:class:`asrlab.lab.dist.DistInfo`), ``exp`` where the guard keeps its bundles,
    ``horizon`` the step the cosine decay ends at, ``meta`` more for the guard's bundles."""
    t, o, device = cfg.train, cfg.optim, info.device
    precision = choose_precision(t.precision, device)
    if precision.scaler and not t.loss_scaling:
        precision = replace(precision, scaler=False, reason=precision.reason + "; loss scaling off")
    torch.manual_seed(t.seed)  # identical initial weights on every rank
    model = ConformerCTC(cfg.model, vocab_size).to(device)
    fbank = BatchFbank.for_data(cfg.data)  # fbank after the copy (data.features=device), else None
    if fbank is not None:
        fbank.to(device)
    # fused: one kernel for all parameters; a loop over them pays Python and launch overhead per tensor
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=o.lr,
        betas=tuple(o.betas),
        weight_decay=o.weight_decay,
        fused=device.type in ("cpu", "cuda"),
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(o, horizon, clock))
    scaler = torch.amp.GradScaler(device.type, enabled=precision.scaler)
    guard = NumericsGuard(  # Join shadows only DDP's all-reduces: no agreement there
        model,
        exp,
        t.diagnostics_every,
        t.nonfinite,
        t.max_rollbacks,
        agree=t.uneven != "join",
        watch=phases,
        meta={
            "lr": lambda: opt.param_groups[0]["lr"],
            "precision": precision.name,
            "model": asdict(cfg.model),
            "vocab_size": vocab_size,
            **(meta or {}),
        },
    )
    torch.manual_seed(t.seed + 1 + info.rank)  # dropout differs across ranks
    ddp = None
    if info.backend:
        ddp = DDP(model)
        ddp.register_comm_hook(None, phases.ddp_hook())
    compiled = None
    if t.compile:
        mode = None if t.compile_mode == "default" or t.compile_backend != "inductor" else t.compile_mode
        compiled = torch.compile(ddp or model, backend=t.compile_backend, mode=mode)
        say_compiles(hb or getattr(phases, "hb", None))
        if t.compile_pad_frames:  # a graph per length bucket: more than torch's default 8 recompilations
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return TrainStep(
        model, ddp, opt, sched, scaler, guard, phases, precision, device, fbank, o.grad_clip, hb, compiled,
        t.compile_pad_frames,
    )  # fmt: skip


def _bucketed(feats: torch.Tensor, feat_lens: torch.Tensor, multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``feats`` (B, T, F) padded with zeros to T a multiple of ``multiple``; T static to torch.compile and B
    dynamic, so that a new length bucket compiles a graph of fixed lengths and a new batch size none."""
    pad = -feats.size(1) % multiple
    feats = torch.nn.functional.pad(feats, (0, 0, 0, pad)) if pad else feats
    torch._dynamo.maybe_mark_dynamic(feats, 0)
    torch._dynamo.mark_static(feats, 1)
    torch._dynamo.maybe_mark_dynamic(feat_lens, 0)
    return feats, feat_lens


__all__ = ["StepResult", "TrainStep", "build_step"]

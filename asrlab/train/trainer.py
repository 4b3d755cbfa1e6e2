"""The trainer: one code path for 1 process and for N under torchrun.

A step: fetch (timed as data wait) -> [agree that every rank has data] -> copy -> forward under
autocast -> backward (scaled; DDP's gradient all-reduce) -> unscale -> clip -> finite check ->
optimizer/scaler step -> LR step -> metrics line. A step whose gradient norm is not finite is
skipped and counted, never silently. Checkpoints hold everything needed to continue exactly:
model, optimizer, scheduler, scaler, step, epoch, every rank's RNG and every rank's loader position.

Each phase is announced to the rank's heartbeat (:mod:`.heartbeat`), which a watchdog thread
(:mod:`.stall`) watches on every rank. Uneven data across ranks (``train.uneven``):

* ``stop`` (default): before each step all ranks agree (one tiny all-reduce) whether every
  rank still has a batch; when one has run out, all end the epoch at the same step.
* ``join``: PyTorch's DDP ``Join``: ranks that ran out shadow the others' all-reduces until all
  are done; then the optimizer, scheduler and step of a rank that trained longest are copied
  to the rest (DDP copies the weights). Mid-epoch checkpoints and the time limit are per rank.
* ``none``: nothing; a rank that runs out waits at the epoch end while the others wait for it
  in their next all-reduce: the hang of field reports 000/001, for demonstrations.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm.auto import tqdm

from ..config import Config, dump_config
from ..diagnostics import Diagnostics, TraceWriter, describe, locate, save_bundle, tightest
from ..data.features import BatchFbank, batch_features
from ..data.loader import AsrLoader
from ..data.preflight import inspect_layout
from ..data.sources import DataError, Source, load_sources, transcripts
from ..data.tokenizer import CharTokenizer
from ..measure.profiling import PARTS, StepTimer, trace
from ..model import ConformerCTC, count_parameters, mean_ctc_loss
from . import checkpoint, dist
from .evaluate import evaluate
from .heartbeat import Heartbeat
from .ledger import LedgerWriter, mark_resumed
from .stall import Watchdog
from .stop import STOP_FILE, clear_stop, stop_requested
from .metrics import MetricsWriter
from .precision import choose_precision, cpu_fp16_kernels

log = logging.getLogger(__name__)
HALT_EXIT = 4  # exit code of a run halted by a non-finite step (train.nonfinite=halt, or rollbacks used up)


class NonFiniteHalt(RuntimeError):
    """Training stopped at a non-finite step; the message says where it was and what was saved."""


class _Rollback(Exception):
    """Internal: go back to the last checkpoint (train.nonfinite=rollback)."""


class RunClock:
    """Training seconds of a run, summed over its resumes, against its budget (``train.max_minutes``).

    ``seen_s`` is the time the ranks agreed on at the last step (the slowest rank's); the LR
    schedule reads it through ``fraction()``, so every rank computes the same LR.
    """

    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self.before_s = 0.0                 # trained by earlier processes of this run (from the checkpoint)
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


def lr_lambda(cfg, max_steps: int, clock: RunClock | None = None):
    """Multiplier of the peak LR at optimizer step ``s``: linear warm-up, then the configured decay.

    Cosine decay runs to ``min_lr`` at ``max_steps``; with ``optim.decay_by_clock`` and a time budget
    (``clock``) it follows whichever is further along, steps or training time, so a run the clock
    stops has decayed too.
    """
    o = cfg.optim
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


def decay_horizon(cfg: Config, sources: list[Source], world_size: int) -> int:
    """Optimizer steps the cosine decay spans: ``train.max_steps`` (0: none), and with
    ``optim.decay_by_clock`` also ``train.max_epochs`` times an epoch's steps as the pre-flight layout
    estimates them (the fewest any rank gets), whichever is smaller. Without the epochs, a run that a fast
    machine ends by its epochs before its clock would stop with the LR still high."""
    t, o = cfg.train, cfg.optim
    if not (o.decay == "cosine" and o.decay_by_clock and t.max_epochs > 0):
        return t.max_steps
    layout = inspect_layout(sources, cfg.data, world_size, cfg.data.num_workers)
    per_epoch = min(r["batches"] for r in layout["ranks"]) // o.accum_steps
    horizon = min(t.max_steps, t.max_epochs * per_epoch) if t.max_steps else t.max_epochs * per_epoch
    log.info("LR: cosine decay to min_lr by step %d (max_steps %d; %d epochs of ~%d steps) or by the %.1f-min "
             "clock, whichever comes first", horizon, t.max_steps, t.max_epochs, per_epoch, t.max_minutes)
    return horizon


def build_tokenizer(exp: Path, sources: list[Source], info: dist.DistInfo) -> CharTokenizer:
    """The experiment's ``units.txt``: made from the training transcripts on first start, reused after."""
    units = exp / "units.txt"
    if info.is_main and not units.exists():
        CharTokenizer.build(transcripts(sources)).save(units)
    dist.barrier(info)
    return CharTokenizer.load(units)


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    skipped: bool
    utts: int
    frames: int
    unalignable: int
    nonfinite: str | None = None   # None | "scaler" (fp16 overflow the loss scaler handles) | "loss" | "grad"
    loss_scale: float = 1.0        # the scale this step's backward used (the scaler may change it after)


class Trainer:
    """Owns the model, optimizer, scheduler, scaler and loaders of one rank."""

    def __init__(self, cfg: Config, data: str, cv: str | None, exp: str | Path, info: dist.DistInfo | None = None):
        self.cfg, self.exp = cfg, Path(exp)
        self.info = info or dist.setup(cfg.train.backend)
        self.device = self.info.device
        self.exp.mkdir(parents=True, exist_ok=True)
        self.hb = Heartbeat(self.info.rank, timeline=cfg.train.timeline)
        self.timer = StepTimer(self.device)  # the step's parts (s), to the metrics
        self._last_bucket_t = [0.0]          # perf_counter() of the last gradient bucket's all-reduce launch
        self._prof = None                    # the torch.profiler window, while one records (train.trace_steps)
        # everything that can be wrong is checked before any work
        self.precision = choose_precision(cfg.train.precision, self.device)
        if self.precision.scaler and not cfg.train.loss_scaling:
            self.precision = replace(self.precision, scaler=False, reason=self.precision.reason + "; loss scaling off")
        train_sources = load_sources(data, cfg.data.raw_chunk)
        if len(train_sources) < self.info.world_size and cfg.train.uneven != "join":
            raise DataError(
                f"{data}: {len(train_sources)} source(s) for {self.info.world_size} ranks, so "
                f"{self.info.world_size - len(train_sources)} of them get no data and " + ("no rank would ever take a step"
                if cfg.train.uneven == "stop" else "the first all-reduce would hang") + ": write smaller shards "
                "(asrlab synth --shard-size), use fewer ranks, or let the others train alone (--uneven join)")
        cv_sources = load_sources(cv, cfg.data.raw_chunk) if cv else None
        if self.info.is_main:
            dump_config(cfg, self.exp / "config.yaml")
        self.tok = build_tokenizer(self.exp, train_sources, self.info)
        self.loader = AsrLoader(train_sources, self.tok, cfg.data, self.info.rank, self.info.world_size)
        self.hb.describe = self.loader.where
        if cfg.train.preflight and self.info.is_main and self.info.world_size > 1:
            self._preflight(train_sources)
        self.cv_loader = None
        if cv_sources:
            self.cv_loader = AsrLoader(cv_sources, self.tok, cfg.data.for_eval(), self.info.rank, self.info.world_size)

        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        self.model = ConformerCTC(cfg.model, len(self.tok)).to(self.device)
        self.fbank = BatchFbank.for_data(cfg.data)  # fbank after the copy (data.features=device), else None
        if self.fbank is not None:
            self.fbank.to(self.device)
        # fused: one kernel for all parameters (on 2 CPU cores the per-tensor loop took ~6% of a tiny step)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                     weight_decay=cfg.optim.weight_decay,
                                     fused=self.device.type in ("cpu", "cuda"))
        self.clock = RunClock(60 * cfg.train.max_minutes)
        horizon = decay_horizon(cfg, train_sources, self.info.world_size)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg, horizon, self.clock))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.scaler)
        self.step, self.epoch, self.skipped, self.epoch_done = 0, 0, 0, False
        self.evals, self.rollbacks = 0, 0
        self.stopped_on_request = False      # EXP/STOP seen by some rank (asrlab.train.stop)
        self.epoch_step0 = 0                 # the step the current epoch started after
        self._discard = 0                    # batches to skip at the start of the next epoch pass (resume_mode=reshuffle)
        self.located: dict | None = None     # where the first non-finite value was (since the last rollback)
        self.diag = self.trace_writer = None
        if cfg.train.diagnostics_every > 0:
            self.diag = Diagnostics(self.model, cfg.train.diagnostics_every)
            self.trace_writer = TraceWriter(self.exp, self.info.rank)
        torch.manual_seed(cfg.train.seed + 1 + self.info.rank)  # dropout differs across ranks
        self.ddp = None
        if self.info.backend:
            self.ddp = DDP(self.model)
            self.ddp.register_comm_hook(None, _allreduce_hook(self.hb, self._last_bucket_t))
        self.metrics = MetricsWriter(self.exp, f"rank{self.info.rank}", cfg.train.tensorboard and self.info.is_main)
        self.eval_metrics = MetricsWriter(self.exp, "eval") if self.info.is_main else None
        self.ledger = LedgerWriter(self.exp, self.info.rank) if cfg.train.ledger else None
        log.info("rank %d/%d on %s; precision %s (%s); model %.2fM parameters; %d train sources",
                 self.info.rank, self.info.world_size, self.device, self.precision.name, self.precision.reason,
                 count_parameters(self.model) / 1e6, len(train_sources))

    def _preflight(self, sources: list[Source]) -> None:
        """Warn, before any step, when this epoch's data will leave a rank short (rank 0 only)."""
        layout = inspect_layout(sources, self.cfg.data, self.info.world_size, self.cfg.data.num_workers)
        hangs = [r for r in layout["ranks"] if r["batches"] != layout["ranks"][0]["batches"]]
        for w in layout["warnings"]:
            log.warning("pre-flight: %s", w)
        if hangs:
            log.warning("pre-flight: uneven=%s: %s", self.cfg.train.uneven, {
                "stop": "all ranks will stop this epoch when the first one runs out",
                "join": "ranks that run out will shadow the others' all-reduces (DDP Join)",
                "none": "UNPROTECTED: this epoch will hang; the stall watchdog will stop it"}[self.cfg.train.uneven])

    # -- state ------------------------------------------------------------------------------
    def resume(self) -> bool:
        """Continue from the newest complete checkpoint of the experiment, if there is one."""
        found = checkpoint.load_latest(self.exp / "checkpoints")  # on CPU: RNG states must be; load_state_dict moves the rest
        if found is None:
            return False
        state, marker = found
        self._load(state)
        self.rollbacks = state.get("rollbacks", 0)
        if "clock" in state:
            self.clock.load_state_dict(state["clock"])
        log.info("resumed from %s: step %d, epoch %d%s", marker["file"], self.step, self.epoch,
                 " (complete)" if self.epoch_done else "")
        mode = self.cfg.train.resume_mode
        if mode != "exact" and not self.epoch_done:  # the ways resumes go wrong elsewhere, for comparison
            trained = self.step - self.epoch_step0
            self.loader.restart(self.epoch)
            if mode == "reshuffle":
                self.loader.reseed(self.cfg.data.seed + 1)
                self._discard = trained
            log.warning("resume_mode=%s: epoch %d starts over%s", mode, self.epoch,
                        f" with another shuffle seed, skipping {trained} batches" if mode == "reshuffle" else
                        f" at batch 0 ({trained} batches of it are trained on again)")
        return True

    def _load(self, state: dict) -> None:
        """Take a checkpoint's state (resume, rollback); the ledger notes that the steps after it are undone."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.skipped = state["step"], state["epoch"], state["skipped"]
        self.epoch_step0 = state.get("epoch_step0", 0)
        self.epoch_done = state["epoch_done"]
        if not self.epoch_done:
            self.loader.load_states(state["loader"])
        self._set_rng(state["rng"][self.info.rank % len(state["rng"])])
        if self.ledger is not None:
            self.ledger.resumed(self.step)
            if self.info.is_main:  # ranks of the old layout that this one does not have
                for r in range(self.info.world_size, state["world_size"]):
                    mark_resumed(self.exp, r, self.step)

    def _rng(self) -> dict:
        """This rank's RNG states: the CPU one, and the GPU's (dropout on the GPU draws from it)."""
        return {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None}

    def _set_rng(self, rng: dict) -> None:
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)

    def rollback(self) -> None:
        """Go back to the newest complete checkpoint and lower the LR (``train.nonfinite=rollback``).

        The LR becomes ``optim.lr * rollback_lr_factor ** rollbacks``; the loader goes back to the
        checkpoint's position, so the same batches are trained on again with the lower LR.
        """
        t = self.cfg.train
        self.hb.enter("checkpoint")
        found = checkpoint.load_latest(self.exp / "checkpoints")
        if found is None:
            raise NonFiniteHalt(f"step {self.step}: not finite, and there is no checkpoint to roll back to "
                                "(set --save-every-steps)")
        state, marker = found
        rollbacks, skipped, failed_at = self.rollbacks + 1, self.skipped, self.step
        self._load(state)
        self.rollbacks, self.skipped, self.located = rollbacks, skipped, None
        if self.epoch_done:  # the checkpoint closed an epoch: start the next one from its beginning
            self.epoch, self.epoch_done = self.epoch + 1, False
            self.loader.restart(self.epoch)
        scale = t.rollback_lr_factor ** self.rollbacks
        self.sched.base_lrs = [self.cfg.optim.lr * scale for _ in self.sched.base_lrs]
        for g, base in zip(self.opt.param_groups, self.sched.base_lrs):
            g["lr"] = base * self.sched.lr_lambdas[0](self.sched.last_epoch)
        log.warning("rollback %d/%d: step %d was not finite; back to %s (step %d), peak LR now %.3g",
                    self.rollbacks, t.max_rollbacks, failed_at, marker["file"], self.step, self.cfg.optim.lr * scale)

    def save(self) -> None:
        """Checkpoint now (a collective: every rank must call it at the same step)."""
        self.hb.enter("checkpoint")
        loaders = dist.all_gather_objects(self.loader.state_dict(), self.info)
        rngs = dist.all_gather_objects(self._rng(), self.info)
        if self.info.is_main:
            state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                     "scheduler": self.sched.state_dict(), "scaler": self.scaler.state_dict(),
                     "step": self.step, "epoch": self.epoch, "epoch_done": self.epoch_done,
                     "skipped": self.skipped, "rollbacks": self.rollbacks, "epoch_step0": self.epoch_step0,
                     "world_size": self.info.world_size, "rng": rngs, "loader": loaders,
                     "clock": self.clock.state_dict()}
            checkpoint.save_checkpoint(self.exp / "checkpoints", state, self.step,
                                       {"epoch": self.epoch, "epoch_done": self.epoch_done,
                                        "rank0_position": loaders[0]["positions"]},
                                       self.cfg.train.keep_last, on_write=self._on_checkpoint_write())
        dist.barrier(self.info)

    def _on_checkpoint_write(self):
        """Called per chunk written: progress for the watchdog; with ``train.inject_kill_at_save`` at this
        step, a SIGKILL after the first chunk (a crash in the middle of a checkpoint write, for tests)."""
        if not self.cfg.train.inject_kill_at_save or self.step != self.cfg.train.inject_kill_at_save:
            return self.hb.tick
        chunks = [0]

        def tick():
            chunks[0] += 1
            if chunks[0] == 2:
                log.warning("inject_kill_at_save: killing this process in the middle of checkpoint %d", self.step)
                os.kill(os.getpid(), signal.SIGKILL)
            self.hb.tick()
        return tick

    # -- one optimizer step ------------------------------------------------------------------
    def _autocast(self):
        p = self.precision
        if p.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=p.dtype)

    def _phase(self, phase: str, step: int | None = None) -> None:
        """Enter a phase: the heartbeat (what this rank does now) and the step timer (how long it took)."""
        self.hb.enter(phase, step)
        self.timer.mark(PART_OF_PHASE.get(phase, phase))

    def _inputs(self, batch: dict, phases: bool = True) -> tuple[torch.Tensor, ...]:
        """(feats, feat_lens, targets, target_lens) of a batch on the device."""
        if phases:
            self._phase("copy")
        if self.fbank is None:
            feats, feat_lens = batch_features(batch, self.device)
        else:
            wavs = batch["wavs"].to(self.device, non_blocking=True)
            if phases:
                self._phase("features")
            feats, feat_lens = self.fbank(wavs, batch["wav_lens"].to(self.device, non_blocking=True))
        return (feats, feat_lens, batch["targets"].to(self.device, non_blocking=True),
                batch["target_lens"].to(self.device, non_blocking=True))

    def train_step(self, batches: list[dict]) -> StepResult:
        """Forward/backward over ``batches`` (gradient accumulation), then one optimizer step."""
        net = self.ddp or self.model
        losses, utts, frames, unalignable = [], 0, 0, 0
        sample = self.diag is not None and self.diag.due(self.step + 1)
        rng = self._rng()  # for replaying this step (dropout) if it goes non-finite
        recording = self.diag.recording() if sample else contextlib.nullcontext()
        with recording:
            for i, batch in enumerate(batches):
                unalignable += self._micro_step(net, batch, i, len(batches), losses)
                utts += len(batch["feat_lens"])
                frames += int(batch["feat_lens"].sum())
        if self.ddp is not None and self.device.type == "cuda":
            # NCCL's all-reduce is asynchronous: wait for it here, under its own phase, so a hang in
            # it is reported as one (the grad-norm read below would wait for it anyway).
            self._phase("allreduce")
            torch.cuda.current_stream(self.device).synchronize()
        self._phase("optimizer")
        total_loss = float(torch.stack(losses).sum())
        self.scaler.unscale_(self.opt)
        clip = self.cfg.optim.grad_clip if self.cfg.optim.grad_clip > 0 else math.inf  # 0: measure, do not clip
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        # this step's loss scale (unchanged until scaler.update(); read after the grad norm has synchronized)
        scale = float(self.scaler.get_scale()) if self.precision.scaler else 1.0
        kind = None
        loss_ok, grad_ok = math.isfinite(total_loss), math.isfinite(grad_norm)  # the norm is every rank's already
        if self.ddp is not None and self.uneven != "join":  # (Join would shadow this all-reduce on finished ranks)
            loss_ok = dist.all_have(loss_ok, self.info)  # one rank's non-finite loss skips the step on every rank
        if not (loss_ok and grad_ok):
            kind = self._nonfinite_kind(loss_ok, grad_ok)
        if kind is not None:  # the scaler skips its own step on inf/NaN gradients; without it we must not step
            self.skipped += 1
            log.warning("step %d: loss %s, grad norm %s: not finite (%s), step skipped (%d so far)",
                        self.step + 1, total_loss, grad_norm, kind, self.skipped)
            if kind != "scaler" and self.located is None:
                self.located = self._locate(batches, rng, scale, kind, total_loss, grad_norm)
            if kind == "scaler":  # the scaler skips it (its unscale found the overflow); a bad loss with finite
                self.scaler.step(self.opt)  # gradients would be stepped by it, so it is not called then
        else:
            self.scaler.step(self.opt)
            self.sched.step()
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.hb.completed += 1
        if sample:
            self.trace_writer.write(self.step, scale, self.diag.summary())
        return StepResult(total_loss, grad_norm, kind is not None, utts, frames, unalignable, kind, scale)

    def _micro_step(self, net, batch: dict, i: int, n: int, losses: list) -> int:
        """Forward and backward of micro-batch ``i`` of ``n``; appends its loss, returns its unalignable count."""
        feats, feat_lens, targets, target_lens = self._inputs(batch)
        sync = i + 1 == n or self.ddp is None
        self._phase("forward")
        with (contextlib.nullcontext() if sync else self.ddp.no_sync()):
            with self._autocast():
                log_probs, out_lens = net(feats, feat_lens)
            loss, n_bad = mean_ctc_loss(log_probs, out_lens, targets, target_lens)
            loss = loss / n
            self._phase("backward")
            self._last_bucket_t[0] = 0.0
            self.scaler.scale(loss).backward()
        if sync and self.ddp is not None and self.device.type == "cpu" and self._last_bucket_t[0]:
            # gloo all-reduces overlap backward; what is left after the last bucket's launch is exposed
            self.timer.mark("comm", at=self._last_bucket_t[0])
        losses.append(loss.detach())
        return n_bad

    def _nonfinite_kind(self, loss_ok: bool, grad_ok: bool) -> str:
        """``"scaler"``: fp16 gradients overflowed at the current loss scale while every rank's loss is
        finite (the scaler lowers its scale: routine); ``"loss"``: a rank's loss is not finite (the
        forward pass overflowed); ``"grad"``: the gradients are not finite without loss scaling."""
        if not loss_ok:
            return "loss"
        return "scaler" if self.precision.scaler else "grad"

    def _locate(self, batches: list[dict], rng: dict, scale: float, kind: str, loss: float,
                grad_norm: float) -> dict:
        """Replay this step with every module recorded (local: no all-reduce, gradients not kept),
        name the first non-finite value, and save the weights and the micro-batch for :func:`replay`."""
        saved_rng = self._rng()
        self._set_rng(rng)
        params = [p for p in self.model.parameters() if p.requires_grad]
        diag = self.diag or Diagnostics(self.model)
        first = summary = None
        for batch in batches:
            feats, feat_lens, targets, target_lens = self._inputs(batch, phases=False)
            masks = self._rng()  # where this micro-batch's dropout draws from, for the replay

            def run():
                with self._autocast():
                    log_probs, out_lens = self.model(feats, feat_lens)
                loss, _ = mean_ctc_loss(log_probs, out_lens, targets, target_lens)
                torch.autograd.grad(loss / len(batches) * scale, params, allow_unused=True)

            first, summary = locate(self.model, run, diag)
            if first is not None:
                break
        self._set_rng(saved_rng)
        step = self.step + 1
        where = describe(first) or "nowhere in the replay (not reproduced)"
        meta = {"step": step, "rank": self.info.rank, "epoch": self.epoch, "kind": kind, "loss": loss,
                "grad_norm": grad_norm, "loss_scale": scale, "precision": self.precision.name,
                "lr": self.opt.param_groups[0]["lr"], "where": where,
                "module": first["module"] if first else None, "direction": first["direction"] if first else None,
                "keys": list(batch["keys"]), "tightest": tightest(summary, 5), "model": asdict(self.cfg.model),
                "vocab_size": len(self.tok)}
        path = save_bundle(self.exp / "nonfinite" / f"step{step:08d}-rank{self.info.rank}", self.model,
                           {"feats": feats, "feat_lens": feat_lens, "targets": targets, "target_lens": target_lens,
                            "keys": list(batch["keys"])}, meta, rng=masks)
        meta["saved"] = str(path)
        log.warning("step %d, rank %d: first non-finite value in %s; batch %s; weights and batch saved in %s",
                    step, self.info.rank, where, ", ".join(meta["keys"][:3]) + (" ..." if len(meta["keys"]) > 3 else ""),
                    path)
        return meta

    # -- the loop ----------------------------------------------------------------------------
    @property
    def uneven(self) -> str:
        """The uneven-data policy in force (alone, there is nothing to agree on)."""
        return self.cfg.train.uneven if self.ddp is not None else "none"

    def _groups(self, it: Iterator[dict]) -> Iterator[list[dict]]:
        """Micro-batch groups of ``accum_steps``; the step timer starts when fetching a group begins.

        With ``uneven=stop`` every rank asks every rank whether it still has data before each
        micro-batch, and all stop together when one has run out.
        """
        accum = self.cfg.optim.accum_steps
        while True:
            group = []
            self.timer.start("data")
            for _ in range(accum):
                self._phase("data", self.step + 1)
                batch = next(it, None)
                if batch is None:
                    log.info("rank %d: out of data for epoch %d after step %d", self.info.rank, self.epoch, self.step)
                have = batch is not None
                if self.uneven == "stop":
                    self._phase("sync")
                    have = dist.all_have(have, self.info)
                    if not have and batch is not None and self.info.is_main:
                        log.info("uneven data: a rank ran out; every rank ends epoch %d at step %d", self.epoch, self.step)
                if not have:
                    if group:
                        yield group
                    return
                group.append(batch)
            yield group

    def _limits_reached(self) -> bool:
        """Step or time budget spent. The ranks agree on the training time (the slowest rank's), which
        the LR schedule reads; under Join (which cannot shadow that all-reduce) the LR decays by steps only."""
        t = self.cfg.train
        if t.max_steps and self.step >= t.max_steps:
            return True
        elapsed = self.clock.elapsed()
        if self.uneven == "join":
            self.clock.seen_s = 0.0  # the ranks cannot agree on it here (nor on a stop request: see _fit)
            return self.clock.spent(elapsed)
        requested = 1.0 if stop_requested(self.exp) else 0.0
        elapsed, requested = dist.all_max_many([elapsed, requested], self.info)  # one all-reduce for both
        self.clock.seen_s = elapsed
        if requested:
            self.stopped_on_request = True
        return self.stopped_on_request or self.clock.spent(elapsed)

    def train_epoch(self, batches: Iterator[dict], bar=None) -> bool:
        """Train on ``batches`` until they run out (False) or a limit is reached (True)."""
        if self.uneven != "join":
            return self._train_batches(batches, bar)
        from torch.distributed.algorithms.join import Join

        with Join([self.ddp]):
            stop = self._train_batches(batches, bar)
        self._sync_after_join()
        return stop

    def _sync_after_join(self) -> None:
        """After Join: every rank takes the optimizer, scheduler and step of one that trained longest."""
        steps = dist.all_gather_objects((self.step, self.skipped), self.info)
        src = max(range(len(steps)), key=lambda r: steps[r][0])
        if len({s for s, _ in steps}) == 1:
            return
        if self.info.is_main:
            log.info("join: ranks ended the epoch at steps %s; all continue from rank %d's step %d",
                     [s for s, _ in steps], src, steps[src][0])
        state = [self.opt.state_dict(), self.sched.state_dict(), self.scaler.state_dict()] if self.info.rank == src \
            else [None, None, None]
        torch.distributed.broadcast_object_list(state, src=src, device=self.device if self.info.backend == "nccl" else None)
        if self.info.rank != src:
            self.opt.load_state_dict(state[0])
            self.sched.load_state_dict(state[1])
            self.scaler.load_state_dict(state[2])
        self.step, self.skipped = steps[src]

    def _train_batches(self, batches: Iterator[dict], bar=None) -> bool:
        t = self.cfg.train
        for group in self._groups(batches):
            r = self.train_step(group)
            parts = self.timer.stop()
            if self.ledger is not None:
                self.ledger.step(self.step, self.epoch, [k for b in group for k in b["keys"]])
            self.metrics.write({
                "step": self.step, "epoch": self.epoch, "loss": r.loss, "grad_norm": r.grad_norm,
                "loss_scale": r.loss_scale,
                "lr": self.opt.param_groups[0]["lr"], "skipped": self.skipped, "utts": r.utts,
                "frames": r.frames, "unalignable": r.unalignable, "data_wait_s": round(parts["data"], 6),
                "step_s": round(parts["total"], 6),  # data, data check, compute, all-reduce, optimizer
                "time": round(time.time(), 3),       # wall clock at the step's end (unix s), to align with samplers
                **{f"{p}_s": round(parts[p], 6) for p in PARTS if p != "data"},
                "nonfinite": r.nonfinite, "rollbacks": self.rollbacks})
            if r.nonfinite in ("loss", "grad") and t.nonfinite != "skip":
                if t.nonfinite == "halt" or self.rollbacks >= t.max_rollbacks:
                    raise NonFiniteHalt(self._halt_report())
                raise _Rollback()
            if self._prof is not None:
                self._prof.step()
            if bar is not None:
                bar.update(1)
                if self.step % max(1, t.log_every_steps) == 0:
                    bar.set_postfix(loss=f"{r.loss:.3f}", lr=f"{self.opt.param_groups[0]['lr']:.1e}")
            if t.save_every_steps and self.step % t.save_every_steps == 0 and self.uneven != "join":
                self.save()
            if self._limits_reached():
                return True
        return False

    def _halt_report(self) -> str:
        """Write ``EXP/nonfinite/halt.json`` (rank 0) and return the one-line reason."""
        t, m = self.cfg.train, self.located or {}
        why = "train.nonfinite=halt" if t.nonfinite == "halt" else f"{self.rollbacks} rollbacks used up"
        msg = (f"halted at step {self.step} ({why}): loss {m.get('loss')}, grad norm {m.get('grad_norm')}; "
               f"first non-finite value on rank {self.info.rank} in {m.get('where', '?')}; "
               f"weights and batch in {m.get('saved', '?')}")
        if self.info.is_main:
            (self.exp / "nonfinite").mkdir(parents=True, exist_ok=True)
            (self.exp / "nonfinite" / "halt.json").write_text(
                json.dumps({"message": msg, "rollbacks": self.rollbacks, **m}, indent=2, default=str))
        log.error("%s", msg)
        return msg

    def fit(self) -> dict:
        """Train until max_epochs / max_steps / max_minutes; returns the last evaluation.

        The stall watchdog watches every rank while this runs (``train.stall_timeout_s``).
        """
        t = self.cfg.train
        watchdog = None
        if t.stall_timeout_s > 0:
            watchdog = Watchdog(self.hb, self.exp, self.info.world_size, t.stall_timeout_s, t.first_step_timeout_s)
            watchdog.start()
        window = contextlib.nullcontext()
        if t.trace_steps:  # steps trace_from .. trace_from + trace_steps - 1 of this run, one warm-up step before
            warm = 1 if t.trace_from > 1 else 0
            window = trace(self.exp / "trace" / f"rank{self.info.rank}", wait=max(0, t.trace_from - 1 - warm),
                           warmup=warm, active=t.trace_steps, device=self.device.type)
        try:
            with window as self._prof, cpu_fp16_kernels(self.device, self.precision.dtype):
                return self._fit()
        finally:
            self._prof = None
            if watchdog is not None:
                watchdog.stop()

    def _fit(self) -> dict:
        t = self.cfg.train
        self.clock.start()
        show = t.progress and self.info.is_main and (sys.stderr.isatty() or "ipykernel" in sys.modules)
        bar = tqdm(total=t.max_steps or None, initial=self.step, disable=not show, desc="train", unit="step")
        last_eval: dict = {}
        if self.epoch_done:
            self.epoch += 1
        # resumed from the final checkpoint, or with the time budget spent: nothing to do
        stop = (bool(t.max_steps) and self.step >= t.max_steps) or self.clock.spent(self.clock.before_s)
        while self.epoch < t.max_epochs and not stop:
            self.epoch_done = False
            self.model.train()
            self.loader.set_epoch(self.epoch)
            fresh = not self.loader.positions
            if fresh:  # a fresh pass over the epoch
                self.epoch_step0 = self.step
            batches = _skip(iter(self.loader), self._discard)
            self._discard = 0
            try:
                stop = self.train_epoch(batches, bar)
                if self.uneven == "join" and not stop:  # outside Join's shadowing the ranks can agree on it
                    self.stopped_on_request = bool(dist.all_max(float(stop_requested(self.exp)), self.info))
                    stop = self.stopped_on_request
            except _Rollback:
                batches.close()  # stops this epoch's loader workers
                self.rollback()
                bar.n = self.step
                continue
            if fresh and not stop and self.step == self.epoch_step0:  # and so would every epoch after it
                raise DataError(f"epoch {self.epoch} ended before its first step: a rank had no batch "
                                f"(uneven={self.uneven}); see how the data falls on ranks with asrlab shards inspect")
            self.hb.enter("epoch_end", self.step)
            dist.store_barrier(f"epoch{self.epoch}.{self.step}", self.info)
            if not stop:
                self.epoch_done = True
                skipped = self.loader.skipped()
                if skipped:
                    log.warning("epoch %d, rank %d: skipped bad input %s", self.epoch, self.info.rank, dict(skipped))
                if self.cv_loader is not None and (self.epoch + 1) % max(1, t.eval_every_epochs) == 0:
                    last_eval = self.evaluate_and_log()
            self.save()
            if not stop:
                self.epoch += 1
        bar.close()
        if self.cv_loader is not None and last_eval.get("step") != self.step:  # stopped mid-epoch
            last_eval = self.evaluate_and_log()
        self.hb.enter("done", self.step)
        if self.stopped_on_request:
            log.info("stopped at step %d on request (%s); checkpoint written", self.step, self.exp / STOP_FILE)
            dist.store_barrier(f"stopped.{self.step}", self.info)  # every rank has seen the file before it goes
            if self.info.is_main:
                clear_stop(self.exp)
        return last_eval

    def evaluate_and_log(self) -> dict:
        self.evals += 1
        self.cv_loader.set_epoch(self.evals)  # a fresh pass (the position of the last one is spent)
        self.hb.enter("eval")
        result = evaluate(self.model, self.cv_loader, self.tok, self.info, self._autocast, tick=self.hb.tick)
        result.update(step=self.step, epoch=self.epoch)
        if self.eval_metrics is not None:
            self.eval_metrics.write({k: v for k, v in result.items() if k != "hyps"})
        log.info("epoch %d step %d: cv loss %.4f, CER %.2f%%, WER %.2f%% (%d utts)", self.epoch, self.step,
                 result["loss"], 100 * result["cer"], 100 * result["wer"], result["utts"])
        return result

    def close(self) -> None:
        self.metrics.close()
        for f in (self.trace_writer, self.ledger):
            if f is not None:
                f.close()
        if self.eval_metrics is not None:
            self.eval_metrics.close()


def _skip(it: Iterator[dict], n: int) -> Iterator[dict]:
    """``it`` without its first ``n`` items (a generator, so ``close()`` stops the loader under it)."""
    for i, x in enumerate(it):
        if i >= n:
            yield x


PART_OF_PHASE = {"sync": "comm", "allreduce": "comm"}  # heartbeat phase -> step-timer part


def _allreduce_hook(hb: Heartbeat, last_t: list[float]):
    """DDP's own all-reduce, announcing the phase (a rank that hangs here waits for the others)
    and noting when the last bucket was launched (``last_t[0]``, for the step timer)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        last_t[0] = time.perf_counter()
        if hb.phase == "backward":
            hb.enter("allreduce")
        return allreduce_hook(state, bucket)

    return hook


def run(cfg: Config, data: str, cv: str | None, exp: str | Path, resume: str | None = "auto") -> dict:
    """Train from the command line (under torchrun or alone); returns the last evaluation."""
    info = dist.setup(cfg.train.backend)
    try:
        trainer = Trainer(cfg, data, cv, exp, info)
        if resume == "auto":
            trainer.resume()
        try:
            return trainer.fit()
        finally:
            trainer.close()
    finally:
        dist.teardown()


__all__ = ["Trainer", "evaluate", "run"]

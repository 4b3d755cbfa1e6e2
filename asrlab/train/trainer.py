"""The trainer: one code path for 1 process and for N under torchrun, built from the parts any loop
can use (:mod:`asrlab.lab`).

A step: fetch (timed as data wait) -> [every rank agrees it has data] -> copy -> forward under autocast
-> backward (scaled; DDP's gradient all-reduce) -> the numerics guard's optimizer step (unscale, clip,
every rank agrees whether the step is finite; a non-finite one is skipped, located and saved, then
``train.nonfinite`` says skip, rollback or halt) -> LR step -> metrics line. Each phase goes to the
rank's heartbeat, which the stall watchdog watches on every rank, and to the step timer.

Uneven data across ranks (``train.uneven``): ``stop`` (default): all ranks agree before each
micro-batch whether every rank has one (:class:`asrlab.lab.UnevenGuard`) and end the epoch together;
``join``: DDP's ``Join``, then every rank continues from one that trained longest (mid-epoch
checkpoints and the time limit are per rank then); ``none``: nothing, so a rank that runs out leaves
the others waiting in their next all-reduce (the multi-GPU hang, for demonstrations).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Iterator

import torch
from tqdm.auto import tqdm

from ..lab import layout
from ..config import Config, dump_config
from ..data.sources import DataError
from ..lab import dist
from ..lab import (
    STOP_FILE,
    Heartbeat,
    MetricsWriter,
    NonFiniteHalt,
    UnevenGuard,
    Watchdog,
    after_join,
    clear_stop,
    cpu_fp16_kernels,
    record_rank_error,
    stop_requested,
    stop_signal,
    trace,
    watching,
)
from ..model import count_parameters
from .checkpoints import Rollback, TrainerCheckpoints
from .evaluate import eval_line, evaluate
from .phases import StepPhases
from .run_data import epoch_batches, load_train_sources, skip_batches, start_data
from .schedule import RunClock, decay_horizon
from .step import StepResult, build_step

log = logging.getLogger(__name__)


class Trainer:
    """Owns the model, optimizer, scheduler, scaler, loaders and guards of one rank."""

    def __init__(
        self, cfg: Config, data: str | list, cv: str | None, exp: str | Path, info: dist.DistInfo | None = None
    ):
        self.cfg, self.exp = cfg, Path(exp)
        self.info = info or dist.setup(cfg.train.backend)
        self.device = self.info.device
        self.exp.mkdir(parents=True, exist_ok=True)
        self.shared_exp = dist.shared_folder(self.exp, self.info)  # else rank 0's files reach the others by broadcast
        self.hb = Heartbeat(self.info.rank, timeline=cfg.train.timeline)
        self.phases = StepPhases(self.hb, self.device)  # to the heartbeat and the step timer
        self._prof = None  # the torch.profiler window, while one records (train.trace_steps)
        # everything that can be wrong is checked before any work
        train_sources = load_train_sources(data, cfg.data.raw_chunk, self.info.world_size, cfg.train.uneven)
        # a hang while reading the data at start-up is a stall like any other
        if self.info.is_main:
            dump_config(cfg, self.exp / layout.CONFIG)
        with watching(
            self.hb, self.exp, self.info.world_size, "index", cfg.train.stall_timeout_s, cfg.train.first_step_timeout_s
        ):
            self.tok, self.loader, self.cv_loader = start_data(
                cfg.data,
                data,
                cv,
                train_sources,
                self.exp,
                self.info,
                self.shared_exp,
                self.hb,
                progress=cfg.train.progress,
                check_layout=cfg.train.preflight and cfg.train.uneven,
            )
        self.clock = RunClock(60 * cfg.train.max_minutes)
        self.stepper = build_step(
            cfg,
            len(self.tok),
            self.info,
            self.exp,
            self.phases,
            self.hb,
            decay_horizon(cfg.optim, cfg.train, lambda: epoch_batches(train_sources, cfg.data, self.info.world_size)),
            self.clock,
            meta={"epoch": lambda: self.epoch},
        )
        s = self.stepper
        self.model, self.ddp, self.opt, self.sched, self.scaler = s.model, s.ddp, s.opt, s.sched, s.scaler
        self.guard, self.precision, self.fbank = s.guard, s.precision, s.fbank
        self.epoch, self.epoch_done, self.evals = 0, False, 0
        self.stopped_on_request = False  # EXP/STOP seen by some rank (asrlab.lab.stop)
        self.epoch_step0 = 0  # the step the current epoch started after
        self._held_by = None  # the UnevenGuard of this epoch, holding batches fetched ahead
        self._limits_sent = None  # (elapsed, stop request) all-reduce under way on the control group
        self._discard = 0  # batches to skip at the next epoch pass's start (resume_mode=reshuffle)
        self.metrics = MetricsWriter(self.exp, f"rank{self.info.rank}", cfg.train.tensorboard and self.info.is_main)
        self.eval_metrics = MetricsWriter(self.exp, "eval") if self.info.is_main else None
        self.ckpt = TrainerCheckpoints(self)  # one schema with the parts' RunState (asrlab.lab)
        self.ledger = self.ckpt.state.ledger
        log.info(
            "rank %d/%d on %s; precision %s (%s); model %.2fM parameters; %d train sources",
            self.info.rank,
            self.info.world_size,
            self.device,
            self.precision.name,
            self.precision.reason,
            count_parameters(self.model) / 1e6,
            len(train_sources),
        )

    def save(self) -> None:
        self.ckpt.save()

    def resume(self) -> bool:
        return self.ckpt.resume()

    def train_step(self, batches: list[dict]) -> StepResult | None:
        """One optimizer step over ``batches`` (:class:`.step.TrainStep`); returns the step before it, read."""
        return self.stepper.train_step(batches, self.epoch)

    def settle(self) -> StepResult | None:
        return self.stepper.settle()

    step = property(
        lambda self: self.stepper.step,
        lambda self, n: setattr(self.stepper, "step", n),
        doc="Optimizer steps taken (the stepper counts them; a resume or a rollback sets them back).",
    )
    skipped = property(lambda self: self.guard.skipped, doc="Steps skipped as not finite (the guard counts them).")
    rollbacks = property(lambda self: self.guard.rollbacks, doc="Rollbacks so far (the guard counts them).")

    # -- the loop ----------------------------------------------------------------------------
    @property
    def uneven(self) -> str:
        """The uneven-data policy in force (alone, there is nothing to agree on)."""
        return self.cfg.train.uneven if self.ddp is not None else "none"

    def _limits_reached(self) -> bool:
        """Step or time budget spent, or a stop asked for. The ranks agree on the training time (the
        slowest rank's), which the LR schedule reads, and on the request, one step late: each rank sends
        its own on the gloo control group without waiting and reads every rank's at the next step, so
        no step waits on it and every rank stops at the same step. Under Join (which cannot shadow that
        all-reduce) the LR decays by steps only."""
        t = self.cfg.train
        if t.max_steps and self.step >= t.max_steps:
            return True
        elapsed = self.clock.elapsed()
        if self.uneven == "join":
            self.clock.seen_s = 0.0  # the ranks cannot agree on it here (nor on a stop request: see _fit)
            return self.clock.spent(elapsed)
        requested = 1.0 if stop_requested(self.exp) else 0.0
        if self.info.backend is None:
            agreed = [elapsed, requested]
        else:
            agreed = self._limits_agreed()
            values = torch.tensor([elapsed, requested], dtype=torch.float64)
            self._limits_sent = (
                values,
                torch.distributed.all_reduce(
                    values, op=torch.distributed.ReduceOp.MAX, group=dist.cpu_group(), async_op=True
                ),
            )
            if agreed is None:
                return False
        self.clock.seen_s = agreed[0]
        self.stopped_on_request = self.stopped_on_request or bool(agreed[1])
        return self.stopped_on_request or self.clock.spent(agreed[0])

    def _limits_agreed(self) -> list[float] | None:
        """Every rank's (elapsed, request) sent at the last step, once in (None when none was sent)."""
        if self._limits_sent is None:
            return None
        values, work = self._limits_sent
        self._limits_sent = None
        work.wait()  # long in by now; also hands over the result (and any error)
        return values.tolist()

    def _log(self, r) -> None:
        """A step read back: its ledger and metrics lines, then its halt or rollback if it asks for one."""
        if self.ledger is not None:
            self.ledger.step(r.step, r.epoch, r.keys)
        self.metrics.write(r.row())
        if r.halt is not None:
            raise r.halt
        if r.check.action == "rollback":
            self.stepper.unread.clear()  # the steps after the one it answers are void
            raise Rollback()

    def _settle(self) -> None:
        """Read and log the last step trained (before a checkpoint, an evaluation, the epoch's end)."""
        r = self.settle()
        if r is not None:
            self._log(r)

    def train_epoch(self, batches: Iterator[dict], bar=None) -> bool:
        """Train on ``batches`` until they run out (False) or a limit is reached (True)."""
        if self.uneven != "join":
            if self.uneven == "stop":  # the guard fetches ahead: checkpoints take the position from it
                batches = self._held_by = UnevenGuard(batches, state_of=self.loader, watch=self.phases)
            return self._train_batches(batches, bar)
        from torch.distributed.algorithms.join import Join

        with Join([self.ddp]):
            stop = self._train_batches(batches, bar)
        self.step, (self.guard.skipped,) = after_join(  # every rank continues from one that trained longest
            self.step,
            [self.opt, self.sched, self.scaler],
            (self.guard.skipped,),
            self.device if self.info.backend == "nccl" else None,
        )
        return stop

    def _train_batches(self, batches, bar=None) -> bool:
        t = self.cfg.train
        for group in self.stepper.groups(iter(batches), self.cfg.optim.accum_steps):
            r = self.stepper.timed_step(group, self.epoch)  # the step before this one, read now the device is past it
            if r is not None:
                self._log(r)
            if self._prof is not None:
                self._prof.step()
            if bar is not None:
                bar.update(1)
                if r is not None and self.step % max(1, t.log_every_steps) == 0:
                    bar.set_postfix(loss=f"{r.check.loss:.3f}", lr=f"{r.lr:.1e}")
            if t.save_every_steps and self.step % t.save_every_steps == 0 and self.uneven != "join":
                self._settle()
                self.save()
            if self._limits_reached():
                self._settle()
                self._limits_agreed()  # every rank sent one at this step: read it, so none is left under way
                return True
        log.info("rank %d: data of epoch %d ended after step %d", self.info.rank, self.epoch, self.step)
        self._settle()
        self._limits_agreed()
        return False

    def fit(self) -> dict:
        """Train until max_epochs / max_steps / max_minutes, watched by the stall watchdog
        (``train.stall_timeout_s``); returns the last evaluation."""
        t = self.cfg.train
        watchdog = None
        if t.stall_timeout_s > 0:
            watchdog = Watchdog(self.hb, self.exp, self.info.world_size, t.stall_timeout_s, t.first_step_timeout_s)
            watchdog.start()
        window = contextlib.nullcontext()
        if t.trace_steps:  # steps trace_from .. trace_from + trace_steps - 1 of this run, one warm-up step before
            warm = 1 if t.trace_from > 1 else 0
            window = trace(
                self.exp / "trace" / f"rank{self.info.rank}",
                wait=max(0, t.trace_from - 1 - warm),
                warmup=warm,
                active=t.trace_steps,
                device=self.device.type,
            )
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
            self._held_by = None
            fresh = not self.loader.positions
            if fresh:  # a fresh pass over the epoch
                self.epoch_step0 = self.step
            batches = skip_batches(iter(self.loader), self._discard)
            self._discard = 0
            try:
                stop = self.train_epoch(batches, bar)
                if self.uneven == "join" and not stop:  # outside Join's shadowing the ranks can agree on it
                    self.stopped_on_request = bool(dist.all_max(float(stop_requested(self.exp)), self.info))
                    stop = self.stopped_on_request
            except Rollback:
                batches.close()  # stops this epoch's loader workers
                self.ckpt.rollback()
                bar.n = self.step
                continue
            if fresh and not stop and self.step == self.epoch_step0:  # and so would every epoch after it
                raise DataError(
                    f"epoch {self.epoch} ended before its first step: a rank had no batch "
                    f"(uneven={self.uneven}); see how the data falls on ranks with asrlab shards inspect"
                )
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
            sig, path = stop_signal(), self.exp / STOP_FILE
            why = sig.name if sig is not None else path if path.exists() else "another rank's"
            log.info("stopped at step %d on request (%s); checkpoint written", self.step, why)
            dist.store_barrier(f"stopped.{self.step}", self.info)  # every rank has seen the file before it goes
            if self.info.is_main:
                clear_stop(self.exp)
        return last_eval

    def evaluate_and_log(self) -> dict:
        self.evals += 1
        self.cv_loader.set_epoch(self.evals)  # a fresh pass (the position of the last one is spent)
        self.hb.enter("eval")
        result = evaluate(self.model, self.cv_loader, self.tok, self.info, self.stepper.autocast, tick=self.hb.tick)
        result.update(step=self.step, epoch=self.epoch)
        if self.eval_metrics is not None:
            self.eval_metrics.write({k: v for k, v in result.items() if k != "hyps"})
        log.info("epoch %d step %d: %s", self.epoch, self.step, eval_line(result))
        return result

    def close(self) -> None:
        """Pending collectives waited for, the groups let go (so :func:`asrlab.lab.dist.teardown` ends
        their threads before the interpreter exits), the files closed."""
        if self._limits_sent is not None:
            dist.settle(self._limits_sent[1])
            self._limits_sent = None
        if self._held_by is not None:
            self._held_by.close()
            self._held_by = None
        self.ddp = self.stepper.ddp = None
        for f in (self.metrics, self.guard, self.ckpt.state, self.eval_metrics):
            if f is not None:
                f.close()


def run(cfg: Config, data: str | list, cv: str | None, exp: str | Path, resume: str | None = "auto") -> dict:
    """Train from the command line (under torchrun or alone); returns the last evaluation. A rank's error is
    recorded before the teardown, which the other ranks see as a lost peer: the first error stays the cause."""
    with dist.process_group(cfg.train.backend) as info:
        trainer = None
        try:
            trainer = Trainer(cfg, data, cv, exp, info)
            if resume == "auto":
                trainer.resume()
            return trainer.fit()
        except Exception as e:
            if info.backend is not None and not isinstance(e, NonFiniteHalt):
                record_rank_error(
                    exp, e, info.rank, phase=trainer and trainer.hb.phase, step=trainer and trainer.hb.step
                )
            raise
        finally:
            if trainer is not None:
                trainer.close()


__all__ = ["Trainer", "evaluate", "run"]

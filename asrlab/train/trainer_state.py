"""What a checkpoint of asrlab's trainer holds, and the ways back to one: resume and rollback.

A checkpoint holds everything needed to continue exactly: model, optimizer, scheduler, scaler, step,
epoch, the training clock, the numerics guard's counts, every rank's RNGs (:func:`.state.all_rng_state`,
as :class:`.state.RunState` keeps them) and every rank's loader position, all of them so that a
checkpoint of one layout (ranks x workers) resumes on another: the loader re-plans the rest of the
epoch. :mod:`.checkpoint` writes it atomically; the ledger notes each return to one.
"""

from __future__ import annotations

import logging
import os
import signal

from ..lab.state import checkpoint
from ..lab import dist
from ..lab.state.ledger import ledger_sizes, ledger_tail, note_resume, put_ledger_tail
from ..lab.numerics.guard import NonFiniteHalt
from ..lab.state.run_state import all_rng_state, set_all_rng_state

log = logging.getLogger(__name__)


class Rollback(Exception):
    """Raised inside an epoch to go back to the last checkpoint (``train.nonfinite=rollback``)."""


class TrainerState:
    """The checkpoint part of :class:`.trainer.Trainer` (a mixin: it reads and sets the trainer's attributes)."""

    def save(self) -> None:
        """Checkpoint now (a collective: every rank must call it at the same step)."""
        self.hb.enter("checkpoint")
        if self.ledger is not None and not self.shared_exp:
            self._gather_ledgers()
        loaders = dist.all_gather_objects((self._held_by or self.loader).state_dict(), self.info)
        rngs = dist.all_gather_objects(all_rng_state(self.device), self.info)
        if self.info.is_main:
            state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                     "scheduler": self.sched.state_dict(), "scaler": self.scaler.state_dict(),
                     "step": self.step, "epoch": self.epoch, "epoch_done": self.epoch_done,
                     "skipped": self.guard.skipped, "rollbacks": self.guard.rollbacks, "epoch_step0": self.epoch_step0,
                     "world_size": self.info.world_size, "rng": rngs, "loader": loaders,
                     "clock": self.clock.state_dict()}
            checkpoint.save_checkpoint(self.exp / "checkpoints", state, self.step,
                                       {"epoch": self.epoch, "epoch_done": self.epoch_done,
                                        "rank0_position": loaders[0]["positions"]},
                                       self.cfg.train.keep_last, on_write=self._on_checkpoint_write())
        dist.barrier(self.info)

    def _gather_ledgers(self) -> None:
        """Bring rank 0's copies of every rank's ledger up to date (nodes with an ``EXP`` of their own):
        each rank sends what its ledger holds beyond rank 0's copy of it, so the checkpoint's node can
        prove coverage. Nothing is sent by the ranks that share rank 0's folder."""
        self.ledger.flush()
        sizes = dist.broadcast_object(ledger_sizes(self.exp, self.info.world_size) if self.info.is_main else None,
                                      self.info)
        tails = dist.gather_objects(ledger_tail(self.exp, self.info.rank, sizes[self.info.rank]), self.info)
        for r, data in enumerate(tails or []):
            if data:
                put_ledger_tail(self.exp, r, sizes[r], data)

    def _latest_checkpoint(self):
        """The newest complete checkpoint and its marker (None without one); where the nodes do not share
        ``EXP``, rank 0's, sent to every rank."""
        if self.shared_exp:
            return checkpoint.load_latest(self.exp / "checkpoints")  # on CPU: RNG states must be
        found = checkpoint.load_latest(self.exp / "checkpoints") if self.info.is_main else None
        return dist.broadcast_object(found, self.info)

    def resume(self) -> bool:
        """Continue from the newest complete checkpoint of the experiment, if there is one."""
        found = self._latest_checkpoint()  # on CPU: load_state_dict moves the rest
        if found is None:
            return False
        state, marker = found
        self._load(state)
        self.guard.rollbacks = state.get("rollbacks", 0)
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

    def rollback(self) -> None:
        """Go back to the newest complete checkpoint and lower the LR (``train.nonfinite=rollback``).

        The LR becomes ``optim.lr * rollback_lr_factor ** rollbacks``; the loader goes back to the
        checkpoint's position, so the same batches are trained on again with the lower LR.
        """
        t = self.cfg.train
        self.hb.enter("checkpoint")
        found = self._latest_checkpoint()
        if found is None:
            raise NonFiniteHalt(f"step {self.step}: not finite, and there is no checkpoint to roll back to "
                                "(set --save-every-steps)")
        state, marker = found
        skipped, failed_at = self.guard.skipped, self.step
        self._load(state)
        self.guard.skipped = skipped  # the skipped steps stay counted; the guard counted this rollback
        if self.epoch_done:  # the checkpoint closed an epoch: start the next one from its beginning
            self.epoch, self.epoch_done = self.epoch + 1, False
            self.loader.restart(self.epoch)
        scale = t.rollback_lr_factor ** self.guard.rollbacks
        self.sched.base_lrs = [self.cfg.optim.lr * scale for _ in self.sched.base_lrs]
        for g, base in zip(self.opt.param_groups, self.sched.base_lrs):
            g["lr"] = base * self.sched.lr_lambdas[0](self.sched.last_epoch)
        log.warning("rollback %d/%d: step %d was not finite; back to %s (step %d), peak LR now %.3g",
                    self.guard.rollbacks, t.max_rollbacks, failed_at, marker["file"], self.step,
                    self.cfg.optim.lr * scale)

    def _load(self, state: dict) -> None:
        """Take a checkpoint's state (resume, rollback); the ledger notes that the steps after it are undone."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.guard.skipped = state["step"], state["epoch"], state["skipped"]
        self.epoch_step0 = state.get("epoch_step0", 0)
        self.epoch_done = state["epoch_done"]
        if not self.epoch_done:
            self.loader.load_states(state["loader"])  # every rank's: another layout re-plans the epoch
        set_all_rng_state(state["rng"][self.info.rank % len(state["rng"])], self.device)
        note_resume(self.exp, self.ledger, self.step, self.info.rank, self.info.world_size, state["world_size"])

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


__all__ = ["Rollback", "TrainerState"]

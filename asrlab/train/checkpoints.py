"""The trainer's checkpoints, in the one schema of :class:`asrlab.lab.RunState`, and the ways back to one:
resume and rollback.

A checkpoint holds everything needed to continue exactly: model, optimizer, scheduler, scaler, step,
epoch, and in the run state's ``extra`` the training clock, the numerics guard's counts and whether the
epoch was done; every rank's RNGs and loader position (so that a checkpoint of one layout, ranks x
workers, resumes on another: the loader re-plans the rest of the epoch).
"""

from __future__ import annotations

import logging

from ..lab import NonFiniteHalt, RunState

log = logging.getLogger(__name__)


class Rollback(Exception):
    """Raised inside an epoch to go back to the last checkpoint (``train.nonfinite=rollback``)."""


class _Position:
    """The loader's position as the trainer checkpoints it: after the batches handed out to the steps (an
    uneven guard fetches one ahead), and every rank's state back on a resume."""

    def __init__(self, tr):
        self.tr = tr

    def state_dict(self) -> dict:
        return (self.tr._held_by or self.tr.loader).state_dict()

    def load_states(self, states: list[dict]) -> None:
        self.tr.loader.load_states(states)


class TrainerCheckpoints:
    """Saves and restores the trainer ``tr`` through a :class:`RunState` it holds."""

    def __init__(self, tr):
        self.tr = tr
        t = tr.cfg.train
        self.state = RunState(
            tr.exp,
            tr.model,
            tr.opt,
            tr.scaler,
            tr.sched,
            loader=_Position(tr),
            ledger=t.ledger,
            keep_last=t.keep_last,
            shared_exp=tr.shared_exp,
            on_write=tr.hb.tick,
        )

    def save(self) -> None:
        """Checkpoint now (a collective: every rank must call it at the same step)."""
        tr = self.tr
        tr.hb.enter("checkpoint")
        extra = {
            "epoch_done": tr.epoch_done,
            "skipped": tr.guard.skipped,
            "rollbacks": tr.guard.rollbacks,
            "epoch_step0": tr.epoch_step0,
            "clock": tr.clock.state_dict(),
        }
        self.state.save(tr.step, tr.epoch, extra, marker={"epoch_done": tr.epoch_done})

    def _restore(self) -> dict | None:
        """Take the newest complete checkpoint back (None without one); the loader's position only when its
        epoch was not done (the next epoch starts from its beginning)."""
        state = self.state.read()
        if state is None:
            return None
        extra = state["extra"]
        self.state.restore(state, loader=not extra["epoch_done"])
        tr = self.tr
        tr.step, tr.epoch, tr.guard.skipped = state["step"], state["epoch"], extra["skipped"]
        tr.epoch_step0, tr.epoch_done = extra.get("epoch_step0", 0), extra["epoch_done"]
        return state

    def resume(self) -> bool:
        """Continue from the newest complete checkpoint of the experiment, if there is one."""
        state = self._restore()
        if state is None:
            return False
        tr, extra = self.tr, state["extra"]
        tr.guard.rollbacks = extra.get("rollbacks", 0)
        if "clock" in extra:
            tr.clock.load_state_dict(extra["clock"])
        log.info(
            "resumed from %s: step %d, epoch %d%s",
            state["file"],
            tr.step,
            tr.epoch,
            " (complete)" if tr.epoch_done else "",
        )
        mode = tr.cfg.train.resume_mode
        if mode != "exact" and not tr.epoch_done:  # the ways resumes go wrong elsewhere, for comparison
            trained = tr.step - tr.epoch_step0
            tr.loader.restart(tr.epoch)
            if mode == "reshuffle":
                tr.loader.reseed(tr.cfg.data.seed + 1)
                tr._discard = trained
            log.warning(
                "resume_mode=%s: epoch %d starts over%s",
                mode,
                tr.epoch,
                f" with another shuffle seed, skipping {trained} batches"
                if mode == "reshuffle"
                else f" at batch 0 ({trained} batches of it are trained on again)",
            )
        return True

    def rollback(self) -> None:
        """Go back to the newest complete checkpoint and lower the LR (``train.nonfinite=rollback``).

        The LR becomes ``optim.lr * rollback_lr_factor ** rollbacks``; the loader goes back to the
        checkpoint's position, so the same batches are trained on again with the lower LR.
        """
        tr = self.tr
        t = tr.cfg.train
        tr.hb.enter("checkpoint")
        skipped, failed_at = tr.guard.skipped, tr.step
        state = self._restore()
        if state is None:
            raise NonFiniteHalt(
                f"step {tr.step}: not finite, and there is no checkpoint to roll back to (set --save-every-steps)"
            )
        tr.guard.skipped = skipped  # the skipped steps stay counted; the guard counted this rollback
        if tr.epoch_done:  # the checkpoint closed an epoch: start the next one from its beginning
            tr.epoch, tr.epoch_done = tr.epoch + 1, False
            tr.loader.restart(tr.epoch)
        scale = t.rollback_lr_factor**tr.guard.rollbacks
        tr.sched.base_lrs = [tr.cfg.optim.lr * scale for _ in tr.sched.base_lrs]
        for g, base in zip(tr.opt.param_groups, tr.sched.base_lrs):
            g["lr"] = base * tr.sched.lr_lambdas[0](tr.sched.last_epoch)
        log.warning(
            "rollback %d/%d: step %d was not finite; back to %s (step %d), peak LR now %.3g",
            tr.guard.rollbacks,
            t.max_rollbacks,
            failed_at,
            state["file"],
            tr.step,
            tr.cfg.optim.lr * scale,
        )


__all__ = ["Rollback", "TrainerCheckpoints"]

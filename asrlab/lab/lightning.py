"""asrlab's parts in a Lightning run (and so in NeMo's, whose ASR models are LightningModules).

    from asrlab.lab.lightning import AsrlabCallback
    trainer = lightning.pytorch.Trainer(strategy="ddp", callbacks=[AsrlabCallback("exp/run", stall_timeout_s=300)])

On every rank: the stall watch (a hang in the data, a collective or the step ends the run with a verdict
and every rank's stacks; a rank's exception is recorded and named first), the ledger of utterance ids per
step (found in the batch whatever it calls them, or ``keys=``; each step's line written and flushed as its optimizer
step returns, so a SIGKILL at any point loses no step that was trained), and the numerics guard: a step whose loss or
gradients are not finite is replayed with every module hooked, saved with its utterances and its cause, and
skipped (its gradients dropped before Lightning's optimizer step), or (``policy="halt"``) raises
:class:`~asrlab.lab.numerics.guard.NonFiniteHalt`. With fp16 mixed precision, gradients that overflow while
the loss is finite are left to Lightning's loss scaler, as routine. A batch whose ids are not found leaves
coverage not measured (``lab.json`` says why, and that ``keys=`` names them), not broken. Lightning's resumes
(the step of the checkpoint it restores) go into the ledger, and each checkpoint file it writes is recorded
for the doctor. ``asrlab doctor EXP`` then reads the run as any other. Needs the ``lightning`` extra.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

from . import dist, layout
from ..files import append_jsonl
from .keys import NAMES, KeyFinder, KeysSpec
from .numerics.guard import NumericsGuard
from .stall.report import write_lab_status
from .stall.watch import StallWatch
from .state.ledger import LedgerWriter


class _Decides:
    """The optimizer as the guard sees it: the guard decides whether the step is taken, Lightning takes it."""

    def __init__(self, optimizer):
        self.param_groups = optimizer.param_groups
        self.stepped = False

    def step(self, *args, **kwargs) -> None:
        self.stepped = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # Lightning's own optimizer step needs the gradients


def _loss_of(out):
    return out["loss"] if isinstance(out, dict) else out


class AsrlabCallback(pl.Callback):
    """See the module docstring. ``every``: record module statistics every ``every`` steps (0: never)."""

    def __init__(
        self,
        exp: str | Path,
        stall_timeout_s: float = 300.0,
        first_step_s: float | None = None,
        every: int = 0,
        policy: str = "skip",
        ledger: bool = True,
        keys: KeysSpec = None,
        eval_allow_s: float = 3600.0,
    ):
        self.exp, self.stall_timeout_s, self.first_step_s = Path(exp), stall_timeout_s, first_step_s
        self.every, self.policy, self.keep_ledger, self.keys = every, policy, ledger, keys
        self.eval_allow_s = eval_allow_s
        self.watch: StallWatch | None = None
        self.guard: NumericsGuard | None = None
        self.ledger: LedgerWriter | None = None
        self._find = KeyFinder(keys, "AsrlabCallback")
        self._step_fn = None
        self._loss = None
        self._batch = self._ctx = None
        self._resumed: int | None = None  # the step of the checkpoint Lightning restored, until the ledger has it
        self._ids_checked = False
        self._pending: list[str] = []  # the ids of the batches since the last optimizer step (accumulation: several)
        self._recorded = 0  # the last step whose ledger line is written

    # -- start and end ---------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or self.watch is not None:
            return
        self.watch = StallWatch(self.exp, self.stall_timeout_s, self.first_step_s).start()
        self.guard = NumericsGuard(
            pl_module, self.exp, every=self.every, policy=self.policy, keys=self.keys, watch=self.watch
        )
        if self.keep_ledger:
            self.ledger = LedgerWriter(self.exp, dist.world()[0])
            if self._resumed is not None:
                self.ledger.resumed(self._resumed)
                self._resumed = None
        # the loss of each step, for the guard: the module's own training_step, kept and wrapped
        self._step_fn = step_fn = pl_module.training_step

        def training_step(*args, **kwargs):
            out = step_fn(*args, **kwargs)
            self._loss = _loss_of(out)
            return out

        pl_module.training_step = training_step
        self._record_steps(trainer)
        self._record_saves(trainer)

    def on_train_start(self, trainer, pl_module) -> None:
        self.watch.enter("data", trainer.global_step + 1)
        self._recorded = trainer.global_step  # a resume's steps up to its checkpoint are in the ledger already

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._pending = []  # a batch whose on_train_batch_start ended the epoch (-1) was not trained

    def on_fit_end(self, trainer, pl_module) -> None:
        self._close(None)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._close(exception if isinstance(exception, Exception) else None)

    def _close(self, error) -> None:
        if self.ledger is not None:
            self.ledger.close()
            self.ledger = None
        if self.guard is not None:
            self.guard.close()
        if self.watch is not None:
            self.watch.stop(error)

    # -- each step -------------------------------------------------------------------------------
    def _end_step_record(self) -> None:
        if self._ctx is not None:  # a step without an optimizer step (training_step returned None) ends here
            self._ctx.__exit__(None, None, None)
            self._ctx = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._end_step_record()
        if not self._ids_checked:
            self._check_ids(batch)
        step = trainer.global_step + 1
        self.watch.enter("compute", step)
        self._pending += self._find(batch) or []
        self._batch, self._idx, self._loss = batch, batch_idx, None
        self._ctx = self.guard.step(step, batch)
        self._ctx.__enter__()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._end_step_record()
        loss = self._loss.detach() if torch.is_tensor(self._loss) else torch.tensor(float("nan"))
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None and bool(torch.isfinite(loss)):
            return  # fp16 gradients that overflow with a finite loss: the scaler's routine
        batch, idx, step_fn = self._batch, self._idx, self._step_fn
        decides = _Decides(optimizer)
        self.guard.optimizer_step(decides, loss, replay=lambda: _loss_of(step_fn(batch, idx)))
        if not decides.stepped:  # skipped: nothing for Lightning's optimizer step to apply
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._end_step_record()
        if trainer.global_step > self._recorded:  # a step the optimizer wrapper did not see (a raw optimizer's)
            self._record(trainer.global_step, trainer.current_epoch)
        self.watch.hb.completed += 1
        self.watch.enter("data", trainer.global_step + 1)

    def _record(self, step: int, epoch: int) -> None:
        """The ledger line of optimizer step ``step``: the ids of every batch since the last one, flushed."""
        keys, self._pending, self._recorded = self._pending, [], step
        if self.ledger is not None:
            self.ledger.step(step, epoch, keys)
            self.ledger.flush()

    def _record_steps(self, trainer) -> None:
        """Each optimizer step's ledger line, written as the step returns: before Lightning's own hooks after it
        (a callback of the user's, a checkpoint saved from a signal handler) and before the next step starts, so
        that no step a checkpoint holds is missing from the ledger. The strategy's ``optimizer_step`` is where every
        step goes (automatic optimization's, and a manual ``opt.step()``); Lightning counts it once it returns."""
        strategy = trainer.strategy
        step_fn = strategy.optimizer_step

        def optimizer_step(*args, **kwargs):
            out = step_fn(*args, **kwargs)
            module = trainer.lightning_module
            accumulating = getattr(trainer.fit_loop, "_should_accumulate", None)  # a strategy that accumulates
            if not (module.automatic_optimization and accumulating is not None and accumulating()):
                if self._pending:  # manual optimization: a batch's second optimizer's step has no ids of its own
                    self._record(trainer.global_step + 1, trainer.current_epoch)
            return out

        strategy.optimizer_step = optimizer_step

    # -- ids, resumes and checkpoints -------------------------------------------------------------------
    def _check_ids(self, batch) -> None:
        """A batch without utterance ids leaves coverage unmeasured, not broken: the doctor is told why and
        which argument names them."""
        self._ids_checked = True
        if self.ledger is None or self._find(batch) or dist.world()[0] != 0:
            return
        what = (
            f"no field {self.keys!r}"
            if isinstance(self.keys, str)
            else "no utterance ids"
            if callable(self.keys)
            else f"no utterance ids under a common name ({', '.join(NAMES)})"
        )
        write_lab_status(
            self.exp,
            {
                "coverage_not_measured": (
                    f'the batches ({type(batch).__name__}) hold {what}; AsrlabCallback(exp, keys="FIELD") names the '
                    "field that holds them (or keys=lambda batch: ids)"
                )
            },
        )

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """Lightning restores a checkpoint (``fit(ckpt_path=...)``): a resume, in the ledger. Steps trained
        after that checkpoint before the run ended are rolled back: the ledger drops them, and they count
        once, when trained again."""
        step = int(checkpoint.get("global_step", 0))
        if self.ledger is not None:
            self.ledger.resumed(step)
            self.ledger.flush()
        else:
            self._resumed = step

    def _record_saves(self, trainer) -> None:
        """Each checkpoint file Lightning writes, recorded once written (its path is known only there: the
        strategy's save, which writes on rank 0)."""
        strategy = trainer.strategy
        save = strategy.save_checkpoint

        def save_checkpoint(checkpoint, filepath, *args, **kwargs):
            if self.ledger is not None:
                self.ledger.flush()  # every step the checkpoint holds is in the ledger before it is written
            out = save(checkpoint, filepath, *args, **kwargs)
            path = os.path.abspath(str(filepath))
            if trainer.is_global_zero and os.path.exists(path):
                st = os.stat(path)
                append_jsonl(
                    Path(self.exp) / layout.CHECKPOINTS / layout.LIGHTNING_CHECKPOINTS,
                    [
                        {
                            "file": path,
                            "step": int(checkpoint.get("global_step", trainer.global_step)),
                            "epoch": int(checkpoint.get("epoch", trainer.current_epoch)),
                            "time": time.time(),
                            "bytes": st.st_size,
                            "mtime": st.st_mtime,
                        }
                    ],
                )
            return out

        strategy.save_checkpoint = save_checkpoint

    # -- evaluation: a phase of its own, with its own allowance ------------------------------------
    def on_validation_start(self, trainer, pl_module) -> None:
        if self.watch is not None:
            self.watch.enter("eval", allow_s=self.eval_allow_s)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0):
        if self.watch is not None:
            self.watch.tick()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.watch is not None:
            self.watch.enter("data", trainer.global_step + 1)


__all__ = ["AsrlabCallback"]

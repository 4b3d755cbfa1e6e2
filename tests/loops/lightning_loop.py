"""A LightningModule of a user's own with ``AsrlabCallback`` as the README shows it, for the Lightning tests:
``Trainer(strategy="ddp")`` on 2 CPU ranks (gloo), a DataLoader worker per rank, each batch's ids under
``uid``. Run as ``python lightning_loop.py EXP`` (Lightning's own launcher starts rank 1) or under torchrun.

Environment: ``FAULT=kill:R:S`` (rank R SIGKILLs itself in step S; R ``all``: every rank), ``raise:R:S`` (rank R
raises in step S), ``trained:R:S`` (rank R
SIGKILLs itself once step S is trained: in a callback of its own whose ``on_train_batch_end`` runs before the
others'), ``TRUTH=DIR`` (that callback keeps the loop's own record of each trained step's ids, and of Lightning's
resumes, in ``DIR/ledger/rank{R}.jsonl``, the ledger's format), ``hang:R:S``
(rank R's worker hangs making step S's batch), ``IDS`` (the batch's field for its ids, default ``uid``),
``KEYS=FIELD`` (given to the callback as ``keys=``), ``CKPT=DIR`` (Lightning's ``ModelCheckpoint`` into DIR
every 5 steps, with ``last.ckpt``), ``RESUME=1`` (``fit(ckpt_path="last")``), ``EPOCHS`` (default 1),
``STALL_S`` (the callback's stall timeout, default 20), ``STEP_S`` (seconds each step sleeps, default 0),
``MP=spawn`` (the DataLoader worker spawned, not forked: forking a rank that runs gloo's and the callback's
threads deadlocked the child inside ``os.fork`` now and then, which the stall watch then rightly named; a
hazard of fork with threads that only the tests about a forked worker's end need to take)."""

import json
import os
import signal
import sys
import time

import torch

FAULT = os.environ.get("FAULT", "").split(":")
BATCH, ITEMS = 4, 64
IDS = os.environ.get("IDS", "uid")


class Clips(torch.utils.data.Dataset):
    def __len__(self):
        return ITEMS

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {IDS: f"utt{i:03d}", "feats": torch.randn(6, generator=g), "target": torch.randn(1, generator=g)}


def collate(items):
    batch = {
        IDS: [b[IDS] for b in items],
        "feats": torch.stack([b["feats"] for b in items]),
        "target": torch.stack([b["target"] for b in items]),
    }
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    if FAULT[0] == "hang" and rank == int(FAULT[1]) and torch.utils.data.get_worker_info():
        # the (S-1)th batch this rank's worker makes is step S's
        collate.made = getattr(collate, "made", 0) + 1
        if collate.made == int(FAULT[2]):
            while True:
                time.sleep(1)
    return batch


# MP=spawn's DataLoader worker runs this file again (as __mp_main__) for Clips and collate alone: Lightning's
# and the callback's imports, seconds of CPU in each worker, are the ranks' only
if __name__ != "__mp_main__":
    import lightning.pytorch as pl

    from asrlab.lab.lightning import AsrlabCallback

    class Record(pl.Callback):
        """The loop's own record of what it trained (``TRUTH``), and the ``trained`` fault: listed before AsrlabCallback."""

        def __init__(self, truth):
            self.truth = truth

        def _write(self, trainer, record):
            if self.truth:
                path = os.path.join(self.truth, "ledger", f"rank{trainer.global_rank}.jsonl")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "a") as f:
                    f.write(json.dumps(record) + "\n")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, idx):
            step = trainer.global_step
            self._write(trainer, {"step": step, "epoch": trainer.current_epoch, "keys": batch[IDS]})
            if FAULT[0] == "trained" and FAULT[1] in ("all", str(trainer.global_rank)) and step == int(FAULT[2]):
                os.kill(os.getpid(), signal.SIGKILL)

        def on_load_checkpoint(self, trainer, pl_module, checkpoint):
            self._write(trainer, {"resumed_from": int(checkpoint["global_step"])})

    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

        def training_step(self, batch, idx):
            step = self.trainer.global_step + 1
            if FAULT[0] == "kill" and FAULT[1] in ("all", str(self.global_rank)) and step == int(FAULT[2]):
                os.kill(os.getpid(), signal.SIGKILL)
            if FAULT[0] == "raise" and FAULT[1] == str(self.global_rank) and step == int(FAULT[2]):
                raise RuntimeError(f"a bad batch on rank {self.global_rank} at step {step}")
            time.sleep(float(os.environ.get("STEP_S", "0")))
            return (self.net(batch["feats"]) - batch["target"]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-2)

        def train_dataloader(self):
            mp = os.environ.get("MP")  # spawned workers persist across epochs: a spawn costs seconds of imports
            return torch.utils.data.DataLoader(
                Clips(),
                batch_size=BATCH,
                collate_fn=collate,
                num_workers=1,
                multiprocessing_context=mp,
                persistent_workers=bool(mp),
            )

    def main(exp: str) -> None:
        torch.manual_seed(0)
        callbacks = [
            Record(os.environ.get("TRUTH")),
            AsrlabCallback(
                exp,
                stall_timeout_s=float(os.environ.get("STALL_S", "20")),
                **({"keys": os.environ["KEYS"]} if os.environ.get("KEYS") else {}),
            ),
        ]
        ckpt = os.environ.get("CKPT")
        if ckpt:
            callbacks.append(
                pl.callbacks.ModelCheckpoint(dirpath=ckpt, every_n_train_steps=5, save_last=True, save_top_k=-1)
            )
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            max_epochs=int(os.environ.get("EPOCHS", "1")),
            logger=False,
            enable_checkpointing=bool(ckpt),
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=callbacks,
        )
        trainer.fit(Regressor(), ckpt_path="last" if os.environ.get("RESUME") else None)


if __name__ == "__main__":
    main(sys.argv[1])

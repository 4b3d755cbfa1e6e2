"""Faults for ESPnet's own trainer, with ESPnet's code and command unchanged: on PYTHONPATH this module is
imported at every interpreter's start (Python's ``sitecustomize``) and, once ``espnet2.train.trainer`` is
imported, wraps ``Trainer.train_one_epoch``'s iterator. ``ESPNET_FAULT`` chooses, at epoch
``ESPNET_FAULT_EPOCH`` and batch ``ESPNET_FAULT_BATCH`` (ESPnet's counting: both from 1, the batch within the
epoch, on that rank) on rank ``ESPNET_FAULT_RANK`` (default 0):

* ``nan``: the batch's audio is multiplied by NaN (every later batch too), so the loss is NaN;
* ``kill``: the rank sends itself SIGKILL before training the batch;
* ``raise``: the iterator raises ``RuntimeError`` for that batch;
* ``hang``: the rank blocks opening the FIFO ``ESPNET_FAULT_FIFO`` (nobody writes it).

Without ``ESPNET_FAULT`` it does nothing (tests/optin/toolkit_runs.py sets it for its ESPnet cases).
"""

import os
import sys

FAULT = os.environ.get("ESPNET_FAULT", "")


def _patch(trainer_module):
    Trainer = trainer_module.Trainer
    original = Trainer.train_one_epoch.__func__
    epoch_at = int(os.environ.get("ESPNET_FAULT_EPOCH", "1"))
    batch_at = int(os.environ.get("ESPNET_FAULT_BATCH", "1"))
    rank_at = int(os.environ.get("ESPNET_FAULT_RANK", "0"))

    def faulty(iterator, epoch):
        import signal

        rank = int(os.environ.get("RANK", "0"))
        for i, (ids, batch) in enumerate(iterator, 1):
            if rank == rank_at and (epoch, i) >= (epoch_at, batch_at):
                if FAULT == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif FAULT == "raise":
                    raise RuntimeError(f"synthetic fault at epoch {epoch}, batch {i}")
                elif FAULT == "hang":
                    with open(os.environ["ESPNET_FAULT_FIFO"], "rb") as fifo:
                        fifo.read()
                elif FAULT == "nan":
                    batch["speech"] = batch["speech"] * float("nan")
            yield ids, batch

    class Sized:
        def __init__(self, it, epoch):
            self.it, self.epoch = it, epoch

        def __len__(self):
            return len(self.it)

        def __iter__(self):
            return faulty(self.it, self.epoch)

    def train_one_epoch(cls, model, iterator, *args, reporter, **kwargs):
        return original(cls, model, Sized(iterator, reporter.get_epoch()), *args, reporter=reporter, **kwargs)

    Trainer.train_one_epoch = classmethod(train_one_epoch)


if FAULT:
    import importlib.abc
    import importlib.util

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "espnet2.train.trainer":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            loader = spec.loader
            exec_module = loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                _patch(module)

            loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, _Finder())

"""Faults for NeMo's own ASR training script (examples/asr/asr_ctc/speech_to_text_ctc.py), with NeMo's code and
the script unchanged: on PYTHONPATH this module is imported at every interpreter's start (Python's
``sitecustomize``; Lightning starts rank 1 as a child process with the same environment, so it is there too) and,
once ``nemo.collections.asr.models.ctc_models`` is imported, wraps ``EncDecCTCModel.training_step``.
``NEMO_FAULT`` chooses, from the optimizer step ``NEMO_FAULT_STEP`` on (Lightning's ``trainer.global_step``
while that step trains: 0 for the first batch, as NeMo logs it in its ``global_step`` scalar) on rank
``NEMO_FAULT_RANK`` (``trainer.global_rank``, default 1):

* ``nan``: the step's loss is multiplied by NaN (every later step's too);
* ``kill``: the rank sends itself SIGKILL before computing the step.

Without ``NEMO_FAULT`` it does nothing (tests/optin/nemo_cases.py sets it for its NeMo cases).
"""

import os
import sys

FAULT = os.environ.get("NEMO_FAULT", "")
TARGET = "nemo.collections.asr.models.ctc_models"


def _patch(module):
    Model = module.EncDecCTCModel
    original = Model.training_step
    step_at = int(os.environ.get("NEMO_FAULT_STEP", "0"))
    rank_at = int(os.environ.get("NEMO_FAULT_RANK", "1"))

    def training_step(self, batch, batch_nb):
        hit = self.trainer.global_rank == rank_at and self.trainer.global_step >= step_at
        if hit and FAULT == "kill":
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        out = original(self, batch, batch_nb)
        if hit and FAULT == "nan":
            loss = out["loss"] * float("nan")
            out["loss"] = loss
            if isinstance(out.get("log"), dict) and "train_loss" in out["log"]:
                out["log"]["train_loss"] = loss
        return out

    Model.training_step = training_step


if FAULT:
    import importlib.abc
    import importlib.util

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != TARGET:
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

"""A training step never waits on the device: nothing it computes is read back while the step runs.

On a GPU the test runs steady-state steps under ``torch.cuda.set_sync_debug_mode("error")``. On the CPU
there is no device to wait on, so the test follows values instead: every tensor the loader made is
marked as the host's, the mark passes to whatever is computed from marked tensors alone, and a copy
"to the device" drops it. Reading an unmarked value (``item``, ``float``, ``tolist``, ...) is what on a
GPU would wait for the device; the step may do it only where it reads the previous step's values.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from asrlab.config import load_config
from asrlab.train import step as step_module
from asrlab.lab.dist import DistInfo
from asrlab.train.step import TrainStep
from asrlab.train.trainer import Trainer

from conftest import SMALL_MODEL

SMALL = [
    *SMALL_MODEL,
    "data.max_frames_in_batch=1500",
    "data.num_workers=0",
    "train.stall_timeout_s=0",
    "train.progress=false",
    "train.diagnostics_every=0",
]
READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__bool__,
    torch.Tensor.numpy,
}
TO_DEVICE = {torch.Tensor.to, torch.Tensor.cuda}  # with non_blocking=True, as the step copies its batch
HOST = "_asrlab_host"


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


class DeviceReads(TorchFunctionMode):
    """Records where a value not computed from the host's tensors alone is read: (function, file, line)."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[str, str, int, object]] = []
        self.step = None  # reads are filed under the step being trained, None: around the steps

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS and not getattr(args[0], HOST, False):
            frame = sys._getframe(1)
            while frame is not None and "/asrlab/" not in frame.f_code.co_filename.replace("\\", "/"):
                frame = frame.f_back
            where = frame or sys._getframe(1)
            self.reads.append(
                (self.step, where.f_code.co_name, where.f_code.co_filename, where.f_lineno, where.f_locals.get("self"))
            )
        out = func(*args, **kwargs)
        if func in TO_DEVICE and kwargs.get("non_blocking"):
            return out.clone() if out is args[0] else out  # a copy to the device: no longer the host's
        inputs = list(_tensors((args, kwargs)))
        if all(getattr(t, HOST, False) for t in inputs):  # the host's alone (a factory: no inputs at all)
            for t in _tensors(out):
                setattr(t, HOST, True)
        return out


def host_batches(tr, n):
    it = iter(tr.loader)
    out = []
    for _ in range(n):
        b = next(it)
        for t in _tensors(b):
            setattr(t, HOST, True)
        out.append(b)
    return out


def test_a_steady_state_step_reads_back_only_the_step_before_it(corpus, tmp_path):
    cfg = load_config("tiny", SMALL + ["train.max_steps=6"])
    tr = Trainer(cfg, str(corpus / "data.list"), None, tmp_path / "exp", DistInfo(0, 1, 0, torch.device("cpu"), None))
    batches = host_batches(tr, 6)
    mode = DeviceReads()
    train_step = tr.stepper.train_step

    def filed(group, epoch=0):
        mode.step = tr.step + 1
        try:
            return train_step(group, epoch)
        finally:
            mode.step = None

    tr.stepper.train_step = filed
    with mode:  # the loop as it runs: steps, metrics, ledger, limits, the last settle
        tr._train_batches(iter(batches))
    tr.close()
    assert tr.step == 6
    for step in range(2, 7):  # the first step may set things up
        reads = [r for r in mode.reads if r[0] == step]
        assert [(name, file_name(file)) for _, name, file, _, _ in reads] == [("read", "guard.py")], reads
        assert reads[0][4].step == step - 1  # the previous step's values, copied when it ended
    # around the steps, only the last step is read (when the loop settles), and no other value
    around = [r for r in mode.reads if r[0] is None]
    assert [(name, file_name(file), taken.step) for _, name, file, _, taken in around] == [("read", "guard.py", 6)]


def test_the_read_counter_sees_a_loss_that_waits_on_the_device(corpus, tmp_path, monkeypatch):
    """The counter above is not blind: the CTC loss counting its alignable utterances on the device (as it
    does when given the lengths on the device, not the batch's own) is seen."""
    cfg = load_config("tiny", SMALL)
    tr = Trainer(cfg, str(corpus / "data.list"), None, tmp_path / "exp", DistInfo(0, 1, 0, torch.device("cpu"), None))
    real, copied = step_module.mean_ctc_loss, []

    def inputs(batch, phases=True):
        copied[:] = TrainStep.inputs(tr.stepper, batch, phases)
        return copied

    def on_the_device(log_probs, out_lens, targets, target_lens, host_targets=None):
        _, feat_lens, targets, target_lens = copied
        return real(log_probs, tr.model.output_lengths(feat_lens), targets, target_lens)

    monkeypatch.setattr(step_module, "mean_ctc_loss", on_the_device)
    monkeypatch.setattr(tr.stepper, "inputs", inputs)
    (batch,) = host_batches(tr, 1)
    with DeviceReads() as mode:
        tr.train_step([batch])
    tr.close()
    assert "ctc_loss" in {name for _, name, *_ in mode.reads}, mode.reads


def file_name(file: str) -> str:
    return file.replace("\\", "/").rsplit("/", 1)[-1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/on_gpu.sh gputests runs it on one)")
def test_a_steady_state_step_on_a_gpu_never_syncs(corpus, tmp_path, monkeypatch):
    """Steady-state steps under sync debug mode "error", every part of the step included, mixed precision
    with its scaler. Torch's native CUDA CTC loss copies its length tables to the device with blocking
    copies, in its forward and again in its backward (a stream sync inside ``F.ctc_loss`` and inside its
    backward node that no caller can avoid); those two run with the mode off, and are counted, so anything
    else that waits on the device fails the test."""
    cuda = torch.device("cuda", 0)
    cfg = load_config("tiny", SMALL + ["train.precision=fp16"])
    tr = Trainer(cfg, str(corpus / "data.list"), None, tmp_path / "exp", DistInfo(0, 1, 0, cuda, None))
    batches = host_batches(tr, 8)
    ctc_calls, ctc_backwards = [], []
    real_ctc = torch.nn.functional.ctc_loss

    def ctc_node(out):
        todo = [out.grad_fn]
        while todo:
            node = todo.pop()
            if node is not None and type(node).__name__.startswith("CtcLossBackward"):
                return node
            todo += [] if node is None else [n for n, _ in node.next_functions]
        raise AssertionError(f"no CTC backward node under {out.grad_fn}")

    def ctc(*args, **kwargs):
        torch.cuda.set_sync_debug_mode(0)
        try:
            ctc_calls.append(1)
            out = real_ctc(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("error")
        if out.requires_grad:  # the backward's own copy of the length tables, let through the same way
            node = ctc_node(out)
            node.register_prehook(lambda grads: (torch.cuda.set_sync_debug_mode(0), ctc_backwards.append(1))[1])
            node.register_hook(lambda grad_in, grad_out: torch.cuda.set_sync_debug_mode("error"))
        return out

    for b in batches[:3]:  # warm-up: allocator, cuDNN, the first read
        tr.train_step([b])
        tr.phases.stop()
    torch.cuda.synchronize()
    monkeypatch.setattr(torch.nn.functional, "ctc_loss", ctc)
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = []
        for b in batches[3:]:
            tr.phases.start()
            results.append(tr.train_step([b]))
            tr.stepper.unread[-1].parts = tr.phases.stop(lazy=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    last = tr.settle()
    tr.close()
    assert len(ctc_calls) == 5 and len(ctc_backwards) == 5 and all(r is not None for r in results)
    assert [r.step for r in results] == [3, 4, 5, 6, 7] and last.step == 8
    assert all(math.isfinite(r.check.loss) for r in results + [last])

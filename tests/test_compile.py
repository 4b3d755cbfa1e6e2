"""``train.compile``: the compiled step trains as the eager one does, and resumes exactly.

On CPU, inductor's code generation takes minutes for one graph here (benchmarks/compile_cpu.txt), so these
tests compile with ``train.compile_backend=aot_eager``: the model traced by Dynamo and AOTAutograd (graph
breaks, guards, the backward graph, the guard's hooks and eager replays) and run without generated kernels.
Inductor itself runs on a GPU (benchmarks/on_gpu.sh)."""

from __future__ import annotations

import math
import time

import pytest
import torch

from asrlab.lab.metrics import read_metrics

from helpers import make_trainer

COMPILED = ["train.compile=true", "train.compile_backend=aot_eager"]
# sampled statistics every 7th step (those run eagerly), a checkpoint at step 10, no stall watchdog in-process
RUN = ["train.diagnostics_every=7", "train.save_every_steps=10", "train.stall_timeout_s=0", "train.preflight=false"]
LOSS_RTOL = 1e-4  # aot_eager decomposes some ops (a different float summation order), never the model's maths


class Killed(Exception):
    """The run ended right after a checkpoint (as a SIGKILL then would: nothing after it kept)."""


def train(corpus, exp, *extra, resume: bool = False, killed_at: int = 0) -> tuple[list[float], dict]:
    """20 steps (the LR schedule's horizon), or to the checkpoint at ``killed_at``; losses and final weights."""
    tr = make_trainer(corpus, exp, *RUN, "train.max_steps=20", *extra)
    save = tr.save

    def save_then_die():
        save()
        if killed_at and tr.step >= killed_at:
            raise Killed()

    tr.save = save_then_die
    try:
        if resume:
            assert tr.resume()
        try:
            tr.fit()
        except Killed:
            pass
        weights = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    finally:
        tr.close()
    return [m["loss"] for m in read_metrics(exp)], weights


@pytest.fixture(scope="module")
def compiled_run(corpus, tmp_path_factory):
    from torch._dynamo.utils import counters

    counters.clear()
    run = train(corpus, tmp_path_factory.mktemp("compiled") / "exp", *COMPILED)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], dict(counters)  # compiled, whole
    return run


def test_a_compiled_batchs_frames_are_padded_to_a_static_length_bucket(corpus, tmp_path):
    """Lengths left symbolic, inductor failed on a GPU (CantSplit, docs/gpu.md): each compiled batch's frames are
    padded up to a multiple of ``train.compile_pad_frames`` and static in the graph, only the batch size dynamic.
    The compiled losses equal the eager ones (above): the model ignores the padded frames."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    frames, lengths = [], set()

    def recording(gm, example_inputs):  # aot_eager, after noting the fbank input's length in each graph
        frames.extend(x.shape[1] for x in example_inputs if isinstance(x, torch.Tensor) and x.shape[-1:] == (80,))
        return aot_autograd(fw_compiler=boxed_nop)(gm, example_inputs)

    tr = make_trainer(corpus, tmp_path / "exp", *RUN, "train.max_steps=8", *COMPILED, "train.compile_pad_frames=128")
    tr.stepper.compiled = torch.compile(tr.stepper.model, backend=recording)
    inputs = tr.stepper.inputs
    tr.stepper.inputs = lambda batch: (r := inputs(batch), lengths.add(r[0].size(1)))[0]
    try:
        tr.fit()
    finally:
        tr.close()
    assert frames and all(isinstance(t, int) and t % 128 == 0 for t in frames), frames
    assert len({-(-n // 128) for n in lengths}) == len(set(frames)) < len(lengths), (frames, lengths)


def test_the_compiled_step_gives_the_eager_steps_losses(corpus, tmp_path, compiled_run):
    eager, _ = train(corpus, tmp_path / "eager")
    compiled, _ = compiled_run
    assert len(eager) == len(compiled) == 20
    assert all(math.isclose(a, b, rel_tol=LOSS_RTOL) for a, b in zip(eager, compiled)), list(zip(eager, compiled))


def test_a_compiled_run_stopped_and_resumed_ends_where_the_uninterrupted_one_ends(corpus, tmp_path, compiled_run):
    exp = tmp_path / "exp"
    train(corpus, exp, *COMPILED, killed_at=10)  # ends with its checkpoint at step 10
    losses, weights = train(corpus, exp, *COMPILED, resume=True)  # a new trainer (a new compile) resumes it
    whole_losses, whole = compiled_run
    assert losses[10:] == whole_losses[10:]
    assert all(torch.equal(weights[k], whole[k]) for k in whole), [
        k for k in whole if not torch.equal(weights[k], whole[k])
    ]


def test_a_compilation_is_its_own_phase_with_a_long_allowance_not_a_stall():
    """torch.compile compiles at the first step and again at a new shape (minutes for inductor): the heartbeat says
    ``compile`` with its long allowance meanwhile, so the stall watchdog waits, and the interrupted phase after."""
    from asrlab.lab import Heartbeat
    from asrlab.lab.stall.heartbeat import COMPILE_ALLOW_S, say_compiles
    from asrlab.lab.stall.watchdog import ProgressClock
    from torch._dynamo.callback import callback_handler

    hb, seen = Heartbeat(0), []
    hb.enter("forward", 3)
    say_compiles(hb)
    look = callback_handler.register_start_callback(lambda args: seen.append((hb.phase, hb.allow_s, hb.snapshot())))
    try:
        torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    finally:
        callback_handler.remove_start_callback(look)
        say_compiles(None)
    (phase, allow, snap), *_ = seen
    assert (phase, allow) == ("compile", COMPILE_ALLOW_S) and (hb.phase, hb.allow_s) == ("forward", 0.0)
    clock = ProgressClock(world_size=1, timeout_s=0.01, first_step_s=0.01)
    clock.overdue({0: snap})
    time.sleep(0.05)  # no progress for five times the allowance of a step, but a compile: within its own
    assert clock.overdue({0: snap}) is None
    assert clock.overdue({0: {**snap, "allow_s": 0.0}}) is not None


def test_a_loop_of_the_parts_has_its_compilations_said_by_its_stall_watch(tmp_path):
    """A loop of asrlab.lab's parts with torch.compile: its StallWatch says the compilations (a stranger's loop, a
    transformer recompiled at a new length for 7.9 s, stalled at step 2 under a 2-s timeout without it), and says
    nothing more once stopped."""
    from asrlab import lab
    from torch._dynamo.callback import callback_handler

    seen = []
    w = lab.StallWatch(tmp_path / "exp", timeout_s=60).start()
    look = callback_handler.register_start_callback(lambda args: seen.append(w.hb.phase))
    try:
        torch.compile(lambda x: x - 1, backend="eager")(torch.ones(2))
        w.stop()
        torch.compile(lambda x: x + 3, backend="eager")(torch.ones(2))
    finally:
        callback_handler.remove_start_callback(look)
        w.stop()
    assert seen == ["compile", "done"], seen  # stopped: its heartbeat is done, and hears no more


def test_a_backend_that_fails_to_compile_leaves_the_run_training_eagerly(corpus, tmp_path, caplog):
    """inductor failed on an H200 at a new batch shape (CantSplit, docs/gpu.md): the run says so once and trains on
    eagerly, every step, rather than ending."""
    calls = []

    def failing(gm, example_inputs):
        calls.append(len(example_inputs))
        raise RuntimeError("CantSplit: a backend that cannot compile this graph")

    tr = make_trainer(corpus, tmp_path / "exp", *RUN, "train.max_steps=3", *COMPILED)
    tr.stepper.compiled = torch.compile(tr.stepper.model, backend=failing)
    try:
        with caplog.at_level("WARNING", logger="asrlab.train.step"):
            tr.fit()
    finally:
        tr.close()
    said = [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert calls and len(said) == 1 and "CantSplit" in said[0], said
    assert tr.stepper.compiled is None and [m["step"] for m in read_metrics(tmp_path / "exp")] == [1, 2, 3]

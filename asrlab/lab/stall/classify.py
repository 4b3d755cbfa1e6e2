"""What a sampled stack says a process is doing: a phase of the training step, and the line of the
job's own code it is at.

A stack anywhere inside torch.compile's compilation is ``compile``. Else the rules read the frames from the
innermost out, and the first that matches names the phase:
torch.distributed's collectives, a DataLoader's ``__next__`` (waiting for data), the optimizer (and the
grad scaler's step), autograd's backward, ``torch.save``/``torch.load``, start-up (imports, the process
group's set-up), a module's forward; else the loop's own code. Any of these but a collective inside an evaluation
pass (``validate``, ``evaluate``, ``validation_step``, ...) is ``eval``. A DataLoader worker is ``reading`` when
it is anywhere but waiting for its next index. ``asrlab watch`` reads stacks sampled from outside with
these rules; a stall watchdog inside a rank reads its own main thread's stack with them. Which loop of the
job's own code a stack is in, and how that loop counts its steps, is read from the job's source file.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
import traceback

Frame = tuple[str, int, str]  # (file, line, function), as py-spy, faulthandler and sys._current_frames give them

COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "wait",
}
DDP_COLLECTIVES = {
    "_pre_forward",
    "_rebuild_buckets",
    "_sync_buffers",
    "_sync_module_states",
    "_check_global_requires_backward_grad_sync",
    "_match_all_reduce_for_bwd_pass",
    "_distributed_broadcast_coalesced",
}
START = {"init_process_group", "_create_c10d_store", "rendezvous", "_new_process_group_helper"}


def _is(file: str, *parts: str) -> bool:
    f = file.replace("\\", "/")
    return any(p in f for p in parts)


# asrlab's own files (the package, its injected sitecustomize among them) are those under this folder,
# wherever it is installed; a user's file in any other folder named ``asrlab`` (a clone of this
# repository, say) is the job's own code.
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PACKAGE = tuple({os.path.join(_HERE, ""), os.path.join(os.path.realpath(_HERE), "")})


def own_code(file: str) -> bool:
    """A file of the job itself, not of Python, an installed package or asrlab."""
    f = file.replace("\\", "/")
    return not (
        f.startswith("<")
        or "/site-packages/" in f
        or "/dist-packages/" in f
        or "/lib/python3" in f
        or f.startswith(_PACKAGE)
    )


# a function of an evaluation pass, the job's own or its toolkit's: its forward, its data and its loss are no
# training step's (a collective in it is still one the ranks wait in)
EVAL_FNS = {
    "validate", "validation", "evaluate", "evaluation", "evaluation_loop", "_evaluation_loop", "validation_loop",
    "validation_step", "val_step", "valid_step", "eval_step", "run_validation", "_run_validation", "run_evaluation",
    "run_eval", "do_eval", "do_validation", "val_epoch", "valid_epoch", "eval_epoch", "validate_epoch",
    "evaluate_epoch", "compute_validation_loss",
}  # fmt: skip


def phase_of(frames: list[Frame]) -> str:
    """The phase of a rank's main-thread stack (outermost first); inside an evaluation pass, ``eval``."""
    phase = _phase_of(frames)
    if phase in ("collective", "start", "compile"):
        return phase
    return "eval" if any(fn.lower() in EVAL_FNS for _, _, fn in frames) else phase


def _phase_of(frames: list[Frame]) -> str:
    if any(
        _is(f, "torch/_dynamo/convert_frame.py", "torch/_inductor/compile_fx.py") and fn != "<module>"
        for f, _, fn in frames
    ):  # the module's own code runs at its import (DDP's, DeepSpeed's), which is not a compilation
        return "compile"  # torch.compile at work (its tracing runs modules' forwards on fake tensors too)
    for file, _, fn in reversed(frames):
        if _is(file, "torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py") and (
            fn in COLLECTIVES or fn in START
        ):
            return "start" if fn in START else "collective"
        if _is(file, "torch/nn/parallel/distributed.py") and fn in DDP_COLLECTIVES:
            return "collective"  # DDP's own collectives around the forward (its buckets, its buffers)
        if _is(file, "torch/utils/data/dataloader.py") and fn in (
            "__next__",
            "_next_data",
            "_get_data",
            "_try_get_data",
            "__iter__",
            "_get_iterator",
        ):
            return "data"
        if _is(file, "torch/optim/", "torch/amp/grad_scaler.py") and fn in (
            "step",
            "_step",
            "wrapper",
            "_use_grad",
            "unscale_",
            "_fused_adamw",
        ):
            return "optimizer"
        if _is(file, "torch/autograd/", "torch/_tensor.py") and fn in ("backward", "_engine_run_backward", "grad"):
            return "backward"
        if _is(file, "torch/serialization.py") and fn in ("save", "load", "_save", "_load"):
            return "checkpoint"
        if fn in START or file.startswith("<frozen importlib"):
            return "start"
        if _is(file, "torch/nn/modules/module.py") and fn in ("_call_impl", "_wrapped_call_impl"):
            return "forward"
    return "other"


def held_phase(phase: str, world: int) -> str:
    """The phase of a rank whose stacks stopped moving: a backward that does not move in a job of several
    ranks waits for the others' gradients, in DDP's all-reduce."""
    return "ddp_allreduce" if phase == "backward" and world > 1 else phase


def worker_busy(frames: list[Frame]) -> bool:
    """A DataLoader worker fetching (not waiting for its next index, not yet started)."""
    for file, _, fn in reversed(frames):
        if _is(file, "torch/utils/data/_utils/fetch.py") or own_code(file):
            return True
        if _is(file, "torch/utils/data/_utils/worker.py") and fn == "_worker_loop":
            return False
    return False


def worker_own(frames: list[Frame]) -> list[Frame]:
    """A forked worker's stack from its own start on (above it: the frames of its rank, copied at the fork)."""
    for i, (file, _, fn) in enumerate(frames):
        if _is(file, "multiprocessing/process.py") and fn == "_bootstrap":
            return frames[i:]
    return frames


def own_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the job's own code: where it is, in its author's words."""
    for f in reversed(frames):
        if own_code(f[0]):
            return f
    return None


def own_stack(thread_id: int) -> list[Frame]:
    """A thread of this process, as the rules read it (outermost first)."""
    frame = sys._current_frames().get(thread_id)
    return [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_stack(frame)] if frame else []


_FILE = re.compile(r'File "([^"]+)"')


def own_tail(lines: list[str], least: int = 12) -> list[str]:
    """A formatted stack (traceback's frames, innermost last) from the innermost frame of the job's own code
    down to the blocking call, so the loop's own line is always shown; at least the last ``least`` frames."""
    mine = [i for i, line in enumerate(lines) if (m := _FILE.search(line)) and own_code(m.group(1))]
    start = len(lines) - least
    if mine:
        start = min(start, mine[-1])
    return lines[max(0, start) :]


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str) -> dict[str, list[Frame]]:
    """``faulthandler``'s dump (innermost call first per thread) as ``{thread: stack}``; the thread that
    did not start in ``threading`` is the main one."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            threads.append((m.group(2), []))
            continue
        f = _FRAME.match(line)
        if f and threads:
            threads[-1][1].append((f.group(1), int(f.group(2)), f.group(3)))
    out = {}
    for ident, frames in threads:
        frames.reverse()
        main = bool(frames) and not frames[0][0].endswith("threading.py")
        out["MainThread" if main and "MainThread" not in out else f"thread {ident}"] = frames
    return out


def worker_lines(text: str) -> list[str]:
    """``["worker pid 42 at dataset.py:80 in __getitem__", ...]``: where each data-loader worker of a dump
    (sections ``[... pid N]`` of faulthandler's text) is reading, in the job's own code."""
    out = []
    for section in re.split(r"^\[[^\]\n]*pid (\d+)\]\s*$", text, flags=re.M)[1:]:
        if section.isdigit():
            pid = section
            continue
        frames = worker_own(parse_faulthandler(section).get("MainThread") or [])
        if worker_busy(frames):
            out.append(f"worker pid {pid} at {where(own_frame(frames)) or 'a read'}")
    return out


Loop = tuple[str, str, int, int]  # (file, function, first line, last line) of a for/while statement


@functools.lru_cache(maxsize=256)
def _functions(file: str) -> tuple:
    """The functions of a source file: ``(name, first line, last line, is a generator, loops)``, each loop
    ``(first line, last line, counter, a for over range())``; empty when the file cannot be read."""
    try:
        with open(file, encoding="utf-8", errors="replace") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            continue
        own = list(_own_nodes(fn))
        loops = tuple(
            (n.lineno, n.end_lineno, _counter(n), _over_range(n))
            for n in own
            if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
        )
        name = "<module>" if isinstance(fn, ast.Module) else fn.name
        first, last = (1, 10**9) if isinstance(fn, ast.Module) else (fn.lineno, fn.end_lineno)
        out.append((name, first, last, any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in own), loops))
    return tuple(out)


def _own_nodes(fn: ast.AST):
    """The nodes of a function's body, not those of functions or classes defined inside it."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield n
        todo.extend(ast.iter_child_nodes(n))


def _over_range(loop: ast.AST) -> bool:
    """``for i in range(...)``: a fixed count (micro-batches of an accumulation, steps of an epoch)."""
    it = getattr(loop, "iter", None)
    return isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"


def _counter(loop: ast.AST) -> tuple | None:
    """How a loop counts its steps: ``("index", name, start)`` for ``for i, x in enumerate(..., start)``;
    ``("count", name, line)`` for a ``name += 1`` in its body (at ``line``); else None."""
    if (
        isinstance(loop, (ast.For, ast.AsyncFor))
        and isinstance(loop.iter, ast.Call)
        and isinstance(loop.iter.func, ast.Name)
        and loop.iter.func.id == "enumerate"
        and isinstance(loop.target, ast.Tuple)
        and loop.target.elts
        and isinstance(loop.target.elts[0], ast.Name)
    ):
        start = (
            loop.iter.args[1]
            if len(loop.iter.args) > 1
            else next((k.value for k in loop.iter.keywords if k.arg == "start"), None)
        )
        return ("index", loop.target.elts[0].id, start.value if isinstance(start, ast.Constant) else 0)
    for n in ast.walk(loop):
        if (
            isinstance(n, ast.AugAssign)
            and isinstance(n.op, ast.Add)
            and isinstance(n.target, ast.Name)
            and isinstance(n.value, ast.Constant)
            and n.value.value == 1
        ):
            return ("count", n.target.id, n.lineno)
    return None


def _function(frame: Frame) -> tuple | None:
    file, line, fn = frame
    found = [f for f in _functions(file) if f[0] == fn and f[1] <= line <= f[2]]
    return min(found, key=lambda f: f[2] - f[1]) if found else None


def loop_of(frames: list[Frame]) -> Loop | None:
    """The loop a stack is in, in the job's own code: the innermost own frame (not a generator's, which
    only relays the batches) whose line lies inside a ``for``/``while`` of its function, and that loop; a
    ``for`` over ``range()`` inside another loop is a step's micro-batches, and the loop around it the steps'."""
    for frame in reversed(frames):
        if not own_code(frame[0]):
            continue
        fn = _function(frame)
        if fn is None or fn[3]:
            continue
        inside = [lp for lp in fn[4] if lp[0] <= frame[1] <= lp[1]]
        if inside:
            inner = max(inside, key=lambda lp: lp[0])
            if inner[3] and (around := [lp for lp in inside if not lp[3] and lp is not inner]):
                inner = max(around, key=lambda lp: lp[0])
            return (frame[0], frame[2], inner[0], inner[1])
    return None


def loop_frame(frames: list[Frame], loop: Loop) -> Frame | None:
    """The frame of ``loop``'s function in a stack (the innermost), or None when it is not on it."""
    for frame in reversed(frames):
        if frame[0] == loop[0] and frame[2] == loop[1]:
            return frame
    return None


def step_of(loop: Loop, line: int, values: dict[str, str], after: bool) -> int | None:
    """The step a rank is on (``after``: the last it took) in the loop's own count, from the values of its
    function's locals (``{name: repr}``) while at ``line``: the index of ``enumerate`` (one more at the loop's
    head, where the next batch is awaited), else the counter that the loop adds 1 to (one more while the rank is
    in a step before that line): a rank waiting for its next batch is on the step that batch is for."""
    fn = _function((loop[0], loop[2], loop[1]))
    counter = next((lp[2] for lp in (fn[4] if fn else ()) if lp[0] == loop[2]), None)
    if counter is None or not str(values.get(counter[1], "")).lstrip("-").isdigit():
        return None
    value = int(values[counter[1]])
    if counter[0] == "index":
        return value + (not after and line == loop[2])
    return value + (not after and line < counter[2])


def where(frame: Frame | None) -> str:
    if frame is None:
        return ""
    file, line, fn = frame
    return f"{file.rsplit('/', 1)[-1]}:{line} in {fn}"


_READS = ("__getitem__", "__getitems__", "__iter__", "__next__", "__len__")


def waits_at(frame: Frame | None) -> str:
    """Where a rank waiting for data is, in its own code: its loop's line, or its dataset's own read (a loader with
    no workers reads in the rank's process: the innermost frame of the job's code is then the dataset's)."""
    if frame is None:
        return ""
    return f"{'reading' if frame[2] in _READS or 'collate' in frame[2] else 'loop'} at {where(frame)}"


__all__ = [
    "COLLECTIVES",
    "Frame",
    "Loop",
    "held_phase",
    "loop_frame",
    "loop_of",
    "own_code",
    "own_frame",
    "own_stack",
    "own_tail",
    "parse_faulthandler",
    "phase_of",
    "step_of",
    "waits_at",
    "where",
    "worker_busy",
    "worker_lines",
    "worker_own",
]

"""Where a step's time goes, and what the machine is doing meanwhile.

``StepTimer``   splits every step into data wait, host-to-device copy, features (when
                fbank is made on the device), forward, backward, communication and optimizer (s): CUDA events on GPUs (asynchronous kernels are
                timed where they run, not where they were launched), wall clock on CPU. The
                parts telescope: they add up to the step exactly.
``GpuSampler``  a thread sampling NVML (``nvidia-ml-py``) per device: utilisation (%), memory
                (MiB), power (W). No GPU or no NVML: ``available`` is False and ``reason`` says
                why; it never raises.
``CpuSampler``  a thread sampling ``psutil``: CPU % of the main process and of each of its
                children (the data-loader workers), so a saturated worker pool shows.
``trace``       a ``torch.profiler`` schedule that exports a Chrome trace for a window of steps.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PARTS = ("data", "copy", "features", "forward", "backward", "comm", "optimizer")


class StepTimer:
    """``start()``, then ``mark(part)`` as each part begins, then ``stop()`` -> ``{part: s, "total": s}``.

    ``mark(part, at=t)`` (CPU only) back-dates a boundary to ``time.perf_counter()`` value ``t``:
    the trainer uses it to split the end of backward into the exposed gradient all-reduce.
    A part marked twice in a step accumulates.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        import torch  # here, not at the top: the doctor reads step splits without torch's start-up

        self.cuda = torch.device(device).type == "cuda"
        self._event = torch.cuda.Event if self.cuda else None
        self._marks: list[tuple[str | None, object]] = []

    def _now(self):
        if self.cuda:
            e = self._event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self, part: str = "data") -> None:
        self._marks = [(part, self._now())]

    def mark(self, part: str, at: float | None = None) -> None:
        if not self._marks:
            self.start(part)
            return
        if at is not None and not self.cuda:
            if at > self._marks[-1][1]:
                self._marks.append((part, at))
            return
        self._marks.append((part, self._now()))

    def stop(self, lazy: bool = False):
        """The parts of the step (s); ``lazy``: a callable that returns them, which on a GPU reads the
        events only when called (by then long completed), so stopping never waits on the device."""
        end = self._now()
        marks = self._marks + [(None, end)]
        self._marks = []
        read = lambda: self._parts(marks)  # noqa: E731
        return read if lazy else read()

    def _parts(self, marks) -> dict[str, float]:
        if self.cuda:
            marks[-1][1].synchronize()
            spans = [a[1].elapsed_time(b[1]) / 1e3 for a, b in zip(marks, marks[1:])]
        else:
            spans = [b[1] - a[1] for a, b in zip(marks, marks[1:])]
        out = {p: 0.0 for p in PARTS}
        for (part, _), s in zip(marks, spans):
            out[part] = out.get(part, 0.0) + s
        out["total"] = sum(spans)
        return out


SPLIT = ("data_wait", "host_overhead", "compute", "comm")
SPLIT_NAMES = {
    "data_wait": "data wait",
    "host_overhead": "host overhead",
    "compute": "compute",
    "comm": "communication",
}
COMPUTE_PARTS = ("copy", "features", "forward", "backward", "optimizer")


def step_split(metrics: list[dict], gpu_busy: float | None = None) -> dict | None:
    """Where the wall-clock time of a run of steps went, as shares that add up to 1, and the largest.

    ``metrics``: one rank's metrics lines (``time``, ``data_wait_s``, ``comm_s`` and the compute parts),
    in order; the wall clock is the span of their ``time`` stamps, and each share is over the steps after
    the first (steps across an epoch's end, with its evaluation and checkpoint, are left out).

    * ``data_wait``: waiting for a batch; ``comm``: exposed communication (gradient all-reduce, agreements);
    * ``compute``: the step's own work; with ``gpu_busy`` (the GPU's busy fraction over the same time,
      e.g. NVML utilisation / 100) the busy time less communication, else the timed parts
      (copy, features, forward, backward, optimizer);
    * ``host_overhead``: the rest: time the device sat idle while the host ran (Python, launches,
      bookkeeping between steps). None with fewer than two lines."""
    pairs = [(a, b) for a, b in zip(metrics, metrics[1:]) if a.get("epoch") == b.get("epoch")]
    wall = sum(b["time"] - a["time"] for a, b in pairs)
    if not pairs or wall <= 0:
        return None
    lines = [b for _, b in pairs]
    data = sum(x["data_wait_s"] for x in lines) / wall
    comm = sum(x.get("comm_s", 0.0) for x in lines) / wall
    compute = sum(x.get(f"{p}_s", 0.0) for x in lines for p in COMPUTE_PARTS) / wall
    return _shares(data, comm, compute, gpu_busy, steps=len(lines), wall_s=round(wall, 3))


def with_gpu_busy(split: dict, gpu_busy: float) -> dict:
    """A split from timed parts (:func:`step_split`) told again with its GPU's busy share, read elsewhere over the
    same steps (``asrlab watch``'s NVML beside a run's metrics)."""
    return _shares(
        split["data_wait"], split["comm"], split["compute"], gpu_busy, steps=split["steps"], wall_s=split["wall_s"]
    )


def _shares(data: float, comm: float, compute: float, gpu_busy: float | None, **rest) -> dict:
    if gpu_busy is not None:
        compute = max(0.0, gpu_busy - comm)
    data, comm, compute = (min(1.0, v) for v in (data, comm, compute))
    scale = max(1.0, data + comm + compute)  # timers overlap a little at the edges: never over 1 together
    out = {"data_wait": data / scale, "comm": comm / scale, "compute": compute / scale}
    out["host_overhead"] = max(0.0, 1.0 - sum(out.values()))
    out = {k: round(out[k], 4) for k in SPLIT}
    basis = "GPU busy (NVML)" if gpu_busy is not None else "timed parts"
    return {**out, "largest": max(SPLIT, key=lambda k: out[k]), **rest, "basis": basis}


def format_split(split: dict) -> str:
    """``data wait 3%, host overhead 12%, compute 80%, communication 5%: compute is the largest``."""
    shares = ", ".join(f"{SPLIT_NAMES[k]} {100 * split[k]:.0f}%" for k in SPLIT)
    return f"{shares}: {SPLIT_NAMES[split['largest']]} is the largest"


# the bound of a job (docs/guide.md, "What bounds a job"): a GPU this busy is the bound, whatever else the step
# does; a wait (for data, in collectives) this large a share of the time names that wait
BOUND_BUSY = 0.9
BOUND_WAIT = 0.25
# a rank's phases, as the watch samples them, in the split's terms
PHASE_PART = {"data": "data_wait", "collective": "comm", "ddp_allreduce": "comm", "allreduce": "comm", "sync": "comm"}


OWN_CODE = 0.5  # of a rank's sampled time in the loop's own code: what holds it back cannot be said


# phases outside the steps (starting up, compiling, checkpoints, evaluation, after the loop): no part of a step's
# split, and the GPU's busy share is not read in them
NOT_STEP = frozenset(
    ("start", "index", "compile", "checkpoint", "eval", "epoch_end", "left_loop", "next_epoch", "done", "exited")
)


def split_of_phases(shares: dict[str, float], gpu_busy: float | None = None) -> dict:
    """The split of a rank's sampled time in its steps (``{phase: share}``, as ``asrlab watch`` samples the
    stacks; phases outside the steps left out): waits for data and in collectives as such; the rest is the
    step's own work, of which, with ``gpu_busy``, the part the GPU was not busy is host overhead."""
    out = {k: 0.0 for k in SPLIT}
    stepping = sum(v for p, v in shares.items() if p not in NOT_STEP) or 1.0
    for phase, share in shares.items():
        if phase not in NOT_STEP:
            out[PHASE_PART.get(phase, "compute")] += share / stepping
    if gpu_busy is not None:
        work = out["compute"]
        out["compute"] = min(work, max(0.0, gpu_busy - out["comm"]))
        out["host_overhead"] = work - out["compute"]
    out = {k: round(v, 4) for k, v in out.items()}
    out["largest"] = max(SPLIT, key=lambda k: out[k])
    # of the step's own work, what the stacks cannot tell apart from waiting: the loop's own code (a reader or
    # a wait of its own, a validation pass) and backward (which holds DDP's gradient all-reduce)
    out["own_code"], out["in_backward"] = (round(shares.get(p, 0.0) / stepping, 4) for p in ("other", "backward"))
    return out


def bound(split: dict, gpu_busy: float | None = None, ranks: int = 1) -> dict:
    """``{"bound", "evidence"}``: what holds a rank's steps back, read from its split (:func:`step_split`,
    :func:`split_of_phases`) and its GPU's busy share: ``device`` (the GPU busy >= 90% of the time),
    ``data`` or ``communication`` (that wait >= 25% of the time, the larger of the two), ``host`` (the GPU
    known to idle while the main thread runs the step: Python and kernel launches), ``unknown`` (sampled stacks
    mostly in the loop's own code), else ``compute`` (the step's own work, with no GPU busy share to tell the
    host from the device)."""
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    busy = "" if gpu_busy is None else f"; the GPU busy {pct(gpu_busy)}"
    if gpu_busy is not None and gpu_busy >= BOUND_BUSY:
        return {"bound": "device", "evidence": f"the GPU is busy {pct(gpu_busy)} of the time"}
    wait, share = max((("data", split["data_wait"]), ("communication", split["comm"])), key=lambda x: x[1])
    if share >= BOUND_WAIT:
        where = "waiting for data (the loader)" if wait == "data" else "waiting in collectives (the other ranks)"
        return {"bound": wait, "evidence": f"{pct(share)} of the time {where}{busy}"}
    if gpu_busy is not None:
        return {
            "bound": "host",
            "evidence": f"the GPU idles {pct(1 - gpu_busy)} of the time while the main thread runs the step "
            f"(host overhead {pct(split['host_overhead'])}; data wait {pct(split['data_wait'])}, "
            f"communication {pct(split['comm'])})",
        }
    if split.get("own_code", 0.0) >= OWN_CODE:
        return {
            "bound": "unknown",
            "evidence": f"{pct(split['own_code'])} of the time in the loop's own code, outside forward, backward and "
            "the loader (a reader or a wait of its own, a validation pass: the stacks do not tell which)",
        }
    held = split.get("in_backward", 0.0) if ranks > 1 else 0.0  # one rank alone waits for no other in backward
    return {
        "bound": "compute",
        "evidence": f"{pct(split['compute'] + split['host_overhead'])} of the time in the step's own work (no GPU "
        "busy share sampled: the host's part and the device's are not told apart"
        + (f"; {pct(held)} in backward, which holds DDP's gradient all-reduce: a wait for a slower rank is counted "
           "there" if held >= BOUND_WAIT else "") + ")",
    }  # fmt: skip


class _Sampler(threading.Thread):
    """A background thread calling ``self.sample()`` every ``interval_s``; ``samples`` is the list of rows."""

    def __init__(self, interval_s: float):
        super().__init__(daemon=True, name=type(self).__name__)
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self._halt = threading.Event()
        self.t0 = time.time()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.samples.extend(self.sample())
            except Exception as e:  # a sampler must never take the run down
                self.reason = f"sampling failed: {e}"
                return
            self._halt.wait(self.interval_s)

    def sample(self) -> list[dict]:
        raise NotImplementedError

    def during(self, start: float, end: float) -> list[dict]:
        """Rows sampled from wall-clock ``start`` to ``end`` (``time.time()`` s), and up to one interval after:
        NVML's utilisation is a share of the time before its sample."""
        return [r for r in self.samples if start <= self.t0 + r["t"] <= end + self.interval_s]

    def stop(self) -> list[dict]:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        return self.samples

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def open_nvml() -> tuple[object, list, str]:
    """``(pynvml, handles, reason)``: NVML initialised with a handle per GPU, and what was found; ``(None, [],
    why not)`` where it cannot be (not installed, no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return pynvml, handles, f"{len(handles)} GPU(s) through NVML" if handles else "NVML found no GPU"
    except ImportError:
        return None, [], "nvidia-ml-py is not installed"
    except Exception as e:  # NVML library absent (no driver): pynvml.NVMLError_LibraryNotFound, ...
        return None, [], f"no GPU sampling: {type(e).__name__}: {e}".strip()


class GpuSampler(_Sampler):
    """NVML per device: ``{"t", "device", "util_pct", "mem_mib", "power_w"}`` rows."""

    def __init__(self, interval_s: float = 0.2):
        super().__init__(interval_s)
        self._nvml, self._handles, self.reason = open_nvml()
        self.available = bool(self._handles)

    def run(self) -> None:
        if self.available:
            super().run()

    def sample(self) -> list[dict]:
        t, nv, rows = time.time() - self.t0, self._nvml, []
        for i, h in enumerate(self._handles):
            try:
                power = nv.nvmlDeviceGetPowerUsage(h) / 1e3
            except Exception:
                power = float("nan")
            rows.append(
                {
                    "t": t,
                    "device": i,
                    "util_pct": nv.nvmlDeviceGetUtilizationRates(h).gpu,
                    "mem_mib": nv.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                    "power_w": power,
                }
            )
        return rows


class CpuSampler(_Sampler):
    """psutil: ``{"t", "pid", "role", "cpu_pct", "rss_mib"}`` for the process and each child (data-loader workers).

    ``cpu_pct`` is of one core (a worker using two cores shows 200).
    """

    def __init__(self, interval_s: float = 0.5, pid: int | None = None):
        super().__init__(interval_s)
        import psutil

        self._psutil = psutil
        self.main = psutil.Process(pid)
        self._known: dict[int, object] = {}
        self.available, self.reason = True, f"psutil, {psutil.cpu_count()} logical cores"

    def sample(self) -> list[dict]:
        ps, t, rows = self._psutil, time.time() - self.t0, []
        procs = [(self.main, "main")] + [(c, "worker") for c in self.main.children(recursive=True)]
        for p, role in procs:
            p = self._known.setdefault(p.pid, p)  # cpu_percent needs the same object between calls
            try:
                with p.oneshot():
                    rows.append(
                        {
                            "t": t,
                            "pid": p.pid,
                            "role": role,
                            "cpu_pct": p.cpu_percent(None),
                            "rss_mib": p.memory_info().rss / 2**20,
                        }
                    )
            except ps.Error:
                continue
        return rows


@contextlib.contextmanager
def trace(out_dir: str | Path, wait: int = 2, warmup: int = 2, active: int = 5, device: str = "cpu"):
    """``torch.profiler`` over one window of steps; call ``prof.step()`` after each step.

    Skips ``wait`` steps, warms up ``warmup``, records ``active``, then writes a Chrome trace
    (open it in chrome://tracing or Perfetto) under ``out_dir``.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    with profile(
        activities=acts,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(out_dir)),
        record_shapes=False,
    ) as prof:
        yield prof


__all__ = [
    "PARTS",
    "SPLIT",
    "StepTimer",
    "GpuSampler",
    "CpuSampler",
    "bound",
    "format_split",
    "open_nvml",
    "split_of_phases",
    "step_split",
    "with_gpu_busy",
    "trace",
]

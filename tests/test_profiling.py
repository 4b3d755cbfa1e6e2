"""Profiling helpers: the step timer adds up, samplers run (and say so plainly without a GPU), traces export."""

import subprocess
import sys
import time

import pytest
import torch

from asrlab.lab.timing import PARTS, CpuSampler, GpuSampler, StepTimer, format_split, step_split, trace

from conftest import SMALL_MODEL


def test_step_timer_parts_match_known_sleeps_and_add_up():
    # each part also measured beside the timer: a busy machine oversleeps, and what is tested is the timer's split
    timer = StepTimer("cpu")
    plan = {"data": 0.06, "copy": 0.01, "forward": 0.04, "backward": 0.05, "optimizer": 0.02}
    seen = {}
    t0 = last = time.perf_counter()
    timer.start("data")
    time.sleep(plan["data"])
    for before, part in (("data", "copy"), ("copy", "forward"), ("forward", "backward")):
        now = time.perf_counter()
        seen[before], last = now - last, now
        timer.mark(part)
        time.sleep(plan[part])
    comm_at = time.perf_counter() - 0.02  # the last 20 ms of backward were the exposed all-reduce
    seen["backward"] = comm_at - last
    timer.mark("comm", at=comm_at)
    last = time.perf_counter()
    timer.mark("optimizer")
    time.sleep(plan["optimizer"])
    parts = timer.stop()
    wall = time.perf_counter() - t0
    seen["optimizer"] = wall - (last - t0)
    assert set(PARTS) <= set(parts)
    assert sum(parts[p] for p in PARTS) == pytest.approx(parts["total"], abs=1e-9)  # they telescope
    assert parts["total"] == pytest.approx(wall, abs=0.005)
    for part, s in plan.items():
        assert seen[part] >= (s - 0.02 if part == "backward" else s) - 0.001, (part, seen)  # it slept at least that
        assert parts[part] == pytest.approx(seen[part], abs=0.015), part
    assert parts["comm"] == pytest.approx(0.02, abs=0.01)


def test_step_timer_accumulates_a_part_marked_twice():
    # each interval measured beside the timer: a busy machine oversleeps, and what is tested is the sum
    timer = StepTimer("cpu")
    t0 = time.perf_counter()
    timer.start("data")
    time.sleep(0.02)
    t1 = time.perf_counter()
    timer.mark("comm")
    time.sleep(0.01)
    t2 = time.perf_counter()
    timer.mark("data")
    time.sleep(0.02)
    t3 = time.perf_counter()
    parts = timer.stop()
    data, comm = (t1 - t0) + (t3 - t2), t2 - t1
    assert parts["data"] == pytest.approx(data, abs=0.004) and parts["comm"] == pytest.approx(comm, abs=0.004)


def test_gpu_sampler_reports_plainly_without_a_gpu():
    s = GpuSampler(interval_s=0.05)
    with s:
        time.sleep(0.2)
    if torch.cuda.is_available():
        assert s.available and s.samples and {"util_pct", "mem_mib", "power_w"} <= set(s.samples[0])
    else:
        assert not s.available and s.reason and s.samples == []


def test_cpu_sampler_sees_the_process_and_its_children():
    spin = "import time\nprint('spinning', flush=True)\nt = time.time()\nwhile time.time() - t < 10: pass"
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "spinning\n"  # sampled once it spins, not while a busy machine starts it
        with CpuSampler(interval_s=0.1) as s:
            time.sleep(1.5)
    finally:
        child.kill()
    roles = {r["role"] for r in s.samples}
    assert roles == {"main", "worker"}
    busy = [r["cpu_pct"] for r in s.samples if r["pid"] == child.pid][1:]  # the first reading is 0 by design
    idle = [r["cpu_pct"] for r in s.samples if r["role"] == "main"][1:]
    # the spinning child shows, and above the sleeping main process (on a busy machine it gets a few percent)
    assert busy and max(busy) > max(5.0, 2 * max(idle, default=0.0)), (busy, idle)


def test_a_sampler_gives_the_rows_of_a_wall_clock_window():
    s = CpuSampler(0.5)  # not started: rows set by hand, t in seconds after s.t0
    s.samples = [{"t": t, "cpu_pct": t} for t in (0.0, 1.0, 2.0, 2.4, 3.0)]
    assert [r["t"] for r in s.during(s.t0 + 0.9, s.t0 + 2.0)] == [1.0, 2.0, 2.4]  # and one interval after


def test_trace_exports_a_window_of_steps(tmp_path):
    x = torch.randn(64, 64)
    with trace(tmp_path, wait=1, warmup=1, active=2) as prof:
        for _ in range(5):
            (x @ x).sum()
            prof.step()
    assert list(tmp_path.glob("*.json"))


def test_training_exports_a_trace_window(corpus, tmp_path):
    from asrlab.config import load_config
    from asrlab.lab.dist import DistInfo
    from asrlab.train.trainer import Trainer

    cfg = load_config(
        "tiny",
        [
            *SMALL_MODEL,
            "data.max_frames_in_batch=800",
            "train.max_steps=5",
            "train.trace_steps=2",
            "train.trace_from=3",
            "train.progress=false",
        ],
    )
    tr = Trainer(cfg, str(corpus / "data.list"), None, tmp_path / "exp", DistInfo(0, 1, 0, torch.device("cpu"), None))
    tr.fit()
    tr.close()
    assert tr.step == 5 and list((tmp_path / "exp" / "trace" / "rank0").glob("*.json"))


def _lines(n, period, data=0.0, comm=0.0, forward=0.0, epoch=0, t0=100.0):
    return [
        {
            "step": i + 1,
            "epoch": epoch,
            "time": t0 + i * period,
            "data_wait_s": data,
            "comm_s": comm,
            "copy_s": 0.0,
            "features_s": 0.0,
            "forward_s": forward,
            "backward_s": 0.0,
            "optimizer_s": 0.0,
        }
        for i in range(n)
    ]


def test_the_step_split_shares_the_wall_clock_and_names_the_largest():
    # 1 s per step: 0.1 data, 0.2 communication, 0.5 compute; 0.2 s outside every timed part
    split = step_split(_lines(11, 1.0, data=0.1, comm=0.2, forward=0.5))
    assert split["steps"] == 10 and split["wall_s"] == pytest.approx(10.0)
    assert (split["data_wait"], split["comm"], split["compute"], split["host_overhead"]) == pytest.approx(
        (0.1, 0.2, 0.5, 0.2)
    )
    assert split["largest"] == "compute" and split["basis"] == "timed parts"
    assert format_split(split) == (
        "data wait 10%, host overhead 20%, compute 50%, communication 20%: compute is the largest"
    )
    # a GPU busy 30% of the time: compute is the busy time less communication, the rest host overhead
    split = step_split(_lines(11, 1.0, data=0.1, comm=0.2, forward=0.5), gpu_busy=0.3)
    assert split["compute"] == pytest.approx(0.1) and split["host_overhead"] == pytest.approx(0.6)
    assert split["largest"] == "host_overhead"


def test_the_step_split_leaves_out_an_epochs_end_and_needs_two_lines():
    lines = _lines(5, 1.0, forward=0.9) + _lines(5, 1.0, forward=0.9, epoch=1, t0=200.0)  # 96 s of evaluation
    split = step_split(lines)
    assert split["steps"] == 8 and split["compute"] == pytest.approx(0.9)
    assert step_split(_lines(1, 1.0)) is None and step_split([]) is None

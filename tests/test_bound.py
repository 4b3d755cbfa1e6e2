"""What bounds a job (docs/guide.md, "What bounds a job"), read from recorded samples: the rule on the splits of
the three runs it must tell apart on a GPU (starved of loader workers, a small batch, the compiled large batch)
and on communication; and the watch's NVML reading of each rank's GPU, with a recorded NVML."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil

from asrlab.lab.timing import bound, split_of_phases
from asrlab.watch.gpus import GpuBusy
from asrlab.watch.procs import Proc


def test_the_bound_of_each_kind_of_run_from_its_sampled_phases_and_its_gpu():
    # recorded shares of a rank's sampled time, with its GPU's busy share
    starved = split_of_phases({"data": 0.62, "forward": 0.12, "backward": 0.2, "optimizer": 0.06}, gpu_busy=0.21)
    assert bound(starved, 0.21)["bound"] == "data"
    assert bound(starved, 0.21)["evidence"] == "62% of the time waiting for data (the loader); the GPU busy 21%"
    small_batch = split_of_phases({"data": 0.01, "forward": 0.34, "backward": 0.55, "optimizer": 0.1}, gpu_busy=0.25)
    said = bound(small_batch, 0.25)
    assert said["bound"] == "host" and said["evidence"].startswith("the GPU idles 75% of the time while"), said
    assert small_batch["host_overhead"] == 0.74 and small_batch["compute"] == 0.25
    compiled = split_of_phases({"data": 0.02, "forward": 0.3, "backward": 0.6, "optimizer": 0.08}, gpu_busy=0.93)
    assert bound(compiled, 0.93) == {"bound": "device", "evidence": "the GPU is busy 93% of the time"}
    waiting = split_of_phases({"data": 0.05, "backward": 0.35, "ddp_allreduce": 0.45, "collective": 0.15}, 0.4)
    assert bound(waiting, 0.4)["bound"] == "communication"
    cpu = split_of_phases({"data": 0.05, "backward": 0.95})
    assert bound(cpu)["bound"] == "compute" and "not told apart" in bound(cpu)["evidence"]


def test_what_sampled_stacks_cannot_tell_from_a_wait_is_not_called_compute():
    """A rank mostly in the loop's own code (a 45-s start of its own, a generator that sleeps for data, a
    validation pass) is bound by what the stacks cannot name; backward on several ranks holds DDP's all-reduce,
    so a wait for a slower rank counted in it is said beside the compute it is called."""
    own = split_of_phases({"other": 0.69, "backward": 0.21, "forward": 0.1})
    assert bound(own)["bound"] == "unknown" and "69% of the time in the loop's own code" in bound(own)["evidence"]
    held = split_of_phases({"backward": 0.89, "forward": 0.09, "data": 0.01, "other": 0.01})
    assert (
        bound(held, ranks=2)["bound"] == "compute"
        and "89% in backward, which holds DDP's" in bound(held, ranks=2)["evidence"]
    )
    assert "DDP" not in bound(held)["evidence"]  # one rank alone: no all-reduce in its backward
    # a compiled run's stacks: compiling, a checkpoint are no part of a step, so not the host's overhead in one
    compiled = {"compile": 0.62, "other": 0.18, "backward": 0.17, "forward": 0.02, "checkpoint": 0.01, "data": 0.01}
    split = split_of_phases(compiled, gpu_busy=0.3)
    assert split["compute"] == 0.3 and split["host_overhead"] == round(1 - 0.3 - 0.01 / 0.38, 4), split
    assert split["own_code"] == round(0.18 / 0.38, 4)


def test_a_wait_below_a_quarter_of_the_time_is_not_the_bound():
    split = split_of_phases({"data": 0.24, "collective": 0.2, "backward": 0.56}, gpu_busy=0.5)
    assert bound(split, 0.5)["bound"] == "host"


class RecordedNvml:
    """NVML as a recording gives it: two GPUs, each one's utilisation per look, rank 0's process listed on GPU
    1 (a CUDA_VISIBLE_DEVICES remap), rank 1's not listed (read from its LOCAL_RANK)."""

    def __init__(self, util: list[tuple[int, int]], listed: dict[int, int]):
        self.util, self.listed, self.at = util, listed, 0  # ``at``: which look of the recording is read

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.util[self.at][h])

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid) for pid, d in self.listed.items() if d == h]


def test_the_watch_reads_each_ranks_gpu_by_its_process_or_its_local_rank():
    # rank 1's process, not listed by NVML: LOCAL_RANK 1 of CUDA_VISIBLE_DEVICES=1,0 is GPU 0
    env = {**os.environ, "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "1,0"}
    rank1 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 60  # until its exec: before it, /proc shows the parent's environment
        while time.monotonic() < deadline and psutil.Process(rank1.pid).environ().get("LOCAL_RANK") != "1":
            time.sleep(0.05)
        nvml = RecordedNvml([(90, 20), (96, 30), (93, 10), (0, 0)], listed={12345: 1})
        gpus = GpuBusy(nvml)
        procs = {0: Proc(pid=12345, rank=0, run="r", started=0.0), 1: Proc(pid=rank1.pid, rank=1, run="r", started=0.0)}
        for nvml.at in range(3):
            gpus.look(procs, {0: "forward", 1: "data"})
        assert gpus.device(procs[0]) == 1 and gpus.device(procs[1]) == 0
        assert gpus.busy(0) == 0.2 and gpus.busy(1) == 0.93
        # rank 1 compiling, as its GPU idles: not a step's idling, not counted; rank 0 in a step is
        nvml.at = 3
        gpus.look(procs, {0: "backward", 1: "compile"})
        assert gpus.busy(0) == 0.15 and gpus.busy(1) == 0.93
    finally:
        rank1.kill()
        rank1.wait()
    assert not GpuBusy(None) or GpuBusy(None).busy(0) is None  # no NVML here: nothing sampled, nothing said

"""Each GPU's busy share beside the ranks' stacks, where NVML is present: which GPU each rank computes on (NVML's
list of the processes on each device, else the rank's ``LOCAL_RANK`` through ``CUDA_VISIBLE_DEVICES``) and the
mean utilisation NVML reports for it over the looks that found the rank in a step. With the sampled phases it
tells what bounds a rank (:func:`asrlab.lab.timing.bound`): a GPU that idles while the main thread runs the step
is the host's doing, one busy 90% of the time is the device's."""

from __future__ import annotations


import psutil

from ..lab.timing import NOT_STEP, open_nvml
from .procs import Proc


class GpuBusy:
    """``look(procs)`` at each of the watch's looks; ``busy(rank)``: the rank's GPU's mean busy share (0-1).
    ``nvml``: an NVML to read instead of the machine's (a recording)."""

    def __init__(self, nvml=None):
        if nvml is None:
            self.nv, self.handles, _ = open_nvml()
        else:
            self.nv, self.handles = nvml, [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._device: dict[int, int | None] = {}  # pid -> device index
        self._sum: dict[int, list[float]] = {}  # rank -> [sum of busy shares, looks]

    def __bool__(self) -> bool:
        return bool(self.handles)

    def _devices_by_pid(self) -> dict[int, int]:
        out = {}
        for i, h in enumerate(self.handles):
            try:
                for p in self.nv.nvmlDeviceGetComputeRunningProcesses(h):
                    out[p.pid] = i
            except Exception:  # a driver that does not list processes (or another pid namespace)
                continue
        return out

    def _device_of(self, proc: Proc, by_pid: dict[int, int]) -> int | None:
        if proc.pid in by_pid:
            return by_pid[proc.pid]
        try:
            env = psutil.Process(proc.pid).environ()
        except psutil.Error:
            return None
        local = env.get("LOCAL_RANK", "0" if proc.rank in (None, 0) else None)
        if local is None or not local.isdigit():
            return None
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        index = int(visible[int(local)]) if int(local) < len(visible) and visible[int(local)].isdigit() else int(local)
        return index if index < len(self.handles) else None

    def look(self, procs: dict[int, Proc], phases: dict[int, str]) -> None:
        """One reading of every GPU's utilisation, added to the ranks that compute on it and are in a step
        (``phases``: each rank's phase at this look; starting up or compiling, the GPU's idling is not the step's)."""
        stepping = {r: proc for r, proc in procs.items() if phases.get(r, "start") not in NOT_STEP}
        if not self.handles or not stepping:
            return
        unknown = [p for p in stepping.values() if self._device.get(p.pid) is None]
        by_pid = self._devices_by_pid() if unknown else {}
        for proc in unknown:
            self._device[proc.pid] = self._device_of(proc, by_pid)
        util = {}
        for i in sorted({d for p in stepping.values() if (d := self._device[p.pid]) is not None}):
            try:
                util[i] = self.nv.nvmlDeviceGetUtilizationRates(self.handles[i]).gpu / 100.0
            except Exception:
                continue
        for rank, proc in stepping.items():
            if (d := self._device[proc.pid]) in util:
                acc = self._sum.setdefault(rank, [0.0, 0])
                acc[0] += util[d]
                acc[1] += 1

    def busy(self, rank: int) -> float | None:
        acc = self._sum.get(rank)
        return round(acc[0] / acc[1], 4) if acc and acc[1] else None

    def device(self, proc: Proc) -> int | None:
        return self._device.get(proc.pid)


__all__ = ["GpuBusy"]

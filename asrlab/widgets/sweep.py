"""The loader sweep: any measure over any two settings, the recommendation marked; live samplers while it runs."""

from __future__ import annotations

import threading
import time

from .base import Explorer, interactive, png
from ..errors import UsageError
from ..lab.timing import CpuSampler, GpuSampler

# the settings a sweep's row carries, as asrlab.measure.tune.grid makes them
SETTINGS = ("storage", "num_workers", "prefetch_factor", "max_frames_in_batch", "features", "fbank")


class SweepExplorer(Explorer):
    """``tune.sweep`` rows: pick the measure (audio hours per hour, data wait, peak memory, GPU
    utilisation where there was a GPU) and the two settings on the axes; the recommended setting is
    outlined. Headless: audio h/h and data wait over ``x`` and ``y`` (the notebook's saved figure)."""

    def __init__(
        self, rows: list[dict], best: dict | None = None, why: str = "", x: str = "num_workers", y: str = "storage"
    ):
        from ..plots import SWEEP_MEASURES  # matplotlib: the notebooks extra

        if not rows:
            raise UsageError("no sweep rows to explore")
        self.rows, self.best, self.why = rows, best, why
        self.measures = [k for k in SWEEP_MEASURES if any(r.get(k) is not None for r in rows)]
        varying = [k for k in SETTINGS if len({str(r.get(k)) for r in rows}) > 1]
        self.axes = varying or [k for k in SETTINGS if k in rows[0]]
        self.y = y if y in self.axes else self.axes[-1]
        others = [k for k in self.axes if k != self.y] or [self.y]
        self.x = x if x in others else others[0]

    def figure(self, key: str, x: str, y: str) -> bytes:
        from .. import plots  # matplotlib: the notebooks extra

        return png(plots.sweep_heatmap(self.rows, key, x, y, mark=self.best))

    def static(self) -> list:
        from .. import plots  # matplotlib: the notebooks extra

        parts = [png(plots.sweep_heatmaps(self.rows, x=self.x, y=self.y))]
        return parts + ([f"<p><b>recommended:</b> {self.why}</p>"] if self.why else [])

    def widget(self):
        import ipywidgets as w

        from ..plots import SWEEP_MEASURES  # matplotlib: the notebooks extra

        self.measure = w.Dropdown(
            options=[(SWEEP_MEASURES[k][0], k) for k in self.measures],
            value=self.measures[0],
            description="measure",
            layout=w.Layout(width="420px"),
        )
        self.xaxis = w.Dropdown(options=self.axes, value=self.x, description="x")
        self.yaxis = w.Dropdown(options=self.axes, value=self.y, description="y")
        self.picture = w.Image(format="png", layout=w.Layout(max_width="100%"))
        why = w.HTML(f"<p><b>recommended</b> (outlined): {self.why}</p>" if self.why else "")

        def redraw(_=None):
            self.picture.value = self.figure(self.measure.value, self.xaxis.value, self.yaxis.value)

        for c in (self.measure, self.xaxis, self.yaxis):
            c.observe(redraw, names="value")
        redraw()
        box = w.VBox([self.measure, w.HBox([self.xaxis, self.yaxis]), self.picture, why])
        box.add_class("asrlab-sweep")
        return box


class SamplerMonitor:
    """While the block runs: CPU % of this process and its loader workers and, where there is a GPU,
    NVML utilisation, redrawn every ``redraw_s`` over the last ``window_s`` (live only; headless it
    does nothing). ``label`` names what is running now (a sweep's progress callback sets it)."""

    def __init__(self, title: str = "while it runs", window_s: float = 60.0, redraw_s: float = 2.0):
        self.title, self.window_s, self.redraw_s, self.label = title, window_s, redraw_s, ""
        self.live = interactive()
        self.redraws = 0

    def __enter__(self):
        if not self.live:
            return self
        import ipywidgets as w
        from IPython.display import display

        self.gpu, self.cpu = GpuSampler(0.5), CpuSampler(0.5)
        self.gpu.__enter__()
        self.cpu.__enter__()
        self.text = w.HTML(f"<b>{self.title}</b>")
        self.picture = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.box = w.VBox([self.text, self.picture])
        self.box.add_class("asrlab-samplers")
        display(self.box)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="asrlab-sampler-view", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._done.wait(self.redraw_s):
            self.redraw()

    def redraw(self) -> None:
        from .. import plots  # matplotlib: the notebooks extra

        def recent(sampler) -> list[dict]:  # its rows' "t" count from the sampler's own start
            since = time.time() - sampler.t0 - self.window_s
            return [r for r in list(sampler.samples) if r["t"] >= since]

        samples = {"cpu": recent(self.cpu), "gpu": recent(self.gpu), "gpu_reason": self.gpu.reason}
        if not samples["cpu"] and not samples["gpu"]:
            return
        self.text.value = f"<b>{self.title}</b>" + (f": {self.label}" if self.label else "")
        self.picture.value = png(plots.samplers(samples, title=f"last {self.window_s:.0f} s", pyplot=False))
        self.redraws += 1

    def __exit__(self, *exc):
        if self.live:
            self._done.set()
            self._thread.join(timeout=10)
            self.cpu.__exit__(*exc)
            self.gpu.__exit__(*exc)
            self.redraw()
        return False

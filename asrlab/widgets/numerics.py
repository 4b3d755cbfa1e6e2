"""fp16 headroom over a run: the tightest modules at a sampled step, and one module's max |x| over steps."""

from __future__ import annotations

from pathlib import Path

from .base import Explorer, png
from ..errors import UsageError
from ..lab.numerics.stats import first_nonfinite_step, headroom_traces, read_traces


class NanExplorer(Explorer):
    """The sampled numerics of a run (``train.diagnostics_every``): a step slider showing the tightest
    modules' fp16 headroom at that step, and a module picker showing its max |x| over the steps against
    65504, the first non-finite step marked. Headless: both at the last sample before the first
    non-finite step, for the tightest module."""

    def __init__(self, exp: str | Path, k: int = 8, direction: str = "forward"):
        self.exp, self.k, self.direction = Path(exp), k, direction
        self.traces = read_traces(self.exp)
        if not self.traces:
            raise UsageError(f"{exp}: no sampled diagnostics (train with train.diagnostics_every=N)")
        self.bad_step = first_nonfinite_step(self.exp)
        # modules ordered by how tight they got while still finite, then the rest
        tight = list(headroom_traces(self.traces, k=10**6, direction=direction))
        rest = sorted({m for t in self.traces for m in t[direction]} - set(tight))
        self.modules = tight + rest
        before = [t for t in self.traces if self.bad_step is None or t["step"] < self.bad_step]
        self.focus = (before or self.traces)[-1]["step"]  # the last sample before it went wrong

    def trace_at(self, step: int) -> dict:
        return min(self.traces, key=lambda t: abs(t["step"] - step))

    def bars(self, step: int) -> bytes:
        from ..plots import headroom_bars  # matplotlib: the notebooks extra

        return png(headroom_bars(self.trace_at(step), self.k, self.direction))

    def module_png(self, module: str) -> bytes:
        from ..plots import module_trace  # matplotlib: the notebooks extra

        return png(module_trace(self.traces, module, self.direction, self.bad_step))

    def static(self) -> list:
        return [self.bars(self.focus), self.module_png(self.modules[0])]

    def widget(self):
        import ipywidgets as w

        steps = [t["step"] for t in self.traces]
        self.step = w.SelectionSlider(
            options=steps, value=self.focus, description="step", continuous_update=False, layout=w.Layout(width="70%")
        )
        self.module = w.Dropdown(
            options=self.modules, value=self.modules[0], description="module", layout=w.Layout(width="70%")
        )
        self.step_picture = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.module_picture = w.Image(format="png", layout=w.Layout(max_width="100%"))
        note = (
            "no step went non-finite" if self.bad_step is None else f"the first non-finite step: <b>{self.bad_step}</b>"
        )
        self.step.observe(lambda _: setattr(self.step_picture, "value", self.bars(self.step.value)), names="value")
        self.module.observe(
            lambda _: setattr(self.module_picture, "value", self.module_png(self.module.value)), names="value"
        )
        self.step_picture.value = self.bars(self.step.value)
        self.module_picture.value = self.module_png(self.module.value)
        box = w.VBox(
            [
                w.HTML(f"<p>{len(steps)} sampled steps; {note}</p>"),
                self.step,
                self.step_picture,
                self.module,
                self.module_picture,
            ]
        )
        box.add_class("asrlab-numerics")
        return box

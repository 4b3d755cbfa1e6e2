"""A training run as it trains: one status line, the curves and a Stop button, redrawn in place."""

from __future__ import annotations

from pathlib import Path

from ..lab.metrics import run_status
from .base import html_escape, interactive, png
from ..lab.stop import request_stop


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def status_html(s: dict, state: str = "training") -> str:
    """The status line of :func:`run_status`, as HTML."""
    done = f"step <b>{s['step']:,}</b>" + (f" of {s['max_steps']:,}" if s["max_steps"] else "")
    parts = [f"<b>{html_escape(state)}</b>", done]
    if s["epoch"] is not None:
        parts.append(f"epoch {s['epoch']}")
    if s["loss"] is not None:
        parts.append(f"loss {s['loss']:.3g}")
    if s["lr"] is not None:
        parts.append(f"LR {s['lr']:.2e}")
    if s["step_s"] is not None:
        parts.append(f"{1000 * s['step_s']:.0f} ms/step")
    parts.append(
        "dev CER "
        + (
            f"<b>{100 * s['cer']:.2f}%</b> (step {s['cer_step']:,})"
            if s["cer"] is not None
            else "after the first epoch"
        )
    )
    parts.append(f"{_clock(s['elapsed_s'])} elapsed")
    if s["left_s"] is not None and state == "training":
        parts.append(f"about {_clock(s['left_s'])} left")
    return '<div class="asrlab-monitor-status">' + " &middot; ".join(parts) + "</div>"


class TrainMonitor:
    """Live: a status line, a progress bar, the curves (``plots.training_curves``) and a Stop button,
    all redrawn in place by :meth:`update`. Static: the status line and, at the end, the curves,
    each one output updated in place (a ``display_id``), so an executed notebook keeps the last.

    The Stop button writes ``EXP/STOP`` (``asrlab.lab.stop``): the run ends after its current step
    with a checkpoint and an evaluation, and the notebook goes on with the model it has. The button
    is heard while the cell awaits (``await nb.train_live(...)``): the kernel takes widget messages
    between the awaits.
    """

    def __init__(self, exp: str | Path, title: str = ""):
        from IPython.display import HTML, DisplayHandle, display

        self.exp, self.title = Path(exp), title
        self.live = interactive()
        self.updates = 0  # how many times the view was redrawn
        self.stop_clicked = False
        if self.live:
            import ipywidgets as w

            self.status = w.HTML(status_html(run_status(self.exp)))
            self.bar = w.FloatProgress(
                value=0.0, min=0.0, max=1.0, description="", bar_style="info", layout=w.Layout(width="60%")
            )
            self.button = w.Button(
                description="Stop",
                icon="stop",
                button_style="warning",
                tooltip="end the run after its current step: checkpoint, evaluation, then the "
                "notebook goes on with this model",
            )
            self.button.on_click(lambda _: self.request_stop())
            self.image = w.Image(format="png", layout=w.Layout(max_width="100%"))
            self.box = w.VBox([w.HBox([self.button, self.bar]), self.status, self.image])
            self.box.add_class("asrlab-monitor")
            display(self.box)
        else:
            self._status = DisplayHandle()
            self._status.display(HTML(status_html(run_status(self.exp))))
            self._figure = None

    def request_stop(self) -> None:
        request_stop(self.exp, "the notebook's Stop button")
        self.stop_clicked = True
        if self.live:
            self.button.disabled = True
            self.button.description = "Stopping..."

    def update(self, elapsed_s: float, state: str = "training", curves: bool | None = None) -> dict:
        """Redraw from the run's files; ``curves``: redraw the figure too (default: live, or at the end)."""
        from IPython.display import HTML, DisplayHandle, Image

        s = run_status(self.exp, elapsed_s)
        if state == "training" and self.stop_clicked:
            state = "stopping after this step"
        text = status_html(s, state)
        draw = (self.live or state != "training") if curves is None else curves
        picture = self._curves() if draw and s["step"] else None
        if self.live:
            self.status.value = text
            if s["max_steps"]:
                self.bar.value = min(1.0, s["step"] / s["max_steps"])
            elif s["max_minutes"]:
                self.bar.value = min(1.0, elapsed_s / (60 * s["max_minutes"]))
            if picture is not None:
                self.image.value = picture
            if state != "training":
                self.button.disabled = True
                self.button.description = "Stopped" if self.stop_clicked else "Finished"
                self.bar.bar_style = "success" if state in ("finished", "stopped") else "danger"
        else:
            self._status.update(HTML(text))
            if picture is not None:
                if self._figure is None:
                    self._figure = DisplayHandle()
                    self._figure.display(Image(data=picture, format="png"))
                else:
                    self._figure.update(Image(data=picture, format="png"))
        self.updates += 1
        return s

    def _curves(self) -> bytes:
        from .. import plots  # matplotlib: the notebooks extra

        return png(plots.training_curves(self.exp, title=self.title))

"""Resumed runs side by side, per utterance: trained once, more than once or never in the epoch, step by step."""

from __future__ import annotations

from pathlib import Path

from ..lab.state.ledger import counts_until, epoch_steps
from .base import Explorer, html_escape, png


class ResumeExplorer(Explorer):
    """``runs`` (label -> experiment with a ledger, ``--ledger``) over the utterances ``keys``: a row per
    run, a column per utterance, coloured by how many times the run trained it in ``epoch``; a step
    slider replays the ledgers up to that step and lists what each run trained at it. Columns follow
    the order in which ``reference`` (the run never interrupted) trained them. Headless: the whole epoch."""

    def __init__(self, runs: dict[str, str | Path], keys, epoch: int = 0, reference: str | None = None):
        self.epoch = epoch
        self.steps = {label: epoch_steps(exp, epoch) for label, exp in runs.items()}
        order: list[str] = []
        if reference in self.steps:
            seen = set()
            for _, ks in self.steps[reference]:
                order += [k for k in ks if k not in seen and not seen.add(k)]
        self.keys = order + sorted(set(keys) - set(order))
        self.last_step = max((s[-1][0] for s in self.steps.values() if s), default=0)
        self.first_step = min((s[0][0] for s in self.steps.values() if s), default=0)

    def counts(self, step: int | None = None) -> dict[str, list[int]]:
        return {label: counts_until(steps, self.keys, step) for label, steps in self.steps.items()}

    def figure(self, step: int | None = None) -> bytes:
        from .. import plots  # matplotlib: the notebooks extra

        title = (
            f"epoch {self.epoch} up to step {step}"
            if step is not None and step < self.last_step
            else f"epoch {self.epoch}, all of it"
        )
        return png(plots.coverage_grid(self.counts(step), title=title))

    def table_html(self, step: int | None = None) -> str:
        rows = []
        for label, c in self.counts(step).items():
            at = dict(self.steps[label]).get(step, []) if step is not None else []
            shown = ", ".join(at[:4]) + (f" and {len(at) - 4} more" if len(at) > 4 else "")
            rows.append(
                f"<tr><td>{html_escape(label)}</td><td>{sum(1 for n in c if n == 1)}</td>"
                f"<td>{sum(1 for n in c if n > 1)}</td><td>{sum(1 for n in c if n == 0)}</td>"
                + (f"<td><small>{html_escape(shown) or '-'}</small></td>" if step is not None else "")
                + "</tr>"
            )
        at_head = f"<th>trained at step {step}</th>" if step is not None else ""
        return (
            "<table><tr><th>run</th><th>once</th><th>more than once</th><th>never"
            + (" (yet)" if step is not None else "")
            + f"</th>{at_head}</tr>{''.join(rows)}</table>"
        )

    def static(self) -> list:
        return [self.figure(), self.table_html()]

    def widget(self):
        import ipywidgets as w

        self.step = w.IntSlider(
            value=self.last_step,
            min=self.first_step,
            max=self.last_step,
            description="step",
            continuous_update=False,
            layout=w.Layout(width="70%"),
        )
        self.picture = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.table = w.HTML()

        def redraw(_=None):
            self.picture.value = self.figure(self.step.value)
            self.table.value = self.table_html(self.step.value)

        self.step.observe(redraw, names="value")
        redraw()
        box = w.VBox([self.step, self.picture, self.table])
        box.add_class("asrlab-resume")
        return box

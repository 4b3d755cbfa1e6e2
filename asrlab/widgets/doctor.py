"""Several runs' diagnoses side by side: what ``asrlab doctor`` says of each, one picked at a time."""

from __future__ import annotations

from pathlib import Path

from .base import Explorer, html_escape
from ..doctor import diagnose, format_diagnosis

VERDICT_COLOURS = {"finished": "#2e7d32", "running": "#1565c0", "stopped": "#6d4c41"}  # failures: red


class DoctorExplorer(Explorer):
    """``{label: EXP}`` -> a table of verdicts (one row per run) and, for the run picked, the whole
    diagnosis. Headless: the table and every diagnosis, folded."""

    def __init__(self, runs: dict[str, str | Path]):
        self.runs = {label: diagnose(exp) for label, exp in runs.items()}
        self.texts = {label: format_diagnosis(d) for label, d in self.runs.items()}

    def table_html(self) -> str:
        rows = []
        for label, d in self.runs.items():
            colour = VERDICT_COLOURS.get(d["verdict"], "#c62828")
            rows.append(
                f"<tr><td>{html_escape(label)}</td><td style='color:{colour}'><b>{d['verdict']}</b></td>"
                f"<td style='text-align:left'>{html_escape(d['summary'])}</td></tr>"
            )
        return (
            "<table><tr><th>run</th><th>verdict</th><th style='text-align:left'>what asrlab doctor says</th></tr>"
            + "".join(rows)
            + "</table>"
        )

    def text_html(self, label: str) -> str:
        return f"<pre style='font-size:11px;line-height:1.3'>{html_escape(self.texts[label])}</pre>"

    def static(self) -> list:
        folded = "".join(
            f"<details><summary>asrlab doctor: {html_escape(label)}</summary>{self.text_html(label)}</details>"
            for label in self.runs
        )
        return [self.table_html() + folded]

    def widget(self):
        import ipywidgets as w

        self.pick = w.Dropdown(options=list(self.runs), description="run", layout=w.Layout(width="50%"))
        self.text = w.HTML()

        def show(_=None):
            self.text.value = self.text_html(self.pick.value)

        self.pick.observe(show, names="value")
        show()
        box = w.VBox([w.HTML(self.table_html()), self.pick, self.text])
        box.add_class("asrlab-doctor")
        return box

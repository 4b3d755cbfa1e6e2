"""A stalled (or finished) run's ranks: the verdict, each rank's phase, heartbeat and stacks, the timeline."""

from __future__ import annotations

from pathlib import Path

from ..lab.stall.classify import own_tail
from ..lab.stall.heartbeat import phase_intervals, read_timeline
from ..lab.stall.report import rank_states
from ..lab.stall.verdict import rank_line
from .base import Explorer, html_escape, png


def rank_html(entry: dict, frames: int = 14) -> str:
    """One rank: where it is, since when, and each thread's Python stack (innermost call last)."""
    head = f"<p>{html_escape(rank_line(entry))}</p>"
    if entry.get("phase") is None:
        return head
    stacks = entry.get("stacks") or {}
    if not stacks:
        extra = entry.get("faulthandler")
        return head + (f"<pre>{html_escape(extra)}</pre>" if extra else "<p><i>no stacks (the run did not stall)</i></p>")
    parts = []
    for name, lines in sorted(stacks.items(), key=lambda kv: "MainThread" not in kv[0]):
        body = html_escape("\n".join(own_tail(lines, frames)))
        parts.append(f"<details{' open' if 'MainThread' in name else ''}><summary><code>{html_escape(name)}</code>"
                     f"</summary><pre style='font-size:11px;line-height:1.25'>{body}</pre></details>")
    return head + "".join(parts)


class StallExplorer(Explorer):
    """The stall report as an explorer: the verdict on top, a rank picker with that rank's phase,
    heartbeat and Python stacks, and the per-rank timeline (``train.timeline=true``) with a zoom on
    its last seconds. Headless: the verdict, a table of the ranks and the timeline's last ``zoom_s``."""

    def __init__(self, exp: str | Path, title: str = "", zoom_s: float = 10.0):
        self.exp, self.title, self.zoom_s = Path(exp), title, zoom_s
        self.verdict, self.ranks = rank_states(self.exp)
        spans = phase_intervals(read_timeline(self.exp), self.exp)
        self.span_s = max((s + n for rows in spans.values() for _, s, n in rows), default=0.0)

    def verdict_html(self) -> str:
        return f"<p style='font-size:15px'><b>{html_escape(self.verdict)}</b></p>"

    def ranks_table(self) -> str:
        rows = "".join(f"<tr><td>{e['rank']}</td><td>{html_escape(e.get('phase') or '-')}</td><td>{e.get('step', '')}</td>"
                       f"<td>{e.get('in_phase_s', '')}</td><td>{html_escape(e.get('detail') or '')}</td></tr>"
                       for e in self.ranks)
        return ("<table><tr><th>rank</th><th>phase</th><th>step</th><th>in phase (s)</th><th>detail</th></tr>"
                f"{rows}</table>")

    def timeline_png(self, last_s: float | None = None) -> bytes | None:
        from .. import plots  # matplotlib: the notebooks extra

        if not self.span_s:
            return None
        title = self.title + (f" (last {last_s:g} s)" if last_s else "")
        return png(plots.timeline(self.exp, title=title, last_s=last_s))

    def static(self) -> list:
        parts = [self.verdict_html() + self.ranks_table()]
        zoom = self.zoom_s if self.span_s > self.zoom_s else None
        picture = self.timeline_png(zoom)
        return parts + ([picture] if picture else [])

    def widget(self):
        import ipywidgets as w

        verdict = w.HTML(self.verdict_html())
        self.rank = w.ToggleButtons(options=[(f"rank {e['rank']}", i) for i, e in enumerate(self.ranks)],
                                    description="rank", style={"button_width": "80px"})
        self.detail = w.HTML()
        self.detail.add_class("asrlab-rank")
        self.zoom = w.FloatSlider(value=self.span_s, min=min(1.0, self.span_s), max=max(self.span_s, 1.0),
                                  step=0.5, description="last s", continuous_update=False,
                                  readout_format=".1f", layout=w.Layout(width="60%"))
        self.picture = w.Image(format="png", layout=w.Layout(max_width="100%"))

        def pick(_=None):
            if self.ranks and self.rank.value is not None:
                self.detail.value = rank_html(self.ranks[self.rank.value])

        def zoom(_=None):
            picture = self.timeline_png(None if self.zoom.value >= self.span_s else self.zoom.value)
            if picture:
                self.picture.value = picture

        self.rank.observe(pick, names="value")
        self.zoom.observe(zoom, names="value")
        pick()
        zoom()
        rows = [verdict, self.rank, self.detail]
        if self.span_s:
            rows += [self.zoom, self.picture]
        else:
            rows.append(w.HTML("<i>no timeline: train with train.timeline=true to record one</i>"))
        box = w.VBox(rows)
        box.add_class("asrlab-stalls")
        return box

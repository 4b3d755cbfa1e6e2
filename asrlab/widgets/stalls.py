"""A stalled (or finished) run's ranks: the verdict, each rank's phase, heartbeat and stacks (its main
thread's and its DataLoader workers'), the timeline."""

from __future__ import annotations

import re
from pathlib import Path

from ..lab.stall.classify import own_code, own_tail, where
from ..lab.stall.heartbeat import phase_intervals, read_timeline
from ..lab.stall.report import rank_states
from ..lab.stall.verdict import rank_line
from .base import Explorer, html_escape, png

_HEADER = re.compile(r"^\[(.+)\]\s*$")
# a frame as traceback (``File "f", line 3, in fn``) and faulthandler (``File "f", line 3 in fn``) write it
_FRAME = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')
_PRE = "<pre style='font-size:11px;line-height:1.25;margin:2px 0 6px 0'>"


def worker_stacks(text: str | None) -> list[dict]:
    """A rank's DataLoader workers' stacks as the stall report keeps them (``workers``: ``[worker pid N]``
    blocks of ``asrlab watch``, innermost call last; or ``[data-loader worker, pid N]`` blocks of a rank's
    own watchdog, faulthandler's dumps, innermost first): per worker ``name``, its ``lines``, and ``at``,
    the innermost line of the job's own code in it ("" where it has none: a worker waiting for its next index)."""
    out: list[dict] = []
    for line in (text or "").splitlines():
        if (m := _HEADER.match(line)) and "pid" in m.group(1):
            out.append({"name": m.group(1).strip(), "lines": []})
        elif line.strip():
            if not out:
                out.append({"name": "worker", "lines": []})
            out[-1]["lines"].append(line.rstrip())
    for w in out:
        w["innermost_first"] = any("most recent call first" in line for line in w["lines"])  # faulthandler's
        own = [
            f
            for line in w["lines"]
            if (m := _FRAME.search(line)) and own_code((f := (m.group(1), int(m.group(2)), m.group(3)))[0])
        ]
        w["at"] = where(own[0] if w["innermost_first"] else own[-1]) if own else ""
    return out


def _stack_block(name: str, lines: list[str], opened: bool, note: str = "") -> str:
    return (
        f"<details{' open' if opened else ''}><summary><code>{html_escape(name)}</code>{html_escape(note)}"
        f"</summary>{_PRE}{html_escape(chr(10).join(lines))}</pre></details>"
    )


def rank_html(entry: dict, frames: int = 14) -> str:
    """One rank: where it is, since when, each thread's Python stack (innermost call last) and, beside
    them, its DataLoader workers' stacks (a worker at a line of the job's own code opened: the read it is in)."""
    head = f"<p>{html_escape(rank_line(entry))}</p>"
    if entry.get("phase") is None:
        return head
    stacks = entry.get("stacks") or {}
    workers = worker_stacks(entry.get("workers"))
    if stacks:
        threads = "".join(
            _stack_block(name, own_tail(lines, frames), "MainThread" in name)
            for name, lines in sorted(stacks.items(), key=lambda kv: "MainThread" not in kv[0])
        )
    elif entry.get("faulthandler"):
        threads = f"{_PRE}{html_escape(entry['faulthandler'])}</pre>"
    elif not workers:
        return head + "<p><i>no stacks (the run did not stall)</i></p>"
    else:
        threads = "<p><i>no stacks of the rank's own threads</i></p>"
    if not workers:
        return head + threads
    reading = [w for w in workers if w["at"]] or workers[:1]
    blocks = "".join(
        _stack_block(
            w["name"],
            w["lines"] if w["innermost_first"] else own_tail(w["lines"], frames),
            w in reading,
            f": at {w['at']}"
            if w["at"]
            else ": reading"
            if any("_utils/fetch.py" in line for line in w["lines"])
            else ": waiting for its next index",
        )
        for w in workers
    )
    column = "<div style='flex:1 1 420px;min-width:0'>"
    return (
        head + "<div style='display:flex;flex-wrap:wrap;gap:4px 16px'>"
        f"{column}<p style='margin:2px 0'><b>the rank's threads</b></p>{threads}</div>"
        f"{column}<p style='margin:2px 0'><b>its DataLoader workers ({len(workers)})</b></p>{blocks}</div></div>"
    )


class StallExplorer(Explorer):
    """The stall report as an explorer: the verdict on top, a rank picker with that rank's phase,
    heartbeat and Python stacks (its threads' and its DataLoader workers'), and the per-rank timeline
    (``train.timeline=true``) with a zoom on its last seconds. Headless: the verdict, a table of the
    ranks, the timeline's last ``zoom_s`` and the stacks of the rank the verdict names, its DataLoader
    workers' among them."""

    def __init__(self, exp: str | Path, title: str = "", zoom_s: float = 10.0):
        self.exp, self.title, self.zoom_s = Path(exp), title, zoom_s
        self.verdict, self.ranks = rank_states(self.exp)
        spans = phase_intervals(read_timeline(self.exp), self.exp)
        self.span_s = max((s + n for rows in spans.values() for _, s, n in rows), default=0.0)

    def verdict_html(self) -> str:
        return f"<p style='font-size:15px'><b>{html_escape(self.verdict)}</b></p>"

    def ranks_table(self) -> str:
        rows = "".join(
            f"<tr><td>{e['rank']}</td><td>{html_escape(e.get('phase') or '-')}</td><td>{e.get('step', '')}</td>"
            f"<td>{e.get('in_phase_s', '')}</td><td>{html_escape(e.get('detail') or '')}</td></tr>"
            for e in self.ranks
        )
        return (
            "<table><tr><th>rank</th><th>phase</th><th>step</th><th>in phase (s)</th><th>detail</th></tr>"
            f"{rows}</table>"
        )

    def timeline_png(self, last_s: float | None = None) -> bytes | None:
        from .. import plots  # matplotlib: the notebooks extra

        if not self.span_s:
            return None
        title = self.title + (f" (last {last_s:g} s)" if last_s else "")
        return png(plots.timeline(self.exp, title=title, last_s=last_s))

    def focus(self) -> dict | None:
        """The rank the verdict names first (the one a reader looks at), where the report kept its stacks;
        else the first rank with stacks; None when no rank has any (the run did not stall)."""
        kept = [e for e in self.ranks if e.get("stacks") or e.get("workers") or e.get("faulthandler")]
        named = {e["rank"]: e for e in kept}
        for m in re.finditer(r"\brank (\d+)", self.verdict):
            if int(m.group(1)) in named:
                return named[int(m.group(1))]
        return kept[0] if kept else None

    def static(self) -> list:
        """The verdict and the ranks' table, the timeline's last ``zoom_s``, then the stacks of the rank the
        verdict names (its threads' and its DataLoader workers')."""
        parts = [self.verdict_html() + self.ranks_table()]
        zoom = self.zoom_s if self.span_s > self.zoom_s else None
        picture = self.timeline_png(zoom)
        parts += [picture] if picture else []
        entry = self.focus()
        if entry is not None:
            parts.append(f"<p><b>rank {entry['rank']}'s stacks</b></p>" + rank_html(entry))
        return parts

    def widget(self):
        import ipywidgets as w

        verdict = w.HTML(self.verdict_html())
        self.rank = w.ToggleButtons(
            options=[(f"rank {e['rank']}", i) for i, e in enumerate(self.ranks)],
            description="rank",
            style={"button_width": "80px"},
        )
        self.detail = w.HTML()
        self.detail.add_class("asrlab-rank")
        self.zoom = w.FloatSlider(
            value=self.span_s,
            min=min(1.0, self.span_s),
            max=max(self.span_s, 1.0),
            step=0.5,
            description="last s",
            continuous_update=False,
            readout_format=".1f",
            layout=w.Layout(width="60%"),
        )
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

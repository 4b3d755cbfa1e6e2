"""A job's own logs (``asrlab doctor LOG``) as curves: the doctor's verdict on top, then each rank's loss
terms, learning rate, grad norm, loss scale and steps/s over the steps, the failure marked.

:func:`log_series` turns what the doctor read (:func:`asrlab.doctor.logs.reader.read_logs`) and its verdict
(:func:`asrlab.doctor.logs.diagnose_logs`) into plot-ready series (JSON-ready, no matplotlib);
:func:`log_curves` draws them; :class:`LogExplorer` shows both, with a rank and a curve picker
live, and headless as the verdict and one figure.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..doctor.logs.progress import SPAN_S, step_number, stretches, where
from ..doctor.verdict import in_epoch
from .base import Explorer, html_escape, png
from .doctor import VERDICT_COLOURS

# the curves besides the loss terms, in the order they are drawn: (record key, what the panel is called)
OTHER_PANELS = (("lr", "learning rate"), ("grad_norm", "grad norm"), ("scale", "loss scale"), ("rate", "steps/s"))
MAX_TERMS = 6  # loss terms drawn at most (the total first); averages only where a term has no value of its own


def _finite(v) -> bool:
    return v is not None and math.isfinite(v)


def _rank_key(rank) -> tuple:
    return (rank is None, rank or 0)


def rank_label(rank) -> str:
    return f"rank {rank}" if rank is not None else "no rank mark"


def _axis(records: list[dict]) -> dict:
    """How the records are placed on x: the global step where every record has one, else the batch within
    the one epoch logged, else the epoch plus the batch's share of the longest epoch seen."""
    if records and all(r["step"] is not None for r in records):
        return {"kind": "step", "label": "step", "per": None}
    epochs = sorted({r["epoch"] for r in records if r["epoch"] is not None})
    batches = [r["batch"] for r in records if r["batch"] is not None]
    if not batches:
        return {"kind": "epoch", "label": "epoch", "per": None}
    if len(epochs) <= 1:
        return {"kind": "batch", "label": f"batch (epoch {epochs[0]})" if epochs else "batch", "per": None}
    per = max(batches) + 1
    return {"kind": "epoch_batch", "label": f"epoch (+ batch / {per})", "per": per}


def _x(axis: dict, r: dict) -> float | None:
    kind = axis["kind"]
    if kind == "step":
        return float(r["step"])
    if kind == "epoch":
        return None if r["epoch"] is None else float(r["epoch"])
    if kind == "batch":
        return None if r["batch"] is None else float(r["batch"])
    if r["epoch"] is None:
        return None
    return r["epoch"] + (r["batch"] or 0) / axis["per"]


def _derived_rate(axis: dict, recs: list[dict]) -> list[tuple[dict, float]]:
    """Steps/s from the lines' own time stamps, where a rank's lines say no rate: between two stamped lines of one
    file, steps apart and seconds apart; where two lines share a stamp (stamps to the second, many steps in one),
    over the doctor's stretches of at least ``SPAN_S``, as it reads a step's seconds."""
    stamped = [r for r in recs if r.get("stamped") and r.get("time") is not None]
    span = SPAN_S if any(a["time"] == b["time"] for a, b in zip(stamped, stamped[1:])) else 0.0
    return [(b, steps / (b["time"] - a["time"])) for a, b, steps in stretches(stamped, span)]


def _culprit_record(run, d: dict) -> dict | None:
    """The step record the verdict's culprit (rank, step) stands for: the first non-finite record where the
    verdict is that one, else the culprit rank's (any rank's, when unknown) last record at that step."""
    c = (d or {}).get("culprit") or {}
    rank, step = c.get("rank"), c.get("step")
    if step is None:
        return None
    first = run.nonfinite[0] if run.nonfinite else None
    if (
        first is not None
        and d.get("verdict") == "nonfinite"
        and step_number(first) == step
        and rank in (None, first["rank"])
    ):
        return first
    pools = []
    if rank in run.series:
        pools.append(run.series[rank].all())
    if None in run.series and rank is not None:
        pools.append(run.series[None].all())  # step lines without a rank mark: the one rank that prints them
    pools.append([r for s in run.series.values() for r in s.all()])
    for pool in pools:
        hits = [r for r in pool if step_number(r) == step]
        if hits:
            return hits[-1]
    return None


def _table_series(d: dict, max_panels: int = 8) -> dict:
    """:func:`log_series`'s shape from the doctor's step series of a toolkit folder's tables (TensorBoard, a
    trainer's state, a metrics CSV): one panel a series (the losses first), x the global step."""
    from ..doctor.series import watched

    named = [(src, name, p) for src, ss in d["series"].items() for name, p in ss.items()]
    named.sort(key=lambda t: ({"loss": 0, "grad_norm": 1}.get(watched(t[1]), 2), t[1]))
    panels = []
    for src, name, p in named[:max_panels]:
        xs, ys = p["steps"], p["values"]
        bad = [{"rank": None, "x": x, "y": y} for x, y in zip(xs, ys) if not math.isfinite(y)]
        line = {"rank": None, "x": xs, "y": ys, "label": src}  # a folder's series: its source, not a rank
        panels.append({"name": name, "label": f"{name} ({src})", "lines": [line], "nonfinite": bad, "derived": False})
    c = d.get("culprit") or {}
    at = c.get("step")
    # a place in its epoch (a console's bar: "epoch 1, batch 14") is no global step of these series: not drawn there
    placed = in_epoch(c)
    mark = None if at is None or placed else {"x": at, "rank": c.get("rank"), "step": at, "where": f"step {at}"}
    first = (d.get("first") or {}).get("series") and mark
    lossy = [b["x"] for p, (_, name, _) in zip(panels, named) if watched(name) == "loss" for b in p["nonfinite"]]
    if placed and lossy:  # the series' own first non-finite step, where the verdict's place is not on their axis
        x = min(lossy)
        first = {"x": x, "rank": None, "step": x, "where": f"step {x}, the series' first loss not finite"}
    return {
        "axis": {"kind": "step", "label": "step"},
        "ranks": [None],
        "panels": panels,
        "marks": {"first_nonfinite": first, "culprit": mark},
        "verdict": d.get("verdict"),
        "summary": d.get("summary"),
        "culprit": d.get("culprit"),
        "steps": {rank_label(None): max((len(p["x"]) for p in [x["lines"][0] for x in panels]), default=0)},
    }


def log_series(run, d: dict | None = None, max_terms: int = MAX_TERMS) -> dict:
    """What the logs' step records (a :class:`~asrlab.doctor.logs.run.LogRun`) and the doctor's verdict on
    them (``diagnose_logs``'s dict) draw as. JSON-ready (values not finite stay ``nan``/``inf``):

    * ``axis``: ``{"kind": "step" | "batch" | "epoch" | "epoch_batch", "label"}``; x is the global step
      where every line has one, else the batch (one epoch logged), else epoch + batch / (longest epoch);
    * ``ranks``: the ranks with step lines (None: lines with no rank mark);
    * ``panels``: ``[{"name", "label", "lines": [{"rank", "x", "y"}], "nonfinite": [{"rank", "x", "y"}]}]``,
      the loss terms first (the total ``loss`` first), then lr, grad norm, loss scale (with the loss-scale
      messages' new values), steps/s (from the lines' time stamps, ``derived``, where they say none);
    * ``marks``: ``culprit``, ``first_nonfinite`` and ``resume``, each ``{"x", "rank", "step", "where"}`` or None;
    * ``verdict``, ``summary``, ``culprit`` as the doctor said (None without ``d``).
    """
    ranks = sorted(run.series, key=_rank_key)
    recs = {rank: run.series[rank].all() for rank in ranks}
    axis = _axis([r for rs in recs.values() for r in rs])

    terms: list[str] = []
    for rs in recs.values():
        for r in rs:
            terms += [k for k in r["losses"] if k not in terms]
    averaged = []
    for rs in recs.values():
        for r in rs:
            averaged += [k for k in r["averages"] if k not in terms and k not in averaged]
    terms = sorted(terms, key=lambda k: k != "loss")  # the total first, then the terms as they first came
    names = [("losses", k, k) for k in terms] + [("averages", k, f"{k} (running average)") for k in averaged]
    names = names[:max_terms] + [(None, key, label) for key, label in OTHER_PANELS]

    panels = []
    for group, key, label in names:
        lines, bad = [], []
        derived = False
        for rank in ranks:
            pts = []
            for r in recs[rank]:
                v = r[group].get(key) if group else r[key]
                x = _x(axis, r)
                if v is not None and x is not None:
                    pts.append((x, float(v)))
            if key == "rate" and not pts:
                pts = [
                    (x, v) for x, v in ((_x(axis, r), v) for r, v in _derived_rate(axis, recs[rank])) if x is not None
                ]
                derived = derived or bool(pts)
            if key == "scale":
                pts = sorted(pts + _scale_points(run, axis, rank), key=lambda p: p[0])
                if all(v == 1.0 or not math.isfinite(v) for _, v in pts):
                    pts = []  # fp32 or bf16 (ESPnet prints loss_scale=1.000, nan after a NaN): no scaler to draw
            if pts:
                lines.append({"rank": rank, "x": [x for x, _ in pts], "y": [v for _, v in pts]})
                bad += [{"rank": rank, "x": x, "y": v} for x, v in pts if not math.isfinite(v)]
        if lines:
            panels.append(
                {
                    "name": key,
                    "label": label + (" (from the lines' time stamps)" if derived else ""),
                    "lines": lines,
                    "nonfinite": bad,
                    "derived": derived,
                }
            )

    if not panels and d and d.get("series"):  # no step lines: the tables' exact series (event files, a trainer's state)
        return _table_series(d)
    first = run.nonfinite[0] if run.nonfinite else None
    culprit = _culprit_record(run, d) if d else None
    c = (d or {}).get("culprit") or {"rank": None, "step": None}
    said = ((d or {}).get("nonfinite") or {}).get("first")
    if first is not None and said:  # the doctor's first non-finite step (the verdict's own event), not a re-reading
        first = {**first, **{k: said.get(k, first[k]) for k in ("epoch", "batch", "rank")}}
        first["step"] = first["step"] if said.get("batch") is not None else said.get("step", first["step"])
    marks = {
        "first_nonfinite": _mark(axis, first, first["rank"] if first else None),
        "culprit": _mark(axis, culprit, c.get("rank"))
        if culprit is not None
        else _mark(axis, _place(c), c.get("rank")) or _bare_mark(axis, c),
        # where a restart began again: the first line after its steps went back
        "resume": _mark(axis, run.resumes[0]["after"], run.resumes[0]["rank"]) if run.resumes else None,
    }
    d = d or {}
    return {
        "axis": {"kind": axis["kind"], "label": axis["label"]},
        "ranks": ranks,
        "panels": panels,
        "marks": marks,
        "verdict": d.get("verdict"),
        "summary": d.get("summary"),
        "culprit": d.get("culprit"),
        "steps": {rank_label(rank): len(rs) for rank, rs in recs.items()},
    }


def _mark(axis: dict, rec: dict | None, rank) -> dict | None:
    from ..doctor.logs.progress import step_number

    if rec is None:
        return None
    x = _x(axis, rec)
    return None if x is None else {"x": x, "rank": rank, "step": step_number(rec), "where": where(rec)}


def _place(c: dict) -> dict | None:
    """The culprit's place as a step record has it, where no record is at it (ESPnet's batch inside a line's
    interval)."""
    if c.get("step") is None:
        return None
    step = c["step"] if c.get("batch") is None and c.get("epoch") is None else None
    return {"step": step, "epoch": c.get("epoch"), "batch": c.get("batch")}


def _bare_mark(axis: dict, c: dict) -> dict | None:
    """A culprit step no step record is at: placed where the axis counts as the culprit does."""
    if c.get("step") is None or axis["kind"] not in ("step", "batch"):
        return None
    return {"x": float(c["step"]), "rank": c.get("rank"), "step": c["step"], "where": f"step {c['step']}"}


def _scale_points(run, axis: dict, rank) -> list[tuple[float, float]]:
    """The loss-scale messages' new values ("reducing loss scale to 1024"), placed at the rank's last step
    line before each in the same file."""
    out = []
    recs = run.series[rank].all() if rank in run.series else []
    for e in run.events:
        if e["kind"] != "scale" or e.get("to") is None:
            continue
        own = e.get("rank") if e.get("rank") in run.series else None  # a marked message beside unmarked step lines
        if own != rank:
            continue
        before = [r for r in recs if r.get("file") == e.get("file") and r.get("order", 0) <= e.get("order", 0)]
        x = _x(axis, before[-1]) if before else None
        if x is not None:
            out.append((x, float(e["to"])))
    return out


def _paths(paths) -> list[str]:
    return [str(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]


def log_curves(series: dict, ranks: list | None = None, panels: list[str] | None = None, title: str = ""):
    """A job's logs as curves (``asrlab.widgets.logs.log_series``): one panel per loss term, lr, grad norm,
    loss scale and steps/s, one line per rank; values not finite as red crosses at the panel's top, the
    verdict's culprit step (red) and the first non-finite step (orange, dashed) as vertical lines."""
    import matplotlib.pyplot as plt  # the notebooks extra
    from matplotlib.transforms import blended_transform_factory

    shown = [p for p in series["panels"] if panels is None or p["name"] in panels] or series["panels"]
    ranks = series["ranks"] if ranks is None else [r for r in series["ranks"] if r in ranks] or series["ranks"]
    cols = 1 if len(shown) == 1 else 2
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11 if cols == 2 else 8, 2.5 * rows + 0.6), squeeze=False, sharex=True)
    cmap = plt.get_cmap("tab10" if len(series["ranks"]) <= 10 else "viridis")
    colour = {
        r: cmap(i if len(series["ranks"]) <= 10 else i / max(1, len(series["ranks"]) - 1))
        for i, r in enumerate(series["ranks"])
    }
    marks = series["marks"]
    culprit, first = marks.get("culprit"), marks.get("first_nonfinite")
    for ax, panel in zip(axes.flat, shown):
        top = blended_transform_factory(ax.transData, ax.transAxes)
        values = []
        for line in panel["lines"]:
            if line["rank"] not in ranks:
                continue
            ys = [y if math.isfinite(y) else float("nan") for y in line["y"]]  # a gap where it is not finite
            values += [y for y in ys if y == y]
            label = line.get("label") or rank_label(line["rank"])
            ax.plot(line["x"], ys, marker="o", ms=3, lw=1.2, color=colour[line["rank"]], label=label)
        bad = [p for p in panel["nonfinite"] if p["rank"] in ranks]
        if bad:
            ax.plot(
                [p["x"] for p in bad],
                [0.93] * len(bad),
                "x",
                color="tab:red",
                ms=9,
                mew=2,
                transform=top,
                clip_on=False,
                label="not finite",
            )
            p = bad[0]
            who = f", rank {p['rank']}" if p["rank"] is not None else ""
            ax.text(p["x"], 0.8, f" {p['y']}{who}", color="tab:red", fontsize=8, transform=top)
        if values and min(values) > 0 and max(values) / min(values) > 1e3:
            ax.set_yscale("log")
        if not values:
            ax.set_yticks([])
        for mark, style, colour_, what in (
            (first, "--", "tab:orange", "first non-finite"),
            (culprit, "-", "tab:red", "culprit"),
            (marks.get("resume"), ":", "tab:purple", "resumed"),
        ):
            if mark is None or (what == "first non-finite" and culprit is not None and culprit["x"] == mark["x"]):
                continue
            ax.axvline(mark["x"], color=colour_, ls=style, lw=1.2)
        ax.set_title(panel["label"], fontsize=10)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(shown) :]:
        ax.set_visible(False)
    if series["axis"]["kind"] in ("step", "batch"):  # counts: no 5426.25
        from matplotlib.ticker import MaxNLocator

        for ax in axes.flat:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[-1]:
        ax.set_xlabel(series["axis"]["label"], fontsize=9)
    if cols == 2 and len(shown) % 2:
        axes[-2][1].xaxis.set_tick_params(labelbottom=True)
        axes[-2][1].set_xlabel(series["axis"]["label"], fontsize=9)
    notes = []
    for mark, what in (
        (culprit, "culprit (red line)"),
        (first, "first non-finite (orange dashed line)"),
        (marks.get("resume"), "resumed (purple dotted line)"),
    ):
        if mark is not None and what.startswith("first") and culprit is not None and culprit["x"] == mark["x"]:
            what = "first non-finite"  # the same step: the culprit's red line stands for both
        if mark is not None:
            who = f"rank {mark['rank']}, " if mark["rank"] is not None else ""
            notes.append(f"{what}: {who}{mark['where']}")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in list(axes.flat)[1 : len(shown)]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    if len(ranks) <= 10 or "not finite" in labels:
        keep = [(h, label) for h, label in zip(handles, labels) if len(ranks) <= 10 or label == "not finite"]
        fig.legend(
            [h for h, _ in keep],
            [label for _, label in keep],
            loc="upper right",
            fontsize=8,
            ncol=min(len(keep), 6),
            bbox_to_anchor=(1.0, 1.0),
            frameon=False,
        )
    verdict = (series.get("verdict") or "").upper()
    head = f"{title}: {verdict}" if title and verdict else title or verdict
    fig.suptitle(head + (f"\n{'; '.join(notes)}" if notes else ""), fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    return fig


class LogExplorer(Explorer):
    """A job's logs (a file, several, a folder of them, a watched run's ``EXP/job.log``): the doctor's verdict
    (the word, the summary, the culprit) on top, the whole diagnosis folded, and the curves parsed from the
    lines, one line per rank, the culprit's step and the first non-finite step marked. Live: pick the
    ranks and the curves. Headless: every rank and every curve in one figure."""

    def __init__(self, paths, title: str = ""):
        from ..doctor import format_diagnosis
        from ..doctor import read_and_diagnose

        self.paths = _paths(paths)
        # the step records themselves and the doctor's verdict, from one read (raises UsageError: no logs)
        self.run, self.diagnosis = read_and_diagnose(self.paths)
        self.series = log_series(self.run, self.diagnosis)
        self.text = format_diagnosis(self.diagnosis)
        self.title = title or ", ".join(Path(p).name for p in self.paths)
        self._figure = None

    @property
    def verdict(self) -> str:
        return self.diagnosis["verdict"]

    def verdict_html(self) -> str:
        d, s = self.diagnosis, self.series
        colour = VERDICT_COLOURS.get(d["verdict"], "#2e7d32" if d["verdict"] == "no_failure_seen" else "#c62828")
        m = s["marks"]["culprit"]
        c = d["culprit"]
        if c["rank"] is not None or c["step"] is not None:
            who = rank_label(c["rank"]) if c["rank"] is not None else "rank unknown"
            place = ", ".join(f"{k} {c[k]}" for k in ("epoch", "batch") if c.get(k) is not None)
            at = m["where"] if m else place or (f"step {c['step']}" if c["step"] is not None else "step unknown")
            culprit = f"{who}, {at}"
        else:
            culprit = "none named"
        steps = (
            f" ({s['axis']['label']}): " + ", ".join(f"{k}: {v}" for k, v in s["steps"].items())
            if s["steps"]
            else ": none"
        )
        return (
            f"<p><b style='color:{colour};font-size:1.15em'>{html_escape(d['verdict'].upper())}</b> "
            f"{html_escape(d['summary'])}</p>"
            f"<p><b>culprit:</b> {html_escape(culprit)} &nbsp; <b>step lines read</b>{html_escape(steps)}</p>"
            f"<details><summary>asrlab doctor {html_escape(' '.join(self.paths))}</summary>"
            f"<pre style='font-size:11px;line-height:1.3'>{html_escape(self.text)}</pre></details>"
        )

    def figure(self, ranks=None, panels=None):
        """The curves as a matplotlib figure (None when the logs have no step line of a known format). Every
        rank and every curve: drawn once, the same figure each time (the static view's, to save as well)."""
        if not self.series["panels"]:
            return None

        if ranks is None and panels is None:
            if self._figure is None:
                self._figure = log_curves(self.series, title=self.title)
            return self._figure
        return log_curves(self.series, ranks=ranks, panels=panels, title=self.title)

    def picture(self, ranks=None, panels=None) -> bytes | None:
        fig = self.figure(ranks, panels)
        return None if fig is None else png(fig)

    def static(self) -> list:
        pic = self.picture()
        note = "" if pic is not None else "<p>no training-step line of a known format in these logs: no curves</p>"
        return [self.verdict_html() + note] + ([pic] if pic is not None else [])

    def widget(self):
        import ipywidgets as w

        head = w.HTML(self.verdict_html())
        if not self.series["panels"]:
            box = w.VBox([head, w.HTML("<p>no training-step line of a known format in these logs: no curves</p>")])
            box.add_class("asrlab-logs")
            return box
        ranks = [(rank_label(r), r) for r in self.series["ranks"]]
        curves = [(p["label"], p["name"]) for p in self.series["panels"]]
        self.rank_pick = w.SelectMultiple(
            options=ranks, value=[r for _, r in ranks], description="ranks", rows=min(6, len(ranks))
        )
        self.curve_pick = w.SelectMultiple(
            options=curves, value=[c for _, c in curves], description="curves", rows=min(8, len(curves))
        )
        self.image = w.Image(format="png", layout=w.Layout(max_width="100%"))

        def draw(_=None):
            pic = self.picture(list(self.rank_pick.value) or None, list(self.curve_pick.value) or None)
            if pic is not None:
                self.image.value = pic

        self.rank_pick.observe(draw, names="value")
        self.curve_pick.observe(draw, names="value")
        draw()
        box = w.VBox([head, w.HBox([self.rank_pick, self.curve_pick]), self.image])
        box.add_class("asrlab-logs")
        return box

"""Plots of where the time of a step goes and of a stall: the phase timeline, each rank's steps, phase shares."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from ..lab import layout
from ..lab.metrics import rank_metrics
from ..lab.stall.heartbeat import phase_intervals, read_timeline
from ..lab.timing import PARTS


PHASE_COLOURS = {
    "start": "#dddddd",
    "index": "#bbbbbb",
    "data": "#d62728",
    "sync": "#ff9896",
    "copy": "#17becf",
    "features": "#aec7e8",
    "forward": "#1f77b4",
    "compile": "#ffbb78",
    "backward": "#9467bd",
    "allreduce": "#7f7f7f",
    "optimizer": "#2ca02c",
    "checkpoint": "#8c564b",
    "eval": "#bcbd22",
    "epoch_end": "#000000",
    "done": "#ffffff",
    "compute": "#1f77b4",
    "ddp_allreduce": "#7f7f7f",
    "collective": "#c7c7c7",
    "other": "#e377c2",
}


# the phases of a training step: the first of them any rank enters is where the first step begins
STEP_PHASES = (
    "data",
    "sync",
    "copy",
    "features",
    "compute",
    "forward",
    "backward",
    "allreduce",
    "ddp_allreduce",
    "optimizer",
)


def _held_in_allreduce(spans: dict[int, list[tuple]], timelines: dict, exp: Path) -> dict[int, list[tuple]]:
    """The spans with the last backward of each rank the stall report found held in DDP's gradient
    all-reduce (phase ``ddp_allreduce``) drawn as that from when its stacks stopped moving: a timeline
    sampled from outside sees such a rank's backward stack only."""
    report = Path(exp) / layout.STALL_REPORT
    if not spans or not report.exists():
        return spans
    import json

    r = json.loads(report.read_text())
    held = {e["rank"]: e.get("since") for e in r.get("ranks") or [] if e.get("phase") == "ddp_allreduce"}
    t0 = min(e["t"] for evs in timelines.values() for e in evs)
    out = dict(spans)
    for rank, since in held.items():
        rows = list(spans.get(rank) or [])
        if not rows or rows[-1][0] != "backward":
            continue
        phase, start, length = rows.pop()
        cut = min(max(start, (since or 0.0) - t0), start + length)
        if cut > start:
            rows.append((phase, start, cut - start))
        rows.append(("ddp_allreduce", cut, start + length - cut))
        out[rank] = rows
    return out


def timeline(exp: str | Path, title: str = "", last_s: float | None = None) -> plt.Figure:
    """A row per rank, coloured by phase over wall-clock time (needs ``train.timeline=true``).

    Zero is where the first step began (the first phase of a step any rank entered): start-up (the
    processes starting, reading the data's index) lies before it, at negative time. A stalled run's last
    phases are drawn up to the stall report's time; ``last_s``: only the last that many seconds.
    """
    timelines = read_timeline(exp)
    spans = _held_in_allreduce(phase_intervals(timelines, Path(exp)), timelines, Path(exp))
    fig, ax = plt.subplots(figsize=(10, 1.4 + 0.45 * max(1, len(spans))))
    zero = min((start for rows in spans.values() for phase, start, _ in rows if phase in STEP_PHASES), default=None)
    xlabel = "seconds since the first step began"
    if zero is None:  # no rank got to a step
        zero, xlabel = 0.0, "seconds since the run started (no step began)"
    spans = {rank: [(phase, start - zero, length) for phase, start, length in rows] for rank, rows in spans.items()}
    seen = set()
    first = min((start for rows in spans.values() for _, start, _ in rows), default=0.0)
    end = max((start + length for rows in spans.values() for _, start, length in rows), default=0.0)
    lo = max(first, end - last_s) if last_s else first
    for rank, rows in spans.items():
        for phase, start, length in rows:
            if start + length < lo:
                continue
            label = phase if phase not in seen else None
            seen.add(phase)
            ax.broken_barh(
                [(start, length)],
                (rank - 0.4, 0.8),
                facecolors=PHASE_COLOURS.get(phase, "#17becf"),
                edgecolor="none",
                label=label,
            )
    if lo < 0 < end:
        ax.axvline(0.0, color="black", lw=0.8, ls=":")
        xlabel += " (start-up before 0)"
    ax.set(
        yticks=list(spans),
        yticklabels=[f"rank {r}" for r in spans],
        xlabel=xlabel,
        title=title or "what each rank was doing",
    )
    ax.set_xlim(lo, end + 0.02 * max(end - lo, 1e-9))
    ax.invert_yaxis()
    order = [p for p in PHASE_COLOURS if p in seen] + sorted(p for p in seen if p not in PHASE_COLOURS)
    handles = {h.get_label(): h for h in ax.get_legend_handles_labels()[0]}
    ax.legend(
        [handles[p] for p in order], order, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False
    )
    fig.tight_layout()
    return fig


def rank_steps(exp: str | Path, title: str = "") -> plt.Figure:
    """Per rank: step time and the part of it spent waiting for data (s), per step."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), sharey=True)
    for name, m in rank_metrics(exp).items():
        axes[0].plot([x["step"] for x in m], [x["step_s"] for x in m], lw=1, label=name)
        axes[1].plot([x["step"] for x in m], [x["data_wait_s"] for x in m], lw=1, label=name)
    axes[0].set(xlabel="step", ylabel="seconds", title=title or "step time")
    axes[1].set(xlabel="step", title="of which waiting for data")
    axes[0].legend()
    fig.tight_layout()
    return fig


# how the time-share bars name a phase where its key alone would mislead
SHARE_LABELS = {
    "data": "waiting for data",
    "ddp_allreduce": "waiting in DDP's gradient all-reduce",
    "collective": "waiting in a collective",
    "allreduce": "gradient all-reduce",
    "other": "the loop's own code",
    "compute": "the rest of the step",
}


HELD = "waiting in DDP's gradient all-reduce (held in backward)"


def held_ranks(stall: dict | None) -> set[int]:
    """The ranks a stall report (or ``asrlab doctor``'s ``stall`` section) found held in backward, waiting
    for the others' gradients in DDP's all-reduce (:func:`asrlab.lab.stall.classify.held_phase`)."""
    return {e["rank"] for e in (stall or {}).get("ranks") or [] if e.get("phase") == "ddp_allreduce"}


def phase_shares(ranks: list[dict], title: str = "", held: set[int] | dict | None = None) -> plt.Figure:
    """Per rank, the share of its time in each phase: ``asrlab doctor``'s ``steps.ranks`` (``shares`` where the
    phases were sampled from outside, else waiting for data against the rest).

    ``held``: the ranks the data found held in backward waiting on the other ranks (a stall report's
    ``ddp_allreduce``; a stall report or the doctor's ``stall`` section is read with :func:`held_ranks`):
    their "backward" is drawn and named as waiting in DDP's gradient all-reduce, not as a slow backward.
    In a job of several ranks whose phases were sampled from outside, "backward" is named as including
    DDP's all-reduce: a rank waiting there for a slower rank shows the stack of its backward.
    """
    if isinstance(held, dict):
        held = held_ranks(held)
    held = set(held or ())
    sampled_ddp = len(ranks) > 1 and any(r.get("source") == "sampled stacks" for r in ranks)

    def shares(r: dict) -> dict:
        out = dict(r.get("shares") or {"data": r["data_wait_share"], "compute": 1 - r["data_wait_share"]})
        if r["rank"] in held and "backward" in out:
            out["held"] = out.pop("backward")
        return out

    names = dict(SHARE_LABELS, held=HELD)
    if sampled_ddp:
        names["backward"] = "backward (and DDP's gradient all-reduce within it)"
    colours = dict(PHASE_COLOURS, held=PHASE_COLOURS["ddp_allreduce"])
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(ranks) + 1.6))
    phases: list[str] = []
    for r in ranks:
        for p in shares(r):
            if p not in phases:
                phases.append(p)
    labels = [f"rank {r['rank']}" for r in ranks]
    left = [0.0] * len(ranks)
    for p in phases:
        vals = [shares(r).get(p, 0.0) for r in ranks]
        ax.barh(
            labels,
            vals,
            left=left,
            label=names.get(p, p),
            color=colours.get(p),
            hatch="//" if p == "held" else None,
            edgecolor="white" if p == "held" else None,
        )
        left = [a + v for a, v in zip(left, vals)]
    ax.set(xlim=(0, 1), xlabel="share of the rank's time", title=title or "where each rank's time goes")
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def step_breakdown(rows: list[dict], labels: list[str] | None = None, title: str = "") -> plt.Figure:
    """Stacked bars: the mean step split into its parts (s), one bar per measured setting (``tune.measure`` rows)."""
    labels = labels or [str(i) for i in range(len(rows))]
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows) + 2), 3.4))
    bottom = [0.0] * len(rows)
    for part in PARTS:
        vals = [r["parts_s"].get(part, 0.0) for r in rows]
        if not any(vals):
            continue
        ax.bar(
            labels,
            vals,
            bottom=bottom,
            label=part,
            color=PHASE_COLOURS.get(part, None) if part != "comm" else "#7f7f7f",
        )
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(ylabel="seconds per step", title=title or "where a step's time goes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    return fig

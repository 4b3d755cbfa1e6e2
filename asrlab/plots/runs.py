"""Plots of a training run: its curves, its non-finite steps and fp16 headroom, resumes and coverage."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from ..lab.metrics import metrics_file, read_metrics
from ..lab.numerics.stats import FP16_MAX, headroom_traces, read_traces, tightest_at


def training_curves(exp: str | Path, title: str = "") -> plt.Figure:
    """Loss per step (rank 0) with the LR, and cv CER per evaluation when there is one."""
    steps = read_metrics(exp)
    evals = read_metrics(exp, "eval") if metrics_file(exp, "eval").exists() else []
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    ax = axes[0]
    ax.plot([m["step"] for m in steps], [m["loss"] for m in steps], lw=1, label="train loss")
    ax.set(xlabel="step", ylabel="CTC loss per utterance", yscale="log", title=title or "training loss")
    lr = ax.twinx()
    lr.plot([m["step"] for m in steps], [m["lr"] for m in steps], color="gray", lw=0.8, ls="--")
    lr.set_ylabel("learning rate", color="gray")
    ax = axes[1]
    if evals:
        ax.plot([e["step"] for e in evals], [100 * e["cer"] for e in evals], "o-", label="cv CER")
        ax.plot([e["step"] for e in evals], [100 * e["wer"] for e in evals], "s--", label="cv WER")
        ax.set(yscale="log")
        ax.legend()
    else:
        ax.text(
            0.5,
            0.5,
            "no evaluation yet\n(one after each epoch)",
            ha="center",
            va="center",
            color="gray",
            transform=ax.transAxes,
        )
    ax.set(xlabel="step", ylabel="error rate (%)", title="validation")
    fig.tight_layout()
    return fig


def nan_traces(exp: str | Path, k: int = 4, title: str = "") -> plt.Figure:
    """Loss, gradient norm, loss scale and skipped steps per step, and the fp16 headroom of the ``k``
    modules whose headroom got smallest (sampled steps; 1 = values at 65504, below it fp16 overflows)."""
    import math

    m = read_metrics(exp)
    steps = [r["step"] for r in m]
    bad = [r["step"] for r in m if r.get("nonfinite") in ("loss", "grad")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 5.8), sharex=True)
    (a_loss, a_norm), (a_scale, a_room) = axes
    for ax, key, label in (
        (a_loss, "loss", "loss per utterance"),
        (a_norm, "grad_norm", "gradient norm (before clipping)"),
    ):
        ax.plot(steps, [r[key] if r[key] is not None else math.nan for r in m], lw=1)
        ax.set(ylabel=label, yscale="log")
        for s in bad:
            ax.axvline(s, color="tab:red", lw=0.6, alpha=0.5)
    a_loss.set_title(title or "training, with non-finite steps in red")
    a_scale.plot(steps, [r["loss_scale"] for r in m], lw=1, label="loss scale")
    a_scale.set(ylabel="loss scale", yscale="log", xlabel="step")
    skip = a_scale.twinx()
    skip.plot(steps, [r["skipped"] for r in m], color="tab:red", lw=1, label="skipped steps")
    skip.set_ylabel("skipped steps (total)", color="tab:red")
    for name, pts in headroom_traces(read_traces(exp), k).items():
        a_room.plot(
            [s for s, _ in pts], [max(h, 1e-2) for _, h in pts], marker=".", lw=1, label=name
        )  # 0 (overflowed) drawn at 0.01
    a_room.axhline(1.0, color="black", ls="--", lw=0.8)
    a_room.text(0.01, 1.0, " fp16 overflows below", transform=a_room.get_yaxis_transform(), va="bottom", fontsize=8)
    a_room.set(ylabel="fp16 headroom (65504 / max |x|)", yscale="log", xlabel="step")
    a_room.legend(fontsize=7, loc="upper right", frameon=False)
    fig.tight_layout()
    return fig


def headroom_bars(trace: dict, k: int = 8, direction: str = "forward", title: str = ""):
    """Bars of the ``k`` tightest modules' fp16 headroom at one sampled step (log scale, 1 = 65504)."""
    rows = tightest_at(trace, k, direction)[::-1]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.32 * len(rows)))
    vals = [max(r, 1e-2) for _, r in rows]
    ax.barh(
        [m for m, _ in rows],
        vals,
        color=["tab:red" if r <= 1 else "tab:orange" if r < 10 else "tab:blue" for _, r in rows],
    )
    ax.axvline(1.0, color="black", ls="--", lw=0.8)
    ax.set(
        xscale="log",
        xlabel="fp16 headroom: 65504 / max |x| (below 1: overflow; 0.01: not finite)",
        title=title or f"step {trace['step']}: the {len(rows)} tightest modules ({direction})",
    )
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    return fig


def module_trace(
    traces: list[dict], module: str, direction: str = "forward", bad_step: int | None = None, title: str = ""
):
    """One module's max |x| over the sampled steps against fp16's 65504; ``bad_step`` marked."""
    import math

    pts = [(t["step"], t[direction][module][0]) for t in traces if module in t[direction]]
    fig, ax = plt.subplots(figsize=(8, 3))
    finite = [(s, v) for s, v in pts if math.isfinite(v)]
    ax.plot([s for s, _ in finite], [max(v, 1e-6) for _, v in finite], marker="o", lw=1, label="max |x|")
    for s, _ in [(s, v) for s, v in pts if not math.isfinite(v)]:
        ax.plot([s], [FP16_MAX * 2], marker="x", color="tab:red", ms=9)
    ax.axhline(FP16_MAX, color="black", ls="--", lw=0.8)
    ax.text(0.01, FP16_MAX, " fp16's largest value, 65504", transform=ax.get_yaxis_transform(), va="bottom", fontsize=8)
    if bad_step is not None:
        ax.axvline(bad_step, color="tab:red", lw=1.2)
        ax.text(
            bad_step,
            0.02,
            f" first non-finite step ({bad_step})",
            color="tab:red",
            fontsize=8,
            transform=ax.get_xaxis_transform(),
        )
    ax.set(yscale="log", xlabel="step", ylabel="max |x|", title=title or f"{module} ({direction})")
    fig.tight_layout()
    return fig


def fix_comparison(rows: list[dict], title: str = "") -> plt.Figure:
    """One bar per run (``diagnostics.outcome`` rows with a ``run`` label): final loss, skipped steps, s/step."""
    import math

    labels = [r["run"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, key, label in (
        (axes[0], "final_loss", "final loss (mean of the last steps)"),
        (axes[1], "skipped", "skipped steps"),
        (axes[2], "step_s", "seconds per step (median)"),
    ):
        vals = [r[key] if r[key] is not None and math.isfinite(r[key]) else 0.0 for r in rows]
        bars = ax.bar(labels, vals, color=["tab:red" if not r["finite"] else "tab:green" for r in rows])
        if key == "final_loss":
            for b, r in zip(bars, rows):
                if not r["finite"]:
                    ax.text(b.get_x() + b.get_width() / 2, 0, "NaN", ha="center", va="bottom", color="tab:red")
        ax.set_title(label, fontsize=10)
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=8)
    fig.suptitle(title or "each fix against the failing run (green: finite to the end)")
    fig.tight_layout()
    return fig


def resume_curves(runs: dict[str, str | Path], reference: str, title: str = "") -> plt.Figure:
    """Training loss per step of each resumed run (from its resume on) over the ``reference`` run's.

    ``runs``: label -> experiment; the reference is drawn whole, the others from the step they
    resumed at (where their metrics' step goes back), dashed where it matters to see through."""
    fig, ax = plt.subplots(figsize=(10, 3.6))
    styles = iter([dict(ls="--", lw=1.6), dict(ls="-", lw=1.0), dict(ls=":", lw=1.8), dict(ls="-.", lw=1.2)])
    for label, exp in runs.items():
        m = read_metrics(exp)
        start = max((i for i in range(1, len(m)) if m[i]["step"] <= m[i - 1]["step"]), default=0)
        m = m if label == reference else m[start:]
        kw = dict(color="black", lw=2.5, alpha=0.35) if label == reference else next(styles)
        ax.plot([r["step"] for r in m], [r["loss"] for r in m], label=label, **kw)
    ax.set(
        xlabel="step",
        ylabel="training loss per utterance",
        yscale="log",
        title=title or "after the crash: each way of resuming against the run never interrupted",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def coverage_grid(counts: dict[str, list[int]], title: str = "") -> plt.Figure:
    """A row per run, a column per utterance: trained never (grey), once (green), twice (orange), more (red)."""
    from matplotlib.colors import ListedColormap

    labels = list(counts)
    grid = [[min(c, 3) for c in counts[name]] for name in labels]
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.5 * len(labels)))
    ax.imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        vmin=0,
        vmax=3,
        cmap=ListedColormap(["#dddddd", "#2ca02c", "#ff9f1c", "#d62728"]),
    )
    ax.set(
        yticks=range(len(labels)),
        yticklabels=labels,
        xlabel="utterance (in the order the run never interrupted trained them)",
        title=title or "how many times each utterance was trained in the epoch",
    )
    ax.tick_params(axis="y", labelsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("#dddddd", "#2ca02c", "#ff9f1c", "#d62728")]
    ax.legend(
        handles,
        ["never (yet)", "once", "twice", "3+"],
        ncol=4,
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(0, -0.35 - 0.1 / max(1, len(labels))),
        frameon=False,
    )
    fig.tight_layout()
    return fig


def resume_times(rows: list[dict], title: str = "") -> plt.Figure:
    """Seconds to the first batch after resuming, against the position in the epoch (``resume_time`` rows)."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = [100 * r["fraction"] for r in rows]
    ax.plot(x, [r["resume_s"] for r in rows], marker="o", label="resume (seek to the saved position)")
    ax.plot(x, [r["replay_s"] for r in rows], marker="s", label="replay (read and discard up to it)")
    ax.set(
        xlabel="position in the epoch (%)",
        ylabel="seconds to the first batch",
        ylim=(0, None),
        title=title or "resume time against position",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig

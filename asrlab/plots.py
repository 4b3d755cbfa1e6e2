"""Plot helpers the notebooks call in one line; each returns a matplotlib Figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from .lab import layout
from .lab.metrics import metric_files, read_metrics
from .lab.numerics.stats import FP16_MAX, headroom_traces, read_traces, tightest_at
from .lab.stall.heartbeat import phase_intervals, read_timeline
from .lab.timing import PARTS


def spectrogram(feats, title: str = "") -> plt.Figure:
    """An fbank matrix (frames, bins) as an image, time on x."""
    fig, ax = plt.subplots(figsize=(8, 2.6))
    ax.imshow(feats.T, origin="lower", aspect="auto", cmap="magma")
    ax.set(xlabel="frame (10 ms)", ylabel="mel bin", title=title)
    fig.tight_layout()
    return fig


def durations(seconds_by_split: dict[str, list[float]]) -> plt.Figure:
    """Histogram of utterance durations (s) per split."""
    fig, ax = plt.subplots(figsize=(6, 3))
    for split, secs in seconds_by_split.items():
        ax.hist(secs, bins=30, alpha=0.6, label=f"{split} ({len(secs)})")
    ax.set(xlabel="duration (s)", ylabel="utterances")
    ax.legend()
    fig.tight_layout()
    return fig


def training_curves(exp: str | Path, title: str = "") -> plt.Figure:
    """Loss per step (rank 0) with the LR, and cv CER per evaluation when there is one."""
    steps = read_metrics(exp)
    evals = read_metrics(exp, "eval") if layout.metrics(exp, "eval").exists() else []
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
        ax.text(0.5, 0.5, "no evaluation yet\n(one after each epoch)", ha="center", va="center", color="gray",
                transform=ax.transAxes)
    ax.set(xlabel="step", ylabel="error rate (%)", title="validation")
    fig.tight_layout()
    return fig


PHASE_COLOURS = {"start": "#dddddd", "index": "#bbbbbb", "data": "#d62728", "sync": "#ff9896", "copy": "#17becf", "features": "#aec7e8", "forward": "#1f77b4",
                 "backward": "#9467bd", "allreduce": "#7f7f7f", "optimizer": "#2ca02c", "checkpoint": "#8c564b",
                 "eval": "#bcbd22", "epoch_end": "#000000", "done": "#ffffff", "compute": "#1f77b4",
                 "ddp_allreduce": "#7f7f7f", "collective": "#c7c7c7", "other": "#e377c2"}


# the phases of a training step: the first of them any rank enters is where the first step begins
STEP_PHASES = ("data", "sync", "copy", "features", "compute", "forward", "backward", "allreduce", "ddp_allreduce",
               "optimizer")


def _held_in_allreduce(spans: dict[int, list[tuple]], timelines: dict, exp: Path) -> dict[int, list[tuple]]:
    """The spans with the last backward of each rank the stall report found held in DDP's gradient
    all-reduce (phase ``ddp_allreduce``) drawn as that from when its stacks stopped moving: a timeline
    sampled from outside sees such a rank's backward stack only."""
    report = layout.stall_report(exp)
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
            ax.broken_barh([(start, length)], (rank - 0.4, 0.8), facecolors=PHASE_COLOURS.get(phase, "#17becf"),
                           edgecolor="none", label=label)
    if lo < 0 < end:
        ax.axvline(0.0, color="black", lw=0.8, ls=":")
        xlabel += " (start-up before 0)"
    ax.set(yticks=list(spans), yticklabels=[f"rank {r}" for r in spans], xlabel=xlabel,
           title=title or "what each rank was doing")
    ax.set_xlim(lo, end + 0.02 * max(end - lo, 1e-9))
    ax.invert_yaxis()
    order = [p for p in PHASE_COLOURS if p in seen] + sorted(p for p in seen if p not in PHASE_COLOURS)
    handles = {h.get_label(): h for h in ax.get_legend_handles_labels()[0]}
    ax.legend([handles[p] for p in order], order, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
    fig.tight_layout()
    return fig


def rank_steps(exp: str | Path, title: str = "") -> plt.Figure:
    """Per rank: step time and the part of it spent waiting for data (s), per step."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), sharey=True)
    for name in metric_files(exp):
        m = read_metrics(exp, name)
        axes[0].plot([x["step"] for x in m], [x["step_s"] for x in m], lw=1, label=name)
        axes[1].plot([x["step"] for x in m], [x["data_wait_s"] for x in m], lw=1, label=name)
    axes[0].set(xlabel="step", ylabel="seconds", title=title or "step time")
    axes[1].set(xlabel="step", title="of which waiting for data")
    axes[0].legend()
    fig.tight_layout()
    return fig


# how the time-share bars name a phase where its key alone would mislead
SHARE_LABELS = {"data": "waiting for data", "ddp_allreduce": "waiting in DDP's gradient all-reduce",
                "collective": "waiting in a collective", "allreduce": "gradient all-reduce",
                "other": "the loop's own code", "compute": "the rest of the step"}
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
        ax.barh(labels, vals, left=left, label=names.get(p, p), color=colours.get(p),
                hatch="//" if p == "held" else None, edgecolor="white" if p == "held" else None)
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
        ax.bar(labels, vals, bottom=bottom, label=part, color=PHASE_COLOURS.get(part, None) if part != "comm" else "#7f7f7f")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(ylabel="seconds per step", title=title or "where a step's time goes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    return fig


def samplers(samples: dict, title: str = "", pyplot: bool = True) -> plt.Figure:
    """CPU % of the main process and of each data-loader worker over time; GPU utilisation where sampled.

    ``pyplot=False`` makes the figure outside pyplot, which a thread other than the main one may do."""
    gpu = samples.get("gpu") or []
    size = (9, 4.6 if gpu else 2.8)
    if pyplot:
        fig, axes = plt.subplots(2 if gpu else 1, 1, figsize=size, sharex=True, squeeze=False)
    else:
        from matplotlib.figure import Figure

        fig = Figure(figsize=size)
        axes = fig.subplots(2 if gpu else 1, 1, sharex=True, squeeze=False)
    ax = axes[0, 0]
    by_pid: dict = {}
    for r in samples.get("cpu") or []:
        by_pid.setdefault((r["role"], r["pid"]), []).append(r)
    for i, ((role, pid), rows) in enumerate(sorted(by_pid.items(), key=lambda kv: (kv[0][0] != "main", kv[0][1]))):
        ax.plot([r["t"] for r in rows], [r["cpu_pct"] for r in rows], lw=1,
                label="main process" if role == "main" else f"worker {pid}")
    ax.set(ylabel="CPU % (of one core)", title=title or "what the machine was doing")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if gpu:
        ax = axes[1, 0]
        for d in sorted({r["device"] for r in gpu}):
            rows = [r for r in gpu if r["device"] == d]
            ax.plot([r["t"] for r in rows], [r["util_pct"] for r in rows], lw=1, label=f"GPU {d}")
        ax.set(ylabel="GPU utilisation %", ylim=(0, 105))
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    else:
        ax.text(0.99, 0.97, samples.get("gpu_reason", "no GPU"), transform=ax.transAxes, ha="right", va="top", fontsize=8,
                color="gray")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    return fig


SWEEP_MEASURES = {  # key: (label, format, colour map, best of several settings in one cell)
    "audio_h_per_h": ("audio hours trained per hour", "{:.0f}", "viridis", max),
    "data_wait": ("share of step time waiting for data", "{:.0%}", "magma_r", min),
    "peak_mib": ("peak memory of the process and its workers (MiB)", "{:.0f}", "cividis_r", min),
    "gpu_util_pct": ("GPU utilisation (%, NVML)", "{:.0f}", "viridis", max),
    "gpu_peak_mib": ("peak GPU memory (MiB)", "{:.0f}", "cividis_r", min),
}


def _heatmap(fig, ax, rows: list[dict], key: str, x: str, y: str, mark: dict | None = None) -> None:
    """One measure over (``y``, ``x``), the best value where other keys differ; ``mark``: a setting to outline."""
    label, fmt, cmap, best = SWEEP_MEASURES[key]
    xs = sorted({r[x] for r in rows}, key=str)
    ys = sorted({r[y] for r in rows}, key=str)
    grid = [[None] * len(xs) for _ in ys]
    for r in rows:
        if r.get(key) is None:
            continue
        i, j = ys.index(r[y]), xs.index(r[x])
        grid[i][j] = r[key] if grid[i][j] is None else best(grid[i][j], r[key])
    vals = [[float("nan") if v is None else v for v in row] for row in grid]
    im = ax.imshow(vals, cmap=cmap, aspect="auto")
    for i, row in enumerate(vals):
        for j, v in enumerate(row):
            if v == v:
                r, g, b_, _ = im.cmap(im.norm(v))
                ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b_ > 0.5 else "white"
                ax.text(j, i, fmt.format(v), ha="center", va="center", color=ink, fontsize=9)
    if mark is not None and mark.get(x) in xs and mark.get(y) in ys:
        j, i = xs.index(mark[x]), ys.index(mark[y])
        ax.add_patch(plt.Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, edgecolor="red", lw=2.5))
        ax.text(j + 0.45, i - 0.45, "recommended", ha="right", va="top", color="red", fontsize=7)
    ax.set(xticks=range(len(xs)), xticklabels=xs, yticks=range(len(ys)), yticklabels=ys, xlabel=x, ylabel=y,
           title=label)
    fig.colorbar(im, ax=ax, shrink=0.8)


def sweep_heatmaps(rows: list[dict], x: str = "num_workers", y: str = "storage") -> plt.Figure:
    """Two heatmaps over (``y``, ``x``): audio hours per hour, and data-wait share of step time (best over other keys)."""
    ys = {r[y] for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.9 + 0.55 * len(ys) + 1.2))
    for ax, key in zip(axes, ("audio_h_per_h", "data_wait")):
        _heatmap(fig, ax, rows, key, x, y)
        ax.set_ylabel("")
    fig.tight_layout()
    return fig


def sweep_heatmap(rows: list[dict], key: str, x: str, y: str, mark: dict | None = None) -> plt.Figure:
    """One measure of the sweep (a key of ``SWEEP_MEASURES``) over (``y``, ``x``), ``mark`` outlined."""
    ys = {r[y] for r in rows}
    fig, ax = plt.subplots(figsize=(6.5, 1.6 + 0.55 * len(ys)))
    _heatmap(fig, ax, rows, key, x, y, mark)
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
    for ax, key, label in ((a_loss, "loss", "loss per utterance"), (a_norm, "grad_norm", "gradient norm (before clipping)")):
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
        a_room.plot([s for s, _ in pts], [max(h, 1e-2) for _, h in pts], marker=".", lw=1, label=name)  # 0 (overflowed) drawn at 0.01
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
    ax.barh([m for m, _ in rows], vals, color=["tab:red" if r <= 1 else "tab:orange" if r < 10 else "tab:blue"
                                               for _, r in rows])
    ax.axvline(1.0, color="black", ls="--", lw=0.8)
    ax.set(xscale="log", xlabel="fp16 headroom: 65504 / max |x| (below 1: overflow; 0.01: not finite)",
           title=title or f"step {trace['step']}: the {len(rows)} tightest modules ({direction})")
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    return fig


def module_trace(traces: list[dict], module: str, direction: str = "forward", bad_step: int | None = None,
                 title: str = ""):
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
        ax.text(bad_step, 0.02, f" first non-finite step ({bad_step})", color="tab:red", fontsize=8,
                transform=ax.get_xaxis_transform())
    ax.set(yscale="log", xlabel="step", ylabel="max |x|", title=title or f"{module} ({direction})")
    fig.tight_layout()
    return fig


def fix_comparison(rows: list[dict], title: str = "") -> plt.Figure:
    """One bar per run (``diagnostics.outcome`` rows with a ``run`` label): final loss, skipped steps, s/step."""
    import math

    labels = [r["run"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, key, label in ((axes[0], "final_loss", "final loss (mean of the last steps)"),
                           (axes[1], "skipped", "skipped steps"), (axes[2], "step_s", "seconds per step (median)")):
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
    ax.set(xlabel="step", ylabel="training loss per utterance", yscale="log",
           title=title or "after the crash: each way of resuming against the run never interrupted")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def coverage_grid(counts: dict[str, list[int]], title: str = "") -> plt.Figure:
    """A row per run, a column per utterance: trained never (grey), once (green), twice (orange), more (red)."""
    from matplotlib.colors import ListedColormap

    labels = list(counts)
    grid = [[min(c, 3) for c in counts[name]] for name in labels]
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.5 * len(labels)))
    ax.imshow(grid, aspect="auto", interpolation="nearest", vmin=0, vmax=3,
              cmap=ListedColormap(["#dddddd", "#2ca02c", "#ff9f1c", "#d62728"]))
    ax.set(yticks=range(len(labels)), yticklabels=labels, xlabel="utterance (in the order the run never interrupted "
           "trained them)", title=title or "how many times each utterance was trained in the epoch")
    ax.tick_params(axis="y", labelsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("#dddddd", "#2ca02c", "#ff9f1c", "#d62728")]
    ax.legend(handles, ["never (yet)", "once", "twice", "3+"], ncol=4, fontsize=8, loc="upper left",
              bbox_to_anchor=(0, -0.35 - 0.1 / max(1, len(labels))), frameon=False)
    fig.tight_layout()
    return fig


def resume_times(rows: list[dict], title: str = "") -> plt.Figure:
    """Seconds to the first batch after resuming, against the position in the epoch (``resume_time`` rows)."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = [100 * r["fraction"] for r in rows]
    ax.plot(x, [r["resume_s"] for r in rows], marker="o", label="resume (seek to the saved position)")
    ax.plot(x, [r["replay_s"] for r in rows], marker="s", label="replay (read and discard up to it)")
    ax.set(xlabel="position in the epoch (%)", ylabel="seconds to the first batch", ylim=(0, None),
           title=title or "resume time against position")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig



"""Plots of a run's data and loaders: spectrograms, durations, the samplers' picks, the loader sweep."""

from __future__ import annotations


import matplotlib.pyplot as plt


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
        ax.plot(
            [r["t"] for r in rows],
            [r["cpu_pct"] for r in rows],
            lw=1,
            label="main process" if role == "main" else f"worker {pid}",
        )
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
        ax.text(
            0.99,
            0.97,
            samples.get("gpu_reason", "no GPU"),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            color="gray",
        )
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
    ax.set(
        xticks=range(len(xs)), xticklabels=xs, yticks=range(len(ys)), yticklabels=ys, xlabel=x, ylabel=y, title=label
    )
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

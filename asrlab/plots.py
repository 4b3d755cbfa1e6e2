"""Plot helpers the notebooks call in one line; each returns a matplotlib Figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from .train.metrics import read_metrics


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
    evals = read_metrics(exp, "eval") if (Path(exp) / "metrics" / "eval.jsonl").exists() else []
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
    ax.set(xlabel="step", ylabel="error rate (%)", title="validation")
    fig.tight_layout()
    return fig

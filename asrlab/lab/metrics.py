"""Per-step metrics: one JSON line per step in ``EXP/metrics/rank{R}.jsonl``, optional TensorBoard."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import yaml

from . import layout
from ..files import JsonLines, read_jsonl
from ..errors import UsageError

FIELDS = (
    "step",
    "epoch",
    "loss",
    "grad_norm",
    "loss_scale",
    "lr",
    "skipped",
    "utts",
    "frames",
    "data_wait_s",
    "step_s",
    "copy_s",
    "features_s",
    "forward_s",
    "backward_s",
    "comm_s",
    "optimizer_s",
    "nonfinite",
    "rollbacks",
)


class MetricsWriter:
    """Appends records to ``EXP/metrics/{name}.jsonl`` (``rank0``, ``rank1``, ..., ``eval``)."""

    def __init__(self, exp: Path, name: str, tensorboard: bool = False):
        self.path = layout.metrics(exp, name)
        self.f = JsonLines(self.path)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise UsageError(
                    "train.tensorboard=true needs the tensorboard package: pip install -e '.[tensorboard]'"
                ) from e
            self.tb = SummaryWriter(str(exp / "tensorboard"))

    def write(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        clean.update(
            {f"{k}_nonfinite": str(v) for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)}
        )
        self.f.write(clean)
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k not in ("step", "epoch"):
                    self.tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        self.f.close()
        if self.tb is not None:
            self.tb.close()


def read_metrics(exp: str | Path, name: str = "rank0") -> list[dict]:
    """The records of ``EXP/metrics/{name}.jsonl`` (a line torn by a killed run is skipped)."""
    return read_jsonl(layout.metrics(exp, name))


def metric_files(exp: str | Path) -> list[str]:
    """The per-rank metric names of an experiment, ``["rank0", "rank1", ...]``."""
    names = [p.stem for p in layout.metrics_dir(exp).glob("rank*.jsonl")]
    return sorted(names, key=lambda n: int(n[4:]))


def rank_summary(exp: str | Path, skip_first: int = 1) -> list[dict]:
    """Per rank: steps, median step time (s), and the share of step time spent waiting for data.

    The first ``skip_first`` steps (start-up, the first batch) are left out.
    """
    return summarize({name: read_metrics(exp, name) for name in metric_files(exp)}, skip_first)


def summarize(metrics: dict[str, list[dict]], skip_first: int = 1) -> list[dict]:
    """:func:`rank_summary` of metric lines already read (``{"rank0": lines, ...}``)."""
    out = []
    for name, lines in metrics.items():
        m = lines[skip_first:]
        if not m:
            continue
        step_s = sorted(x["step_s"] for x in m)
        out.append(
            {
                "rank": int(name[4:]),
                "steps": len(m),
                "median_step_s": step_s[len(step_s) // 2],
                "data_wait_share": sum(x["data_wait_s"] for x in m) / max(1e-9, sum(x["step_s"] for x in m)),
            }
        )
    return out


def run_status(exp: str | Path, elapsed_s: float = 0.0) -> dict:
    """What a person wants to know about a running experiment, read from its files.

    Keys: ``step``, ``epoch``, ``loss`` (mean of the last 10 steps), ``lr``, ``step_s`` (median of the
    last 20 steps' ``step_s``), ``s_per_step`` (wall clock per step over the last 20, evaluations
    included), ``cer`` and ``cer_step`` (the last evaluation), ``max_steps``, ``max_minutes`` (from the
    run's ``config.yaml``), ``left_s`` (time left by whichever limit comes first; None when unknown).
    """
    exp = Path(exp)
    out = {
        "step": 0,
        "epoch": None,
        "loss": None,
        "lr": None,
        "step_s": None,
        "s_per_step": None,
        "cer": None,
        "cer_step": None,
        "max_steps": 0,
        "max_minutes": 0.0,
        "left_s": None,
        "elapsed_s": elapsed_s,
    }
    try:  # absent before the run writes it, half-written while it does: read again at the next call
        train = (yaml.safe_load(layout.config(exp).read_text()) or {}).get("train") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        train = {}
    out["max_steps"], out["max_minutes"] = int(train.get("max_steps") or 0), float(train.get("max_minutes") or 0)
    if not layout.metrics(exp, "rank0").exists():
        return out
    m = read_metrics(exp)
    if m:
        last = m[-20:]
        losses = [x["loss"] for x in m[-10:] if x.get("loss") is not None]
        out.update(
            step=m[-1]["step"],
            epoch=m[-1]["epoch"],
            lr=m[-1]["lr"],
            loss=statistics.fmean(losses) if losses else None,
            step_s=statistics.median(x["step_s"] for x in last),
        )
        if len(last) > 1 and last[-1]["step"] > last[0]["step"]:
            out["s_per_step"] = (last[-1]["time"] - last[0]["time"]) / (last[-1]["step"] - last[0]["step"])
    if layout.metrics(exp, "eval").exists():
        ev = read_metrics(exp, "eval")
        if ev:
            out["cer"], out["cer_step"] = ev[-1]["cer"], ev[-1]["step"]
    left = []
    if out["max_steps"] and out["s_per_step"]:
        left.append(max(0, out["max_steps"] - out["step"]) * out["s_per_step"])
    if out["max_minutes"]:
        left.append(max(0.0, 60 * out["max_minutes"] - elapsed_s))
    out["left_s"] = min(left) if left else None
    return out

"""Per-step metrics: one JSON line per step in ``EXP/metrics/rank{R}.jsonl``, optional TensorBoard."""

from __future__ import annotations

import math
from pathlib import Path

from ..jsonl import JsonLines, read_jsonl

FIELDS = ("step", "epoch", "loss", "grad_norm", "loss_scale", "lr", "skipped", "utts", "frames",
          "data_wait_s", "step_s", "copy_s", "features_s", "forward_s", "backward_s", "comm_s", "optimizer_s",
          "nonfinite", "rollbacks")


class MetricsWriter:
    """Appends records to ``EXP/metrics/{name}.jsonl`` (``rank0``, ``rank1``, ..., ``eval``)."""

    def __init__(self, exp: Path, name: str, tensorboard: bool = False):
        self.path = exp / "metrics" / f"{name}.jsonl"
        self.f = JsonLines(self.path)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ValueError("train.tensorboard=true needs the tensorboard package: "
                                 "pip install -e '.[tensorboard]'") from e
            self.tb = SummaryWriter(str(exp / "tensorboard"))

    def write(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        clean.update({f"{k}_nonfinite": str(v) for k, v in record.items()
                      if isinstance(v, float) and not math.isfinite(v)})
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
    return read_jsonl(Path(exp) / "metrics" / f"{name}.jsonl")


def metric_files(exp: str | Path) -> list[str]:
    """The per-rank metric names of an experiment, ``["rank0", "rank1", ...]``."""
    names = [p.stem for p in (Path(exp) / "metrics").glob("rank*.jsonl")]
    return sorted(names, key=lambda n: int(n[4:]))


def rank_summary(exp: str | Path, skip_first: int = 1) -> list[dict]:
    """Per rank: steps, median step time (s), and the share of step time spent waiting for data.

    The first ``skip_first`` steps (start-up, the first batch) are left out.
    """
    out = []
    for name in metric_files(exp):
        m = read_metrics(exp, name)[skip_first:]
        if not m:
            continue
        step_s = sorted(x["step_s"] for x in m)
        out.append({"rank": int(name[4:]), "steps": len(m), "median_step_s": step_s[len(step_s) // 2],
                    "data_wait_share": sum(x["data_wait_s"] for x in m) / max(1e-9, sum(x["step_s"] for x in m))})
    return out

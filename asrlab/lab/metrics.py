"""Per-step metrics: one JSON line per step in ``EXP/metrics/rank{R}.jsonl``, optional TensorBoard."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path

import yaml

from ..errors import UsageError
from ..files import JsonLines, read_jsonl
from . import layout
from .timing import bound, split_of_phases, step_split

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
        self.path = metrics_file(exp, name)
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


def metrics_file(exp: str | Path, name: str = "rank0") -> Path:
    """``EXP/metrics/{name}.jsonl``: ``rank<R>`` for a rank's steps, ``eval`` for the evaluations."""
    return Path(exp) / layout.METRICS / f"{name}.jsonl"


def read_metrics(exp: str | Path, name: str = "rank0") -> list[dict]:
    """The records of ``EXP/metrics/{name}.jsonl`` (a line torn by a killed run is skipped)."""
    return read_jsonl(metrics_file(exp, name))


def rank_metrics(exp: str | Path) -> dict[str, list[dict]]:
    """Every rank's records, in rank order: ``{"rank0": [...], "rank1": [...]}``."""
    names = sorted((p.stem for p in (Path(exp) / layout.METRICS).glob("rank*.jsonl")), key=lambda n: int(n[4:]))
    return {name: read_metrics(exp, name) for name in names}


def rank_summary(exp: str | Path, skip_first: int = 1) -> list[dict]:
    """Per rank: steps, median step time (s), and the share of step time spent waiting for data.

    The first ``skip_first`` steps (start-up, the first batch) are left out.
    """
    return summarize(rank_metrics(exp), skip_first)


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
        train = (yaml.safe_load((Path(exp) / layout.CONFIG).read_text()) or {}).get("train") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        train = {}
    out["max_steps"], out["max_minutes"] = int(train.get("max_steps") or 0), float(train.get("max_minutes") or 0)
    if not metrics_file(exp, "rank0").exists():
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
    if metrics_file(exp, "eval").exists():
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


def kept_steps(lines: list[dict]) -> list[dict]:
    """Metric lines of the steps that count: when the steps go back (a resume, a rollback), the lines of
    the steps trained again replace the earlier ones (as :func:`asrlab.lab.state.ledger.read_ledger` does)."""
    out: list[dict] = []
    for m in lines:
        while out and out[-1].get("step", 0) >= m.get("step", 0):
            out.pop()
        out.append(m)
    return out


# a rank's reads hold the others up when its data-wait share is this far above the others' median, and this
# many times it: sampled shares of equal ranks differ by up to 10 points, and ranks that all wait for data
# alike (a loader too slow everywhere) have no one rank to blame
SLOW_READ_POINTS = 0.15


SLOW_READ_TIMES = 2.0


def slow_reader(shares: dict[int, float]) -> int | None:
    """The rank whose reads hold the others up, from each rank's share of its time waiting for data: the one
    at least :data:`SLOW_READ_POINTS` above the median of the others and :data:`SLOW_READ_TIMES` times it;
    None when no rank stands out so (one rank alone, equal ranks, every rank slow alike)."""
    if len(shares) < 2:
        return None
    rank = max(shares, key=lambda r: shares[r])
    others = sorted(v for r, v in shares.items() if r != rank)
    mid = len(others) // 2
    median = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
    return rank if shares[rank] >= median + SLOW_READ_POINTS and shares[rank] >= SLOW_READ_TIMES * median else None


def step_times(metrics: dict[str, list[dict]], beats: dict[int, dict]) -> dict:
    """Per rank: steps, median step time, share of it waiting for data (:func:`summarize`, the first step
    left out), and the spread: the slowest rank and how much slower than the fastest its median step is.
    ``metrics``: each rank's metric lines (``{"rank0": [...]}``); ``beats``: the ranks' heartbeats."""
    missing = None
    try:
        ranks = summarize(metrics)
    except KeyError as e:  # a loop's metrics without the trainer's timing keys
        ranks, missing = [], f"the metrics lines have no {e}"
    ranks = ranks or _heartbeat_times(beats)  # a loop without asrlab's metrics: its heartbeat's time per phase
    if not ranks and missing:
        return {"ranks": [], "spread": None, "missing": missing}
    out: dict = {
        "ranks": [
            {
                **r,
                "median_step_s": None if r["median_step_s"] is None else round(r["median_step_s"], 6),
                "data_wait_share": round(r["data_wait_share"], 4),
            }
            for r in ranks
        ],
        "spread": None,
    }
    for r in out["ranks"]:
        if r.get("source") is None:  # from metrics lines: where the steps' wall clock went
            try:
                r["split"] = step_split(metrics[f"rank{r['rank']}"][1:])
            except KeyError:  # a loop's metrics without the timing keys
                r["split"] = None
        elif r.get("shares"):  # sampled stacks (and the GPU's busy share, where the watch read NVML)
            r["split"] = split_of_phases(r["shares"], r.get("gpu_busy"))
        if r.get("split"):
            r["bound"] = bound(r["split"], r.get("gpu_busy"), ranks=len(ranks))
    if any(r.get("rank_known") is False for r in ranks):  # processes no launcher named: no ranks to compare
        pass
    elif len(ranks) > 1 and any(r["median_step_s"] is None for r in ranks):  # sampled from outside: no step times
        most = max(ranks, key=lambda r: r["data_wait_share"])
        out["spread"] = {"most_data_wait_rank": most["rank"], "data_wait_share": round(most["data_wait_share"], 4)}
    elif len(ranks) > 1:
        slow = max(ranks, key=lambda r: r["median_step_s"])
        fast = min(ranks, key=lambda r: r["median_step_s"])
        out["spread"] = {
            "slowest_rank": slow["rank"],
            "fastest_rank": fast["rank"],
            "slowest_s": round(slow["median_step_s"], 6),
            "fastest_s": round(fast["median_step_s"], 6),
            "ratio": round(slow["median_step_s"] / max(1e-9, fast["median_step_s"]), 3),
        }
    if out["spread"] is not None:
        out["spread"]["slow_reader"] = slow_reader({r["rank"]: r["data_wait_share"] for r in ranks})
    return out


def _heartbeat_times(beats: dict[int, dict]) -> list[dict]:
    """Per rank, from the time a StallWatch heartbeat kept per phase (a loop without asrlab's metrics):
    steps done, mean seconds per step (``median_step_s`` holds the mean), share of it waiting for data."""
    out = []
    for rank, b in sorted(beats.items()):
        if b.get("watched"):  # asrlab watch: seconds per phase from sampled stacks, no step count
            spent = {p: s for p, s in (b.get("phase_s") or {}).items() if p not in ("start", "done")}
            total = sum(spent.values())
            if total > 0:
                out.append(
                    {
                        "rank": rank,
                        "rank_known": b.get("rank_known") is not False,
                        "pid": b.get("pid"),
                        "steps": None,
                        "median_step_s": None,
                        "data_wait_share": spent.get("data", 0.0) / total,
                        "source": "sampled stacks",
                        "shares": {p: round(t / total, 4) for p, t in sorted(spent.items(), key=lambda x: -x[1])},
                        "gpu_busy": b.get("gpu_busy"),
                    }
                )
            continue
        spent = {p: s for p, s in (b.get("phase_s") or {}).items() if p not in ("start", "epoch_end", "done", "eval")}
        steps = b.get("completed", 0)
        if steps and sum(spent.values()) > 0:
            total = sum(spent.values())
            out.append(
                {
                    "rank": rank,
                    "steps": steps,
                    "median_step_s": total / steps,
                    "data_wait_share": spent.get("data", 0.0) / total,
                    "source": "heartbeat (mean)",
                }
            )
    return out


def loss_scale_history(rank0: list[dict]) -> dict | None:
    """Rank 0's loss scale over the steps that count (first, min, last, how often it changed) and the
    skipped steps by kind (``scaler``: fp16 overflow the scaler handles; ``loss``/``grad``: not finite)."""
    if not rank0:
        return None
    scales = [m["loss_scale"] for m in rank0 if m.get("loss_scale") is not None]
    kinds = Counter(m.get("nonfinite") for m in rank0 if m.get("nonfinite"))
    out = {
        "skipped": rank0[-1].get("skipped", sum(kinds.values())),  # a loop's lines without the count: those marked
        "skipped_by_kind": dict(kinds),
        "rollbacks": rank0[-1].get("rollbacks", 0),
    }
    if scales:
        out.update(
            first=scales[0],
            min=min(scales),
            last=scales[-1],
            changes=sum(1 for a, b in zip(scales, scales[1:]) if a != b),
        )
    return out


def went_back(lines: list[dict]) -> list[dict]:
    """Where a rank's metric lines (as written) went back, ``{"after_step", "back_to_step"}`` each: a resume
    that lost steps, or a rollback."""
    return [
        {"after_step": a["step"], "back_to_step": b["step"] - 1}
        for a, b in zip(lines, lines[1:])
        if b["step"] <= a["step"]
    ]

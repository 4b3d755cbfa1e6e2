"""Every non-finite step of a run, one line each: ``EXP/nonfinite/rank{R}.jsonl``.

The numerics guard saves a replay bundle for the first non-finite step it locates (weights and batch: too
large to keep for each); every non-finite step, that one included, also gets a line here, so a bad
utterance that breaks a step again an epoch later is seen. A line holds the step, its kind (``loss`` or
``grad``), loss and gradient norm, whether the optimizer stepped, the step's utterance ids, and which of
them were not finite (``utterances``, with ``found_by``: how; None where that could not be told), and the
bundle when this step has one. No torch here: ``asrlab doctor`` reads it.
"""

from __future__ import annotations

from pathlib import Path

from .. import layout
from ...files import append_jsonl, read_json, read_jsonl

VERSION = 1  # of a line; a reader passes over lines of another version and counts them


def log_path(exp: str | Path, rank: int) -> Path:
    return Path(exp) / layout.NONFINITE / f"rank{rank}.jsonl"


class NonFiniteLog:
    """This rank's lines (a run that stays finite writes none). Each is appended and the file closed again:
    the lines are rare, and read while the run goes on or after it was killed."""

    def __init__(self, exp: str | Path, rank: int):
        self.path = log_path(exp, rank)

    def write(self, record: dict) -> None:
        append_jsonl(self.path, [{"v": VERSION, **record}])


def read_events(exp: str | Path) -> tuple[list[dict], int]:
    """Every rank's lines in step order (with ``rank``), and how many lines of another version were passed over."""
    out, other = [], 0
    for path in sorted((Path(exp) / layout.NONFINITE).glob("rank*.jsonl")):
        try:
            rank = int(path.stem[4:])
        except ValueError:
            continue
        for rec in read_jsonl(path):
            if rec.get("v") != VERSION:
                other += 1
                continue
            out.append({**rec, "rank": rank})
    return sorted(out, key=lambda r: (r.get("step", 0), r["rank"])), other


# what a halt report and a step's replay bundle both say of the step that was not finite
SAID = ("step", "rank", "kind", "module", "direction", "where", "keys", "loss", "grad_norm", "loss_scale")
BUNDLE = ("epoch", "precision", "cause", "utterances", "found_by", "micro_batch", "micro_batches")


def nonfinite_summary(exp: str | Path, metrics: dict[str, list[dict]]) -> dict:
    """What the run recorded of its non-finite steps: the replay bundles (``EXP/nonfinite/step*-rank*/``: step,
    kind, module, direction, utterance ids); every non-finite step the numerics guard logged (``log``, each with
    the utterances that were not finite where it could tell; ``by_utterance``: their steps); and the steps any
    rank's metrics marked non-finite (its loss, or gradients; the fp16 overflows the loss scaler handles are
    counted by :func:`asrlab.lab.metrics.loss_scale_history`). Every rank's: a rank's own non-finite loss is
    marked on that rank only."""
    events = []
    for report in sorted(Path(exp).glob("nonfinite/step*-rank*/report.json")):
        m = read_json(report)
        if m is None:
            continue
        events.append({**{k: m.get(k) for k in (*SAID, *BUNDLE)}, "bundle": str(report.parent)})
    steps = sorted({m["step"] for lines in metrics.values() for m in lines if m.get("nonfinite") in ("loss", "grad")})
    log, other = read_events(exp)
    by_utt: dict[str, list[int]] = {}
    for e in log:
        for k in e.get("utterances") or []:
            by_utt.setdefault(k, []).append(e["step"])
    return {
        "events": events,
        "steps": steps,
        "log": log,
        "count": len({e["step"] for e in log}),
        "by_utterance": by_utt,
        "other_versions": other,
    }


def read_halt(exp: str | Path, since: float = 0.0) -> dict | None:
    """``EXP/nonfinite/halt.json`` (the trainer's halt report), with ``current``: written by this launch."""
    path = Path(exp) / layout.NONFINITE / layout.HALT
    h = read_json(path)
    if h is None:
        return None
    t = path.stat().st_mtime
    return {**{k: h.get(k) for k in ("message", "rollbacks", *SAID, "saved")}, "time": t, "current": t >= since}


__all__ = ["NonFiniteLog", "VERSION", "log_path", "read_events", "nonfinite_summary", "read_halt"]

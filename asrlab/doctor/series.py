"""What exact step series say: the first step a loss (or a gradient norm that stays so) went non-finite, as a
failure event, and a loss that diverges before it, as a warning with its step. Every source that holds series
(TensorBoard's event files, a trainer's state, a metrics CSV) is judged here, the same way."""

from __future__ import annotations

import math
import re

from .timeline import failure

LOSS = re.compile(r"loss|ctc|(?:^|[/_])(?:att|rnnt|transducer|kl)(?:$|[/_])", re.I)
GRAD = re.compile(r"grad(?:ient)?s?[_ /.]?(?:total[_ ]?)?norm|gnorm|total_norm", re.I)  # grad/norm, Gradients/norm
# a loss scale, a rate or a count, even with "loss" in its name ("train_loss_step" is a loss: Lightning's suffix)
NOT_A_LOSS = re.compile(
    r"scale|(?:^|[/_])(?:lr|learning[_ ]?rate|epoch|runtime|per_second|samples|flos|tokens)(?:$|[/_])", re.I
)
# an evaluation's series ("val_ctc", "eval/loss", "valid_wer"): not finite, its evaluation is broken, not training
EVAL = re.compile(r"(?:^|[/_.-])(?:val|valid|validation|eval|dev|test)(?:$|[/_.-])", re.I)
DIVERGE = 10.0  # a loss this many times its running minimum has diverged (not the noise of a converging run)
SPIKE = 100.0  # a gradient norm this many times the median of those before it: a spike
AFTER = 5  # points before a rise can count: the first steps of any run swing
HISTORY = 32  # gradient norms the spike's median is taken over


def watched(name: str) -> str | None:
    """``"loss"`` or ``"grad_norm"`` for a series worth judging, else None (a learning rate, a loss scale)."""
    if GRAD.search(name):
        return "grad_norm"
    if LOSS.search(name) and not NOT_A_LOSS.search(name.split("/")[-1]):
        return "loss"
    return None


def judge(source: str, series: dict[str, list[tuple[int, float]]], wall: dict[str, list[float]]):
    """``(events, warnings)`` of one source's series."""
    events, warnings = [], []
    for name, points in series.items():
        kind = watched(name)
        if kind is None or not points:  # a learning rate, a loss scale: their values are the scheduler's
            continue
        times = wall.get(name)
        bad = next((i for i, (_, v) in enumerate(points) if not math.isfinite(v)), None)
        if EVAL.search(name):  # said, not a failure: training went on whatever its evaluation printed
            if bad is not None:
                step, v = points[bad]
                said = f"the evaluation's {name} was {v} at step {step} ({source}'s exact series: an evaluation's, not training's)"
                warnings.append({"kind": "eval_nonfinite", "name": name, "step": step, "text": said, "source": source})
            continue
        if bad is not None:
            again = any(math.isfinite(v) for _, v in points[bad + 1 :])
            # fp16's overflow-and-skip leaves a gradient norm inf for a step and finite after: not a failure
            if kind == "loss" or not again:
                step, v = points[bad]
                before = ""
                if bad:  # the last finite value before it, and the lowest
                    (last_step, last_v), low = points[bad - 1], min(points[:bad], key=lambda p: p[1])
                    before = f"; before it: {last_v:.4g} at step {last_step}, lowest {low[1]:.4g} at step {low[0]}"
                events.append(
                    failure(
                        "nonfinite", "nonfinite_series", times[bad] if times else None,
                        f"{name} was {v} at step {step} ({source}'s exact series"
                        f"{', finite again later' if again else ', never finite again'}){before}",
                        source=source, step=step, transient=again, series=name, order=step,  # no clock: the step
                    )
                )  # fmt: skip
        upto = points[:bad] if bad is not None else points
        w = diverged(name, upto) if kind == "loss" else _spike(name, upto)
        if w is not None:
            warnings.append({**w, "source": source})
    return events, warnings


def diverged(name: str, points: list[tuple[int, float]]) -> dict | None:
    low = None
    for i, (step, v) in enumerate(points):
        if low is not None and i >= AFTER and low[1] > 0 and v > DIVERGE * low[1]:
            said = f"{name} rose to {v:.4g} at step {step}, {v / low[1]:.0f}x its lowest so far ({low[1]:.4g} at step "
            said += f"{low[0]}): the run diverges (a learning rate too high, a bad batch, fp16's range)"
            return {"kind": "diverging", "name": name, "step": step, "text": said}
        if low is None or v < low[1]:
            low = (step, v)
    return None


def _spike(name: str, points: list[tuple[int, float]]) -> dict | None:
    for i in range(AFTER, len(points)):
        prev = sorted(v for _, v in points[max(0, i - HISTORY) : i])
        median = prev[len(prev) // 2]
        step, v = points[i]
        if median > 0 and v > SPIKE * median:
            said = f"{name} spiked to {v:.4g} at step {step}, {v / median:.0f}x the median of the {len(prev)} before it"
            return {"kind": "grad_spike", "name": name, "step": step, "text": f"{said} ({median:.4g})"}
    return None


__all__ = ["diverged", "judge", "watched"]

"""A log's non-finite section: its first non-finite step record read closely; fp16's skips that never stop."""

from __future__ import annotations

import math

from .progress import last_before, next_after, step_number, where
from ..series import DIVERGE, diverged
from .run import LogRun, finite, position


def skipped_overflow(run: LogRun, r: dict) -> bool:
    """A step whose gradient norm alone was not finite, with a finite step logged after it on its rank: skipped
    (fp16's overflow-and-skip), for non-finite gradients applied would leave every later loss non-finite."""
    vals = [*r["losses"].values(), *r["averages"].values()]
    if not vals or not all(v is None or math.isfinite(v) for v in vals):
        return False
    return any(
        x["file"] == r["file"] and x["order"] > r["order"] and x["losses"] and finite(x) and x["grad_norm"] is not None
        for x in run.series[r["rank"]].all()
    )


def lone_lossy(run: LogRun, r: dict) -> dict | None:
    """Of the ranks' records not finite at ``r``'s step, the one rank's whose loss itself is not finite where the
    others' losses are (their gradient norm alone not: the gradients' all-reduce brought it to them); else None."""
    same = at_step(run, r)
    lossy = [x for x in same if any(v is not None and not math.isfinite(v) for v in x["losses"].values())]
    alone = len({x["rank"] for x in lossy}) == 1 and lossy[0]["rank"] is not None
    return lossy[0] if alone and len({x["rank"] for x in same}) > 1 else None


def at_step(run: LogRun, r: dict) -> list[dict]:
    """The non-finite records of ``r``'s step on any rank: its epoch's too, where a step counts within the epoch
    ("e0/s015", then "e1/s015")."""
    return [x for x in run.nonfinite if position(x) == position(r) and x["epoch"] == r["epoch"]]


def nonfinite_section(run: LogRun) -> dict | None:
    """The first non-finite step a log shows (rank, step, which terms), whether it was finite again later, and
    what led to it (the gradient norm, the loss scale's halvings); else the loss-scale messages' count."""
    if not run.nonfinite:
        n = sum(e["kind"] == "scale" for e in run.events)
        skips = sum(e["kind"] == "norm_skip" for e in run.events)
        said = [f"{n} loss-scale messages"] * bool(n) + [
            f"{skips} gradient norms not finite beside a loss scale (the steps fp16's scaler skipped)"
        ] * bool(skips)
        return {"first": None, "scale_events": n, "norm_skips": skips, "text": "; ".join(said)} if said else None
    r = lone_lossy(run, run.nonfinite[0]) or run.nonfinite[0]
    bad = [k for k, v in r["losses"].items() if v is not None and not math.isfinite(v)]
    good = [k for k, v in r["losses"].items() if v is not None and math.isfinite(v)]
    averaged = [k for k, v in r["averages"].items() if v is not None and not math.isfinite(v) and k not in bad]
    terms = list([k for k in bad if k != "loss"] or bad or [k for k in averaged if k != "loss"] or averaged)
    if r["grad_norm"] is not None and not math.isfinite(r["grad_norm"]):
        bad.append("grad_norm")
        terms.append("grad_norm")
    # finite again: at a later step (not another unmarked rank's line of the same step), and still at the end
    after = [x for x in run.series[r["rank"]].all() if x["order"] > r["order"] and x["file"] == r["file"]]
    ends_finite = bool(after) and not after[-1]["nonfinite"]
    later = [x for x in after if not x["nonfinite"] and position(x) > position(r)] if ends_finite else []
    before = [x for x in run.series[r["rank"]].all() if x["order"] < r["order"] and x["file"] == r["file"]]
    norms = [x["grad_norm"] for x in before if x["grad_norm"] is not None]
    scales = [x["scale"] for x in before if x["scale"] is not None]
    led = []
    if len(norms) >= 2:
        led.append(f"grad norm {norms[0]:.3g} -> {max(norms):.3g} (max) -> {norms[-1]:.3g}")
    lrs = [(x, x["lr"]) for x in before[-LR_RECENT:] if x["lr"] is not None]
    jump = next(((x, a, b) for (_, a), (x, b) in zip(lrs, lrs[1:]) if a > 0 and b >= LR_JUMP * a), None)
    if jump:  # a learning rate raised a hundredfold between two logged steps just before: what led to it
        led.append(f"lr {jump[1]:.3g} -> {jump[2]:.3g} at {where(jump[0])}")
    elif lrs and lrs[0][1] > 0 and lrs[-1][1] >= LR_JUMP * lrs[0][1]:  # or over the last few, step by step
        led.append(f"lr {lrs[0][1]:.3g} at {where(lrs[0][0])} -> {lrs[-1][1]:.3g} at {where(lrs[-1][0])}")
    for k in r["losses"]:  # a loss that rose many times its lowest before it: the run diverged first
        if w := diverged(k, _points(before, k)):
            led.append(w["text"].split(": the run")[0])
            break
    if halvings := sum(1 for a, b in zip(scales, scales[1:]) if b < a):
        led.append(f"loss scale halved {halvings} times ({scales[0]:g} -> {scales[-1]:g})")
    kind = "transient (finite again at the next logged step)" if later else "fatal (never finite again)"
    if later and bad == ["grad_norm"]:  # the losses finite, before and after: the step was skipped, not applied
        kind += ": a skipped step, as a loss scaler skips one on an fp16 overflow"
    why = ""
    ctc_inf = any("ctc" in t.lower() and math.isinf(r["losses"].get(t) or 0.0) for t in terms)
    if ctc_inf and any("att" in g.lower() for g in good):  # inf, not nan: what CTC gives an utterance it cannot align
        why = "; an infinite CTC loss beside a finite attention loss: an utterance with fewer frames than its "
        why += "labels need"
    gone = next((x for x in after if not all(math.isfinite(v) for v in x["losses"].values() if v is not None)), None)
    if bad == ["grad_norm"] and gone is not None and not later:  # the loss itself went after the gradients
        why += f"; the loss not finite from {where(gone)}"
    if not bad:  # only the running average: the batch that made it so was not logged
        why += "; only in the running average (this batch's terms are finite): an earlier, unlogged batch was not"
    finite_too = f" ({', '.join(good)} finite)" if good and bad else ""
    before_it = f"; before it: {'; '.join(led)}" if led else ""
    text = f"{', '.join(terms)} not finite{finite_too}{why}; {kind}{before_it}"
    place = {"rank": r["rank"], "step": step_number(r), "epoch": r["epoch"], "batch": r["batch"]}
    first = {**place, "terms": terms, "finite_terms": good, "time": r["time"]}
    return {"first": first, "transient": bool(later), "count": len(run.nonfinite), "text": text}


def _points(recs: list[dict], k: str) -> list[tuple[int, float]]:
    """``(step, value)`` of the loss term ``k`` where the records print it finite, at a step."""
    points = [(step_number(x), v) for x in recs if math.isfinite(v := x["losses"].get(k) or math.nan)]
    return [p for p in points if p[0] is not None]


def diverging(run: LogRun) -> list[dict]:
    """Warnings of a loss that rose many times its lowest and stayed there to the end of the log, each rank's first
    (a run ruined without a non-finite value; a spike it recovered from is no warning)."""
    out = []
    for rank, series in run.series.items():
        recs = series.all()
        for k in dict.fromkeys(k for x in recs for k in x["losses"]):
            points = _points(recs, k)
            w = diverged(k, points)
            low = min((v for s, v in points if s < w["step"]), default=0.0) if w else 0.0
            if w and low > 0 and points[-1][1] > DIVERGE * low:  # still diverged at the end
                who = "" if rank is None else f"rank {rank}: "
                out.append({**w, "rank": rank, "text": f"{who}{w['text']}; still {points[-1][1]:.4g} at the end"})
                break
    return out


LR_JUMP, LR_RECENT = 100.0, 10  # a learning rate this many times its last logged value, in the last logged steps

SKIPS_IN_A_ROW = 3  # overflow skips with no logged step between them: not a calibration, a run that cannot step
SCALE_FLOOR = 8.0  # a dynamic loss scale below this has halved far past where fp16 starts to overflow


def finite_after(run: LogRun, e: dict) -> bool:
    """Whether a step of finite losses was logged after the event in its file (a scale fallen low while training
    went on is no failure); after a ``recoverable`` warning, any step logged (a bar that counts on)."""
    return any(
        r["file"] == e.get("file")
        and r["order"] > e.get("order", 0)
        and (r["losses"] or r["toolkit"] == "vits" or e.get("recoverable"))  # VITS's "Train Epoch: N [P%]"
        and not r["nonfinite"]
        for s in run.series.values()
        for r in s.all()
    )


def persistent_skips(run: LogRun) -> dict | None:
    """The first of the loss-scale or grad-norm skips that do not stop: several in a row, or a loss scale
    gone below :data:`SCALE_FLOOR`. A few skips while the scale calibrates at the start are not a failure."""
    scales = [e for e in run.events if e["kind"] == "scale"]
    for e in scales:
        if e.get("to") is not None and e["to"] < SCALE_FLOOR and not finite_after(run, e):
            return {**e, "kind": "scale_collapse"}
    row: list[dict] = []
    for x in sorted(scales + [r for s in run.series.values() for r in s.all()], key=lambda x: x.get("order", 0)):
        if x.get("kind") != "scale" or x.get("to") is not None:  # a halving with its scale: judged by the floor
            row = []
            continue
        row.append(x)
        if len(row) >= SKIPS_IN_A_ROW:
            return {**row[0], "kind": "skips", "count": len(row)}
    return None


def unscaled_skip(run: LogRun) -> dict | None:
    """A step skipped for a non-finite gradient norm where no dynamic loss scale calibrates (loss scale 1 or none:
    fp32, bf16): the gradients themselves were not finite (ESPnet's "The grad norm is nan. Skipping updating")."""
    for e in run.events:
        if e["kind"] != "scale" or e.get("grad") is None:
            continue
        rec = last_before(run, e.get("rank"), e)
        if rec is None or rec["scale"] is None or rec["scale"] == 1.0:
            # ESPnet's line reports the batches since the last one: the skip is in the interval the next reports
            nxt = next_after(run, e.get("rank"), e)
            if nxt is not None and nxt.get("first_batch") is not None:  # the interval's first batch skipped first
                nxt = {**nxt, "batch": nxt["first_batch"]}
            # the norm is of the all-reduced gradients: every rank prints the same; which rank's data made it,
            # the log cannot say where several ranks train
            many = (run.world or 0) > 1 or len(run.ranks()) > 1
            return {**e, "kind": "grad_skip", "record": nxt or rec, **({"culprit_rank": None} if many else {})}
    return None


__all__ = [
    "at_step",
    "diverging",
    "finite_after",
    "lone_lossy",
    "nonfinite_section",
    "persistent_skips",
    "skipped_overflow",
    "unscaled_skip",
]

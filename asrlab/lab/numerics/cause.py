"""Why a step was not finite, told apart by what the replay shows.

* **overflow**: the step ran under fp16 or bf16 autocast, and the same step in fp32 is finite: the values
  outgrew the format (a loss scale, a layer's range), not the data;
* **CTC targets the outputs cannot hold**: CTC needs at least as many output frames as labels (plus one
  between each repeated pair); an utterance whose transcript is longer than its frames after subsampling
  has no alignment and an infinite loss. The lengths are read from the loop's own ``ctc_loss`` call during
  the replay (``torch.nn.functional.ctc_loss``, which ``nn.CTCLoss`` calls); empty targets are named too;
* **the loss**: every activation finite, the loss not (a log of zero, a division by a zero count);
* **the data or the model**: not finite in fp32 either, from the first module named;
* **another rank's**: this rank's loss was finite and its own step replays finite: its gradients came
  non-finite through DDP's all-reduce.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


@contextlib.contextmanager
def ctc_calls():
    """Every ``torch.nn.functional.ctc_loss`` call inside: ``[(input_lengths, target_lengths, targets)]``."""
    seen: list[tuple] = []
    original = F.ctc_loss

    def spy(log_probs, targets, input_lengths, target_lengths, *args, **kwargs):
        seen.append(
            (_ints(input_lengths), _ints(target_lengths), targets.detach().cpu() if torch.is_tensor(targets) else None)
        )
        return original(log_probs, targets, input_lengths, target_lengths, *args, **kwargs)

    F.ctc_loss = spy
    try:
        yield seen
    finally:
        F.ctc_loss = original


def _ints(x) -> list[int]:
    return [int(v) for v in (x.tolist() if torch.is_tensor(x) else x)]


def _labels(targets, lengths: list[int], i: int) -> list[int] | None:
    """Utterance ``i``'s labels: a row of padded (N, S) targets, or a slice of concatenated ones."""
    if targets is None:
        return None
    if targets.dim() == 2:
        return targets[i, : lengths[i]].tolist()
    start = sum(lengths[:i])
    return targets[start : start + lengths[i]].tolist()


def ctc_problems(calls: list[tuple], keys: list[str]) -> list[dict]:
    """The utterances of the captured CTC calls that have no alignment (more labels, with a blank between
    each repeated pair, than output frames) or no labels at all; keyed where the batch's ids line up."""
    out = []
    for frames, lengths, targets in calls:
        named = len(keys) == len(frames)
        for i, (t, n) in enumerate(zip(frames, lengths)):
            labels = _labels(targets, lengths, i)
            repeats = sum(1 for a, b in zip(labels, labels[1:]) if a == b) if labels else 0
            need = n + repeats
            if n == 0 or need > t:
                out.append(
                    {
                        "key": keys[i] if named else None,
                        "index": i,
                        "frames": t,
                        "labels": n,
                        "needs": need,
                        "problem": "empty target" if n == 0 else "target longer than its frames",
                    }
                )
    return out


def classify(
    first: dict | None, dtype: torch.dtype | None, fp32_finite: bool | None, ctc: list[dict], loss_finite: bool = False
) -> dict:
    """``{"cause", "text", "utterances"}`` from the replay: the first non-finite module (None: none found),
    the step's autocast dtype, whether the same step's loss is finite in fp32 (None: not run), the CTC
    utterances without an alignment, and whether the step's loss was finite (its gradients were not)."""
    impossible = [p for p in ctc if p["problem"] != "empty target"]
    if impossible:
        who = ", ".join(
            f"{p['key'] or '#' + str(p['index'])} ({p['labels']} labels, {p['frames']} frames)" for p in impossible[:5]
        )
        return {
            "cause": "ctc_no_alignment",
            "utterances": [p["key"] for p in impossible],
            "text": f"CTC targets longer than the model's output frames: {who}"
            + (f" and {len(impossible) - 5} more" if len(impossible) > 5 else "")
            + " (filter them out, or subsample less)",
        }
    if dtype in (torch.float16, torch.bfloat16) and fp32_finite:
        name = "fp16" if dtype == torch.float16 else "bf16"
        return {
            "cause": "overflow",
            "utterances": [],
            "text": f"an overflow of {name}: the same step in fp32 is finite (the values outgrew {name}, "
            "not a data problem)",
        }
    empty = [p for p in ctc if p["problem"] == "empty target"]
    if loss_finite and first is None:
        return {
            "cause": "another_rank",
            "utterances": [],
            "text": "another rank's: this rank's own step replays finite, so its non-finite gradients came "
            "in DDP's all-reduce (the rank whose loss was not finite has the cause)",
        }
    note = f" (empty targets: {', '.join(str(p['key'] or p['index']) for p in empty[:5])})" if empty else ""
    if not loss_finite and (first is None or first.get("direction") == "backward"):  # the forward was finite
        return {
            "cause": "loss",
            "utterances": [p["key"] for p in empty],
            "text": "the loss: every activation is finite and the loss is not" + note,
        }
    return {
        "cause": "data_or_model",
        "utterances": [p["key"] for p in empty],
        "text": "the data or the model: not finite in fp32 either" + note,
    }


__all__ = ["classify", "ctc_calls", "ctc_problems"]

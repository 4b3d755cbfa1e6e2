"""A step's micro-batches as the numerics guard keeps them, its replay as one callable per micro-batch,
and which utterances of a non-finite step were not finite.

A step is every micro-batch ``guard.step(step, batch)`` saw with the same step number before
``optimizer_step``: with gradient accumulation, each micro-batch's forward and backward is wrapped with the
optimizer step's number. A replay given as a function of the batch (``replay=lambda batch: ...``) runs once
per micro-batch, each from the RNG state its own forward started from.

The utterances: where the loop gave each micro-batch's losses per utterance (``guard.utterance_losses``),
those not finite, read only once the step is known to be non-finite (nothing is read from the device on a
finite step). Otherwise, where the replay takes the batch and the batch can be cut (a dict, tuple or list
of tensors and lists whose first dimension is the number of ids), each utterance alone is replayed, for
at most :data:`REPLAY_STEPS` non-finite steps of a rank and :data:`REPLAY_MAX` utterances a micro-batch.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

REPLAY_MAX = 64  # utterances in a micro-batch replayed one at a time, at most
REPLAY_STEPS = 10  # non-finite steps of a rank replayed per utterance; later ones are named by batch only


@dataclass
class Micro:
    """One micro-batch of a step: the batch, its utterance ids, the RNG state its forward started from,
    and its losses per utterance where the loop gave them."""

    batch: object
    ids: list
    rng: dict | None
    losses: torch.Tensor | None = None


def rng_state(device: torch.device | None = None) -> dict:
    """The CPU RNG state and the GPU's (dropout on the GPU draws from it)."""
    cuda = device is not None and device.type == "cuda"
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if cuda else None}


def set_rng_state(rng: dict, device: torch.device | None = None) -> None:
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], device)


def takes_batch(fn) -> bool:
    """A replay that takes the micro-batch: exactly one positional parameter without a default."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in positional and p.default is p.empty) == 1


def replay_parts(replay, micro: list[Micro]) -> list[tuple[Callable, Micro | None]]:
    """The replay as ``(callable without arguments, its micro-batch)`` in the order the step ran them. A list
    as long as the micro-batches pairs with them; another list runs in order from the step's RNG state (its
    micro-batches behind one ``step()``, as asrlab's trainer does it: micro-batch None); a callable of no
    argument is the last micro-batch's."""
    if replay is None:
        return []
    if isinstance(replay, (list, tuple)):
        if len(replay) == len(micro) > 1:
            return list(zip(replay, micro))
        return [(r, None) for r in replay]
    if takes_batch(replay):
        return [(partial(replay, m.batch), m) for m in micro]
    return [(replay, micro[-1] if micro else None)]


def cut(batch, j: int, n: int):
    """Utterance ``j`` of a batch of ``n``: every tensor, list or tuple in it whose first dimension is ``n`` cut
    to ``[j:j+1]``, the rest as it is; None for a batch that cannot be cut."""

    def one(v):
        if torch.is_tensor(v):
            return v[j : j + 1] if v.dim() and v.shape[0] == n else v
        if isinstance(v, (list, tuple)) and len(v) == n:
            return list(v[j : j + 1])
        return v

    if torch.is_tensor(batch):
        return one(batch) if batch.dim() and batch.shape[0] == n else None
    if isinstance(batch, Mapping):
        return {k: one(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)) and not (len(batch) == n and all(isinstance(x, str) for x in batch)):
        return tuple(one(v) for v in batch)
    return None


def from_losses(micro: list[Micro]) -> list[str] | None:
    """The utterances whose loss the loop gave and is not finite; None unless every micro-batch gave them."""
    if not micro or any(m.losses is None or m.losses.numel() != len(m.ids) for m in micro):
        return None
    bad = []
    for m in micro:
        ok = torch.isfinite(m.losses.detach().float().reshape(-1)).tolist()
        bad += [k for k, good in zip(m.ids, ok) if not good]
    return bad


def one_by_one(replay: Callable, micro: list[Micro], backward: bool, run_one: Callable) -> list[str] | None:
    """Replay every utterance of every micro-batch alone (``run_one(fn, rng, backward)`` -> finite or not);
    None where a micro-batch is too large or cannot be cut."""
    bad = []
    for m in micro:
        n = len(m.ids)
        if not n or n > REPLAY_MAX:
            return None
        pieces = [cut(m.batch, j, n) for j in range(n)]
        if any(p is None for p in pieces):
            return None
        bad += [k for k, p in zip(m.ids, pieces) if not run_one(partial(replay, p), m.rng, backward)]
    return bad


def alone(
    replay: Callable, micro: list[Micro], backward: bool, scale: float, model, autocast: Callable, device: torch.device
) -> list[str] | None:
    """:func:`one_by_one` through ``replay`` (a function of the batch) under ``autocast()``: the loss alone
    (no gradients) when the step's loss was not finite, forward and backward when its gradients were not;
    the RNG state left as it was."""
    params = [p for p in model.parameters() if p.requires_grad]
    saved = rng_state(device)

    def run_one(fn, rng, backward: bool) -> bool:
        if rng is not None:  # the micro-batch's: dropout draws alike where it can
            set_rng_state(rng, device)
        with autocast(), contextlib.nullcontext() if backward else torch.no_grad():
            out = fn()
        loss = (out[0] if isinstance(out, tuple) else out).float()
        if not bool(torch.isfinite(loss).all()):
            return False
        grads = torch.autograd.grad(loss.sum() * scale, params, allow_unused=True) if backward else []
        return all(bool(torch.isfinite(g).all()) for g in grads if g is not None)

    try:
        return one_by_one(replay, micro, backward, run_one)
    finally:
        set_rng_state(saved, device)


def tensors_of(batch) -> dict:
    """A batch's tensors by name, whatever it is: a dict's, a tuple's (``batch0``, ``batch1``, ...), an
    object's attributes, or a tensor alone (``batch``)."""
    if torch.is_tensor(batch):
        return {"batch": batch}
    if isinstance(batch, dict):
        items = batch.items()
    elif isinstance(batch, (tuple, list)):
        items = ((f"batch{i}", v) for i, v in enumerate(batch))
    else:
        items = getattr(batch, "__dict__", {}).items()
    return {str(k): v for k, v in items if torch.is_tensor(v)}


def ids_text(keys: list[str], first: int = 3) -> str:
    return ", ".join(keys[:first]) + (f" (+{len(keys) - first} more)" if len(keys) > first else "")


__all__ = [
    "Micro",
    "REPLAY_MAX",
    "REPLAY_STEPS",
    "alone",
    "cut",
    "from_losses",
    "ids_text",
    "one_by_one",
    "replay_parts",
    "rng_state",
    "set_rng_state",
    "takes_batch",
    "tensors_of",
]

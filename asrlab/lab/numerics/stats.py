"""Numerics diagnostics: where values leave fp16's range, and the first value that is not finite.

Hooks on every module's forward output and on the gradient it sends back to its input record,
on sampled steps only, four numbers per module and direction:

* ``max_abs``: the largest magnitude (inf or nan when one is there),
* ``rms``: root mean square,
* ``nonfinite``: the fraction of inf/nan values,
* ``tiny``: the fraction of non-zero values below fp16's smallest normal (2**-14 = 6.1e-5),
  which fp16 stores with fewer digits and, below 6e-8, as zero.

``headroom = 65504 / max_abs``: how many times larger the values may grow before fp16
overflows (1 or less: they already do). The attention logits are a module of their own
(``...attn.logits``), since that is where fp16 overflows first in transformers.

Off sampled steps there are no hooks: the model runs untouched. When a step goes non-finite
the trainer replays it with recording on (:func:`locate`), names the first module in execution order
whose output (forward) or gradient to its input (backward) is not finite, and saves the model
state and the batch (:func:`save_bundle`); :func:`replay_step` runs that step again in another
precision, through the loop's own loss function.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from .. import layout
from ...files import JsonLines, read_jsonl
from ..precision import cpu_fp16_kernels
from ..metrics import read_metrics

FP16_MAX = 65504.0
FP16_TINY = 2.0**-14  # fp16's smallest normal number
STATS = ("max_abs", "rms", "nonfinite", "tiny")


def raw_stats(x: torch.Tensor, sample: int | None = None) -> tuple:
    """What :func:`tensor_stats` needs of ``x``, in the fewest ops (a hook calls this on every module of a
    sampled step, where each op's fixed cost outweighs its work): the minimum, the maximum and the L2
    norm of all of ``x``, its size, and either a float32 copy of an evenly strided subset of at most
    ``sample`` values (counted later with every other record's in a few ops, :func:`stats_of`) or, with no
    ``sample``, the counts of finite values and of non-zero values below fp16's smallest normal."""
    x = x.detach()
    n = max(1, x.numel())
    if x.numel() == 0:
        x = x.new_zeros(1)
    lo, hi = torch.aminmax(x)  # one pass (vector_norm with ord=inf is much slower on CPU); nan propagates
    norm = torch.linalg.vector_norm(x, dtype=torch.float32)
    s = x.reshape(-1)
    if sample:
        if n > sample:
            s = s[:: -(-n // sample)]  # at most sample values, spread over all of x
        return lo, hi, norm, n, s.to(torch.float32, copy=True)
    a = s.abs()
    return (
        lo,
        hi,
        norm,
        n,
        (
            torch.count_nonzero(a < math.inf),  # False for nan too; isfinite is several ops
            torch.count_nonzero((a < FP16_TINY) & (a > 0)),
            max(1, s.numel()),
        ),
    )


def stats_of(raws: list[tuple]) -> torch.Tensor:
    """``[max_abs, rms, nonfinite fraction, tiny fraction]`` per :func:`raw_stats` record, as an
    ``(N, 4)`` float32 tensor on their device (a handful of ops for all of them)."""
    if not raws:
        return torch.zeros(0, len(STATS))
    lo, hi, norm = (torch.stack([r[i] for r in raws]).float() for i in range(3))
    dev = lo.device
    n = torch.tensor([r[3] for r in raws], dtype=torch.float32, device=dev)
    finite, tiny, m = torch.zeros_like(n), torch.zeros_like(n), torch.ones_like(n)
    sampled = [i for i, r in enumerate(raws) if torch.is_tensor(r[4])]
    if sampled:
        parts = [raws[i][4] for i in sampled]
        a = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True).abs()  # padded with zeros: finite, not tiny
        idx = torch.tensor(sampled, device=dev)
        size = torch.tensor([p.numel() for p in parts], dtype=torch.float32, device=dev)
        finite[idx] = (a < math.inf).sum(1).float() - (a.shape[1] - size)
        tiny[idx] = ((a < FP16_TINY) & (a > 0)).sum(1).float()
        m[idx] = size.clamp(min=1)
    counted = [i for i, r in enumerate(raws) if not torch.is_tensor(r[4])]
    if counted:
        idx = torch.tensor(counted, device=dev)
        finite[idx] = torch.stack([raws[i][4][0] for i in counted]).float()
        tiny[idx] = torch.stack([raws[i][4][1] for i in counted]).float()
        m[idx] = torch.tensor([float(raws[i][4][2]) for i in counted], device=dev)
    max_abs = torch.maximum(hi, -lo)
    nonfinite = (m - finite) / m
    nonfinite = torch.where(torch.isfinite(max_abs), nonfinite, torch.maximum(nonfinite, 1 / n))
    return torch.stack([max_abs, norm / n.sqrt(), nonfinite, tiny / m], dim=1)


def tensor_stats(x: torch.Tensor, sample: int | None = None) -> torch.Tensor:
    """``[max_abs, rms, nonfinite fraction, tiny fraction]`` of ``x`` as a float32 tensor on its device.

    ``max_abs`` and ``rms`` are exact (max_abs is inf/nan when any value is). With ``sample``, the
    two fractions are counted on an evenly strided subset of about that many values (the
    non-finite fraction is at least one value's share whenever max_abs is not finite).
    """
    return stats_of([raw_stats(x, sample)])[0]


def headroom(max_abs: float) -> float:
    """65504 / max_abs: the factor by which values may grow before fp16 overflows (0 once they have)."""
    if max_abs is None or not math.isfinite(max_abs):
        return 0.0
    return math.inf if max_abs == 0 else FP16_MAX / max_abs


def _first_tensor(out):
    if torch.is_tensor(out):
        return out if out.is_floating_point() else None
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


class Diagnostics:
    """Per-module statistics of a model's forward outputs and backward gradients.

    ``every``: record on steps where ``step % every == 0`` (0: never; :meth:`recording` still works).
    The hooks exist only inside :meth:`recording`: other steps run the model untouched. ``sample``: values per
    tensor the two fractions are counted on (None: all; see :func:`tensor_stats`). A forward
    output that is the very tensor an inner module already returned (a container's, a no-op
    dropout's) is recorded once, under the inner module's name.
    """

    def __init__(self, model: nn.Module, every: int = 0, sample: int | None = 1024):
        self.every, self.sample = every, sample
        self.active = False
        self.records: list[tuple[str, str, tuple]] = []  # (module, "forward"/"backward", raw_stats) in call order
        self._seen: dict[tuple, torch.Tensor] = {}  # forward outputs recorded (kept alive so addresses stay unique)
        self._calls: list[tuple[str, bool]] = []  # exact mode: the module calls under way, inputs finite?
        self._origin: tuple[str, str] | None = (
            None  # exact mode: (module, first seen at) of the first non-finite output
        )
        self.model = model

    def _pre_hook(self, name: str):
        """Backward: the gradient this module sends to its input (its own contribution, through a
        fresh view of the input), so the module that first produces a non-finite gradient is named."""

        def pre_hook(module, args):
            if not self.active:
                return None
            if self.sample is None:  # exact mode (locating): one device sync per module, fine on a bad step
                self._calls.append(
                    (
                        name,
                        all(
                            bool(torch.isfinite(a).all()) for a in args if torch.is_tensor(a) and a.is_floating_point()
                        ),
                    )
                )
            for i, a in enumerate(args):
                if torch.is_tensor(a) and a.is_floating_point() and a.requires_grad:
                    v = a.view_as(a)
                    v.register_hook(
                        lambda g: (
                            self.records.append((name, "backward", raw_stats(g, self.sample))) if self.active else None
                        )
                    )
                    return (*args[:i], v, *args[i + 1 :])
            return None

        return pre_hook

    def _hook(self, name: str):
        def forward_hook(module, inputs, output):
            if not self.active:
                return
            x = _first_tensor(output)
            if self.sample is None and self._calls:
                self._place(name, x)
            if x is None:
                return
            key = (x.data_ptr(), x.shape, x.stride(), x.dtype)
            if self.sample is None or key not in self._seen:
                self._seen[key] = x
                self.records.append((name, "forward", raw_stats(x, self.sample)))

        return forward_hook

    def _place(self, name: str, x) -> None:
        """Exact mode, end of a module call: on the first non-finite output, find the innermost module
        under way (this one or an enclosing one) whose inputs were finite: the value was made there."""
        calls = self._calls
        while calls and calls[-1][0] != name:  # a call whose forward raised; drop it
            calls.pop()
        if self._origin is None and x is not None and not bool(torch.isfinite(x).all()):
            origin = next((n for n, ok in reversed(calls) if ok), "model")
            self._origin = (origin, name)
        if calls:
            calls.pop()

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    @contextmanager
    def recording(self, keep: bool = False):
        """Record every hooked module's statistics for the forward and backward passes run inside; ``keep``:
        after those recorded before (a step's next micro-batch)."""
        self.records, self.active = (self.records if keep else []), True
        handles = []
        for name, m in self.model.named_modules():
            name = name or "model"
            handles += [m.register_forward_pre_hook(self._pre_hook(name)), m.register_forward_hook(self._hook(name))]
        try:
            yield self
        finally:
            self.active, self._seen = False, {}
            for h in handles:
                h.remove()

    def rows(self) -> list[dict]:
        """The records in call order: module, direction and the four statistics (one device sync)."""
        if not self.records:
            return []
        values = stats_of([s for _, _, s in self.records]).tolist()
        return [{"module": m, "direction": d, **dict(zip(STATS, v))} for (m, d, _), v in zip(self.records, values)]

    def summary(self) -> dict:
        """``{"forward": {module: [max_abs, rms, nonfinite, tiny]}, "backward": {...}}``: the worst
        value of each statistic over the calls of a module (a module called twice counts once)."""
        out: dict[str, dict[str, list]] = {"forward": {}, "backward": {}}
        for r in self.rows():
            v = [r[k] for k in STATS]
            old = out[r["direction"]].get(r["module"])
            if old is not None:
                v = [max(a, b) if not (math.isnan(a) or math.isnan(b)) else math.nan for a, b in zip(old, v)]
            out[r["direction"]][r["module"]] = v
        return out

    def first_nonfinite(self) -> dict | None:
        """The first record, in execution order, with a value that is not finite (forward before backward).

        Forward, in exact mode: when that module's own input was already not finite, the value
        came from its parent's code between submodules (``x * scale`` before a dropout, say), so
        ``module`` is the innermost enclosing module whose inputs were finite and ``first_seen``
        the module where it was first seen. Backward: the first module whose gradient to its
        input is not finite.
        """
        rows = self.rows()
        for direction in ("forward", "backward"):
            for r in rows:
                if r["direction"] == direction and not math.isfinite(r["max_abs"]):
                    r = dict(r, first_seen=r["module"])
                    if direction == "forward" and self._origin is not None:
                        r["module"], r["first_seen"] = self._origin
                    return r
        return None


def describe(first: dict | None) -> str:
    """``"blocks.3.attn (forward), first seen at blocks.3.attn.logits"`` for a :meth:`Diagnostics.first_nonfinite` row."""
    if first is None:
        return ""
    where = f"{first['module']} ({first['direction']})"
    if first.get("first_seen", first["module"]) != first["module"]:
        where += f", first seen at {first['first_seen']}"
    return where


def tightest(summary: dict, k: int = 5, direction: str = "forward") -> list[tuple[str, float]]:
    """The ``k`` modules with the least fp16 headroom in a :meth:`Diagnostics.summary`."""
    rooms = [(name, headroom(v[0])) for name, v in summary.get(direction, {}).items()]
    return sorted(rooms, key=lambda x: x[1])[:k]


def tightest_at(trace: dict, k: int, direction: str = "forward") -> list[tuple[str, float]]:
    """The ``k`` modules with the least headroom at one sampled step (0 where the value was not finite)."""
    rooms = [(m, headroom(v[0]) if math.isfinite(v[0]) else 0.0) for m, v in trace[direction].items()]
    return sorted(rooms, key=lambda r: r[1])[:k]


def first_nonfinite_step(exp: str | Path) -> int | None:
    """The first step whose loss or gradients were not finite (rank 0's metrics), or None."""
    return next((m["step"] for m in read_metrics(exp) if m.get("nonfinite") in ("loss", "grad")), None)


class TraceWriter:
    """Sampled summaries to ``EXP/diagnostics/rank{R}.jsonl``, one line per sampled step."""

    def __init__(self, exp: Path, rank: int):
        self.f = JsonLines(Path(exp) / layout.DIAGNOSTICS / f"rank{rank}.jsonl")

    def write(self, step: int, loss_scale: float, summary: dict) -> None:
        clean = {
            d: {m: [v if math.isfinite(v) else str(v) for v in vals] for m, vals in mods.items()}
            for d, mods in summary.items()
        }
        self.f.write({"step": step, "loss_scale": loss_scale, **clean})

    def close(self) -> None:
        self.f.close()


def read_traces(exp: str | Path, rank: int = 0) -> list[dict]:
    """The sampled summaries of an experiment (values back as floats, inf/nan included)."""
    path = Path(exp) / layout.DIAGNOSTICS / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    out = []
    for rec in read_jsonl(path):
        for d in ("forward", "backward"):
            rec[d] = {m: [float(v) for v in vals] for m, vals in rec.get(d, {}).items()}
        out.append(rec)
    return out


def headroom_traces(traces: list[dict], k: int = 5, direction: str = "forward") -> dict[str, list[tuple[int, float]]]:
    """{module: [(step, headroom), ...]} for the ``k`` modules whose headroom got smallest while still
    finite (once a value is inf or nan every module after it is too, so those samples do not rank)."""
    worst: dict[str, float] = {}
    for rec in traces:
        for m, v in rec[direction].items():
            if math.isfinite(v[0]):
                worst[m] = min(worst.get(m, math.inf), headroom(v[0]))
    names = sorted(worst, key=worst.get)[:k]
    return {m: [(rec["step"], headroom(rec[direction][m][0])) for rec in traces if m in rec[direction]] for m in names}


# -- the step that went wrong: save it, replay it ------------------------------------------------


def save_bundle(path: Path, model: nn.Module, inputs: dict, meta: dict, rng: dict | None = None) -> Path:
    """Save what is needed to run a step again: model weights (before the step), its inputs, and ``meta``.

    ``inputs``: ``feats`` (B, T, mel), ``feat_lens``, ``targets``, ``target_lens`` tensors and
    ``keys`` (utterance ids); ``meta``: step, precision, loss scale, model config, ...; ``rng``: the
    RNG states (``{"torch": ..., "cuda": ...}``) the step's forward started from, so that a replay draws
    the same dropout masks.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path / "model.pt")
    torch.save({k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in inputs.items()}, path / "batch.pt")
    if rng is not None:
        torch.save({k: (v.cpu() if v is not None else None) for k, v in rng.items()}, path / "rng.pt")
    (path / "report.json").write_text(json.dumps(meta, indent=2, default=str))
    return path


def load_bundle(path: str | Path, device="cpu") -> tuple[dict, dict, dict]:
    """(model state, inputs, meta) saved by :func:`save_bundle`; ``meta["rng"]``: its RNG states, if saved."""
    path = Path(path)
    state = torch.load(path / "model.pt", map_location=device, weights_only=True)
    inputs = torch.load(path / "batch.pt", map_location=device, weights_only=True)
    meta = json.loads((path / "report.json").read_text())
    if (path / "rng.pt").exists():
        meta["rng"] = torch.load(path / "rng.pt", weights_only=True)
    return state, inputs, meta


def _draw_as_the_step_did(meta: dict, device: torch.device) -> None:
    """Set the RNGs where the saved step's forward started (its dropout masks); without them, the step number."""
    rng = meta.get("rng")
    if rng is None:
        torch.manual_seed(int(meta.get("step", 0)))
        return
    torch.set_rng_state(rng["torch"])
    if device.type == "cuda" and rng.get("cuda") is not None:
        torch.cuda.set_rng_state(rng["cuda"], device)


def locate(model: nn.Module, step_fn, diag: Diagnostics | None = None) -> tuple[dict | None, dict]:
    """Run ``step_fn()`` (a forward and backward of ``model``) with every module recorded.

    Returns (the first non-finite record or None, the summary).
    """
    diag = diag or Diagnostics(model)
    sample, diag.sample = diag.sample, None  # exact counts
    try:
        diag._calls, diag._origin = [], None
        with diag.recording():
            step_fn()
        return diag.first_nonfinite(), diag.summary()
    finally:
        diag.sample = sample


def replay_step(
    path: str | Path, model: nn.Module, loss_fn, precisions=("fp32", "bf16", "fp16"), device="cpu"
) -> list[dict]:
    """Run a step saved by :func:`save_bundle` again in each precision, with ``model`` (weights loaded
    from the bundle) and ``loss_fn(model, inputs) -> loss`` (the loop's own forward and loss): loss,
    gradient norm and the first non-finite value per precision. fp16 runs with the loss scale the
    failing step had (``meta["loss_scale"]``, 1 without scaling); every precision draws the failing
    step's dropout masks."""
    device = torch.device(device)
    state, inputs, meta = load_bundle(path, device)
    model.load_state_dict(state)
    model.to(device).train()
    rows = []
    for name in precisions:
        dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[name]
        scale = float(meta.get("loss_scale") or 1.0) if name == "fp16" else 1.0
        result: dict = {}

        def step():
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = loss_fn(model, inputs)
            grads = torch.autograd.grad(
                loss.float() * scale, [p for p in model.parameters() if p.requires_grad], allow_unused=True
            )
            norm = torch.nn.utils.get_total_norm([g for g in grads if g is not None]) / scale
            result.update(loss=float(loss.detach()), grad_norm=float(norm))

        _draw_as_the_step_did(meta, device)
        with cpu_fp16_kernels(device, dtype):
            first, summary = locate(model, step)
        tight = tightest(summary, 1)
        rows.append(
            {
                "precision": name,
                "loss": result["loss"],
                "grad_norm": result["grad_norm"],
                "finite": first is None and math.isfinite(result["loss"]) and math.isfinite(result["grad_norm"]),
                "first_nonfinite": describe(first),
                "tightest_module": tight[0][0] if tight else "",
                "max_abs": summary["forward"].get(tight[0][0], [math.nan])[0] if tight else math.nan,
            }
        )
    return rows


def outcome(exp: str | Path, last: int = 10) -> dict:
    """How a run ended: final loss (mean of the last ``last`` steps, None if any was not finite),
    skipped steps, median s/step, the first non-finite step and where it was found."""
    m = read_metrics(exp)
    tail = [r["loss"] for r in m[-last:]]
    finite = all(v is not None for v in tail)
    bad = [r for r in m if r.get("nonfinite") in ("loss", "grad")]
    where = ""
    if bad:
        reports = sorted(Path(exp).glob(f"nonfinite/step{bad[0]['step']:08d}-rank*/report.json"))
        where = json.loads(reports[0].read_text())["where"] if reports else ""
    step_s = sorted(r["step_s"] for r in m[1:]) or [math.nan]
    return {
        "steps": len(m),
        "final_loss": sum(tail) / len(tail) if finite and tail else None,
        "finite": finite,
        "skipped": m[-1]["skipped"] if m else 0,
        "first_nonfinite_step": bad[0]["step"] if bad else None,
        "where": where,
        "step_s": step_s[len(step_s) // 2],
    }


__all__ = [
    "FP16_MAX",
    "FP16_TINY",
    "Diagnostics",
    "TraceWriter",
    "describe",
    "first_nonfinite_step",
    "headroom",
    "headroom_traces",
    "load_bundle",
    "locate",
    "outcome",
    "read_traces",
    "replay_step",
    "save_bundle",
    "tensor_stats",
    "tightest",
    "tightest_at",
]

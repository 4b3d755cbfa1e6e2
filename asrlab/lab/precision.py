"""Which precision to train in, and why: the choice follows the hardware.

bf16 where the GPU really computes in bf16 (compute capability >= 8.0: A100, A5000, H100...),
fp16 with loss scaling on older GPUs (V100, 2080 Ti: fp16 tensor cores, no real bf16), fp32 on
CPU. fp16 tops out at 65504; without loss scaling small gradients underflow, and without care
large activations overflow (the NaN losses of a V100 run with larger batches).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..errors import UsageError

CHOICES = ("auto", "fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Precision:
    name: str  # fp32 | fp16 | bf16
    dtype: torch.dtype | None  # autocast dtype; None for fp32 (no autocast)
    scaler: bool  # use a GradScaler (fp16 only)
    reason: str


@contextlib.contextmanager
def cpu_fp16_kernels(device: torch.device, dtype: torch.dtype | None):
    """While inside: fp16 on CPU runs on PyTorch's own kernels, not oneDNN's (nothing changes elsewhere).

    With torch 2.11 on a CPU with AVX512-FP16 (Sapphire Rapids), oneDNN's fp16 depthwise conv1d (the
    Conformer's convolution module) never returns for some batch sizes (3, 5, 7 and 11 with 144 channels
    and kernel 15, while 1, 2, 4, 6 and 9 return), so an fp16 run on such a CPU would stall.
    The switch is process-wide, so enter it around whole passes (forward and backward), not per op."""
    if device.type != "cpu" or dtype != torch.float16 or not torch.backends.mkldnn.enabled:
        yield
        return
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = True


def choose_precision(
    requested: str, device: torch.device, capability: tuple[int, int] | None = None, bf16_native: bool | None = None
) -> Precision:
    """Resolve ``requested`` (auto|fp32|fp16|bf16) for ``device``.

    ``capability`` and ``bf16_native`` default to what the CUDA device reports; tests pass them
    to simulate hardware. Raises ValueError for a precision the hardware cannot do.
    """
    if requested not in CHOICES:
        raise UsageError(f"precision must be one of {', '.join(CHOICES)}, not {requested!r}")
    if device.type != "cuda":
        if requested == "auto":
            return Precision("fp32", None, False, "auto: no GPU, fp32 on CPU")
        if requested == "fp32":
            return Precision("fp32", None, False, "requested fp32")
        return Precision(
            requested,
            _dtype(requested),
            requested == "fp16",
            f"requested {requested} on CPU (autocast on CPU; slow, for reproducing numerics)",
        )
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    if bf16_native is None:
        bf16_native = torch.cuda.is_bf16_supported(including_emulation=False)
    cc = f"{capability[0]}.{capability[1]}"
    if requested == "auto":
        if capability >= (8, 0) and bf16_native:
            return Precision("bf16", torch.bfloat16, False, f"auto: compute capability {cc} computes in bf16")
        if capability >= (7, 0):
            return Precision(
                "fp16", torch.float16, True, f"auto: compute capability {cc} has no native bf16; fp16 with loss scaling"
            )
        return Precision("fp32", None, False, f"auto: compute capability {cc} has no fast fp16 or bf16; fp32")
    if requested == "bf16" and not (capability >= (8, 0) and bf16_native):
        raise UsageError(
            f"bf16 requested but this GPU (compute capability {cc}) does not compute in bf16; "
            "use --precision fp16 (with loss scaling) or fp32"
        )
    if requested == "fp32":
        return Precision("fp32", None, False, "requested fp32")
    return Precision(requested, _dtype(requested), requested == "fp16", f"requested {requested} (cc {cc})")


def _dtype(name: str) -> torch.dtype:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


# (name, compute capability, computes in bf16): what `auto` picks on each, for the capability table
KNOWN_GPUS = (
    ("V100", (7, 0), False),
    ("T4", (7, 5), False),
    ("RTX 2080 Ti", (7, 5), False),
    ("A100", (8, 0), True),
    ("A5000 / RTX 3090", (8, 6), True),
    ("L4 / RTX 4090", (8, 9), True),
    ("H100 / H200", (9, 0), True),
)


def capability_table(device: torch.device | None = None) -> list[dict]:
    """What ``--precision auto`` picks on common GPUs, on CPU, and on ``device`` (this machine)."""
    cuda = torch.device("cuda", 0)
    rows = []
    for name, cap, native in KNOWN_GPUS:
        p = choose_precision("auto", cuda, capability=cap, bf16_native=native)
        rows.append({"hardware": name, "capability": f"{cap[0]}.{cap[1]}", "auto": p.name, "loss_scaling": p.scaler})
    rows.append({"hardware": "CPU", "capability": "-", "auto": "fp32", "loss_scaling": False})
    if device is not None:
        p = choose_precision("auto", device)
        here = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        rows.append(
            {
                "hardware": f"this machine: {here}",
                "capability": f"{cap[0]}.{cap[1]}" if cap else "-",
                "auto": p.name,
                "loss_scaling": p.scaler,
                "why": p.reason,
            }
        )
    return rows

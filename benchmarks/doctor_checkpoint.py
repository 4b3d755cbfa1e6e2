"""What a large checkpoint costs ``asrlab doctor``: a short ``asrlab train`` run folder whose newest checkpoint is
made large (its model state padded with one tensor of ``--mb`` MiB, saved again with its marker), then the doctor
on the folder, timed, with the peak resident memory of the process that ran it.

    .venv/bin/python benchmarks/doctor_checkpoint.py [--mb 1024] [--rounds 3]

The doctor checks every checkpoint's SHA-256 against its marker and reads the training clock the newest loadable
one holds: the bytes of a large checkpoint are read at least once.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_run(tmp: Path, mb: int) -> Path:
    import torch

    from asrlab.cli import main as cli
    from asrlab.lab.state.checkpoint import list_checkpoints, save_checkpoint

    assert cli(["synth", str(tmp / "corpus"), "--utts", "32", "--quiet"]) == 0
    exp = tmp / "exp"
    small = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.ff_dim=64", "data.num_workers=0"]
    data = str(tmp / "corpus" / "train" / "data.list")
    assert cli(["train", "--data", data, "--exp", str(exp), *small, "train.max_steps=6", "train.progress=false"]) == 0
    ckpts = exp / "checkpoints"
    marker = list_checkpoints(ckpts)[-1]
    state = torch.load(ckpts / marker["file"], weights_only=True)
    state["model"]["padding"] = torch.zeros(mb * (1 << 20) // 4)
    info = {k: v for k, v in marker.items() if k not in ("step", "file", "sha256", "complete")}
    (ckpts / marker["file"]).unlink()
    save_checkpoint(ckpts, state, marker["step"], info)
    return exp


def timed(exp: Path) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of ``asrlab doctor EXP`` in a process of its own."""
    code = (
        "import resource, sys, time; from asrlab.doctor import diagnose; t = time.perf_counter(); "
        "d = diagnose(sys.argv[1]); s = time.perf_counter() - t; "
        "print(s, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, d['checkpoints']['clock_s'])"
    )
    out = subprocess.run([sys.executable, "-c", code, str(exp)], capture_output=True, text=True, check=True)
    s, rss, clock = out.stdout.split()
    assert clock != "None", "the newest checkpoint's clock was not read"
    return float(s), float(rss)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--make", help=argparse.SUPPRESS)  # the run folder made in a process of its own
    a = ap.parse_args()
    if a.make:
        make_run(Path(a.make), a.mb)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="asrlab-ckpt-"))
    try:
        # made in another process: a child's peak memory counts its parent's at the fork
        subprocess.run(
            [sys.executable, __file__, "--make", str(tmp), "--mb", str(a.mb)], check=True, capture_output=True
        )
        exp = tmp / "exp"
        size = max(p.stat().st_size for p in (exp / "checkpoints").glob("*.pt")) / (1 << 20)
        runs = [timed(exp) for _ in range(a.rounds)]
        best = min(runs)
        print(f"newest checkpoint {size:.0f} MiB; asrlab doctor EXP: best of {a.rounds} {best[0]:.2f} s, "
              f"peak RSS {max(r[1] for r in runs):.0f} MiB")  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

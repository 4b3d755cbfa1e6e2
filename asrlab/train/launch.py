"""``asrlab train --nproc N``: start N ranks with torchrun on this node and wait for them.

Multi-node runs use torchrun's own rendezvous (``torchrun --nnodes ... -m asrlab.cli train``).
"""

from __future__ import annotations

import os
import subprocess
import sys


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_command(nproc: int, train_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "asrlab.cli", "train", *train_args]


def launch(nproc: int, train_args: list[str], timeout_s: float | None = None) -> int:
    """Run ``asrlab train`` on ``nproc`` local ranks; returns torchrun's exit code."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return subprocess.run(torchrun_command(nproc, train_args), env=env, timeout=timeout_s).returncode

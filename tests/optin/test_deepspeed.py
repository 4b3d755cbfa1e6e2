"""Opt-in: DeepSpeed's own launcher (``deepspeed --num_gpus 2``, its CPU accelerator, gloo) under ``asrlab watch``,
each fault of ``ds_loop.py`` run several times: rank 1 named in every run. The runs kept as fixtures
(``tests/fixtures/watched/deepspeed_*``, ``tests/fixtures/toolkit_runs/deepspeed/``) came from this.

CI never runs it: DeepSpeed is not a dependency. Skipped unless ``ASRLAB_DEEPSPEED`` names a virtual environment
with DeepSpeed that sees the project's torch, made outside the repository:

    python3 -m venv /work/ds && echo "$PWD/.venv/lib/python3.11/site-packages" \\
        > /work/ds/lib/python3.11/site-packages/asrlab_main.pth
    /work/ds/bin/pip install wheel setuptools pydantic && /work/ds/bin/pip install --no-build-isolation --no-deps \\
        deepspeed hjson ninja py-cpuinfo msgpack einops
    ASRLAB_DEEPSPEED=/work/ds .venv/bin/python -m pytest -n 0 -p no:cacheprovider tests/optin/test_deepspeed.py

About 4 minutes on 2 cores (three runs of each fault; ``ASRLAB_DEEPSPEED_RUNS`` sets how many).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_VENV = Path(os.environ["ASRLAB_DEEPSPEED"]) if os.environ.get("ASRLAB_DEEPSPEED") else None
if _VENV is None or not (_VENV / "bin" / "deepspeed").exists():
    pytest.skip(
        "opt-in: set ASRLAB_DEEPSPEED to a virtual environment with DeepSpeed (see this module's docstring)",
        allow_module_level=True,
    )

from asrlab.doctor import diagnose  # noqa: E402

LOOP = Path(__file__).resolve().parent / "ds_loop.py"
RUNS = int(os.environ.get("ASRLAB_DEEPSPEED_RUNS", "3"))


@pytest.mark.parametrize("fault, verdict", [("hang", "stalled"), ("raise", "crashed"), ("kill", "killed")])
def test_deepspeeds_launcher_under_the_watch_names_rank_1_in_every_run(tmp_path, fault, verdict):
    env = {**os.environ, "PATH": f"{_VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    said = []
    for i in range(RUNS):
        exp = tmp_path / f"run{i}"
        cmd = [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(exp), "--stall-timeout", "15"]
        cmd += ["--on-stall", "kill", "--", "deepspeed", "--num_gpus", "2", str(LOOP), "--fault", fault]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        d = diagnose(exp)
        said.append((out.returncode, d["verdict"], d["culprit"]["rank"], d["summary"][:200]))
    assert all(v == verdict and rank == 1 and rc != 0 for rc, v, rank, _ in said), said

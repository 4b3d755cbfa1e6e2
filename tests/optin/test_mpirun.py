"""Opt-in: a loop of one's own under Open MPI's ``mpirun -np 2`` (``mpi_loop.py``: ranks from
OMPI_COMM_WORLD_RANK, gloo on 127.0.0.1) under ``asrlab watch``: rank 1 named for a hung reader, a raise and a
SIGKILL, and for never joining the group (named by mpirun's variables, before any process group), with the
world of 2; a rank 15 s late to the group under an 8 s stall timeout is no stall.

CI never runs it: Open MPI is not a dependency. Skipped unless ``ASRLAB_MPIRUN=1`` and ``mpirun`` is on PATH
(Debian: ``apt install openmpi-bin``):

    ASRLAB_MPIRUN=1 .venv/bin/python -m pytest -n 0 -p no:cacheprovider tests/optin/test_mpirun.py

About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if not os.environ.get("ASRLAB_MPIRUN") or shutil.which("mpirun") is None:
    pytest.skip("opt-in: set ASRLAB_MPIRUN=1 with Open MPI's mpirun on PATH (apt install openmpi-bin)",
                allow_module_level=True)  # fmt: skip

LOOP = Path(__file__).resolve().parent / "mpi_loop.py"
ASRLAB = [sys.executable, "-m", "asrlab.cli"]


@pytest.mark.parametrize(
    "fault, verdict, rank, step",
    [("hang", "stalled", 1, 4), ("raise", "crashed", 1, 4), ("kill", "killed", 1, 4),
     ("hang_start", "stalled", 1, None), ("slow_start", "finished", None, None)],
)  # fmt: skip
def test_mpirun_ranks_are_named_under_the_watch(tmp_path, fault, verdict, rank, step):
    exp = tmp_path / "watch"
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "FAULT", "-x", "OMP_NUM_THREADS"]
    out = subprocess.run(
        [*ASRLAB, "watch", "--exp", str(exp), "--stall-timeout", "8", "--on-stall", "kill", "--",
         *mpirun, sys.executable, str(LOOP)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "FAULT": fault, "OMP_NUM_THREADS": "1", "PORT": str(29500 + os.getpid() % 400)},
    )  # fmt: skip
    d = json.loads(subprocess.run([*ASRLAB, "doctor", str(exp), "--json"], capture_output=True, text=True,
                                  timeout=120).stdout)  # fmt: skip
    said = f"{out.returncode}: {d['verdict']}: {d['summary'][:400]}\n{out.stderr[-2000:]}"
    assert (d["verdict"], d["culprit"]["rank"], d["culprit"]["step"]) == (verdict, rank, step), said
    assert d["world_size"] == 2, said
    assert (out.returncode == 0) == (fault == "slow_start"), said

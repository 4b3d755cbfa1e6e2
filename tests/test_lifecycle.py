"""How a run of ``asrlab train`` ends: a process ends without an abort at exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from asrlab.lab.numerics.guard import HALT_EXIT

from conftest import SMALL

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


# Forks pairs of ranks from one process that has imported everything (a process start costs seconds of
# imports; 20 pairs of them would cost minutes). Each child runs ``asrlab train`` as a rank would and
# leaves through SystemExit, so its interpreter exits as a rank's does, the step where the abort was.
_PAIRS = """
import json, os, socket, sys
from asrlab.cli import main
from asrlab.lab.dist import teardown  # noqa: F401 (everything a rank imports, imported once)
import asrlab.train.trainer  # noqa: F401
out, n, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ended = []
for i in range(n):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kids = []
    for rank in (0, 1):
        pid = os.fork()
        if pid == 0:
            log = os.open(f"{out}/run{i}.rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            sys.exit(main([*args, "--exp", f"{out}/exp{i}"]))
        kids.append(pid)
    ended.append([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in kids])
print(json.dumps(ended))
"""


def test_two_ranks_halted_on_a_non_finite_step_exit_without_an_abort_20_times(corpus, tmp_path):
    """The halt case that once ended in "terminate called without an active exception" (SIGABRT) after
    the ranks were done: gloo's worker threads outlived the process group (DDP and the guards still held
    it) and freed their last works while the interpreter exited. 20 times two ranks: each ends with the
    halt's exit code, and says no gloo thread outlived its process group."""
    args = ["train", "--data", str(corpus / "data.list"), "--resume", "none", "--max-steps", "20",
            "--nonfinite", "halt", "optim.lr=1e30", "optim.warmup_steps=0", "train.stall_timeout_s=0",
            "train.preflight=false", *SMALL]
    run = subprocess.run([sys.executable, "-c", _PAIRS, str(tmp_path), "20", *args], capture_output=True, text=True,
                         timeout=400, env=ENV)
    assert run.returncode == 0, run.stderr[-3000:]
    ended = json.loads(run.stdout.splitlines()[-1])
    for i, codes in enumerate(ended):
        for r, code in enumerate(codes):
            out = (tmp_path / f"run{i}.rank{r}.log").read_text()
            assert code == HALT_EXIT, f"run {i}, rank {r}: exit code {code}\n{out[-3000:]}"
            assert "terminate called" not in out and "outlive the process group" not in out, f"run {i}, rank {r}\n{out}"
            assert "training halted" in out
    assert len(ended) == 20

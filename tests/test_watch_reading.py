"""How a stall and a run are read, on loops that are not asrlab's (tests/loops/): uneven data under
``asrlab watch`` named as a rank that left the loop, and the watch's injected code leaving the job no
warning and no file handle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from asrlab.doctor import diagnose
from asrlab.lab.stall.classify import loop_of, step_of

LOOPS = Path(__file__).resolve().parent / "loops"
HF = str(LOOPS / "hf_style_loop.py")


def watch(exp: Path, *cmd: str, watch_args: tuple = (), env: dict | None = None, timeout: float = 150):
    return subprocess.run([sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(exp), *watch_args, "--", *cmd],
                          cwd=LOOPS, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def left_behind(mark: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if mark in " ".join(p.info["cmdline"] or [])]


def test_uneven_data_is_read_as_a_rank_that_left_the_loop_not_as_a_mismatch(tmp_path):
    """Rank 1's sampler yields 3 batches more than rank 0's: rank 0 leaves the loop after its 10th batch
    (``step`` 9) for the barrier after it, while rank 1 waits for it in DDP's all-reduce of ``step`` 10.
    The Flight Recorder sees one collective number with two calls; the verdict names uneven data, each
    rank's step in the loop's own count, and where rank 0 is. The job ran with ResourceWarnings shown and
    printed none."""
    exp, out = tmp_path / "exp", tmp_path / "out"
    run = watch(exp, sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", HF, str(out),
                watch_args=("--stall-timeout", "6", "--on-stall", "kill"),
                env={"EXTRA": "3", "PYTHONWARNINGS": "always::ResourceWarning"})
    assert run.returncode != 0, run.stderr[-3000:]
    v = json.loads((exp / "stall_report.json").read_text())["verdict"]
    assert v.startswith("rank 0 ran out of data after step 9 and left the loop (at hf_style_loop.py:"), v
    assert "in main); rank 1 still trains (step 10) and waits for it in DDP's gradient all-reduce (backward)" in v, v
    assert "disagree" not in v, v
    text = (exp / "stall_report.txt").read_text()
    assert "rank 0 " in text and "past the training loop (its data ran out)" in text, text[:2000]
    d = diagnose(exp)
    assert d["verdict"] == "stalled" and d["summary"] == v, d["summary"]
    assert "ResourceWarning" not in run.stdout + run.stderr, (run.stdout + run.stderr)[-3000:]
    assert not left_behind(str(out))


def test_the_watchs_injected_code_leaves_the_job_no_warning_and_no_handle(tmp_path):
    """A DataLoader's forked workers under the watch: each holds only its own stack-dump file (not the one
    inherited from its parent), and nothing is left unclosed to warn about, in a worker or at exit."""
    run = watch(tmp_path / "exp", sys.executable, str(LOOPS / "worker_files.py"), timeout=90,
                env={"PYTHONWARNINGS": "always::ResourceWarning"})
    assert run.returncode == 0, run.stderr[-3000:]
    said = run.stdout + run.stderr
    assert "ResourceWarning" not in said and "sum 28" in said, said[-3000:]
    held = [line.split() for line in run.stdout.splitlines() if line.startswith("worker ")]
    assert len(held) == 2 and all(words[3:] == [f"['{words[1]}.txt']"] for words in held), held


def test_the_training_loop_and_its_step_are_read_from_the_loops_own_source():
    """The loop a stack is in is the innermost of the job's own (a generator that relays batches is passed
    over); its step is ``enumerate``'s index, else the counter the loop adds 1 to."""
    src = Path(HF).read_text().splitlines()
    for_line = next(i for i, s in enumerate(src, 1) if s.strip().startswith("for step, batch in enumerate("))
    backward = next(i for i, s in enumerate(src, 1) if s.strip() == "loss.backward()")
    barrier = next(i for i, s in enumerate(src, 1) if s.strip().startswith("dist.barrier()"))
    torch_file = "/x/site-packages/torch/utils/data/dataloader.py"
    loop = loop_of([(HF, 100, "<module>"), (HF, for_line, "main"), (torch_file, 700, "__next__")])
    assert loop is not None and loop[:3] == (HF, "main", for_line) and for_line < backward <= loop[3] < barrier, loop
    assert loop_of([(HF, barrier, "main")]) is None  # after the loop: in no loop of its function
    assert step_of(loop, backward, {"step": "10", "completed_steps": "10"}, after=False) == 10
    assert step_of(loop, barrier, {"step": "9"}, after=True) == 9

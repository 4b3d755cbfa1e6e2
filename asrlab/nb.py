"""What notebooks share: where things go, results files, and a training run with a live curve.

Notebooks orchestrate and plot; this module and the rest of the package compute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def root() -> Path:
    """The project folder: the nearest folder up from here that holds ``notebooks/``."""
    for d in [Path.cwd(), *Path.cwd().parents]:
        if (d / "notebooks").is_dir() and (d / "asrlab").is_dir():
            return d
    return Path.cwd()


def run_dir(notebook: str) -> Path:
    d = root() / "runs" / notebook
    d.mkdir(parents=True, exist_ok=True)
    return d


def save_results(notebook: str, results: dict) -> Path:
    """Write a notebook's key numbers to ``runs/<notebook>/results.json``."""
    path = run_dir(notebook) / "results.json"
    path.write_text(json.dumps(results, indent=2, default=float))
    return path


def save_figure(fig, name: str) -> Path:
    d = root() / "figures"
    d.mkdir(exist_ok=True)
    path = d / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def table(rows: list[dict], columns: list[str] | None = None, digits: int = 4) -> str:
    """Rows of dicts as an aligned text table (floats to ``digits`` significant digits)."""
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))

    def cell(v):
        if isinstance(v, float):
            return f"{v:.{digits}g}"
        return "" if v is None else str(v)

    grid = [columns] + [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in grid) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in grid]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def train(args: list[str], exp: str | Path, live: bool = True, poll_s: float = 5.0, timeout_s: float | None = None,
          check: bool = True) -> int:
    """Run ``asrlab train ARGS --exp EXP`` in a subprocess (torchrun when ``--nproc N`` > 1) and wait.

    With ``live``, a loss curve is redrawn in place (one display) while it trains; executed
    headless (papermill, nbval) the last drawing stays as a static figure. Returns the exit code;
    with ``check`` a non-zero one raises, showing the end of the log.
    """
    exp = Path(exp)
    cmd = [sys.executable, "-m", "asrlab.cli", "train", *args, "--exp", str(exp)]
    log_path = exp.parent / f"{exp.name}.log"
    exp.parent.mkdir(parents=True, exist_ok=True)
    handle = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        t0 = time.time()
        while proc.poll() is None:
            time.sleep(poll_s)
            if live:
                handle = _redraw(exp, handle, time.time() - t0)
            if timeout_s and time.time() - t0 > timeout_s:
                proc.kill()
                proc.wait()
                raise TimeoutError(f"training ran past {timeout_s} s; log in {log_path}")
    if live:
        _redraw(exp, handle, time.time() - t0)
    if check and proc.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-25:])
        raise RuntimeError(f"asrlab train exited with {proc.returncode}; end of {log_path}:\n{tail}")
    return proc.returncode


def last_step(exp: str | Path) -> int:
    """The last step rank 0 logged to its metrics (a line being written is not read); 0 before any."""
    from .train.metrics import read_metrics

    try:
        m = read_metrics(exp)
    except FileNotFoundError:
        return 0
    return m[-1]["step"] if m else 0


def train_until_killed(args: list[str], exp: str | Path, step: int, timeout_s: float = 600) -> int:
    """Run ``asrlab train ARGS --exp EXP`` and SIGKILL it, and every process under it (torchrun, ranks,
    loader workers), as soon as rank 0 has logged ``step``: a crash at a step. Returns the last step logged."""
    from .train.launch import kill_tree

    exp = Path(exp)
    exp.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "asrlab.cli", "train", *args, "--exp", str(exp)]
    with open(exp.parent / f"{exp.name}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        t0 = time.time()
        try:
            while last_step(exp) < step:
                if proc.poll() is not None:
                    raise RuntimeError(f"the run ended (exit {proc.returncode}) before step {step}")
                if time.time() - t0 > timeout_s:
                    raise TimeoutError(f"step {step} not reached in {timeout_s} s")
                time.sleep(0.005)
        finally:
            kill_tree(proc.pid)
            proc.wait()
    return last_step(exp)


def _redraw(exp: Path, handle, elapsed_s: float):
    if not (exp / "metrics" / "rank0.jsonl").exists():
        return handle
    try:
        from IPython.display import display
    except ImportError:
        return handle
    import matplotlib.pyplot as plt

    from .train.metrics import read_metrics

    m = read_metrics(exp)
    if not m:
        return handle
    fig, ax = plt.subplots(figsize=(7, 2.8))
    ax.plot([x["step"] for x in m], [x["loss"] if x["loss"] is not None else float("nan") for x in m], lw=1)
    ax.set(yscale="log", xlabel="step", ylabel="train loss",
           title=f"step {m[-1]['step']}, epoch {m[-1]['epoch']}, {elapsed_s:.0f} s")
    fig.tight_layout()
    if handle is None:
        handle = display(fig, display_id=True)
    else:
        handle.update(fig)
    plt.close(fig)
    return handle

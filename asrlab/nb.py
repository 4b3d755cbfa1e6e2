"""What notebooks share: where things go, results files, and training runs with their progress in the page.

Notebooks orchestrate and plot; this module and the rest of the package compute. Where things go:
``runs/<notebook>/`` and ``figures/`` of the project, or the folders named by ``ASRLAB_RUNS`` and
``ASRLAB_FIGURES`` (``asrlab notebooks --out DIR`` sets both, so that two runs never overwrite each other).
Nothing a run makes goes into a tracked folder: figures go to ``runs/figures/`` (a notebook's figure of a
user's own run, notebook 06's, to ``runs/<notebook>/figures/``). ``figures/``, the copies the README and
docs show, is refreshed on purpose: ``ASRLAB_FIGURES=figures asrlab notebooks``.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import widgets
from .doctor import format_diagnosis
from .lab.metrics import read_metrics, run_status
from .lab.state.ledger import ledger_path
from .lab.stop import clear_stop, own_session_ending_with_parent, request_stop
from .train.launch import kill_tree


def root() -> Path:
    """The project folder: the nearest folder up from here that holds ``notebooks/``."""
    for d in [Path.cwd(), *Path.cwd().parents]:
        if (d / "notebooks").is_dir() and (d / "asrlab").is_dir():
            return d
    return Path.cwd()


RUNS_ENV, FIGURES_ENV = "ASRLAB_RUNS", "ASRLAB_FIGURES"


def run_dir(notebook: str) -> Path:
    """Where a notebook writes its experiments and ``results.json``: ``runs/<notebook>`` (or under ``ASRLAB_RUNS``)."""
    d = Path(os.environ.get(RUNS_ENV) or root() / "runs") / notebook
    d.mkdir(parents=True, exist_ok=True)
    return d


def save_results(notebook: str, results: dict) -> Path:
    """Write a notebook's key numbers to ``runs/<notebook>/results.json``."""
    path = run_dir(notebook) / "results.json"
    path.write_text(json.dumps(results, indent=2, default=float))
    return path


def save_figure(fig, name: str, notebook: str | None = None) -> Path:
    """``runs/figures/<name>.png`` (under ``ASRLAB_RUNS``, or in ``ASRLAB_FIGURES`` when set). ``notebook``:
    a figure of that notebook's own run (of a user's run, say): ``runs/<notebook>/figures/<name>.png``."""
    d = (
        run_dir(notebook) / "figures"
        if notebook
        else Path(os.environ.get(FIGURES_ENV) or Path(os.environ.get(RUNS_ENV) or root() / "runs") / "figures")
    )
    d.mkdir(parents=True, exist_ok=True)
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


def _start(args: list[str], exp: Path):
    """``asrlab train ARGS --exp EXP`` in a subprocess, its output to ``EXP.log``: (process, log path, log file)."""
    return _spawn([sys.executable, "-m", "asrlab.cli", "train", *args, "--exp", str(exp)], exp)


def _spawn(cmd: list[str], exp: Path, cwd: Path | None = None, env: dict | None = None):
    """``cmd`` in its own session, its output to ``EXP.log``: (process, log path, log file). Its own session,
    so that interrupting the kernel (a SIGINT to the kernel's process group) does not stop it mid-step (the
    notebook asks it to stop instead); and it ends when the kernel does, so that no run outlives its notebook."""
    log_path = exp.parent / f"{exp.name}.log"
    exp.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        preexec_fn=own_session_ending_with_parent(),
    )
    return proc, log_path, log


def _ended(proc, log_path: Path, check: bool) -> int:
    if check and proc.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-25:])
        raise RuntimeError(f"asrlab train exited with {proc.returncode}; end of {log_path}:\n{tail}")
    return proc.returncode


def train(
    args: list[str],
    exp: str | Path,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
    check: bool = True,
    progress: bool = True,
) -> int:
    """Run ``asrlab train ARGS --exp EXP`` in a subprocess (torchrun when ``--nproc N`` > 1) and wait,
    with a progress bar of its steps in the page. Returns the exit code; with ``check`` a non-zero one
    raises, showing the end of the log. See :func:`train_live` for the monitor with a Stop button."""
    exp = Path(exp)
    proc, log_path, log = _start(args, exp)
    bar = widgets.progress(desc=exp.name, unit="step") if progress else None
    t0 = time.time()
    try:
        while proc.poll() is None:
            time.sleep(poll_s)
            if bar is not None:
                _advance(bar, exp)
            if timeout_s and time.time() - t0 > timeout_s:
                raise TimeoutError(f"training ran past {timeout_s} s; log in {log_path}")
        if bar is not None:
            _advance(bar, exp)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
        log.close()
        if bar is not None:
            bar.close()
    return _ended(proc, log_path, check)


def _advance(bar, exp: Path) -> None:
    s = run_status(exp)
    if bar.total is None and s["max_steps"]:
        bar.total = s["max_steps"]
    if s["step"] != bar.n:
        bar.update(s["step"] - bar.n)


async def train_live(
    args: list[str],
    exp: str | Path,
    poll_s: float = 3.0,
    timeout_s: float | None = None,
    check: bool = True,
    title: str = "",
) -> int:
    """:func:`train` watched by a :class:`asrlab.widgets.TrainMonitor` (status, curves, a Stop button).

    A coroutine: the cell ``await``s it, and between its sleeps the kernel takes the Stop button's
    click (a cell that blocks would hear it only after training). A Stop click, or interrupting the
    kernel, asks the run to end after its current step (``EXP/STOP``): it writes a checkpoint and the
    notebook goes on with the model it has; an interrupt then re-raises once the run has ended.
    Headless the monitor is a status line and a figure, updated in place.
    """
    import asyncio

    exp = Path(exp)
    clear_stop(exp)  # a request left by an earlier run must not end this one
    monitor = widgets.TrainMonitor(exp, title=title)
    proc, log_path, log = _start(args, exp)
    t0 = time.time()
    try:
        try:
            while proc.poll() is None:
                await asyncio.sleep(poll_s)
                monitor.update(time.time() - t0)
                if timeout_s and time.time() - t0 > timeout_s:
                    raise TimeoutError(f"training ran past {timeout_s} s; log in {log_path}")
        except (KeyboardInterrupt, asyncio.CancelledError):
            request_stop(exp, "the notebook was interrupted")
            try:
                proc.wait(timeout=120)
            finally:
                monitor.update(time.time() - t0, "interrupted: stopped after its step")
            raise
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
        log.close()
    ok = proc.returncode == 0
    monitor.update(
        time.time() - t0,
        ("stopped" if monitor.stop_clicked else "finished") if ok else f"failed (exit code {proc.returncode})",
    )
    return _ended(proc, log_path, check)


def last_step(exp: str | Path) -> int:
    """The last step rank 0 logged to its metrics (a line being written is not read); 0 before any."""
    try:
        m = read_metrics(exp)
    except FileNotFoundError:
        return 0
    return m[-1]["step"] if m else 0


def train_until_killed(args: list[str], exp: str | Path, step: int, timeout_s: float = 600) -> int:
    """Run ``asrlab train ARGS --exp EXP`` and SIGKILL it, and every process under it (torchrun, ranks,
    loader workers), as soon as rank 0 has logged ``step``: a crash at a step. Returns the last step logged."""
    exp = Path(exp)
    return _kill_at(_start(args, exp), exp, step, lambda: last_step(exp), timeout_s)


def _kill_at(started, exp: Path, step: int, steps, timeout_s: float) -> int:
    """SIGKILL the run ``started`` (process, log path, log file) and all under it once ``steps()`` >= ``step``."""
    proc, log_path, log = started
    t0 = time.time()
    bar = widgets.progress(total=step, desc=f"{exp.name}: until step {step}", unit="step")
    try:
        while (now := steps()) < step:
            if now != bar.n:
                bar.update(now - bar.n)
            if proc.poll() is not None:
                raise RuntimeError(f"the run ended (exit {proc.returncode}) before step {step}; see {log_path}")
            if time.time() - t0 > timeout_s:
                raise TimeoutError(f"step {step} not reached in {timeout_s} s")
            time.sleep(0.005)
    finally:
        kill_tree(proc.pid)
        proc.wait()
        log.close()
        bar.close()
    return steps()


def examples_dir() -> Path:
    """``examples/`` of the project (the training loops of one's own that notebook 05 runs): next to the
    notebooks, or next to the package (an editable install run from elsewhere)."""
    for d in (root() / "examples", Path(__file__).resolve().parents[1] / "examples"):
        if (d / "lab_loop.py").exists():
            return d
    raise FileNotFoundError(
        "examples/lab_loop.py not found next to the notebooks or the asrlab package: run from a checkout of the project"
    )


def _loop_start(script: str, exp: Path, nproc: int, fault: str, args: list[str], watch: list[str] | None = None):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        script,
        str(exp if watch is None else exp / "job"),
        *map(str, args),
    ]
    if watch is not None:  # the job as it is, under asrlab watch, which writes into EXP
        cmd = [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(exp), *map(str, watch), "--", *cmd]
    return _spawn(cmd, exp, cwd=examples_dir(), env={"TOY_FAULT": fault, "OMP_NUM_THREADS": "1"})


def run_loop(
    script: str,
    exp: str | Path,
    nproc: int = 2,
    fault: str = "",
    args: list | None = None,
    timeout_s: float = 600,
    watch: list | None = None,
) -> dict:
    """Run ``torchrun --nproc-per-node NPROC examples/SCRIPT EXP ARGS`` (``TOY_FAULT=fault``) to its end,
    with a clock in the page: ``{"exit", "seconds", "log"}`` (the output is in ``EXP.log``). ``watch``: run
    it under ``asrlab watch --exp EXP WATCH --`` instead (the loop's own folder is then ``EXP/job``)."""
    exp = Path(exp)
    proc, log_path, log = _loop_start(script, exp, nproc, fault, args or [], watch)
    t0 = time.time()
    bar = widgets.progress(desc=f"{exp.name}: running", unit="s")
    try:
        while proc.poll() is None:
            if time.time() - t0 > timeout_s:
                raise TimeoutError(f"{script} did not end in {timeout_s} s; see {log_path}")
            time.sleep(0.5)
            bar.update(round(time.time() - t0) - bar.n)
    finally:
        kill_tree(proc.pid)
        proc.wait()
        log.close()
        bar.close()
    return {"exit": proc.returncode, "seconds": round(time.time() - t0, 1), "log": str(log_path)}


def run_loop_until_killed(
    script: str, exp: str | Path, step: int, nproc: int = 2, args: list | None = None, timeout_s: float = 600
) -> int:
    """Run a loop as :func:`run_loop` and SIGKILL every process of it once rank 0's ledger has ``step``
    steps: a crash at a step. Returns the steps rank 0's ledger holds then."""
    exp = Path(exp)
    ledger = ledger_path(exp, 0)

    def steps() -> int:
        return (
            sum(1 for line in ledger.read_text().splitlines() if line.startswith('{"step"')) if ledger.exists() else 0
        )

    return _kill_at(_loop_start(script, exp, nproc, "", args or []), exp, step, steps, timeout_s)


def doctor(exp: str | Path) -> dict:
    """Run ``asrlab doctor EXP --json``, print its diagnosis as the command prints it, return the dict
    (with ``"exit"``: the command's exit code)."""
    r = subprocess.run(
        [sys.executable, "-m", "asrlab.cli", "doctor", str(exp), "--json"], capture_output=True, text=True
    )
    if r.returncode == 2 or not r.stdout.strip():
        raise RuntimeError(f"asrlab doctor {exp} failed: {r.stderr.strip()}")
    d = json.loads(r.stdout)
    said = f"$ asrlab doctor {exp}    # exit {r.returncode}\n\n{format_diagnosis(d).rstrip()}"
    # shown as preformatted text, not printed: ``asrlab doctor`` on this executed notebook reads what the notebook's
    # own run printed, and this diagnosis of another run is none of it
    from IPython.display import display

    display({"text/plain": said, "text/html": f"<pre>{html.escape(said)}</pre>"}, raw=True)
    return {**d, "exit": r.returncode}

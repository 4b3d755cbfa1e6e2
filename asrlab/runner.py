"""``asrlab notebooks``: run every notebook headless with papermill (the main job).

By default executed copies go to ``runs/<notebook>/<notebook>.ipynb``; the notebooks themselves write
their figures to ``runs/figures/`` and their key numbers to ``runs/<notebook>/results.json``. With an output
folder everything goes under it (``DIR/<notebook>/`` and ``DIR/figures/``), so two runs with different
parameters never overwrite each other. The kernels draw explorers as their static views
(``ASRLAB_WIDGETS=static``). A parameter file is YAML: top-level keys apply to every notebook, a key
named after a notebook (``01_stalls:``) holds parameters for that one only (e.g. ``notebooks/params/gpu.yaml``).
While a notebook runs, its progress goes to stderr (:class:`NotebookProgress`): the cell running, the step
of a training run in it, the time left.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import yaml

from .lab import layout
from .errors import UsageError
from .lab.metrics import read_metrics, run_status
from .nb import FIGURES_ENV, RUNS_ENV, root
from .widgets import MODE_ENV


def notebook_params(params_file: str | Path | None, stem: str, available: set[str]) -> dict:
    """The parameters for notebook ``stem`` that it declares (others are left out)."""
    if not params_file:
        return {}
    raw = yaml.safe_load(Path(params_file).read_text()) or {}
    merged = {k: v for k, v in raw.items() if not isinstance(v, dict) or k not in _stems(raw)}
    merged.update(raw.get(stem) or {})
    return {k: v for k, v in merged.items() if k in available}


def _stems(raw: dict) -> set[str]:
    return {k for k in raw if k[:2].isdigit()}


def check_params(params_file: str | Path | None, declared: dict[str, set[str]]) -> None:
    """Refuse a parameter file with a key no notebook would take (a typo would otherwise be dropped).

    ``declared`` maps each notebook's stem to its parameters: a top-level key must be declared by some
    notebook, a per-notebook block must name a notebook and hold only parameters that notebook declares.
    """
    if not params_file:
        return
    raw = yaml.safe_load(Path(params_file).read_text()) or {}
    if not isinstance(raw, dict):
        raise UsageError(f"{params_file}: expected a mapping of parameter names to values")
    anywhere = set().union(*declared.values()) if declared else set()
    errors = []
    for key, value in raw.items():
        if key in _stems(raw):
            if key not in declared:
                errors.append(f"{key}: no such notebook (have {', '.join(sorted(declared))})")
                continue
            if not isinstance(value or {}, dict):
                errors.append(f"{key}: expected that notebook's parameters as a mapping, got {value!r}")
                continue
            for name in sorted(set(value or {}) - declared[key]):
                errors.append(
                    f"{key}.{name}: {key} has no parameter {name!r} (it has {', '.join(sorted(declared[key]))})"
                )
        elif key not in anywhere:
            errors.append(f"{key}: no notebook has this parameter")
    if errors:
        raise UsageError(f"{params_file}: " + "; ".join(errors))


def declared_parameters(nb_path: Path) -> set[str]:
    """Names assigned in the cell tagged ``parameters``."""
    import ast

    nb = json.loads(nb_path.read_text())
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse("".join(cell["source"]))
            return {
                t.id
                for node in tree.body
                if isinstance(node, ast.Assign)
                for t in node.targets
                if isinstance(t, ast.Name)
            }
    return set()


@contextmanager
def kernel_env(values: dict[str, str]):
    """Environment variables the kernels papermill starts inherit, restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_notebooks(
    nb_dir: Path,
    out_dir: Path | None = None,
    only: str | None = None,
    params_file: str | None = None,
    report=print,
    html: bool = False,
    progress=None,
    progress_every_s: float = 12.0,
) -> list[dict]:
    """Execute the notebooks; returns one record per notebook (name, seconds, ok, error, output, html).

    ``out_dir`` None: executed copies under the project's ``runs/``, figures in ``runs/figures/`` (the notebooks'
    own defaults); a folder: everything under it. ``html``: also each executed notebook as a standalone page.
    ``progress``: called with a line of progress when a cell starts and every ``progress_every_s`` seconds
    in between (default: a :class:`StatusLine` on stderr).
    """
    import papermill as pm  # the notebooks extra

    notebooks = sorted(p for p in Path(nb_dir).glob("*.ipynb") if not only or only in p.stem)
    if not notebooks:
        raise UsageError(f"no notebook in {nb_dir}" + (f" matches {only!r}" if only else ""))
    declared = {p.stem: declared_parameters(p) for p in sorted(Path(nb_dir).glob("*.ipynb"))}
    check_params(params_file, declared)
    env = {MODE_ENV: os.environ.get(MODE_ENV, "static")}
    if out_dir is not None:
        out_dir = Path(out_dir).resolve()
        env.update({RUNS_ENV: str(out_dir), FIGURES_ENV: str(out_dir / "figures")})
    runs = out_dir if out_dir is not None else Path(os.environ.get(RUNS_ENV) or root() / "runs")
    records = []
    with kernel_env(env):
        for nb in notebooks:
            out = runs / nb.stem / nb.name
            out.parent.mkdir(parents=True, exist_ok=True)
            params = notebook_params(params_file, nb.stem, declared[nb.stem])
            report(f"{nb.stem}: running" + (f" with {params}" if params else ""))
            t0 = time.time()
            rec = {"notebook": nb.stem, "output": str(out), "ok": True}
            try:
                with (
                    watching(NotebookProgress(out), progress or StatusLine(), progress_every_s),
                    tools_logged_to(out.with_suffix(".log")),
                ):
                    pm.execute_notebook(
                        str(nb),
                        str(out),
                        parameters=params,
                        cwd=str(nb.parent),
                        kernel_name="python3",
                        progress_bar=False,
                    )
            except pm.PapermillExecutionError as e:
                rec.update(ok=False, error=f"cell {e.exec_count} ({e.ename}): {e.evalue}")
            rec["seconds"] = round(time.time() - t0, 1)
            if html and out.exists():
                rec["html"] = str(to_html(out))
            report(f"{nb.stem}: {'ok' if rec['ok'] else 'FAILED at ' + rec['error']} in {rec['seconds']} s")
            records.append(rec)
    return records


class NotebookProgress:
    """What a notebook that papermill executes into ``out`` is doing, read from files: the executed copy
    (papermill saves it as each cell starts and ends) and the newest ``metrics/rank0.jsonl`` of a training
    run under the notebook's run folder (``out``'s folder). Time left in the notebook: the training run's
    own estimate for its cell, and for the cells after it their durations in the previous executed copy
    (read here, before papermill overwrites it); unknown without one.
    """

    def __init__(self, out: str | Path):
        self.out, self.t0 = Path(out), time.time()
        try:
            self.previous = _durations(_read_nb(self.out))
        except (OSError, ValueError, KeyError, TypeError):  # none, or not an executed copy
            self.previous = {}
        self._mtime, self._nb = None, None

    def cell(self) -> dict | None:
        """The code cell running: ``index`` (from 1, among the code cells) of ``cells``, ``what`` (the
        heading above it, else its first line), ``source``, ``started`` (unix s), ``later`` (the sources of
        the code cells after it); None before the first starts."""
        try:
            mtime = self.out.stat().st_mtime
            if mtime != self._mtime:
                nb, self._mtime = _read_nb(self.out), mtime
                started = nb["metadata"].get("papermill", {}).get("start_time")
                if started and datetime.fromisoformat(started).timestamp() >= self.t0:  # not the previous run's
                    self._nb = nb
        except (OSError, ValueError):  # not there yet, or read while papermill writes it: the next look
            pass
        if self._nb is None:
            return None
        code, heading = [], None
        for c in self._nb["cells"]:
            text = _text(c)
            if c["cell_type"] == "markdown" and text.startswith("#"):
                heading = text.splitlines()[0]
            elif c["cell_type"] == "code":
                code.append((c, heading))
        for i, (c, heading) in enumerate(code):
            meta = c.get("metadata", {}).get("papermill", {})
            if meta.get("status") == "running" and meta.get("start_time"):
                first = next((line for line in _text(c).splitlines() if line.strip()), "")
                return {
                    "index": i + 1,
                    "cells": len(code),
                    "what": heading or first,
                    "source": _text(c),
                    "started": datetime.fromisoformat(meta["start_time"]).timestamp(),
                    "later": [_text(c) for c, _ in code[i + 1 :]],
                }
        return None

    def status(self, c: dict | None = None) -> dict | None:
        """:meth:`cell` (or ``c``, a cell it returned), with ``elapsed_s`` and ``cell_s`` (seconds in the
        notebook and in the cell), ``run`` (the live training run's folder, relative to the notebook's run
        folder; None without one) with its ``step``, ``epoch``, ``max_epochs``, ``max_steps`` (``estimated``
        or not), ``s_per_step`` and ``run_left_s`` (see :func:`training_progress`), and
        ``left_s`` (in the notebook; None when unknown)."""
        c = c or self.cell()
        if c is None:
            return None
        now = time.time()
        s = {**c, "elapsed_s": now - self.t0, "cell_s": now - c["started"], "run": None, "run_left_s": None}
        exp = self._live_run(c["started"])
        if exp is not None:
            r = training_progress(exp)
            s.update(
                run=str(exp.relative_to(self.out.parent)),
                step=r["step"],
                epoch=r["epoch"],
                max_epochs=r["max_epochs"],
                max_steps=r["total"],
                estimated=r["estimated"],
                s_per_step=r["s_per_step"],
                run_left_s=r["left_s"],
            )
        prev = self.previous
        cell_left = s["run_left_s"]
        if cell_left is None and c["source"] in prev:
            cell_left = max(0.0, prev[c["source"]] - s["cell_s"])
        known = cell_left is not None and all(src in prev for src in c["later"])
        s["left_s"] = cell_left + sum(prev[src] for src in c["later"]) if known else None
        return s

    def _live_run(self, since: float) -> Path | None:
        """The experiment whose rank 0 metrics changed last, if that was since ``since``."""
        found = [
            p for pattern in ("*/metrics/rank0.jsonl", "*/*/metrics/rank0.jsonl") for p in self.out.parent.glob(pattern)
        ]
        times = {p: p.stat().st_mtime for p in found if p.exists()}
        newest = max(times, key=times.get, default=None)
        return newest.parent.parent if newest is not None and times[newest] >= since else None


def training_progress(exp: Path) -> dict:
    """A training run's ``step``, ``epoch`` (from 0) of ``max_epochs``, ``total`` (the steps it will take:
    its ``train.max_steps``, or fewer by ``train.max_epochs`` at the steps its finished epochs took, then
    ``estimated``; 0 when unknown), ``s_per_step`` and ``left_s`` (by steps, or by ``train.max_minutes``
    counted from its ``config.yaml``, whichever ends it first; None when unknown)."""
    config = Path(exp) / layout.CONFIG
    try:
        started = config.stat().st_mtime
        max_epochs = int(((yaml.safe_load(config.read_text()) or {}).get("train") or {}).get("max_epochs") or 0)
    except (OSError, yaml.YAMLError, AttributeError, ValueError):
        started, max_epochs = time.time(), 0
    r = run_status(exp, time.time() - started)
    total, by_epochs = r["max_steps"], 0
    if max_epochs and r["epoch"]:  # steps count from 1: the first of epoch E follows E epochs' steps
        first = next(m["step"] for m in read_metrics(exp) if m["epoch"] == r["epoch"])
        by_epochs = round((first - 1) / r["epoch"] * max_epochs)
    estimated = by_epochs > 0 and (not total or by_epochs < total)
    total = by_epochs if estimated else total
    left = [] if r["left_s"] is None else [r["left_s"]]
    if total and r["s_per_step"]:
        left.append(max(0, total - r["step"]) * r["s_per_step"])
    return {
        "step": r["step"],
        "epoch": r["epoch"],
        "max_epochs": max_epochs,
        "total": total,
        "estimated": estimated,
        "s_per_step": r["s_per_step"],
        "left_s": min(left) if left else None,
    }


def _read_nb(path: Path) -> dict:
    return json.loads(path.read_text())


def _text(cell: dict) -> str:
    src = cell.get("source", "")
    return ("".join(src) if isinstance(src, list) else src).strip()


def _durations(nb: dict) -> dict[str, float]:
    """Seconds each code cell took in an executed copy, by the cell's source."""
    return {
        _text(c): c["metadata"]["papermill"]["duration"]
        for c in nb.get("cells", [])
        if c["cell_type"] == "code" and c.get("metadata", {}).get("papermill", {}).get("duration") is not None
    }


def format_progress(stem: str, s: dict) -> str:
    """One line of :meth:`NotebookProgress.status`: ``00_quickstart: cell 6/10 (## 4 · Train) for 2m05s; exp:
    epoch 3/8, step 340/~1152, 0.74 s/step, about 10m00s left; notebook: 3m02s so far, about 11m20s left``."""
    what = s["what"] if len(s["what"]) <= 50 else s["what"][:49] + "…"
    line = f"{stem}: cell {s['index']}/{s['cells']} ({what}) for {_hms(s['cell_s'])}"
    if s["run"] is not None:
        by_epochs = s["max_epochs"] and s["epoch"] is not None and (s["estimated"] or not s["max_steps"])
        line += f"; {s['run']}: " + (f"epoch {s['epoch'] + 1}/{s['max_epochs']}, " if by_epochs else "")
        line += f"step {s['step']}" + (f"/{'~' * s['estimated']}{s['max_steps']}" if s["max_steps"] else "")
        if s["s_per_step"]:
            line += f", {s['s_per_step']:.2f} s/step"
        if s["run_left_s"] is not None:
            line += f", about {_hms(s['run_left_s'])} left"
    line += f"; notebook: {_hms(s['elapsed_s'])} so far"
    return line + (f", about {_hms(s['left_s'])} left" if s["left_s"] is not None else "")


def _hms(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class StatusLine:
    """Progress lines on ``stream`` (stderr): on a terminal one line redrawn in place, else a line each."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty, self.shown = self.stream.isatty(), False

    def __call__(self, line: str) -> None:
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            self.stream.write("\r\033[K" + line[:width])
            self.shown = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        """Clear a line left on the terminal (the next report takes its place)."""
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


TOOLS = (
    "papermill",
    "nbclient",
    "jupyter_client",
    "traitlets",
)  # their own log lines: the run's file, not the terminal


@contextmanager
def tools_logged_to(path: Path):
    """While a notebook runs, papermill's and the kernel client's own log lines (the notebook's paths, the
    kernel's start, its warnings) go to ``path`` beside the executed copy, not between the progress lines."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    kept = []
    for name in TOOLS:
        lg = logging.getLogger(name)
        kept.append((lg, lg.propagate))
        lg.addHandler(handler)
        lg.propagate = False
    try:
        yield
    finally:
        for lg, propagate in kept:
            lg.removeHandler(handler)
            lg.propagate = propagate
        handler.close()


@contextmanager
def watching(progress: NotebookProgress, emit, every_s: float = 12.0):
    """While the body runs, ``emit(line)`` when a cell starts and every ``every_s`` seconds in between."""
    stem, stop = progress.out.stem, threading.Event()

    def watch():
        shown, at = None, 0.0
        while not stop.wait(min(1.0, every_s)):
            try:
                c = progress.cell()
                if c is not None and (c["index"] != shown or time.time() - at >= every_s):
                    emit(format_progress(stem, progress.status(c)))
                    shown, at = c["index"], time.time()
            except (OSError, ValueError, KeyError, TypeError):  # files mid-write: the next look
                pass

    thread = threading.Thread(target=watch, name=f"progress of {stem}", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()
        if hasattr(emit, "done"):
            emit.done()


def to_html(notebook: str | Path) -> Path:
    """An executed notebook as a standalone HTML page beside it (nbconvert; figures embedded)."""
    import nbformat
    from nbconvert import HTMLExporter

    notebook = Path(notebook)
    body, _ = HTMLExporter(embed_images=True).from_notebook_node(nbformat.read(notebook, as_version=4))
    path = notebook.with_suffix(".html")
    path.write_text(body)
    return path

"""The notebooks under nbval: each run once in the suite, with the small parameters of
``notebooks/params/small.yaml``; the committed notebooks keep their full defaults (``asrlab notebooks``).

nbval executes a parameterized copy of each notebook (written under pytest's temporary folder; the
notebook's node keeps its own path, so ``pytest notebooks/01_stalls.ipynb`` selects it as before). The
kernels write their runs and figures under that folder too, not into the project's ``runs/`` and
``figures/``, and draw explorers as their static views, as under ``asrlab notebooks``.

A test marked ``executes_notebook(stem)`` (the browser test: Run All Cells in JupyterLab, checking every
cell ran and none raised) is that notebook's execution when it is collected and not skipped: nbval's
cells of that notebook are then deselected, and the collection report says so.
"""

from __future__ import annotations

import os

# One intra-op thread in every process of the suite (a value the caller sets wins): three workers, each test
# often with two ranks, already fill the two cores, and torch's default of a thread per core in each
# process spent minutes of CPU contending (docs/benchmarks.md). Set before torch loads, here and in every
# process a test starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The suite starts some five hundred Pythons (ranks, launchers, kernels, the doctor): with bytecode writing
# off (PYTHONDONTWRITEBYTECODE, set on some machines) each compiled asrlab's and the tests' modules again.
# The caches go to the gitignored __pycache__ folders.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from collections import Counter
from pathlib import Path

import nbformat
import pytest
from _pytest.compat import legacy_path
from nbval.plugin import IPyNbFile

from asrlab.nb import FIGURES_ENV, RUNS_ENV
from asrlab.runner import declared_parameters, kernel_env, notebook_params
from asrlab.widgets import MODE_ENV

ROOT = Path(__file__).resolve().parent
NOTEBOOKS = ROOT / "notebooks"
SMALL_PARAMS = NOTEBOOKS / "params" / "small.yaml"

# The files that run longest (docs/benchmarks.md has their times), started first and longest first: a long
# file started late ends the run alone on one worker while the others idle. The other files follow in
# pytest-xdist's own order (most tests first). Each file stays on one worker (--dist loadfile).
LONGEST_FIRST = (
    "tests/test_browser.py",
    "tests/test_lab.py",
    "tests/test_resume.py",
    "tests/test_watch.py",
    "tests/test_watch_launchers.py",
    "tests/test_nodes.py",
    "tests/test_stalls.py",
    "tests/test_lifecycle.py",
    "tests/test_watch_reading.py",
    "tests/test_resume_loaders.py",
    "tests/test_lightning_runs.py",
)

_WORK = pytest.StashKey[Path]()
_RAN_ELSEWHERE = pytest.StashKey[list]()


class SmallNotebook(IPyNbFile):
    """A shipped notebook as nbval runs it: its copy with the small parameters."""

    copy: Path | None = None

    @property
    def fspath(self):
        # nbval reads the cells and starts the kernel (its working folder) from ``fspath``; pytest names and
        # selects the node by ``path``, which stays the shipped notebook's
        return legacy_path(self.copy or self.path)

    def collect(self):
        # papermill only where notebooks are collected
        from papermill.iorw import load_notebook_node
        from papermill.parameterize import parameterize_notebook

        work = _work(self.config)
        params = notebook_params(SMALL_PARAMS, self.path.stem, declared_parameters(self.path))
        self.copy = work / self.path.name
        nbformat.write(parameterize_notebook(load_notebook_node(str(self.path)), params), self.copy)
        return super().collect()

    def setup(self):
        work = _work(self.config)
        with kernel_env(
            {
                RUNS_ENV: str(work / "runs"),
                FIGURES_ENV: str(work / "figures"),
                MODE_ENV: os.environ.get(MODE_ENV, "static"),
            }
        ):  # the kernel started now inherits these
            super().setup()


def _work(config) -> Path:
    """The session's folder for the copies and what their kernels write (pytest's temporary folder)."""
    if _WORK not in config.stash:
        config.stash[_WORK] = config._tmp_path_factory.mktemp("notebooks")
    return config.stash[_WORK]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "executes_notebook(stem): this test runs that shipped notebook to its end "
        "and checks every cell ran and none raised (nbval's run of it is deselected)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path, parent):
    """nbval's node of a shipped notebook, replaced by its small-parameter run (other files as they are)."""
    nodes = yield
    if file_path.parent != NOTEBOOKS:
        return nodes
    return [SmallNotebook.from_parent(parent, path=file_path) if type(n) is IPyNbFile else n for n in nodes]


def _will_run(item) -> bool:
    """Whether ``item`` runs rather than skips; a skip condition other than a plain False counts as a skip."""
    if any(item.iter_markers("skip")):
        return False
    return all((m.args[0] if m.args else m.kwargs.get("condition")) is False for m in item.iter_markers("skipif"))


@pytest.hookimpl(trylast=True)  # after -k, -m and --deselect have had their say
def pytest_collection_modifyitems(config, items):
    runners = {}
    for item in items:
        for mark in item.iter_markers("executes_notebook"):
            if _will_run(item):
                runners.setdefault(mark.args[0], item.nodeid)
    keep, dropped, notes = [], [], {}
    for item in items:
        nb = item.parent if isinstance(item.parent, SmallNotebook) else None
        if nb is not None and nb.path.stem in runners:
            dropped.append(item)
            notes.setdefault(nb.path.stem, [nb.nodeid, 0])[1] += 1
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    _longest_first(items)
    config.stash[_RAN_ELSEWHERE] = [
        f"nbval: {nodeid} ({n} cells) deselected: {runners[stem]} runs it" for stem, (nodeid, n) in notes.items()
    ]


def _longest_first(items) -> None:
    """The files of :data:`LONGEST_FIRST` first, in its order, then the rest by their number of tests; each
    file's tests stay together and in their order (the sort is stable)."""
    files = [item.nodeid.split("::")[0] for item in items]
    counts, place = Counter(files), {f: i for i, f in enumerate(LONGEST_FIRST)}
    order = {id(item): (place.get(f, len(place)), -counts[f], f) for item, f in zip(items, files)}
    items.sort(key=lambda item: order[id(item)])


def pytest_report_collectionfinish(config):
    return config.stash.get(_RAN_ELSEWHERE, [])

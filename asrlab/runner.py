"""``asrlab notebooks``: run every notebook headless with papermill (the main job).

By default executed copies go to ``runs/<notebook>/<notebook>.ipynb``; the notebooks themselves write
their figures to ``figures/`` and their key numbers to ``runs/<notebook>/results.json``. With an output
folder everything goes under it (``DIR/<notebook>/`` and ``DIR/figures/``), so two runs with different
parameters never overwrite each other. The kernels draw explorers as their static views
(``ASRLAB_WIDGETS=static``). A parameter file is YAML: top-level keys apply to every notebook, a key
named after a notebook (``01_stalls:``) holds parameters for that one only (e.g. ``notebooks/params/gpu.yaml``).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

from .errors import UsageError
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
                errors.append(f"{key}.{name}: {key} has no parameter {name!r} "
                              f"(it has {', '.join(sorted(declared[key]))})")
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
            return {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Name)}
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


def run_notebooks(nb_dir: Path, out_dir: Path | None = None, only: str | None = None, params_file: str | None = None,
                  report=print, html: bool = False) -> list[dict]:
    """Execute the notebooks; returns one record per notebook (name, seconds, ok, error, output, html).

    ``out_dir`` None: executed copies under the project's ``runs/``, figures in ``figures/`` (the notebooks'
    own defaults); a folder: everything under it. ``html``: also each executed notebook as a standalone page.
    """
    import papermill as pm  # the notebooks extra

    declared = {p.stem: declared_parameters(p) for p in sorted(Path(nb_dir).glob("*.ipynb"))}
    check_params(params_file, declared)
    notebooks = sorted(p for p in Path(nb_dir).glob("*.ipynb") if not only or only in p.stem)
    if not notebooks:
        raise UsageError(f"no notebook in {nb_dir}" + (f" matches {only!r}" if only else ""))
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
                pm.execute_notebook(str(nb), str(out), parameters=params, cwd=str(nb.parent), kernel_name="python3",
                                    progress_bar=False)
            except pm.PapermillExecutionError as e:
                rec.update(ok=False, error=f"cell {e.exec_count} ({e.ename}): {e.evalue}")
            rec["seconds"] = round(time.time() - t0, 1)
            if html and out.exists():
                rec["html"] = str(to_html(out))
            report(f"{nb.stem}: {'ok' if rec['ok'] else 'FAILED at ' + rec['error']} in {rec['seconds']} s")
            records.append(rec)
    return records


def to_html(notebook: str | Path) -> Path:
    """An executed notebook as a standalone HTML page beside it (nbconvert; figures embedded)."""
    import nbformat
    from nbconvert import HTMLExporter

    notebook = Path(notebook)
    body, _ = HTMLExporter(embed_images=True).from_notebook_node(nbformat.read(notebook, as_version=4))
    path = notebook.with_suffix(".html")
    path.write_text(body)
    return path

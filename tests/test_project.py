"""The project keeps its promises: CI runs the README's commands, the environment matches pyproject."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def readme_block(title):
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"{title}.*?```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert m, f"README has no code block after {title!r}"
    return [ln for ln in m.group(1).splitlines() if ln.strip() and not ln.startswith("#")]


def test_ci_runs_exactly_the_readme_setup_and_test_commands():
    """After installing Debian's Chromium where it can (for the browser test), CI runs the README's two commands."""
    ci = [
        ln.strip()
        for ln in (ROOT / ".ci" / "run").read_text().splitlines()
        if ln.strip() and not ln.startswith(("#", "set ", "cd "))
    ]
    assert ci[-2:] == readme_block("### Set up") + readme_block("### Test")
    assert all("chromium" in ln or "clone/asrlab" in ln for ln in ci[:-2]) and len(ci) <= 4


def test_environment_yml_agrees_with_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = env["dependencies"]
    assert "python=3.11" in deps and "conda-forge" in env["channels"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    assert pip == ["-e .[dev]"]
    extras = project["optional-dependencies"]
    # dev is every other extra together, so `-e .[dev]` installs everything
    assert set(extras["dev"]) == set().union(*(extras[k] for k in extras if k != "dev"))
    names = {re.split(r"[=<>\[ ]", d)[0] for d in project["dependencies"]}
    assert {"torch", "torchaudio", "soundfile", "numpy", "espeakng-loader", "zstandard", "tqdm", "pyyaml"} <= names
    pins = {d.split("==")[0]: d.split("==")[1] for d in project["dependencies"] if "==" in d}
    assert pins["torch"] == pins["torchaudio"] == "2.11.0"  # torchaudio loads only against its own torch


def test_every_shipped_notebook_is_clean_and_parameterized():
    import json

    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert "parameters" in code[0].get("metadata", {}).get("tags", []), (
            f"{nb_path.name}: first code cell is not tagged parameters"
        )
        assert not any(c.get("outputs") or c.get("execution_count") for c in code), f"{nb_path.name} has stored outputs"


def test_papermill_reads_every_notebook_parameter():
    """``papermill --help-notebook`` lists each parameter (a second '=' on a line hides it from papermill)."""
    import papermill

    from asrlab.runner import declared_parameters

    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert set(papermill.inspect_notebook(str(nb_path))) == declared_parameters(nb_path), nb_path.name


def test_shipped_parameter_files_name_only_what_the_notebooks_take():
    """Every key of ``notebooks/params/*.yaml`` reaches a notebook, and its configs and overrides load."""
    from asrlab.config import load_config
    from asrlab.runner import _stems, check_params, declared_parameters

    declared = {p.stem: declared_parameters(p) for p in (ROOT / "notebooks").glob("*.ipynb")}
    files = sorted((ROOT / "notebooks" / "params").glob("*.yaml"))
    assert files
    for path in files:
        check_params(path, declared)
        raw = yaml.safe_load(path.read_text())
        for stem in _stems(raw):
            block = {**{k: v for k, v in raw.items() if k not in _stems(raw)}, **raw[stem]}
            if "config" in block or "overrides" in block:  # raises on an unknown key or a bad value
                load_config(block.get("config", "tiny"), block.get("overrides", []))


def test_the_trainer_is_built_from_the_public_parts_not_beside_them():
    """asrlab's trainer stays a loop over the parts a user's loop gets (asrlab.lab): one NonFiniteHalt (the
    numerics guard's), RNG states captured and set only by the parts, and a trainer short enough to read."""
    import ast

    from asrlab import lab
    from asrlab.lab.numerics import guard
    from asrlab.lab.state import run_state
    from asrlab.train import step, trainer

    train = ROOT / "asrlab" / "train"
    assert len((train / "trainer.py").read_text().splitlines()) <= 400
    halts = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "asrlab").rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "NonFiniteHalt"
    ]
    assert halts == ["asrlab/lab/numerics/guard.py"]
    rng_calls = {"get_rng_state", "set_rng_state", "getstate", "setstate"}  # torch's (CPU, CUDA), Python's
    for path in sorted(train.glob("*.py")):
        called = {
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
        }
        assert not called & rng_calls, f"{path.name} captures or sets RNG states itself: {called & rng_calls}"
    assert step.NumericsGuard is lab.NumericsGuard and trainer.UnevenGuard is lab.UnevenGuard
    from asrlab.train import checkpoints

    assert checkpoints.RunState is run_state.RunState and checkpoints.NonFiniteHalt is guard.NonFiniteHalt

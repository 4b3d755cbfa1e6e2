"""The notebook runner: parameter files, failures named by cell."""

import json

import nbformat
import pytest

from asrlab.runner import declared_parameters, notebook_params, run_notebooks


def write_nb(path, *cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_parameter_file_merges_global_and_per_notebook_keys(tmp_path):
    nb = tmp_path / "01_x.ipynb"
    write_nb(nb, "nproc = 1\nbackend = 'gloo'\nutts = 10")
    assert declared_parameters(nb) == {"nproc", "backend", "utts"}
    params = tmp_path / "p.yaml"
    params.write_text("nproc: 8\nbackend: nccl\nunrelated: 1\n01_x:\n  utts: 99\n02_y:\n  utts: 5\n")
    assert notebook_params(params, "01_x", declared_parameters(nb)) == {"nproc": 8, "backend": "nccl", "utts": 99}


def test_runner_executes_and_names_the_failing_cell(tmp_path):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    write_nb(nbs / "01_ok.ipynb", "x = 1", "y = x + 1")
    write_nb(nbs / "02_broken.ipynb", "x = 1", "raise RuntimeError('boom')")
    records = run_notebooks(nbs, tmp_path / "runs", report=lambda m: None)
    ok, broken = records
    assert ok["ok"] and (tmp_path / "runs" / "01_ok" / "01_ok.ipynb").exists()
    assert not broken["ok"] and "cell 2" in broken["error"] and "boom" in broken["error"]
    with pytest.raises(ValueError, match="no notebook"):
        run_notebooks(nbs, tmp_path / "runs", only="nothing-matches", report=lambda m: None)


def test_a_parameter_the_notebooks_do_not_take_is_refused_before_any_runs(tmp_path):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    write_nb(nbs / "01_x.ipynb", "utts = 10", "open('ran', 'w')")
    for text, why in [("utt: 5\n", "utt: no notebook has this parameter"),
                      ("01_x:\n  nproc: 2\n", "01_x has no parameter 'nproc'"),
                      ("02_y:\n  utts: 5\n", "02_y: no such notebook"),
                      ("01_x: 5\n", "01_x: expected")]:
        params = tmp_path / "p.yaml"
        params.write_text(text)
        with pytest.raises(ValueError, match=why):
            run_notebooks(nbs, tmp_path / "runs", params_file=str(params), report=lambda m: None)
    assert not (tmp_path / "runs").exists()
    params.write_text("utts: 3\n01_x:\n  utts: 4\n")
    assert run_notebooks(nbs, tmp_path / "runs", params_file=str(params), report=lambda m: None)[0]["ok"]


def test_out_puts_everything_a_run_writes_under_one_folder(tmp_path):
    """Executed copies, results.json, experiment folders and figures under --out; kernels draw static views;
    --html writes a standalone page with the figures in it."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    write_nb(nbs / "01_x.ipynb", "n = 1",
             "import os\nimport matplotlib.pyplot as plt\nfrom asrlab import nb, widgets\n"
             "(nb.run_dir('01_x') / 'exp').mkdir(exist_ok=True)\n"
             "fig, ax = plt.subplots(); ax.plot([1, 2]); nb.save_figure(fig, 'x_fig'); plt.show()\n"
             "bar = widgets.progress(total=2); bar.update(2); bar.close()\n"
             "nb.save_results('01_x', {'mode': os.environ.get('ASRLAB_WIDGETS'), 'live': widgets.interactive()})")
    out = tmp_path / "elsewhere"
    rec = run_notebooks(nbs, out, report=lambda m: None, html=True)[0]
    assert rec["ok"], rec
    assert (out / "01_x" / "01_x.ipynb").exists() and (out / "01_x" / "exp").is_dir()
    assert (out / "figures" / "x_fig.png").exists()
    assert json.loads((out / "01_x" / "results.json").read_text()) == {"mode": "static", "live": False}
    page = (out / "01_x" / "01_x.html").read_text()
    assert rec["html"] == str(out / "01_x" / "01_x.html") and "<img" in page and "data:image/png;base64" in page
    assert "widgets" not in nbformat.read(out / "01_x" / "01_x.ipynb", as_version=4).metadata  # no widget state
    assert not (tmp_path / "runs").exists() and not (tmp_path / "figures").exists() and not (nbs / "figures").exists()

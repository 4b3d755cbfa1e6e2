"""The notebook runner: parameter files, failures named by cell, progress while a notebook runs."""

import datetime
import io
import json
import time

import nbformat
import pytest

from asrlab.runner import (
    NotebookProgress,
    StatusLine,
    declared_parameters,
    format_progress,
    notebook_params,
    run_notebooks,
    training_progress,
)


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


def test_runner_executes_and_names_the_failing_cell(tmp_path, caplog):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    write_nb(nbs / "01_ok.ipynb", "x = 1", "y = x + 1")
    write_nb(nbs / "02_broken.ipynb", "x = 1", "raise RuntimeError('boom')")
    caplog.set_level("INFO")
    records = run_notebooks(nbs, tmp_path / "runs", report=lambda m: None)
    ok, broken = records
    assert ok["ok"] and (tmp_path / "runs" / "01_ok" / "01_ok.ipynb").exists()
    # papermill's own lines went to the file beside the executed copy, not to the terminal's log
    assert "Input Notebook" in (tmp_path / "runs" / "01_ok" / "01_ok.log").read_text()
    assert not [r for r in caplog.records if r.name.split(".")[0] in ("papermill", "nbclient", "traitlets")]
    assert not broken["ok"] and "cell 2" in broken["error"] and "boom" in broken["error"]
    with pytest.raises(ValueError, match="no notebook"):
        run_notebooks(nbs, tmp_path / "runs", only="nothing-matches", report=lambda m: None)


def test_a_parameter_the_notebooks_do_not_take_is_refused_before_any_runs(tmp_path):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    write_nb(nbs / "01_x.ipynb", "utts = 10", "open('ran', 'w')")
    for text, why in [
        ("utt: 5\n", "utt: no notebook has this parameter"),
        ("01_x:\n  nproc: 2\n", "01_x has no parameter 'nproc'"),
        ("02_y:\n  utts: 5\n", "02_y: no such notebook"),
        ("01_x: 5\n", "01_x: expected"),
    ]:
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
    write_nb(
        nbs / "01_x.ipynb",
        "n = 1",
        "import os\nimport matplotlib.pyplot as plt\nfrom asrlab import nb, widgets\n"
        "(nb.run_dir('01_x') / 'exp').mkdir(exist_ok=True)\n"
        "fig, ax = plt.subplots(); ax.plot([1, 2]); nb.save_figure(fig, 'x_fig'); plt.show()\n"
        "bar = widgets.progress(total=2); bar.update(2); bar.close()\n"
        "nb.save_results('01_x', {'mode': os.environ.get('ASRLAB_WIDGETS'), 'live': widgets.interactive()})",
    )
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


TRAIN_CELL = """import json, time
from asrlab import nb
exp = nb.run_dir('01_x') / 'exp'
(exp / 'metrics').mkdir(parents=True, exist_ok=True)
(exp / 'config.yaml').write_text('train:\\n  max_steps: 8\\n')
for step in range(1, 5):
    with open(exp / 'metrics' / 'rank0.jsonl', 'a') as f:
        f.write(json.dumps({'step': step, 'epoch': 0, 'lr': 0.1, 'loss': 1.0, 'step_s': 0.4,
                            'time': time.time()}) + '\\n')
    time.sleep(0.4)
time.sleep(1.5)"""


def test_progress_names_the_cell_running_and_the_step_of_its_training_run(tmp_path):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("n = 1"),
        nbformat.v4.new_markdown_cell("## Train the toy\nIt learns."),
        nbformat.v4.new_code_cell(TRAIN_CELL),
        nbformat.v4.new_code_cell("done = True"),
    ]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, nbs / "01_x.ipynb")
    lines = []
    rec = run_notebooks(nbs, tmp_path / "runs", report=lambda m: None, progress=lines.append, progress_every_s=0.5)[0]
    assert rec["ok"], rec
    training = [line for line in lines if line.startswith("01_x: cell 2/3 (## Train the toy)")]
    assert training, lines
    assert any("exp: step " in line and "/8, " in line and "left" in line for line in training), lines
    assert not any("left" in line.split("notebook:")[1] for line in lines)  # no earlier run to go by


def test_time_left_from_the_run_and_the_previous_executed_copy(tmp_path):
    """The training run's estimate for its cell, the previous run's durations for the cells after it; a copy
    from before this run is not mistaken for it."""
    out = tmp_path / "01_x" / "01_x.ipynb"
    out.parent.mkdir()

    def executed(start, statuses, durations):
        nb = nbformat.v4.new_notebook()
        nb.metadata["papermill"] = {"start_time": start}
        nb.cells = [nbformat.v4.new_markdown_cell("## Train")]
        nb.cells += [nbformat.v4.new_code_cell(src) for src in ("a = 1", "train()", "plot()", "save()")]
        for c, status, d in zip(nb.cells[1:], statuses, durations):
            c.metadata["papermill"] = {"status": status, "duration": d, "start_time": start}
        nbformat.write(nb, out)

    executed("2020-01-01T00:00:00+00:00", ["completed"] * 4, [1.0, 300.0, 20.0, 5.0])
    progress = NotebookProgress(out)
    assert progress.cell() is None  # the previous run's copy
    now = datetime.datetime.fromtimestamp(time.time(), datetime.timezone.utc).isoformat()
    exp = tmp_path / "01_x" / "exp"
    (exp / "metrics").mkdir(parents=True)
    (exp / "config.yaml").write_text("train:\n  max_steps: 100\n")
    time.sleep(0.05)
    executed(now, ["completed", "running", "pending", "pending"], [1.0, None, None, None])
    t = time.time()
    (exp / "metrics" / "rank0.jsonl").write_text(
        "".join(
            json.dumps({"step": k, "epoch": 0, "lr": 0.1, "loss": 1.0, "step_s": 2.0, "time": t - 2 * (40 - k)}) + "\n"
            for k in range(21, 41)
        )
    )
    s = progress.status()
    assert (s["index"], s["cells"], s["what"]) == (2, 4, "## Train")
    assert (s["run"], s["step"], s["max_steps"]) == ("exp", 40, 100)
    assert s["run_left_s"] == pytest.approx(120) and s["left_s"] == pytest.approx(120 + 25)
    line = format_progress("01_x", s)
    assert line.startswith("01_x: cell 2/4 (## Train) for ")
    assert "; exp: step 40/100, 2.00 s/step, about 2m00s left; notebook: " in line
    assert line.endswith("about 2m25s left")

    (exp / "config.yaml").write_text("train:\n  max_epochs: 4\n  max_steps: 0\n")  # epochs decide
    (exp / "metrics" / "rank0.jsonl").write_text(
        "".join(  # epoch 0 took 10 steps: 40 in all
            json.dumps(
                {"step": k, "epoch": int(k > 10), "lr": 0.1, "loss": 1.0, "step_s": 2.0, "time": t - 2 * (15 - k)}
            )
            + "\n"
            for k in range(1, 16)
        )
    )
    r = training_progress(exp)
    assert (r["step"], r["epoch"], r["total"], r["estimated"], r["left_s"]) == (15, 1, 40, True, pytest.approx(50))
    assert "; exp: epoch 2/4, step 15/~40, 2.00 s/step, about 50s left; " in format_progress("01_x", progress.status())

    tty = io.StringIO()
    tty.isatty = lambda: True
    status = StatusLine(tty)
    status("one")
    status("two")
    status.done()
    assert tty.getvalue() == "\r\033[Kone\r\033[Ktwo\r\033[K"

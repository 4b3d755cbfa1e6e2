"""Explorers, both ways: built from small real runs, drawn as widgets (controls change what is shown)
and as the static view headless runs get (no widget created)."""

from pathlib import Path
import asyncio
import json
import math
import os
import subprocess
import sys
import time

import ipywidgets
import pytest
import torch

from asrlab import nb, widgets
from asrlab.config import load_config
from asrlab.decode import decode_exp
from asrlab.lab.state import checkpoint
from asrlab.lab.dist import DistInfo
from asrlab.lab.metrics import read_metrics
from asrlab.train.trainer import Trainer

from conftest import SMALL

CPU = DistInfo(0, 1, 0, torch.device("cpu"), None)
PNG = b"\x89PNG"


@pytest.fixture(autouse=True)
def live(monkeypatch):
    monkeypatch.setenv(widgets.MODE_ENV, "live")


def widget_count():
    from ipywidgets.widgets.widget import _instances

    return len(_instances)


def is_png(value) -> bool:
    return bytes(value).startswith(PNG)


def find(box, cls):
    """Every widget of type ``cls`` under ``box``, depth first."""
    out = [box] if isinstance(box, cls) else []
    for child in getattr(box, "children", ()):
        out += find(child, cls)
    return out


def static_parts(explorer):
    """The static view, checked to create no widget."""
    before = widget_count()
    parts = explorer.static()
    assert widget_count() == before and parts
    assert all(is_png(p) if isinstance(p, bytes) else isinstance(p, str) for p in parts)
    return parts


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """6 steps with a ledger, a timeline, numerics sampled every step and an overflow planted at step 4;
    then greedy and lexicon decoding of the same list."""
    exp = tmp_path_factory.mktemp("run") / "exp"
    cfg = load_config(
        "tiny",
        SMALL
        + [
            "train.max_steps=6",
            "train.diagnostics_every=1",
            "train.ledger=true",
            "train.timeline=true",
            "train.max_epochs=2",
        ],
    )
    tr = Trainer(cfg, str(corpus / "data.list"), str(corpus / "data.list"), exp, CPU)
    target = dict(tr.model.named_modules())["blocks.0.ff1.net.0"]
    forward = target.forward
    target.forward = lambda *a, **k: forward(*a, **k) * (math.inf if (tr.guard.replaying or tr.step + 1) == 4 else 1.0)
    tr.fit()
    tr.close()
    decoded = decode_exp(exp, corpus / "data.list", name="train", lexicon_from=corpus / "data.list", device="cpu")
    return exp, decoded


def test_mode_follows_the_environment(monkeypatch):
    monkeypatch.setenv(widgets.MODE_ENV, "static")
    assert not widgets.interactive()
    monkeypatch.setenv(widgets.MODE_ENV, "live")
    assert widgets.interactive()
    monkeypatch.setenv(widgets.MODE_ENV, "auto")
    assert not widgets.interactive()  # no kernel here
    monkeypatch.setenv(widgets.MODE_ENV, "sometimes")
    with pytest.raises(ValueError, match="expected auto, live or static"):
        widgets.interactive()


def test_a_live_views_fallback_holds_every_part_of_the_static_view():
    """What a saved notebook shows where widgets are not drawn (one papermill ran, a page on the web): the static
    view's words (the doctor's verdict) and its figures, in order, not the first figure alone."""
    from asrlab.widgets.base import fallback

    b = fallback(["<p>NONFINITE: at step 40</p>", b"\x89PNG one", "<p>warnings</p>", b"\x89PNG two"])
    assert b["text/html"].startswith('<p>NONFINITE: at step 40</p><img src="data:image/png;base64,')
    assert b["text/html"].count("<img") == 2 and b["text/html"].index("warnings") < b["text/html"].rindex("<img")
    assert b["image/png"] and fallback([]) == {}


def test_static_mode_shows_the_static_view_and_creates_no_widget(run, monkeypatch, capsys):
    exp, _ = run
    monkeypatch.setenv(widgets.MODE_ENV, "static")
    before = widget_count()
    widgets.NanExplorer(exp).show()
    widgets.StallExplorer(exp).show()
    assert widget_count() == before
    assert "Image object" in capsys.readouterr().out  # IPython's display, outside a kernel, prints the repr


def test_utterance_browser(run, corpus):
    exp, decoded = run
    b = widgets.UtteranceBrowser(corpus / "data.list", decoded["hyps_path"], decoded["lexicon"]["hyps_path"])
    assert b.total == 120 and len(b.audio) == 120
    wrong = b.select(errors_only=True)
    assert wrong and all(b._errors(r) > 0 for r in wrong)  # an untrained model: errors everywhere
    html = static_parts(b)[0]
    assert "have a character error" in html and wrong[0]["key"] in html and ('class="d"' in html or 'class="s"' in html)
    box = b.widget()
    pick = find(box, ipywidgets.Select)[0]
    text, player, picture = b.text.value, b.player.value, b.picture.value
    assert bytes(player)[:4] == b"RIFF" and is_png(picture) and wrong[0]["key"] in text
    pick.value = pick.options[1][1]
    assert b.text.value != text and b.player.value != player and b.picture.value != picture
    b.errors_only.value = False
    assert len(pick.options) == 120


def test_error_marks_follow_the_alignment():
    from asrlab.widgets.utterances import marked

    html = marked("one two", "on too")
    assert '<span class="d">e</span>' in html and '<span class="s" title="reference: \'w\'">o</span>' in html
    assert marked("go", "go") == "go" and '<span class="i">x</span>' in marked("go", "gox")


def test_voices_filter_on_the_embedded_corpus_keys(tmp_path):
    from asrlab.data.audio import encode_wav
    from asrlab.data.shards import write_split
    from asrlab.data.synth import voice_of

    assert voice_of("test-en-029_m7-000012") == {"split": "test", "accent": "en-029", "variant": "m7"}
    assert voice_of("utt00001") is None and voice_of("BAC009S0002W0122") is None
    keys = ["test-en-029_m7-000001", "test-en-sc_f2-000002", "test-en-sc_m7-000003"]
    wav = encode_wav((torch.zeros(4000)).numpy(), 16000)
    write_split(((k, "go", wav) for k in keys), tmp_path / "d", "test", shard_size=10)
    hyps = tmp_path / "hyps.txt"
    hyps.write_text("".join(f"{k}\tgo\t{h}\n" for k, h in zip(keys, ["go", "no", "g"])))
    b = widgets.UtteranceBrowser(tmp_path / "d" / "data.list", hyps)
    b.widget()
    assert [o for o, _ in b.accent.options] == ["all accents", "en-029", "en-sc"]
    b.accent.value = "en-sc"
    assert [k for _, k in b.pick.options] == keys[1:]
    b.variant.value = "m7"
    assert [k for _, k in b.pick.options] == keys[2:]


def test_nan_explorer(run):
    exp, _ = run
    ex = widgets.NanExplorer(exp)
    assert ex.bad_step == 4 and ex.focus == 3
    static_parts(ex)
    box = ex.widget()
    slider = find(box, ipywidgets.SelectionSlider)[0]
    assert list(slider.options) == [t["step"] for t in ex.traces] and slider.value == 3
    before = ex.step_picture.value
    slider.value = 1
    assert ex.step_picture.value != before and is_png(ex.step_picture.value)
    before = ex.module_picture.value
    ex.module.value = ex.modules[-1]
    assert ex.module_picture.value != before


def test_stall_explorer_of_a_stalled_run(corpus, tmp_path):
    """A real stall: one rank blocked in its data; the watchdog writes the report the explorer reads."""
    exp = tmp_path / "exp"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "asrlab.cli",
            "train",
            "--data",
            str(corpus / "data.list"),
            "--exp",
            str(exp),
            "--stall-timeout",
            "3",
            "train.timeline=true",
            "data.inject_delay_s=3600",
            "data.inject_delay_ranks=[0]",
            "data.inject_delay_from_batch=3",
            *SMALL,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 3, out.stderr[-2000:]
    ex = widgets.StallExplorer(exp, zoom_s=2)
    assert "rank 0" in ex.verdict and ex.span_s > 3
    html, picture, stacks = static_parts(ex)
    assert ex.verdict.split(";")[0][:20] in html.replace("&#x27;", "'") and is_png(picture)
    assert "rank 0&#x27;s stacks" in stacks.replace("'", "&#x27;") and "MainThread" in stacks
    ex.widget()  # builds the detail pane
    assert "MainThread" in ex.detail.value and "<pre" in ex.detail.value  # rank 0's stacks
    before = ex.picture.value
    ex.zoom.value = 2.0
    assert ex.picture.value != before


def test_stall_explorer_of_a_run_that_finished(run):
    exp, _ = run
    ex = widgets.StallExplorer(exp)
    assert ex.verdict == "no stall: every rank finished"
    ex.widget()
    assert "): finished" in ex.detail.value and "no stacks" in ex.detail.value  # the phase as the verdicts say it


WATCHED_WORKERS = """[worker pid 101]
  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap
  File "/venv/site-packages/torch/utils/data/_utils/worker.py", line 318, in _worker_loop
  File "/usr/lib/python3.11/multiprocessing/queues.py", line 113, in get

[worker pid 102]
  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap
  File "/venv/site-packages/torch/utils/data/_utils/worker.py", line 358, in _worker_loop
  File "/venv/site-packages/torch/utils/data/_utils/fetch.py", line 54, in fetch
  File "/job/train.py", line 19, in __getitem__
  File "/usr/lib/python3.11/socket.py", line 706, in readinto"""


def stalled_folder(tmp_path, workers: str = WATCHED_WORKERS):
    """A small stall like asrlab watch leaves one: rank 1 waits for data (its worker 102 blocked at train.py:19),
    rank 0 is held in backward (DDP's all-reduce); 3 s of start-up, then the steps, the report at 10 s."""
    exp = tmp_path / "exp"
    (exp / "heartbeat").mkdir(parents=True)
    t = 1000.0
    main = [
        '  File "/job/train.py", line 30, in main',
        '  File "/venv/site-packages/torch/utils/data/dataloader.py", line 741, in __next__',
    ]
    ranks = [
        {
            "rank": 0,
            "phase": "ddp_allreduce",
            "step": None,
            "since": t + 4.1,
            "detail": "at train.py:33 in main",
            "host": "h",
            "pid": 10,
            "in_phase_s": 5.9,
            "stacks": {"MainThread": main[:1]},
        },
        {
            "rank": 1,
            "phase": "data",
            "step": None,
            "since": t + 4.2,
            "host": "h",
            "pid": 11,
            "in_phase_s": 5.8,
            "detail": "loop at train.py:30 in main; worker pid 102 at train.py:19 in __getitem__",
            "stacks": {"MainThread": main},
            "workers": workers,
        },
    ]
    verdict = (
        "rank 1 has waited 5 s for data (worker pid 102 at train.py:19 in __getitem__); "
        "rank 0 is waiting in DDP's gradient all-reduce (backward)"
    )
    (exp / "stall_report.json").write_text(
        json.dumps(
            {"verdict": verdict, "time": t + 10, "timeout_s": 5.0, "world_size": 2, "ranks": ranks, "failure": None}
        )
    )
    for rank, phases in (
        (0, [(0, "start"), (3, "forward"), (3.5, "backward")]),
        (1, [(0, "start"), (3.2, "forward"), (3.6, "backward"), (4.2, "data")]),
    ):
        (exp / "heartbeat" / f"rank{rank}.timeline.jsonl").write_text(
            "".join(json.dumps({"t": t + dt, "phase": p, "step": None}) + "\n" for dt, p in phases)
        )
    return exp


def test_stall_explorer_shows_the_workers_stacks_of_the_picked_rank(tmp_path):
    ex = widgets.StallExplorer(stalled_folder(tmp_path), zoom_s=30)
    assert ex.focus()["rank"] == 1  # the rank the verdict names first
    html, picture, stacks = static_parts(ex)
    assert is_png(picture) and "rank 1" in stacks and "DataLoader workers (2)" in stacks
    assert 'train.py", line 19, in __getitem__' in stacks.replace("&quot;", '"')  # the worker's own line
    assert "worker pid 102</code>: at train.py:19" in stacks and "worker pid 101</code>: waiting" in stacks
    ex.widget()
    assert "DataLoader workers" not in ex.detail.value  # rank 0: held in backward, no workers kept
    ex.rank.value = 1
    assert "MainThread" in ex.detail.value and "dataloader.py" in ex.detail.value  # its main thread beside ...
    assert 'train.py", line 19' in ex.detail.value.replace("&quot;", '"')  # ... its worker's stack


def test_worker_stacks_of_a_ranks_own_watchdog():
    """A rank's own watchdog keeps its workers' faulthandler dumps (innermost call first)."""
    from asrlab.widgets.stalls import rank_html, worker_stacks

    text = (
        "\n[data-loader worker, pid 7]\nCurrent thread 0x1 (most recent call first):\n"
        '  File "/usr/lib/python3.11/socket.py", line 706 in readinto\n'
        '  File "/job/train.py", line 19 in __getitem__\n'
        '  File "/job/train.py", line 5 in load\n'
    )
    (w,) = worker_stacks(text)
    assert w["name"] == "data-loader worker, pid 7" and w["at"] == "train.py:19 in __getitem__"
    html = rank_html(
        {
            "rank": 1,
            "phase": "data",
            "step": 4,
            "since": 0.0,
            "detail": "",
            "host": "h",
            "pid": 11,
            "in_phase_s": 3.0,
            "stacks": None,
            "workers": text,
        }
    )
    assert "line 19 in __getitem__" in html and "<details open" in html


def test_phase_shares_name_a_rank_held_in_backward_as_waiting_in_ddps_all_reduce(tmp_path):
    import matplotlib.pyplot as plt

    from asrlab import plots

    ranks = [
        {
            "rank": 0,
            "data_wait_share": 0.0,
            "source": "sampled stacks",
            "shares": {"backward": 0.98, "collective": 0.02},
        },
        {"rank": 1, "data_wait_share": 0.9, "source": "sampled stacks", "shares": {"data": 0.9, "backward": 0.1}},
    ]
    report = json.loads((stalled_folder(tmp_path) / "stall_report.json").read_text())
    assert plots.held_ranks(report) == {0}
    fig = plots.phase_shares(ranks, held=report)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)
    assert "waiting in DDP's gradient all-reduce (held in backward)" in legend  # rank 0's 98%
    assert "backward (and DDP's gradient all-reduce within it)" in legend  # rank 1's 10%
    assert "backward" not in legend


def test_timeline_starts_at_the_first_step(tmp_path):
    import matplotlib.pyplot as plt

    from asrlab import plots

    exp = stalled_folder(tmp_path)
    fig = plots.timeline(exp)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    starts = sorted(round(float(c.get_paths()[0].vertices[:, 0].min()), 3) for c in ax.collections)
    plt.close(fig)
    assert "since the first step began" in ax.get_xlabel() and "start-up before 0" in ax.get_xlabel()
    assert starts[0] == -3.0 and 0.0 in starts  # start-up at -3 s, the first forward at 0
    assert lo == -3.0 and hi > 7.0
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "ddp_allreduce" in legend  # rank 0's last backward: held, as the stall report says


def test_a_notebooks_own_figures_go_under_its_run_folder(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setenv(nb.RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv(nb.FIGURES_ENV, str(tmp_path / "figures"))
    fig, _ = plt.subplots()
    own = nb.save_figure(fig, "watched_shares", notebook="06_your_run")
    shown = nb.save_figure(fig, "quickstart_curves")
    plt.close(fig)
    assert own == tmp_path / "runs" / "06_your_run" / "figures" / "watched_shares.png" and own.exists()
    assert shown == tmp_path / "figures" / "quickstart_curves.png"
    monkeypatch.delenv(nb.RUNS_ENV)
    monkeypatch.delenv(nb.FIGURES_ENV)
    monkeypatch.setattr(nb, "root", lambda: tmp_path / "project")
    fig, _ = plt.subplots()
    path = nb.save_figure(fig, "x", notebook="06_your_run")
    assert path == tmp_path / "project" / "runs" / "06_your_run" / "figures" / "x.png"
    # a notebook run with nothing set writes nothing into the project's tracked figures/
    assert (
        nb.save_figure(fig, "quickstart_curves") == tmp_path / "project" / "runs" / "figures" / "quickstart_curves.png"
    )
    assert not (tmp_path / "project" / "figures").exists()
    plt.close(fig)


def test_sweep_explorer(corpus, tmp_path):
    from asrlab.measure.tune import grid, recommend, sweep

    cfg = load_config("tiny", SMALL)
    rows = sweep(cfg, {"shards/none": corpus / "data.list"}, grid((0,), (2,), (400, 800)), steps=2)
    best, why = recommend(rows)
    ex = widgets.SweepExplorer(rows, best, why)
    assert ex.axes == ["max_frames_in_batch"] and "gpu_util_pct" not in ex.measures  # no GPU here
    assert "recommended" in static_parts(ex)[-1]
    ex.widget()
    before = ex.picture.value
    ex.measure.value = "data_wait"
    assert ex.picture.value != before


def test_sampler_monitor_redraws_while_the_block_runs():
    from asrlab.widgets.sweep import SamplerMonitor

    with SamplerMonitor(redraw_s=0.2) as mon:
        t0, a = time.time(), torch.randn(256, 256)
        while mon.redraws < 2 and time.time() - t0 < 60:  # work that lets the drawing thread run, as training does
            a = torch.tanh(a @ a)
        assert mon.redraws >= 2, "not redrawn while the block ran"
    assert is_png(mon.picture.value)


def test_resume_explorer(run, corpus, tmp_path):
    """A run resumed the way WeNet does (the epoch starts over) against the run never interrupted."""
    from asrlab.data.sources import iter_items, load_sources

    ref, _ = run
    keys = {it.key for it in iter_items(load_sources(corpus / "data.list"))}
    crashed = tmp_path / "crashed"
    base = SMALL + ["train.ledger=true", "train.max_epochs=2", "train.save_every_steps=3"]
    tr = Trainer(load_config("tiny", base + ["train.max_steps=3"]), str(corpus / "data.list"), None, crashed, CPU)
    tr.fit()
    tr.close()
    assert checkpoint.load_latest(crashed / "checkpoints")[1]["step"] == 3
    again = Trainer(
        load_config("tiny", base + ["train.max_steps=6", "train.resume_mode=epoch_start"]),
        str(corpus / "data.list"),
        None,
        crashed,
        CPU,
    )
    assert again.resume()
    again.fit()
    again.close()
    ex = widgets.ResumeExplorer(
        {"never interrupted": ref, "epoch starts over": crashed}, keys, reference="never interrupted"
    )
    final = ex.counts()
    assert max(final["epoch starts over"]) == 2 and max(final["never interrupted"]) == 1  # the first steps twice
    figure, table = static_parts(ex)
    assert "epoch starts over" in table
    box = ex.widget()
    slider = find(box, ipywidgets.IntSlider)[0]
    assert (slider.min, slider.max) == (1, 6)
    before, text = ex.picture.value, ex.table.value
    slider.value = 2
    assert ex.picture.value != before and ex.table.value != text and "trained at step 2" in ex.table.value
    assert sum(ex.counts(2)["never interrupted"]) == sum(len(k) for s, k in ex.steps["never interrupted"] if s <= 2)


def test_monitor_reads_a_run_and_its_stop_button_writes_the_request(run, tmp_path):
    exp, _ = run
    mon = widgets.TrainMonitor(exp)
    s = mon.update(12.0)
    assert s["step"] == 6 and s["max_steps"] == 6 and s["cer"] is not None
    assert "step <b>6</b> of 6" in mon.status.value and is_png(mon.image.value) and mon.bar.value == 1.0
    mon.button.click()
    assert (exp / "STOP").exists() and mon.button.disabled
    (exp / "STOP").unlink()
    mon.update(13.0, "stopped")
    assert "stopped" in mon.status.value and mon.updates == 2


def test_train_live_runs_and_reports_headless(corpus, tmp_path, monkeypatch, capsys):
    """Static mode: the awaited run ends, its status is updated in place, the curves drawn once at the end."""
    monkeypatch.setenv(widgets.MODE_ENV, "static")
    exp = tmp_path / "exp"
    args = ["--data", str(corpus / "data.list"), "--max-steps", "3", *SMALL]
    before = widget_count()
    assert asyncio.run(nb.train_live(args, exp, poll_s=0.2)) == 0
    assert widget_count() == before and read_metrics(exp)[-1]["step"] == 3


KERNEL_CODE = """
import os
os.environ["ASRLAB_WIDGETS"] = "live"
from asrlab import nb
code = await nb.train_live({args!r}, {exp!r}, poll_s=0.5)
print("EXIT", code)
"""


def is_idle(msg, msg_id) -> bool:
    """``msg`` is the kernel's word that it finished the request ``msg_id`` (all its output sent)."""
    return (
        bool(msg)
        and msg["msg_type"] == "status"
        and msg["content"]["execution_state"] == "idle"
        and msg["parent_header"].get("msg_id") == msg_id
    )


def train_live_in_a_kernel(corpus, exp, act):
    """Run ``KERNEL_CODE`` in a real kernel; once rank 0 has logged step 3, ``act(km, kc, button comm id)``
    once. Returns (the execute reply's content, what the cell printed, the error name if it raised)."""
    from jupyter_client.manager import start_new_kernel

    args = ["--data", str(corpus / "data.list"), "--cv", str(corpus / "data.list"), "train.max_epochs=1000", *SMALL]
    km, kc = start_new_kernel(kernel_name="python3", env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        msg_id = kc.execute(KERNEL_CODE.format(args=args, exp=str(exp)))
        button, printed, reply, acted, idle = None, "", None, False, False
        deadline = time.time() + 240
        while reply is None:
            assert time.time() < deadline, "no reply from the kernel"
            try:
                m = kc.get_iopub_msg(timeout=1)
            except Exception:
                m = None
            if m and m["msg_type"] == "comm_open" and m["content"]["data"]["state"].get("_model_name") == "ButtonModel":
                button = m["content"]["comm_id"]
            if m and m["msg_type"] == "stream":
                printed += m["content"]["text"]
            idle = idle or is_idle(m, msg_id)
            if button and not acted and nb.last_step(exp) >= 3:
                act(km, kc, button)
                acted = True
            try:
                r = kc.get_shell_msg(timeout=0.05)
                if r["parent_header"].get("msg_id") == msg_id:
                    reply = r["content"]
            except Exception:
                pass
        while not idle:  # the rest of the cell's output: the kernel says idle after the cell's last output
            m = kc.get_iopub_msg(timeout=60)
            if m["msg_type"] == "stream":
                printed += m["content"]["text"]
            idle = is_idle(m, msg_id)
        return reply, printed
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def stopped_cleanly(exp):
    """The run ended after some step with a checkpoint and an evaluation there, the request cleared."""
    steps = [m["step"] for m in read_metrics(exp)]
    assert 3 <= steps[-1] < 1000 and checkpoint.load_latest(exp / "checkpoints")[1]["step"] == steps[-1]
    assert json.loads((exp / "metrics" / "eval.jsonl").read_text().splitlines()[-1])["step"] == steps[-1]
    assert not (exp / "STOP").exists()


def test_the_stop_button_is_heard_while_the_cell_awaits(corpus, tmp_path):
    """In a real kernel: the cell awaits training; a click on the Stop button (the comm message a front end
    sends) ends the run after its step, and the cell goes on with the model it has."""

    def click(km, kc, button):
        kc.shell_channel.send(
            kc.session.msg("comm_msg", {"comm_id": button, "data": {"method": "custom", "content": {"event": "click"}}})
        )

    reply, printed = train_live_in_a_kernel(corpus, tmp_path / "exp", click)
    assert reply["status"] == "ok" and "EXIT 0" in printed, (reply, printed)
    stopped_cleanly(tmp_path / "exp")


def test_interrupting_the_kernel_stops_the_run_cleanly_too(corpus, tmp_path):
    reply, printed = train_live_in_a_kernel(corpus, tmp_path / "exp", lambda km, kc, button: km.interrupt_kernel())
    assert reply["status"] == "error" and "EXIT" not in printed  # the cell reports the interrupt
    stopped_cleanly(tmp_path / "exp")


def test_sweep_explorer_puts_two_different_settings_on_its_axes():
    rows = [
        {
            "storage": st,
            "num_workers": 0,
            "prefetch_factor": None,
            "max_frames_in_batch": mf,
            "features": "cpu",
            "audio_h_per_h": float(mf),
            "data_wait": 0.1,
            "peak_mib": 10.0,
            "gpu_util_pct": None,
        }
        for st in ("raw", "shards/none")
        for mf in (1000, 2000)
    ]
    ex = widgets.SweepExplorer(rows, rows[0], "why", x="num_workers", y="storage")  # num_workers does not vary
    assert (ex.x, ex.y) == ("max_frames_in_batch", "storage")


def wenet_log(path, ranks=3, bad_rank=1, bad_batch=300, last=400):
    """A WeNet train_utils log of ``ranks`` ranks, a line per rank every 50 batches of epoch 0; rank
    ``bad_rank``'s CTC loss, total and grad norm not finite from ``bad_batch`` on."""
    lines = []
    for i, b in enumerate(range(0, last + 1, 50)):
        for r in range(ranks):
            bad = r == bad_rank and b >= bad_batch
            att = 50.0 / (1 + b / 100) + r
            ctc = math.nan if bad else 1.3 * att
            s = 10 + 30 * i
            norm = math.inf if bad else 20.0 - b / 50 + r
            lines.append(
                f"2024-03-01 10:{s // 60:02d}:{s % 60:02d},{100 + r} DEBUG "
                f"TRAIN | steps/sec {1.5 + 0.1 * r:.3f}| Batch 0/{b} loss {0.3 * ctc + 0.7 * att:.6f} "
                f"loss_att {att:.6f} loss_ctc {ctc:.6f} lr {0.001 * (1 + b / 400):.8f} "
                f"grad_norm {norm:.6f} rank {r}"
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_log_explorer_draws_each_ranks_curves_and_marks_the_first_nonfinite_step(tmp_path):
    log = wenet_log(tmp_path / "train.log")
    ex = widgets.LogExplorer(log)
    s = ex.series
    assert ex.verdict == "nonfinite" and {k: ex.diagnosis["culprit"][k] for k in ("rank", "step")} == {
        "rank": 1,
        "step": 300,
    }
    assert s["axis"]["kind"] == "batch" and s["ranks"] == [0, 1, 2]
    panels = {p["name"]: p for p in s["panels"]}
    assert list(panels) == ["loss", "loss_att", "loss_ctc", "lr", "grad_norm", "rate"]  # no loss scale logged
    loss = {line["rank"]: line for line in panels["loss"]["lines"]}
    assert loss[0]["x"] == [float(b) for b in range(0, 401, 50)] and all(map(math.isfinite, loss[0]["y"]))
    assert [math.isnan(y) for y in loss[1]["y"]] == [False] * 6 + [True] * 3
    assert [(p["rank"], p["x"]) for p in panels["grad_norm"]["nonfinite"]] == [(1, 300.0), (1, 350.0), (1, 400.0)]
    assert not panels["loss_att"]["nonfinite"]
    assert [line["y"][0] for line in panels["rate"]["lines"]] == [1.5, 1.6, 1.7]
    for mark in ("culprit", "first_nonfinite"):
        assert s["marks"][mark] == {"x": 300.0, "rank": 1, "step": 300, "where": "epoch 0, batch 300"}
    json.dumps(s)  # JSON-ready, for a notebook's results.json

    head, picture = static_parts(ex)
    assert "NONFINITE" in head and "rank 1, epoch 0, batch 300" in head and "loss_ctc, grad_norm not finite" in head
    box = ex.widget()
    assert "asrlab-logs" in box._dom_classes and is_png(ex.image.value)
    before = ex.image.value
    ex.rank_pick.value = (1,)
    ex.curve_pick.value = ("loss_ctc", "grad_norm")
    assert ex.image.value != before and is_png(ex.image.value)

    import matplotlib.pyplot as plt

    from asrlab.widgets.logs import log_curves

    fig = log_curves(s, ranks=[0, 1], panels=["loss"])
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.get_lines()][:2] == ["rank 0", "rank 1"]
    assert list(ax.get_lines()[-1].get_xdata()) == [300.0, 300.0]  # the culprit's step, a vertical line
    plt.close(fig)


def test_log_explorer_of_a_real_icefall_log_every_rank_nan_at_one_batch():
    ex = widgets.LogExplorer(
        os.path.join(os.path.dirname(__file__), "fixtures", "logs", "icefall", "nan_inf_losses_all_ranks_mpirun.log")
    )
    s = ex.series
    assert s["ranks"] == [0, 3, 5, 6] and s["axis"]["label"] == "batch (epoch 7)"
    assert s["marks"]["culprit"]["x"] == s["marks"]["first_nonfinite"]["x"] == 1650.0
    panels = {p["name"]: p for p in s["panels"]}
    assert sorted(p["rank"] for p in panels["simple_loss"]["nonfinite"]) == [0, 3, 5, 6]
    assert all(math.isinf(p["y"]) for p in panels["simple_loss"]["nonfinite"])
    assert [line["y"] for line in panels["lr"]["lines"]] == [[4.28e-03]] * 4
    static_parts(ex)


def test_an_espnet_run_draws_its_own_terms_and_one_place_for_its_first_failure():
    """ESPnet's own asr_train (fp32, a NaN at epoch 2, batch 5): the terms as ESPnet names them (not "040loss"
    from its "acc=0.040loss=..." fields), no loss-scale panel for a run without a scaler, and the culprit and
    the first non-finite step marked at one place."""
    from asrlab.doctor import read_and_diagnose
    from asrlab.widgets.logs import log_series

    case = Path(__file__).parent / "fixtures" / "toolkit_runs" / "espnet" / "nan_single_e2b5"
    run, d = read_and_diagnose([str(case / "console.log")])
    s = log_series(run, d)
    names = [p["name"] for p in s["panels"]]
    assert "scale" not in names and not any(n[0].isdigit() for n in names), names
    assert (
        s["marks"]["culprit"] == s["marks"]["first_nonfinite"] and s["marks"]["culprit"]["where"] == "epoch 2, batch 5"
    )


def test_steps_per_second_from_stamps_to_the_second_are_read_over_stretches(tmp_path):
    """Ten step lines a second, stamped to the second: the derived steps/s is about 10 (stretches of the doctor's
    SPAN_S), not 1 from the two lines either side of each second's turn."""
    from asrlab.widgets.logs import LogExplorer

    lines = [f"2026-11-30T04:00:{s // 10:02d} epoch=0 batch={s}/400 step={s} loss=1.0" for s in range(1, 400)]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    panel = next(p for p in LogExplorer([str(tmp_path / "train.log")]).series["panels"] if p["name"] == "rate")
    rates = [v for line in panel["lines"] for v in line["y"]]
    assert rates and all(8 <= v <= 12 for v in rates), rates


def test_a_restart_is_marked_where_the_steps_went_back():
    """A stranger's loop killed and restarted at step 51: the curves mark the restart (the purple dotted line)."""
    from asrlab.widgets.logs import LogExplorer

    fixtures = Path(__file__).parent / "fixtures" / "own_loops"
    e = LogExplorer([str(fixtures / "w25_one_process_killed_resumed_step_51_data_from_batch_1.log")])
    assert e.series["marks"]["resume"] == {"x": 51.0, "rank": 0, "step": 51, "where": "step 51 (epoch 1)"}


def test_a_place_in_its_epoch_is_not_drawn_on_a_folders_global_steps():
    """A toolkit's folder whose event files count global steps while the verdict's place came from a console's bar
    (epoch 1, batch 14): no culprit line at x=14 of the global axis (where the loss is finite), the series' own first
    non-finite loss marked instead; a global step is drawn where it is."""
    from asrlab.widgets.logs import _table_series

    nan = float("nan")
    series = {"tensorboard": {"train_loss": {"steps": [10, 20, 39, 40], "values": [3.1, 3.0, nan, nan]}}}
    d = {"series": series, "first": None, "verdict": "nonfinite", "summary": ""}
    s = _table_series({**d, "culprit": {"rank": None, "step": 14, "epoch": 1, "batch": 14}})
    assert s["marks"]["culprit"] is None and s["marks"]["first_nonfinite"]["x"] == 39, s["marks"]
    s = _table_series({**d, "culprit": {"rank": None, "step": 39, "epoch": None, "batch": None}})
    assert s["marks"]["culprit"]["x"] == 39, s["marks"]

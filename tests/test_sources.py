"""The doctor's sources beside a log: TensorBoard's event files (written here by torch's own SummaryWriter),
Hugging Face Trainer's ``trainer_state.json`` and Lightning's ``metrics.csv`` read into exact step series; the
first non-finite step exactly, a loss that diverges before it as a warning; and a source added as one module."""

import json
import math
import sys
import types
from pathlib import Path

import pytest

from asrlab.cli import main
from asrlab.doctor import SCHEMA, diagnose, format_diagnosis
from asrlab.doctor import sources
from asrlab.doctor.timeline import failure

SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter


def write_events(folder, losses, norms=None, start=1, ended=False):
    """``ended``: the train summary Hugging Face Trainer logs once training ended (``train/train_runtime``); an
    event file without an end says nothing of how the run ended."""
    w = SummaryWriter(str(folder))
    for i, v in enumerate(losses, start):
        w.add_scalar("train/loss", v, i)
        w.add_scalar("train/lr", 1e-3, i)
        if norms is not None:
            w.add_scalar("train/grad_norm", norms[i - start], i)
    if ended:
        w.add_scalar("train/train_runtime", 12.5, start + len(losses) - 1)
    w.close()


def test_tensorboard_first_nonfinite_step_exactly_and_the_divergence_before_it(tmp_path, capsys):
    # a converging loss, then a rise to many times its lowest at step 31, then nan from step 40 on
    losses = [10.0 / i for i in range(1, 30)] + [0.3 * (i - 28) ** 3 for i in range(30, 40)] + [math.nan] * 9
    write_events(tmp_path / "runs" / "a", losses)
    d = diagnose(tmp_path)
    assert d["verdict"] == "nonfinite" and d["culprit"]["step"] == 40, d["summary"]
    assert "train/loss was nan at step 40" in d["summary"]
    w = d["warnings"]
    assert [x["kind"] for x in w] == ["diverging"] and w[0]["step"] == 31, w
    s = d["series"]["tensorboard"]["train/loss"]
    assert s["steps"] == list(range(1, 49)) and s["values"][:2] == [10.0, 5.0]  # every point, as written
    assert main(["doctor", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NONFINITE: train/loss was nan at step 40")
    assert "warning (tensorboard): train/loss rose to" in out and "at step 31" in out


def test_a_resumed_run_keeps_the_later_launchs_points_and_a_cut_file_is_said(tmp_path):
    """A resume in a folder of its own (Hugging Face Trainer's runs/DATE_HOST per launch) goes on from the run's
    steps: one series, the later launch's points. A cut file is said; where the run's last file is cut (its
    writer killed mid-record) no all-clear is given, where a resume went on after it, it is only a note."""
    write_events(tmp_path / "r1", [1.0] * 10)  # steps 1-10, killed at 10
    write_events(tmp_path / "r2", [0.5] * 10, start=6, ended=True)  # resumed from step 5: steps 6-15 again
    first, last = (sorted((tmp_path / r).glob("events*"))[0] for r in ("r1", "r2"))
    first.write_bytes(first.read_bytes()[:-7])  # the first launch's writer killed mid-record
    d = diagnose(tmp_path)
    s = d["series"]["tensorboard"]["train/loss"]
    assert s["steps"][:5] == [1, 2, 3, 4, 5] and s["values"][5] == 0.5, s
    assert d["verdict"] == "no_failure_seen", d["summary"]
    notes = [n for x in d["sources"] for n in x["notes"]]
    assert len(notes) == 1 and "cut after its last whole record" in notes[0], notes
    last.write_bytes(last.read_bytes()[:-7])  # and the resumed launch's: how the run ended is not known
    d = diagnose(tmp_path)
    assert d["verdict"] == "unknown" and "cut after its last whole record" in d["summary"], d["summary"]


def test_runs_side_by_side_stay_apart_and_a_healthy_one_hides_no_failure(tmp_path):
    """Two runs in folders side by side, both from step 1: the older one's loss goes nan at step 6, the newer is
    healthy. Each keeps its own series (named by its folder); the failure is the verdict, never finite again."""
    write_events(tmp_path / "a", [1.0] * 5 + [math.nan] * 5)
    write_events(tmp_path / "b", [0.9] * 10)
    d = diagnose(tmp_path)
    assert d["verdict"] == "nonfinite" and d["culprit"]["step"] == 6, d["summary"]
    assert d["summary"].startswith("a/train/loss was nan at step 6") and "never finite again" in d["summary"]
    assert {"a/train/loss", "b/train/loss"} <= set(d["series"]["tensorboard"]), d["series"]["tensorboard"].keys()


def test_an_events_file_with_nothing_in_it_is_no_all_clear(tmp_path):
    (tmp_path / "events.out.tfevents.1.host.1.0").write_bytes(bytes(range(256)) * 4)  # not an event file
    d = diagnose(tmp_path)
    assert d["verdict"] == "unknown" and "no record read" in d["summary"] and not d["ok"], d["summary"]


@pytest.mark.parametrize("tag", ["grad/norm", "Gradients/norm", "train/gnorm", "grad/total_norm"])
def test_a_gradient_norm_under_any_usual_tag(tmp_path, tag):
    w = SummaryWriter(str(tmp_path))
    for i in range(1, 41):
        w.add_scalar("loss", 1.0, i)
        w.add_scalar(tag, 1000.0 if i == 30 else 1.0, i)  # a spike that recovers: a warning
    w.add_scalar("train_runtime", 60.0, 40)
    w.close()
    d = diagnose(tmp_path)
    assert d["verdict"] == "no_failure_seen" and [(x["name"], x["step"]) for x in d["warnings"]] == [(tag, 30)]


def test_fp16_overflow_skips_leave_a_grad_norm_inf_and_the_run_healthy(tmp_path):
    norms = [math.inf, math.inf, 3.0, 2.0] + [1.0] * 16  # the scaler calibrating at the start
    write_events(tmp_path, [5.0 - 0.1 * i for i in range(20)], norms, ended=True)
    d = diagnose(tmp_path)
    assert d["verdict"] == "no_failure_seen" and d["ok"], d["summary"]


def test_series_that_just_stop_are_no_all_clear(tmp_path, capsys):
    """Event files alone whose series stop with no end of training logged: a crash, a kill or a hang leave them so
    as a finished run does. Unknown, said with where they stop, and the console is what to read next."""
    write_events(tmp_path, [5.0 - 0.1 * i for i in range(20)])
    d = diagnose(tmp_path)
    assert d["verdict"] == "unknown" and "nothing read says the run ended" in d["summary"], d["summary"]
    assert "tensorboard's at step 20" in d["summary"] and "console" in d["next"], d
    (tmp_path / "train.log").write_text("".join(f"step {i} loss {5.0 - 0.1 * i:.2f}\n" for i in range(1, 21)))
    assert diagnose(tmp_path)["verdict"] == "no_failure_seen"  # a log's step lines speak for the run


def test_trainer_state_log_history(tmp_path):
    # the shape Hugging Face Trainer writes (json.dumps of floats: NaN as NaN), in checkpoint-N/ and the folder
    hist = [
        {"epoch": 0.1 * s, "grad_norm": 1.5, "learning_rate": 1e-4, "loss": 4.0 - 0.1 * s, "step": s}
        for s in range(1, 9)
    ]
    hist += [{"epoch": 0.9, "grad_norm": math.nan, "learning_rate": 1e-4, "loss": math.nan, "step": 9}]
    for n, upto in ((5, 5), (10, 9)):
        ck = tmp_path / f"checkpoint-{n}"
        ck.mkdir()
        (ck / "trainer_state.json").write_text(
            json.dumps({"global_step": n, "max_steps": 20, "log_history": hist[:upto]})
        )
    d = diagnose(tmp_path)
    assert d["verdict"] == "nonfinite" and d["culprit"]["step"] == 9, d["summary"]
    assert d["series"]["trainer_state"]["loss"]["steps"] == list(range(1, 10))


def test_a_gradient_norm_that_never_comes_back_comes_before_the_loss_and_json_is_strict(tmp_path, capsys):
    """A trainer's state whose grad_norm is Infinity at step 40 and 45, then NaN with the loss from step 50: the
    first failure is step 40 (the series hold no clock: their steps order them), and ``--json`` is strict JSON
    (the series' nan and inf as strings: a strict parser refuses NaN)."""
    hist = [{"step": s, "epoch": s / 20, "loss": 2.0 - s / 100, "grad_norm": 2.0, "learning_rate": 1e-4} for s in
            range(5, 40, 5)]  # fmt: skip
    hist += [{"step": s, "epoch": s / 20, "loss": 1.5, "grad_norm": math.inf, "learning_rate": 1e-4} for s in (40, 45)]
    hist += [{"step": s, "epoch": s / 20, "loss": math.nan, "grad_norm": math.nan, "learning_rate": 1e-4} for s in
             (50, 55, 60)]  # fmt: skip
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 60, "log_history": hist}))
    d = diagnose(tmp_path)
    assert d["verdict"] == "nonfinite" and d["culprit"]["step"] == 40, d["summary"]
    assert main(["doctor", "--json", str(tmp_path)]) == 1
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert out["series"]["trainer_state"]["loss"]["values"][-1] == "nan", out["series"]


def test_a_trainer_stopped_early_by_its_callback_is_no_failure(tmp_path):
    """Early stopping ends Trainer short of max_steps: the state's control says the stop was asked for (Trainer's
    own TrainerControl, saved with the checkpoint); the same state without it is no all-clear."""
    hist = [{"step": s, "epoch": s / 10, "loss": 3.0 - s / 100, "learning_rate": 1e-4} for s in range(1, 31)]
    control = {"TrainerControl": {"args": {"should_training_stop": True}, "attributes": {}}}
    state = {"global_step": 30, "max_steps": 100, "log_history": hist, "stateful_callbacks": control}
    (tmp_path / "checkpoint-30").mkdir()
    (tmp_path / "checkpoint-30" / "trainer_state.json").write_text(json.dumps(state))
    d = diagnose(tmp_path)
    assert d["verdict"] == "no_failure_seen" and d["ok"], d["summary"]
    control["TrainerControl"]["args"]["should_training_stop"] = False
    (tmp_path / "checkpoint-30" / "trainer_state.json").write_text(json.dumps(state))
    d = diagnose(tmp_path)
    assert d["verdict"] == "unknown" and "global step 30 of max_steps 100" in d["summary"], d["summary"]


def test_lightning_metrics_csv(tmp_path):
    rows = ["epoch,step,train_loss_step,val_loss"] + [f"0,{s},{3.0 - 0.1 * s}," for s in range(10)]
    rows += ["0,10,nan,", "0,11,,2.5"]
    (tmp_path / "version_0").mkdir()
    (tmp_path / "version_0" / "metrics.csv").write_text("\n".join(rows) + "\n")
    d = diagnose(tmp_path)
    assert d["verdict"] == "nonfinite" and d["culprit"]["step"] == 10, d["summary"]
    assert d["files"] == []  # read as a table, not as a log


@pytest.mark.parametrize("head", ["tick,ctc,lr", "ctc,lr"])
def test_a_loops_own_metrics_csv_steps_by_its_counter_or_its_rows(tmp_path, head):
    """A loop's own metrics.csv whose counter is not named ``step`` (``tick``), or that has none: its series read by
    that counter, else by row, never an all-clear over its nan."""
    rows = [(f"{s}," if head.startswith("tick") else "") + f"{3.0 - 0.1 * s},0.01" for s in range(1, 11)]
    rows += [("11," if head.startswith("tick") else "") + "nan,0.01"]
    (tmp_path / "metrics.csv").write_text("\n".join([head, *rows]) + "\n")
    d = diagnose(tmp_path)
    assert d["verdict"] == "nonfinite" and d["culprit"]["step"] == 11, d["summary"]
    assert sorted(d["series"]["csv_metrics"]) == ["ctc", "lr"]


def test_a_new_source_is_one_module(tmp_path, monkeypatch):
    """A source is a module with ``owns`` and ``read``: registered, its events join the one timeline."""
    toy = types.ModuleType("asrlab.doctor.sources.toy")
    toy.owns = lambda p: p.suffix == ".toy"
    toy.read = lambda files: sources.Reading(
        "toy", [str(f) for f in files],
        events=[failure("crashed", "toy", None, "the toy said so", source="toy", step=3)],
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "asrlab.doctor.sources.toy", toy)
    monkeypatch.setattr(sources, "SOURCES", sources.SOURCES + ("toy",))
    (tmp_path / "run.toy").write_text("x")
    d = diagnose(tmp_path)
    assert (d["verdict"], d["culprit"]["step"], d["summary"]) == ("crashed", 3, "the toy said so")
    assert list(d) == list(SCHEMA) and format_diagnosis(d).startswith("CRASHED: the toy said so")


def test_a_checkpoint_of_a_toolkits_classes_is_not_called_broken(tmp_path, monkeypatch):
    """Saved with a class asrlab does not have (NeMo's omegaconf, a recipe's config): not opened, its archive
    checked whole; the same file cut in half is not intact."""
    torch = pytest.importorskip("torch")
    mod = types.ModuleType("toolkit_only_here")

    class Config:
        pass

    Config.__module__, Config.__qualname__ = "toolkit_only_here", "Config"
    mod.Config = Config
    monkeypatch.setitem(sys.modules, "toolkit_only_here", mod)
    # Lightning's name for it, as NeMo's runs leave them
    torch.save({"state_dict": {"w": torch.zeros(2)}, "cfg": Config()}, tmp_path / "epoch=1-step=7.ckpt")
    monkeypatch.delitem(sys.modules, "toolkit_only_here")
    whole = (tmp_path / "epoch=1-step=7.ckpt").read_bytes()
    (tmp_path / "step_9.ckpt").write_bytes(whole[: len(whole) // 2])
    from asrlab.doctor.logs.checkpoints import checkpoints

    found = checkpoints([str(tmp_path)])
    rows = {Path(r["file"]).name: r for r in found["files"]}
    kept = rows["epoch=1-step=7.ckpt"]
    assert kept["intact"] is None and "needs toolkit_only_here" in kept["why"] and "archive is whole" in kept["why"]
    assert (kept["epoch"], kept["step"]) == (1, 7)
    assert rows["step_9.ckpt"]["intact"] is False and [Path(f).name for f in found["broken"]] == ["step_9.ckpt"]


def test_a_legacy_pickle_checkpoint_never_runs_its_code(tmp_path):
    """torch.save's format before zip archives, holding an object whose unpickling would run code: the doctor
    reads such a file weights only (its step from its name), never runs what it pickled."""
    torch = pytest.importorskip("torch")
    ran = tmp_path / "code_ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (ran,))

    path = tmp_path / "step_12.pt"
    torch.save({"step": 12, "payload": Payload()}, path, _use_new_zipfile_serialization=False)
    plain = tmp_path / "step_3.pt"
    torch.save({"step": 3, "w": torch.zeros(2)}, plain, _use_new_zipfile_serialization=False)
    from asrlab.doctor.logs.checkpoints import checkpoints

    rows = {Path(r["file"]).name: r for r in checkpoints([str(tmp_path)])["files"]}
    assert not ran.exists(), "the checkpoint's pickled code ran"
    assert rows["step_12.pt"]["intact"] is None and rows["step_12.pt"]["why"].startswith("not opened"), rows
    assert rows["step_12.pt"]["step"] == 12
    assert rows["step_3.pt"]["intact"] is True and rows["step_3.pt"]["step"] == 3, rows


def test_a_toolkit_folder_alone_is_read_whole_and_drawn():
    """Hugging Face Trainer's output folder of a real run (no console): its trainer_state.json and its event
    file say the NaN at step 9 (the NaN-filtered loss hides it; the gradient norm does not); notebook 06's
    explorer draws their series and marks the step."""
    pytest.importorskip("matplotlib")
    from asrlab.widgets.logs import LogExplorer

    exp = Path(__file__).parent / "fixtures" / "toolkit_runs" / "hf_trainer" / "nan_rank1_step9" / "exp"
    e = LogExplorer([str(exp)])
    assert e.diagnosis["verdict"] == "nonfinite" and e.diagnosis["culprit"]["step"] == 9, e.diagnosis["summary"]
    labels = [p["label"] for p in e.series["panels"]]
    assert "grad_norm (trainer_state)" in labels and "train/grad_norm (tensorboard)" in labels, labels
    assert e.series["marks"]["culprit"]["x"] == 9 and e.figure() is not None


def test_a_real_lightning_folder_metrics_csv_and_event_files(tmp_path):
    """Lightning's own loggers (CSVLogger, TensorBoardLogger) on a fit whose loss turns NaN at global step 7: the
    folder alone names the first step each logger wrote NaN at, as its own file says."""
    L = pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    import csv

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            loss = self.lin(batch[0]).pow(2).mean()
            if self.global_step >= 7:
                loss = loss * float("nan")
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(48, 4)), batch_size=4)
    loggers = [L.pytorch.loggers.CSVLogger(tmp_path), L.pytorch.loggers.TensorBoardLogger(tmp_path)]
    trainer = L.Trainer(
        max_steps=10, logger=loggers, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False,
        enable_model_summary=False, accelerator="cpu", devices=1,
    )  # fmt: skip
    trainer.fit(Tiny(), data)
    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    first = min(int(r["step"]) for r in rows if r.get("train_loss") and not math.isfinite(float(r["train_loss"])))
    d = diagnose(tmp_path)
    assert d["verdict"] == "nonfinite" and d["culprit"]["step"] == first, d["summary"]
    assert {"csv_metrics", "tensorboard"} <= set(d["series"]), d["series"].keys()


def test_a_checkpoint_saved_after_the_first_nonfinite_step_is_said(tmp_path, capsys):
    """A loss nan from step 6, checkpoints of steps 4 and 8 beside it: the one of step 8 was saved after the
    failure (a resume from it may start from non-finite weights), the one of step 4 before it."""
    import torch

    write_events(tmp_path, [1.0] * 5 + [math.nan] * 5)
    for step in (4, 8):
        torch.save({"step": step, "model": {"w": torch.zeros(2)}}, tmp_path / f"step_{step}.pt")
    d = diagnose(tmp_path)
    assert d["verdict"] == "nonfinite" and d["culprit"]["step"] == 6, d["summary"]
    after = {Path(r["file"]).name: r["after_failure"] for r in d["checkpoints"]["files"]}
    assert after == {"step_4.pt": False, "step_8.pt": True}, after
    main(["doctor", str(tmp_path)])
    assert "step_8.pt: step 8 (saved at or after step 6, the first not finite" in capsys.readouterr().out


def test_one_json_shape_for_a_run_folder_a_log_and_a_toolkit_folder():
    """The same keys, and the same shape under each key that was read, whatever the doctor was given: a watched
    run folder, a log, a toolkit's experiment folder (event files, checkpoints)."""
    fixtures = Path(__file__).parent / "fixtures"
    nemo = fixtures / "toolkit_runs" / "nemo" / "nan_rank1"
    ds = [
        diagnose(str(p))
        for p in (fixtures / "watched" / "loop_gloo_timeout_rank1_held", nemo / "console.log", nemo / "exp")
    ]
    assert [d["read"] for d in ds] == ["run folder", "logs", "logs"]
    for d in ds:
        assert list(d) == list(SCHEMA)
        assert list(d["culprit"]) == list(ds[0]["culprit"]) and list(d["resumes"]) == list(ds[0]["resumes"]), d["paths"]
    for k in SCHEMA:
        shapes = {type(d[k]).__name__ for d in ds if d[k] is not None}
        assert len(shapes) <= 1, (k, shapes)


def test_a_survivors_collective_timeout_after_a_reported_stall_is_its_consequence():
    """A stranger's accumulation loop: the watch reported rank 1 hung (and did not end the job), then gloo's
    timeout ended rank 0. The verdict is the stall on rank 1; rank 0's timeout is said as its consequence, not
    as the first error, and the report does not say the watch stopped the job."""
    exp = Path(__file__).parent / "fixtures" / "watched" / "accumulation_rank1_hung_report_only"
    d = diagnose(str(exp))
    assert (d["verdict"], d["culprit"]["rank"]) == ("stalled", 1), d["summary"]
    text = format_diagnosis(d)
    assert "error of a rank that gave up waiting in a collective (the stall's consequence): rank 0" in text, text
    assert "first error:" not in text and d["error"]["waited"] is True
    assert "stopped the job" not in (exp / "stall_report.txt").read_text()


def test_a_launcher_that_could_not_listen_on_its_port_is_the_failure_said():
    """torchrun under the watch could not open its port (another job held it) and started no rank: the failure is
    its DistNetworkError (no peer's consequence), from the folder and from the watched job's log alone."""
    exp = Path(__file__).parent / "fixtures" / "watched" / "torchrun_port_in_use_before_any_rank"
    for d in (diagnose(str(exp)), diagnose(str(exp / "job.log"))):
        assert d["verdict"] == "crashed" and "EADDRINUSE" in d["summary"], d["summary"]


def test_a_watched_stall_takes_its_step_from_the_jobs_own_output_and_says_its_culprit_first():
    """The watch samples stacks, not steps: a stranger's spinning rank 1 (its samples hold no step) gets the last
    step its own lines printed (9), in the JSON and in the text's culprit line, as a log's reading has it."""
    exp = Path(__file__).parent / "fixtures" / "watched" / "spawn_busy_rank1_own_code"
    d = diagnose(str(exp))
    assert (d["verdict"], d["culprit"]["rank"], d["culprit"]["step"]) == ("stalled", 1, 9), d["summary"]
    assert format_diagnosis(d).splitlines()[1] == "  culprit: rank 1, step 9"

"""``asrlab doctor``: the verdict and every section, read from the files of real runs of asrlab's trainer
(finished, stopped, a rank crashed, a non-finite halt, killed and resumed), and from copies of a finished
run broken on purpose (the ledger, a checkpoint's bytes). Its reading of a stalled 2-rank run is in
test_stalls.py, beside the watchdog's tests of the same run."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asrlab.cli import main
from asrlab.data.sources import load_sources
from asrlab.doctor import diagnose, format_diagnosis
from asrlab.errors import UsageError
from asrlab.files import read_jsonl
from asrlab.nb import train_until_killed
from asrlab.lab.stall.heartbeat import write_heartbeat

from conftest import SMALL
from helpers import train2

FAST = SMALL  # test_stalls' small model: a step takes milliseconds; the stall watchdog on (its default)


def doctor(exp, capsys, *flags) -> tuple[int, str]:
    """``asrlab doctor EXP`` through the CLI: (exit code, what it printed)."""
    capsys.readouterr()
    code = main(["doctor", str(exp), *flags])
    return code, capsys.readouterr().out


def train(corpus, exp, *args) -> int:
    """``asrlab train`` in this process (one rank): the quickest real run."""
    return main(["train", "--data", str(corpus / "data.list"), "--exp", str(exp), *FAST, *args])


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory):
    """Two complete epochs with a ledger and a checkpoint every 4 steps (the last 3 kept)."""
    exp = tmp_path_factory.mktemp("finished") / "exp"
    assert train(corpus, exp, "--ledger", "--save-every-steps", "4", "--resume", "none", "train.max_epochs=2") == 0
    return exp


def copy_of(exp, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(exp, dst)
    return dst


def test_a_finished_run(finished, capsys):
    code, out = doctor(finished, capsys)
    d = diagnose(finished)
    last = d["last_step"]
    assert code == 0 and d["verdict"] == "finished" and d["ok"]
    assert out.startswith(f"FINISHED: finished at step {last} (max_epochs=2 reached)")
    # the trainer names no expected keys: each epoch ended with every key seen once, never "complete"
    assert [(e["epoch"], e["status"], e["keys"], e["exactly_once"]) for e in d["coverage"]["epochs"]] == [
        (0, "ended", 120, True),
        (1, "ended", 120, True),
    ]
    assert "epoch 0: ended, 120 keys, every key seen once; whether all were seen is not known" in out
    assert not d["coverage"]["expected_known"] and "complete" not in out.split("coverage (", 1)[1].split("\n\n")[0]
    assert [c["state"] for c in d["checkpoints"]["files"]] == ["ok"] * 3
    assert d["checkpoints"]["newest_loadable"] == f"step_{last:08d}.pt"
    assert [r["state"] for r in d["ranks"]] == ["done"] and d["steps"]["ranks"][0]["steps"] == last - 1
    assert d["loss_scale"]["first"] == d["loss_scale"]["last"] == 1.0 and d["loss_scale"]["skipped"] == 0
    assert d["resumes"]["resumed_from"] == [] and "resumes: none" in out
    split = d["steps"]["ranks"][0]["split"]  # where the wall clock went, named in the text
    assert sum(split[k] for k in ("data_wait", "host_overhead", "compute", "comm")) == pytest.approx(1, abs=1e-3)
    assert f"wall clock: data wait {100 * split['data_wait']:.0f}%" in out and "is the largest" in out
    text = out
    code, out = doctor(finished, capsys, "--json")
    parsed = json.loads(out)
    assert code == 0 and parsed["verdict"] == "finished" and parsed["coverage"]["epochs"][1]["once"] == 120
    assert format_diagnosis(parsed) == text  # the JSON holds everything the text says


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["doctor", str(tmp_path / "nothing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["doctor", str(tmp_path)]) == 2
    assert "no run there" in capsys.readouterr().err
    with pytest.raises(UsageError, match="no run there"):
        diagnose(tmp_path)


def _keys_of_epoch(exp, epoch):
    return [k for r in read_jsonl(exp / "ledger" / "rank0.jsonl") if r.get("epoch") == epoch for k in r["keys"]]


def test_broken_coverage_names_the_keys(finished, tmp_path, capsys):
    """Epoch 1 of the ledger edited: one utterance trained twice in place of another."""
    exp = copy_of(finished, tmp_path)
    path = exp / "ledger" / "rank0.jsonl"
    lines = read_jsonl(path)
    keys = _keys_of_epoch(exp, 1)
    twice, never = keys[0], keys[-1]
    for r in lines:
        if r.get("epoch") == 1 and never in r["keys"]:
            r["keys"] = [twice if k == never else k for k in r["keys"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    code, out = doctor(exp, capsys)
    d = diagnose(exp)
    e0, e1 = d["coverage"]["epochs"]
    assert code == 1 and d["verdict"] == "finished" and not d["ok"] and d["coverage"]["broken"]
    assert e0["exactly_once"] and not e1["exactly_once"]
    assert e1["repeated_keys"] == {twice: 2} and e1["skipped_keys"] == [never]
    assert f"epoch 1: ended, 119 keys, 1 repeated ({twice} x2), 1 skipped ({never})" in out and "BROKEN" in out
    # said on the verdict's own line too, not only in the coverage section below it
    assert d["summary"].endswith("; but epoch 1: 1 key trained twice, 1 key skipped"), d["summary"]


def test_expected_keys_from_lab_json(finished, tmp_path, capsys):
    """A loop that names the keys each epoch should cover: one that no epoch trained is found."""
    exp = copy_of(finished, tmp_path)
    keys = sorted(set(_keys_of_epoch(exp, 0))) + ["utt99999"]
    (exp / "keys.txt").write_text("".join(f"{k}\n" for k in keys))
    (exp / "lab.json").write_text(json.dumps({"world_size": 1, "epoch_keys": "keys.txt", "status": None}))
    code, out = doctor(exp, capsys)
    cov = diagnose(exp)["coverage"]
    assert code == 1 and cov["expected"] == 121 and [e["skipped_keys"] for e in cov["epochs"]] == [["utt99999"]] * 2
    assert "the 121 keys of" in out and "1 skipped (utt99999)" in out
    assert [e["status"] for e in cov["epochs"]] == ["complete"] * 2 and cov["expected_known"]  # known: complete


def test_a_corrupt_newest_checkpoint(finished, tmp_path, capsys):
    exp = copy_of(finished, tmp_path)
    ckpts = sorted((exp / "checkpoints").glob("step_*.pt"))
    newest, middle, oldest = ckpts[-1], ckpts[-2], ckpts[0]
    with open(newest, "r+b") as f:  # flip bytes in the middle of the newest
        f.seek(newest.stat().st_size // 2)
        b = f.read(16)
        f.seek(-16, 1)
        f.write(bytes(x ^ 0xFF for x in b))
    middle.with_suffix(".done").unlink()  # and one whose write never finished
    code, out = doctor(exp, capsys)
    d = diagnose(exp)
    states = {c["file"]: c["state"] for c in d["checkpoints"]["files"]}
    assert states[newest.name].startswith("SHA-256 mismatch") and states[middle.name].startswith("no marker")
    assert states[oldest.name] == "ok" and d["checkpoints"]["newest_loadable"] == oldest.name
    assert f"newest loadable: {oldest.name}" in out and f"{newest.name}: epoch 1 (done), SHA-256 mismatch" in out
    assert code == 0 and d["verdict"] == "finished"  # the run did finish; its integrity section says what is lost


def test_a_stopped_run(corpus, tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "STOP").write_text("test\n")  # asked before the first step: it stops after it
    assert train(corpus, exp, "train.max_epochs=5") == 0
    code, out = doctor(exp, capsys)
    d = diagnose(exp)
    assert code == 0 and d["verdict"] == "stopped" and d["last_step"] == 1
    assert out.startswith("STOPPED: stopped on request at step 1, before its limits (max_epochs=5)")
    assert "from step_00000001.pt" in out


def test_a_non_finite_halt(corpus, tmp_path, capsys):
    """A real divergence (an absurd LR) under train.nonfinite=halt: module, utterances, bundle."""
    exp = tmp_path / "exp"
    assert train(corpus, exp, "--max-steps", "20", "--nonfinite", "halt", "optim.lr=1e30", "optim.warmup_steps=0") == 4
    code, out = doctor(exp, capsys)
    d = diagnose(exp)
    bundle = next((exp / "nonfinite").glob("step*-rank0"))
    report = json.loads((bundle / "report.json").read_text())
    assert code == 1 and d["verdict"] == "nonfinite_halt" and not d["ok"]
    assert d["summary"] == json.loads((exp / "nonfinite" / "halt.json").read_text())["message"]
    [event] = d["nonfinite"]["events"]
    assert (event["step"], event["module"], event["direction"]) == (report["step"], report["module"], "forward")
    assert event["keys"] == report["keys"] and event["bundle"] == str(bundle) and d["last_step"] == report["step"]
    assert out.startswith(f"NONFINITE_HALT: halted at step {report['step']}")
    assert f"first in {report['where']}; utterances {report['keys'][0]}" in out and f"bundle: {bundle}" in out
    assert f"asrlab.train.replay.replay('{bundle}')" in out
    assert d["loss_scale"]["skipped_by_kind"] == {"loss": 1}


def test_loss_scale_history_of_an_fp16_run(corpus, tmp_path, capsys):
    """fp16 on the CPU overflows at the scaler's first scales: each step skipped halves the scale."""
    exp = tmp_path / "exp"
    assert train(corpus, exp, "--max-steps", "4", "--precision", "fp16") == 0
    code, out = doctor(exp, capsys)
    ls = diagnose(exp)["loss_scale"]
    n = ls["skipped_by_kind"].get("scaler", 0)
    assert code == 0 and ls["first"] == 65536.0 and n >= 1 and ls["skipped"] == n
    changes = n - (read_jsonl(exp / "metrics" / "rank0.jsonl")[-1]["nonfinite"] == "scaler")  # (seen next step)
    assert ls["changes"] == changes and ls["min"] == ls["last"] == 65536.0 / 2**changes
    assert f"loss scale: first 65536, min {ls['min']:g}, last {ls['last']:g}, {changes} changes" in out
    assert f"skipped steps: {n} (in the steps that count: scaler {n})" in out


def _beat(exp, rank, phase, step, age, pid, run="r1", in_phase=2.0):
    now = time.time()
    write_heartbeat(
        exp,
        {
            "rank": rank,
            "phase": phase,
            "step": step,
            "since": now - age - in_phase,
            "beats": 9,
            "detail": "",
            "completed": step - 1,
            "pid": pid,
            "host": socket.gethostname(),
            "time": now - age,
        },
        run,
    )


def test_heartbeats_say_running_frozen_or_gone(tmp_path, capsys):
    """What each rank does now; a heartbeat older than STALE_S (4 s) is a frozen process (alive) or a gone one."""
    exp = tmp_path / "exp"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _beat(exp, 0, "forward", 5, 0.2, os.getpid())
    _beat(exp, 1, "allreduce", 5, 0.4, os.getpid())
    code, out = doctor(exp, capsys)
    d = diagnose(exp)
    assert code == 0 and d["verdict"] == "running" and [r["state"] for r in d["ranks"]] == ["alive", "alive"]
    assert (
        f"rank 1 ({socket.gethostname()}, pid {os.getpid()}): blocked in the gradient all-reduce of step 5 for 2"
    ) in out
    d = diagnose(exp, now=time.time() + 10)  # looked at 10 s later: the processes are there, their beats old
    assert d["verdict"] == "stalled" and [r["state"] for r in d["ranks"]] == ["frozen", "frozen"]
    assert d["summary"].startswith(f"ranks 0, 1 frozen: process alive (pid {os.getpid()}) but no heartbeat for 10 s")
    _beat(exp, 1, "allreduce", 5, 1.0, dead.pid)
    code, out = doctor(exp, capsys)
    d = diagnose(exp)
    assert code == 1 and d["verdict"] == "crashed" and d["ranks"][1]["state"] == "gone"
    assert d["summary"].startswith(
        f"rank 1 ended without recording an error: it vanished (pid {dead.pid} on "
        f"{socket.gethostname()}, last seen blocked in the gradient all-reduce of step 5"
    )
    _beat(exp, 1, "done", 5, 100.0, dead.pid, run="older")  # a file of an earlier launch is not this run's
    assert [r["rank"] for r in diagnose(exp)["ranks"]] == [0]


def test_an_error_of_the_attempt_before_a_torch_elastic_restart_is_history(tmp_path, monkeypatch):
    """A rank of the failed attempt records its error around when the restarted attempt starts; the restarted
    attempt finished: the verdict is the restarted attempt's, the error is history."""
    from asrlab.lab.stall.errors import record_rank_error

    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "config.yaml").write_text("train: {}\n")  # the restarted attempt's rank 0 wrote it
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # what torchrun gives the failed attempt's ranks
    record_rank_error(exp, RuntimeError("Connection reset by peer"), rank=0)
    for rank in (0, 1):
        _beat(exp, rank, "done", 9, 0.1, os.getpid(), run="job.1")
    d = diagnose(exp)
    assert d["verdict"] == "finished" and d["error"] is None, d["summary"]
    assert any("Connection reset by peer" in h for h in d["history"]), d["history"]


def test_a_ranks_own_error_of_memory_is_out_of_memory_with_what_to_do(tmp_path):
    """A rank's recorded MemoryError (or torch.OutOfMemoryError) is out of memory, as a log's would be, not a crash;
    the next step says to make the batch smaller."""
    from asrlab.lab.stall.errors import record_rank_error

    exp = tmp_path / "exp"
    exp.mkdir()
    for rank in (0, 1):
        _beat(exp, rank, "train", 7, 0.1, os.getpid(), run="job.1")
    record_rank_error(exp, MemoryError("could not allocate 96 GiB for the attention cache"), rank=1, run="job.1")
    d = diagnose(exp)
    assert (d["verdict"], d["culprit"]["rank"]) == ("out_of_memory", 1), d["summary"]
    assert d["next"].startswith("make the batch (or the model) smaller") and not d["ok"]


def test_a_crashed_rank(corpus, tmp_path, capsys):
    """One shard of four cut short, with data.bad_input=fail: the rank that reads it raises."""
    shards = load_sources(corpus / "data.list")[:4]
    cut = tmp_path / "cut.tar"
    data = open(shards[3].path, "rb").read()
    cut.write_bytes(data[: len(data) // 2])
    lst = tmp_path / "data.list"
    lst.write_text("".join(f"{s.path}\n" for s in shards[:3]) + f"{cut}\n")
    exp = tmp_path / "exp"
    out = train2(lst, exp, "data.bad_input=fail", "--stall-timeout", "20")
    assert out.returncode != 0, out.stderr[-3000:]
    [err] = [json.loads(p.read_text()) for p in (exp / "errors").glob("rank*.json") if "truncated" in p.read_text()]
    code, text = doctor(exp, capsys)
    d = diagnose(exp)
    assert code == 1 and d["verdict"] == "crashed"
    e = d["error"]
    assert (e["rank"], e["type"], e["message"]) == (err["rank"], "DataError", err["message"])
    assert "cut.tar" in e["message"] and "truncated_tar" in e["message"]
    assert d["summary"].startswith(f"rank {err['rank']} failed") and e["traceback_tail"]
    assert (
        f"first error: rank {err['rank']} failed at step 1 (waiting for data): DataError: " in text
        and "next: fix the cause, then run the same command again (no checkpoint loads" in text
    )


def test_killed_then_resumed(corpus, tmp_path, capsys):
    """SIGKILL at step 7 (checkpoints every 3): a crash without an error; the resume is listed and the
    epoch it finished is covered exactly once (the killed launch's step 7 was undone)."""
    exp = tmp_path / "exp"
    args = ["--data", str(corpus / "data.list"), "--ledger", "--save-every-steps", "3", "train.max_epochs=1", *FAST]
    killed = train_until_killed([*args, "data.inject_delay_s=0.2"], exp, 7, timeout_s=120)  # slow enough for
    # the watchdog to write a heartbeat (once a second)
    code, text = doctor(exp, capsys)
    d = diagnose(exp)
    assert code == 1 and d["verdict"] == "crashed" and d["ranks"][0]["state"] == "gone"
    assert d["summary"].startswith("rank 0 ended without recording an error") and "killed (SIGKILL" in text
    saved = int(d["checkpoints"]["newest_loadable"][5:13])
    assert 3 <= saved < killed and saved % 3 == 0  # steps after the checkpoint were trained, then lost
    assert main(["train", "--exp", str(exp), *args]) == 0
    code, text = doctor(exp, capsys)
    d = diagnose(exp)
    assert code == 0 and d["verdict"] == "finished"
    assert d["resumes"]["resumed_from"] == [saved] and f"resumes: from step {saved}" in text
    [e0] = d["coverage"]["epochs"]
    assert e0["status"] == "ended" and e0["exactly_once"] and e0["keys"] == 120
    assert d["history"] == []


def test_reading_a_log_or_a_run_folder_does_not_start_torch():
    """The doctor reads logs, ledgers, heartbeats and checkpoint markers without torch (seconds of start-up
    on a small machine, before a person sees a verdict); torch loads only to open a checkpoint's tensors."""
    fixtures = os.path.join(os.path.dirname(__file__), "fixtures")
    code = (
        "import contextlib, io, sys\n"
        "from asrlab.cli import main\n"
        "for target in sys.argv[1:]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        main(['doctor', target])\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            os.path.join(fixtures, "watched", "rank_killed_survivor_reset"),
            os.path.join(fixtures, "logs", "icefall", "nan_inf_losses_all_ranks_mpirun.log"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout


def test_a_toolkits_experiment_folder_is_read_as_its_logs(tmp_path, capsys):
    """ESPnet's exp/asr_train_* has a config.yaml of its own: not asrlab's run folder; its train.log is read."""
    case = Path(__file__).parent / "fixtures" / "toolkit_runs" / "espnet" / "nan_single_e2b5"
    exp = tmp_path / "asr_train_tiny"
    exp.mkdir()
    shutil.copy(case / "exp" / "asr" / "config.yaml", exp / "config.yaml")
    shutil.copy(case / "console.log", exp / "train.log")
    assert main(["doctor", str(exp), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["read"] == "logs" and d["verdict"] == "nonfinite", d["summary"]
    assert (
        (d["culprit"]["epoch"], d["culprit"]["batch"])
        == (2, 5)
        == (d["nonfinite"]["first"]["epoch"], d["nonfinite"]["first"]["batch"])
    )


def test_every_ranks_error_of_being_ended_from_outside_is_a_stop_not_a_crash(tmp_path):
    """SIGTERM to torchrun over a loop of the parts: both ranks' DataLoader workers die of it first, and each rank
    records "DataLoader worker ... is killed by signal: Terminated." (tests/fixtures/parts_runs/). No rank went
    first and nothing else failed: the job was stopped by SIGTERM, not a crash of rank 1."""
    exp = tmp_path / "exp"
    shutil.copytree(Path(__file__).parent / "fixtures" / "parts_runs" / "sigterm_to_torchrun", exp)
    d = diagnose(exp)
    assert d["verdict"] == "stopped" and d["summary"].startswith("the job was stopped by SIGTERM from outside"), d[
        "summary"
    ]


def test_an_earlier_launchs_error_of_a_rank_being_ended_is_said_as_a_consequence():
    """A run resumed after a rank was SIGKILLed: the survivor's recorded error ("DataLoader worker ... killed by
    signal: Terminated", its launcher ending it) is history, said as what followed that launch's failure."""
    from asrlab.doctor.sources.run_events import history

    ended = {"rank": 0, "time": 1.0, "type": "RuntimeError", "step": 25, "phase": "compute",
             "message": "DataLoader worker (pid 7) is killed by signal: Terminated. "}  # fmt: skip
    own = {"rank": 1, "time": 2.0, "type": "ValueError", "step": 3, "phase": "compute", "message": "no frames"}
    said = history({}, [ended, own], [], None, None, None)
    assert said[0].startswith("earlier launch: rank 0") and "not its cause" in said[0], said
    assert "not its cause" not in said[1], said


def test_a_live_jobs_look_has_the_doctors_one_json_shape():
    """``asrlab doctor --pid PID --json``: the keys of every diagnosis (what was read: ``pid``), stalled where no
    rank's stacks moved, the one rank not waiting for the others its culprit."""
    from asrlab.cli.runs import pid_diagnosis
    from asrlab.doctor import SCHEMA

    rank = {"rank": 0, "pid": 11, "phase": "allreduce", "step": 7, "detail": "", "stacks": {}, "workers": {}}
    look = {"verdict": "rank 1 is waiting for data; rank 0 is waiting in ...", "moved": False, "busy": {},
            "root": 10, "world_size": 2, "ranks": [rank, {**rank, "rank": 1, "pid": 12, "phase": "data"}]}  # fmt: skip
    d = pid_diagnosis(look, 10)
    assert tuple(d) == SCHEMA and d["read"] == "pid" and d["paths"] == ["10"]
    assert d["verdict"] == "stalled" and not d["ok"] and d["culprit"]["rank"] == 1 and d["culprit"]["step"] == 7
    d = pid_diagnosis({**look, "moved": True}, 10)
    assert d["verdict"] == "running" and d["ok"] and d["culprit"]["rank"] is None
    # a rank in its own code that used most of a CPU over the look: computing, not blocked
    d = pid_diagnosis({**look, "busy": {1: 0.97}}, 10)
    assert d["verdict"] == "running" and d["ok"], d
    json.dumps(d)

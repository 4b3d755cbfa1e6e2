"""A watched job's own output: passed through, kept in EXP/job.log, and read by the doctor with the
toolkits' log readers (tests/loops/printing_loop.py, a stranger's loop that prints its own progress)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from asrlab.doctor import diagnose, format_diagnosis

LOOP = Path(__file__).parent / "loops" / "printing_loop.py"


def watch(
    exp: Path, fault: str = "", steps: int = 40, timeout: str = "60", *flags, sleep: str = "0.05", **popen
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "asrlab.cli",
        "watch",
        "--exp",
        str(exp),
        "--stall-timeout",
        timeout,
        *flags,
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(LOOP),
    ]
    env = {**os.environ, "FAULT": fault, "STEPS": str(steps), "SLEEP": sleep, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_steps_printed_in_the_jobs_output_end_the_first_step_allowance(tmp_path):
    """A loop whose steps are too short to be sampled computing (most of its time asleep in its own code, 0.3 s
    a step) is seen training from its own step lines, and moving while it prints new ones (its stacks sampled at
    one line for longer than --stall-timeout): when rank 1 then sleeps for good, the stall is found after
    --stall-timeout, not after the first-step allowance (3x) that holds while ranks may still be starting, and
    not before, while both ranks were asleep between steps."""
    exp = tmp_path / "exp"
    proc = watch(exp, "hang:1:30", 200, "5", "--on-stall", "kill", sleep="0.3")
    out, err = proc.communicate(timeout=150)
    report = json.loads((exp / "stall_report.json").read_text())
    assert report["timeout_s"] == 5 and report["verdict"].startswith("rank 1 "), (report["verdict"], err[-2000:])
    assert "rank 0 is waiting in DDP's gradient all-reduce" in report["verdict"], report["verdict"]


def test_a_config_dump_is_not_steps_and_two_step_lines_at_once_are_not_two_moments(tmp_path, monkeypatch):
    """What counts as the job's steps: a loss's value beside a counter, at two moments a second apart."""
    from asrlab.watch import output

    clock = [1000.0]
    monkeypatch.setattr(output.time, "time", lambda: clock[0])
    job = output.JobOutput(tmp_path)
    job._saw(b"model:\n  loss_weight: 0.3\n  ctc_loss: 1\nepoch 0 step 1 loss=2.5\nepoch 0 step 2 loss=2.4\n")
    clock[0] += 0.5
    job._saw(b"loss_weight: 0.3 (rank 1's config)\n")
    assert not job.training()
    clock[0] += 0.6
    job._saw(b"\r  3%|3         | 12/400 [00:05<02:40,  2.42it/s, loss=1.91]")  # a bar's redraw, no newline yet
    assert job.training()
    job.close()
    # a loss by its own name beside a loop's own counter: the logging module's "it=00080 | xent=1.3070", a JSON
    # line's "upd": 55 with "ctc": 2.47, or its loss written L ("L": 2.3); not its learning rate's "LR"
    for first, second in (
        (b"09:00:15.086 w1 I it=00070 | xent=1.3212 | lr=3.0e-03\n", b"09:00:16.101 w1 I it=00080 | xent=1.3070\n"),
        (b'{"upd": 50, "rank": 1, "ctc": 2.45}\n', b'{"upd": 55, "rank": 1, "ctc": 2.47}\n'),
        (b'{"@": "r1", "it": 38, "upd": 19, "L": 2.29}\n', b'{"@": "r1", "it": 40, "upd": 20, "L": NaN}\n'),
        (b"[w46 r0] i=0000 loss=1.7031\n", b"[w46 r1] i=0004 loss=1.6219\n"),  # enumerate's index, printed as i=
    ):
        job = output.JobOutput(tmp_path)
        job._saw(first + b"  ctc_weight: 0.3\n")
        clock[0] += 1.1
        job._saw(second)
        assert job.training(), second
        job.close()
    job = output.JobOutput(tmp_path)
    job._saw(b'{"it": 1, "LR": 0.1}\n')
    clock[0] += 1.1
    job._saw(b'{"it": 2, "LR": 0.1}\n')
    assert not job.training()
    job.close()


def test_a_bars_redraws_are_kept_in_their_place_among_the_other_pipes_lines(tmp_path):
    """tqdm redraws its bar on stderr with ``\\r`` and no newline for a whole epoch; a line on stdout meanwhile (a
    signal's notice) is kept after the redraws that came before it, not before the whole epoch's bar."""
    from asrlab.watch import output

    job = output.JobOutput(tmp_path)
    err_r, err_w = os.pipe()
    out_r, out_w = os.pipe()
    sink = open(os.devnull, "wb")
    job.pump(os.fdopen(err_r, "rb", buffering=0), sink)
    job.pump(os.fdopen(out_r, "rb", buffering=0), sink)
    os.write(err_w, b"\rEpoch 0:  59%| 59/100 [loss=2.9]\rEpoch 0:  60%| 60/100 [loss=2.9]\r")
    deadline = time.time() + 30
    while b"60/100" not in (tmp_path / "job.log").read_bytes() and time.time() < deadline:
        time.sleep(0.05)
    os.write(out_w, b"[rank: 0] Received SIGTERM: 15\n")
    os.close(out_w)
    while b"SIGTERM" not in (tmp_path / "job.log").read_bytes() and time.time() < deadline:
        time.sleep(0.05)
    os.write(err_w, b"Epoch 0:  61%| 61/100 [loss=2.7]\n")
    os.close(err_w)
    job.close()
    sink.close()
    kept = (tmp_path / "job.log").read_bytes()
    assert kept.index(b"60/100") < kept.index(b"Received SIGTERM") < kept.index(b"61/100"), kept


def test_the_loops_own_nan_losses_are_read_from_its_output(tmp_path):
    exp = tmp_path / "exp"
    out, err = watch(exp, "nan:10", steps=16).communicate(timeout=150)
    assert "epoch 0 step 15 loss=nan rank 0" in out  # passed through unchanged
    assert "loss=nan" in (exp / "job.log").read_text()  # and kept
    d = diagnose(exp)
    assert d["verdict"] == "nonfinite", d["summary"]
    assert d["culprit"]["step"] == 10 and "loss not finite" in d["summary"], d["summary"]
    # the job exited 0: the watch says what its output showed, and where to read more
    assert f"asrlab watch: nonfinite: {d['summary']}\n  asrlab doctor {exp}" in err, err[-2000:]


@pytest.mark.parametrize("how,signame", [("kill", "SIGKILL"), ("abort", "SIGABRT")])
def test_a_rank_ended_by_a_signal_is_named_with_that_signal(tmp_path, how, signame):
    """torchrun's summary in the job's output says which signal: SIGKILL is not SIGABRT, and neither is a
    guess."""
    exp = tmp_path / "exp"
    proc = watch(exp, f"{how}:1:8")
    _, err = proc.communicate(timeout=150)
    assert proc.returncode != 0
    d = diagnose(exp)
    assert d["verdict"] == "killed", d["summary"]
    assert err.rstrip().endswith(f"asrlab watch: killed: {d['summary']}\n  asrlab doctor {exp}"), err[-2000:]
    assert d["summary"].startswith(f"rank 1 was killed by {signame} at step 7"), d["summary"]
    assert {k: d["culprit"][k] for k in ("rank", "step")} == {"rank": 1, "step": 7}


def test_a_raising_ranks_step_is_read_from_the_jobs_output(tmp_path):
    """The watch records the rank's exception with no step (it knows none); the loop's own lines place it.
    A raising rank is the first failure, not a stall of the rank left waiting for it."""
    exp = tmp_path / "exp"
    proc = watch(exp, "raise:1:8")
    proc.communicate(timeout=150)
    assert proc.returncode != 0
    d = diagnose(exp)
    assert d["verdict"] == "crashed" and d["summary"].startswith("rank 1 failed: ValueError: a batch of shape"), d[
        "summary"
    ]
    assert d["error"]["type"] == "ValueError" and not (exp / "stall_report.json").exists()
    assert {k: d["culprit"][k] for k in ("rank", "step")} == {"rank": 1, "step": 7}, d["culprit"]


def _killed_survivor_reset(tmp_path) -> Path:
    """A copy of a real watched run: rank 1 SIGKILLed, rank 0's "Connection reset by peer" recorded first."""
    exp = tmp_path / "exp"
    shutil.copytree(Path(__file__).parent / "fixtures" / "watched" / "rank_killed_survivor_reset", exp)
    return exp


def test_a_survivors_lost_peer_error_recorded_first_is_not_the_cause(tmp_path):
    """When the survivor's "Connection reset by peer" was recorded before the watch saw the killed rank go (a
    busy machine), the job's output still names the killed rank first and the survivor's error after it."""
    exp = _killed_survivor_reset(tmp_path)
    d = diagnose(exp)
    assert d["verdict"] == "killed", d["summary"]
    assert d["summary"].startswith("rank 1 was killed by SIGKILL at step 7"), d["summary"]
    assert "then rank 0 failed" in d["summary"] and "Connection reset by peer" in d["summary"]
    assert {k: d["culprit"][k] for k in ("rank", "step")} == {"rank": 1, "step": 7}
    text = format_diagnosis(d)  # the survivor's error is not shown as the first one under the killed rank
    assert "first error:" not in text and "error of a rank whose peer was gone (a consequence" in text, text[:1500]


def test_ranks_a_script_started_are_one_launch_and_the_pid_bash_names_is_their_rank(tmp_path):
    """Two ranks a script started itself (RANK set, no torch elastic): both ranks' heartbeats and rank 0's error
    are this launch's (the watch's run id, not each process's own), and bash's "line 11: PID Killed" names rank 1
    by the pid its heartbeat holds."""
    exp = tmp_path / "exp"
    shutil.copytree(Path(__file__).parent / "fixtures" / "watched" / "script_ranks_rank1_sigkill", exp)
    d = diagnose(exp)
    assert d["verdict"] == "killed" and d["summary"].startswith("rank 1 was killed by SIGKILL at batch 5"), d["summary"]
    assert [r["rank"] for r in d["ranks"]] == [0, 1] and not d["history"], (d["ranks"], d["history"])


def test_one_process_a_signal_ended_is_killed_by_that_signal(tmp_path):
    """A job of one process SIGKILLed (nothing printed): the watch's exit code is the process's own, so it was
    killed by SIGKILL, not a guess that it vanished "as the other ranks saw it" (there are none)."""
    exp = tmp_path / "exp"
    shutil.copytree(Path(__file__).parent / "fixtures" / "watched" / "one_process_sigkill", exp)
    d = diagnose(exp)
    assert d["verdict"] == "killed" and "ended by SIGKILL (exit code 137)" in d["summary"], d["summary"]
    assert "other ranks" not in d["summary"] and d["culprit"]["rank"] == 0, d["summary"]


def test_a_launcher_that_a_sigterm_ended_stopped_the_job_not_a_rank_that_vanished(tmp_path):
    """Lightning Fabric's own launcher (rank 0, which started rank 1) ended by SIGTERM from outside: the watch's
    exit code is its own (143), so the job was stopped, not killed (SIGKILL, the OOM killer) in a rank that
    vanished first."""
    exp = tmp_path / "exp"
    shutil.copytree(Path(__file__).parent / "fixtures" / "watched" / "fabric_launcher_sigterm", exp)
    d = diagnose(exp)
    assert d["verdict"] == "stopped" and "ended by SIGTERM (exit code 143)" in d["summary"], d["summary"]
    assert "vanished" not in d["summary"] and "OOM" not in d["summary"], d["summary"]


def test_without_the_jobs_output_a_vanished_peer_still_comes_before_the_survivors_error(tmp_path):
    """The same run read from the folder alone (no job output kept), with the killed rank's last heartbeat,
    written a second before the survivor's error, by a process that is gone: the vanished rank is the cause."""
    exp = _killed_survivor_reset(tmp_path)
    (exp / "job.log").unlink()
    beat = json.loads((exp / "heartbeat" / "rank0.json").read_text())
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no process has now
    beat.update(rank=1, pid=gone.pid, time=beat["time"] - 1.0, since=beat["since"] - 1.0)
    (exp / "heartbeat" / "rank1.json").write_text(json.dumps(beat))
    d = diagnose(exp)
    assert d["summary"].startswith("rank 1 ended without recording an error: it vanished"), d["summary"]
    assert "; then rank 0 failed" in d["summary"] and d["error"]["lost_peer"], d["summary"]
    text = format_diagnosis(d)
    assert "first error:" not in text and "error of a rank whose peer was gone (a consequence" in text, text[:1500]


def _job_process(watch_pid: int, marker: str) -> psutil.Process:
    """The process of the watched job whose command line holds ``marker`` (torchrun's agent)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        for p in psutil.Process(watch_pid).children(recursive=True):
            try:
                line = " ".join(p.cmdline())
                # the watch's keeper holds the job's command too; a process forked and not yet exec'd, its parent's
                up = " ".join(p.parent().cmdline())
                if marker in line and "keeper" not in line and (marker not in up or "keeper" in up):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no process of the job with {marker!r}")


@pytest.mark.parametrize("target", ["watch", "launcher"])
def test_sigterm_to_the_watch_or_the_launcher_is_a_stop(tmp_path, target):
    """SIGTERM at step 5 to ``asrlab watch`` or to torchrun: the job was stopped, by that signal, at its step,
    never a rank's crash."""
    exp = tmp_path / "exp"
    proc = watch(exp, steps=100000)
    deadline = time.time() + 90
    while "step 5 " not in (exp / "job.log").read_text() if (exp / "job.log").exists() else True:
        assert time.time() < deadline and proc.poll() is None, (
            proc.stderr.read()[-2000:] if proc.poll() else "no step 5"
        )
        time.sleep(0.2)
    family = []
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
        if target == "watch":
            proc.send_signal(signal.SIGTERM)
        else:
            _job_process(proc.pid, "torch.distributed.run").terminate()
        # generous: torchrun gives its workers 30 s to end before it kills them, and a loaded machine slows each step
        _, err = proc.communicate(timeout=180)
    finally:  # a failure here leaves nothing of the job running
        for p in family:
            try:
                p.kill()
            except psutil.Error:
                pass
        if proc.poll() is None:
            proc.kill()
    d = diagnose(exp)
    if target == "watch":
        assert proc.returncode == 128 + signal.SIGTERM
        assert d["verdict"] == "stopped", d["summary"]
        assert d["summary"].startswith("ended by SIGTERM to asrlab watch at ") and "step" in d["summary"], d["summary"]
        assert json.loads((exp / "lab.json").read_text())["status"] == "stopped"
    else:
        assert proc.returncode != 0
        assert d["verdict"] == "stopped" and "SIGTERM" in d["summary"] and "step" in d["summary"], d["summary"]
        assert "vanished" not in d["summary"] and "crash" not in d["summary"], d["summary"]
        # the console says how the job ended, as the folder does: a reader of the console alone is told the stop
        assert f"asrlab watch: stopped: {d['summary']}" in err, err[-2000:]


STRANGER = """
import time, torch
w = torch.nn.Linear(8, 1)
opt = torch.optim.AdamW(w.parameters(), lr=1e-2)
for it in range(16):
    loss = (w(torch.randn(16, 8)) ** 2).mean() * (float("nan") if it >= 10 else 1.0)
    opt.zero_grad(); loss.backward(); opt.step()
    print(f"it={it} | train/loss={loss.item():.4f} | lr=1e-2", flush=True)
    time.sleep(0.05)
"""


def test_a_watched_nan_is_one_event_in_the_verdict_the_section_and_the_json(tmp_path):
    """One process, no torchrun, its own print format: the verdict, the non-finite section and --json's culprit
    all come from the same event (the first line with a non-finite loss), and the job's lines carry the watch's
    clock (job.times)."""
    loop = tmp_path / "loop.py"
    loop.write_text(STRANGER)
    exp = tmp_path / "exp"
    cmd = [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(exp), "--", sys.executable, str(loop)]
    subprocess.run(cmd, capture_output=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert (exp / "job.times").read_text().split()[0] == "0"
    d = diagnose(exp)
    assert d["verdict"] == "nonfinite" and d["basis"] == "job output", d["summary"]
    assert d["culprit"]["step"] == 10 == d["job_output"]["nonfinite"]["first"]["step"], d["culprit"]
    assert d["nonfinite"]["count"] == d["job_output"]["nonfinite"]["count"] > 0  # --json's count, where it is read
    text = format_diagnosis(d)
    assert "non-finite steps: none" not in text and "first at step 10" in text, text
    assert "train.ledger" not in text and "--ledger" not in text, text  # no words of asrlab's trainer for a stranger


RESUMER = """
import os, signal, time
for step in range(int(os.environ.get("START", "0")), 16):
    print(f"step {step} | loss {1.0 / (step + 1):.4f}", flush=True)
    if os.environ.get("DIE_AT") == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.02)
"""


def test_a_stranger_loop_killed_then_resumed_shows_the_resume_and_the_earlier_launch(tmp_path):
    """Two watches into one EXP: the first launch SIGKILLed after step 11, the second starting again at step
    10. No ledger: the resume is read from the job's own lines, the first launch's end kept in lab.json."""
    exp, loop = tmp_path / "exp", tmp_path / "resumer.py"
    loop.write_text(RESUMER)
    for env in ({"DIE_AT": "11"}, {"START": "10"}):
        cmd = [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(exp), "--", sys.executable, str(loop)]
        subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, timeout=120)
    d = diagnose(exp)
    assert d["verdict"] == "finished", d["summary"]
    said = [r["text"] for r in d["resumes"]["from_output"]]
    assert said == ["resumed at step 10 after step 11: 2 steps run again"], d["resumes"]
    assert d["summary"] == "finished; resumed at step 10 after step 11: 2 steps run again"  # said first, as a log's
    assert any(h.startswith("earlier launch: ended ") and "exit code 137 (SIGKILL)" in h for h in d["history"])
    text = format_diagnosis(d)
    assert "resumes: read from the job's output: resumed at step 10 after step 11" in text, text


def test_the_watched_trainers_own_run_folder_is_read_with_the_watchs(tmp_path):
    """``asrlab watch -- asrlab train --exp X``: the trainer's own watchdog ended the job and wrote its stall report
    in X, not in the watch's folder. The doctor of the watch's folder reads X too, inside it or where the command's
    ``--exp`` names it: a stall, not a rank that vanished; the trainer's step times beside the sampled ones."""
    exp = tmp_path / "exp"
    shutil.copytree(Path(__file__).parent / "fixtures" / "watched" / "train_inside_stalled", exp)
    inside = diagnose(exp)
    elsewhere = tmp_path / "runs" / "train"
    elsewhere.parent.mkdir()
    shutil.move(exp / "train", elsewhere)
    lab = json.loads((exp / "lab.json").read_text())
    lab["watched"][lab["watched"].index("--exp") + 1], lab["cwd"] = "runs/train", str(tmp_path)
    (exp / "lab.json").write_text(json.dumps(lab))
    named = diagnose(exp)
    # without it: what the job printed (its own watchdog's word) and its one process's exit code
    lab["watched"][lab["watched"].index("--exp") + 1] = str(tmp_path / "gone")
    (exp / "lab.json").write_text(json.dumps(lab))
    alone = diagnose(exp)
    for d, folder in ((inside, exp / "train"), (named, elsewhere)):
        assert d["verdict"] == "stalled" and d["summary"].startswith("rank 0 has waited 10 s for data at step 4"), d
        assert d["culprit"]["rank"] == 0 and d["stall"]["report"] == str(folder / "stall_report.txt")
        assert [s["files"] for s in d["sources"]] == [[str(folder)]]
        assert [r.get("median_step_s") is not None for r in d["steps"]["ranks"]] == [True, False]  # then sampled
        assert f"also read: {folder}" in format_diagnosis(d)
    assert alone["verdict"] == "stalled" and "exited with code 3" in alone["summary"] and alone["sources"] is None
    outer = tmp_path / "outer"  # a run folder of asrlab train's, not a watch's: another run inside it is its own
    shutil.copytree(elsewhere, outer)
    shutil.copytree(elsewhere, outer / "old")
    assert diagnose(outer)["sources"] is None


def test_the_gpu_busy_share_the_watch_read_tells_the_trainers_timed_steps_bound_once(tmp_path):
    """A finished ``asrlab watch -- asrlab train``: one bound for rank 0, its timed steps', told with the GPU busy
    share the watch read (NVML; given here, as a CPU reads none), not a second from the sampled stacks."""
    exp = tmp_path / "exp"
    shutil.copytree(Path(__file__).parent / "fixtures" / "watched" / "train_inside_finished", exp)
    timed, sampled = diagnose(exp)["steps"]["ranks"]
    assert timed["bound"]["bound"] == "compute" and "bound" not in sampled  # no GPU read: the timed parts
    beat = json.loads((exp / "heartbeat" / "rank0.json").read_text())
    (exp / "heartbeat" / "rank0.json").write_text(json.dumps({**beat, "gpu_busy": 0.05}))
    d = diagnose(exp)
    timed, sampled = d["steps"]["ranks"]
    assert "bound" not in sampled and timed["gpu_busy"] == 0.05 and timed["split"]["basis"] == "GPU busy (NVML)"
    assert timed["bound"]["bound"] == "host" and timed["bound"]["evidence"].startswith("the GPU idles 95%"), timed
    assert format_diagnosis(d).count("    bound: ") == 1


def test_a_stopped_watched_trainer_stopped_at_its_furthest_step_not_its_last_logged_one():
    """SIGTERM to the watch of ``asrlab train``, whose log names steps only at an epoch's end (61): its metrics
    reach 65, and the stop is placed there."""
    d = diagnose(Path(__file__).parent / "fixtures" / "watched" / "train_inside_sigterm")
    assert d["verdict"] == "stopped" and d["culprit"]["step"] == d["last_step"] == 65, d["culprit"]


def test_a_watched_loops_own_checkpoints_in_its_folder_are_read_and_named_for_its_resume():
    """A stranger's loop saves ``ckpt/snap_it0010.pt`` of its own in the watch's folder, then its launcher is
    SIGTERMed: the checkpoint is listed with its step, and the next step names it (not asrlab's RunState)."""
    d = diagnose(Path(__file__).parent / "fixtures" / "watched" / "spawn_loop_own_checkpoint_launcher_sigterm")
    assert d["verdict"] == "stopped" and d["checkpoints"]["own"], d["summary"]
    assert [(Path(c["file"]).name, c["step"], c["state"]) for c in d["checkpoints"]["files"]] == [
        ("snap_it0010.pt", 10, "ok")
    ]
    text = format_diagnosis(d)
    [hint] = [ln for ln in text.splitlines() if ln.startswith("  next: ")]
    assert "its newest checkpoint is " in hint and "RunState" not in hint and "snap_it0010.pt: step 10, ok" in text


def test_a_ranks_own_stall_watchdog_in_a_log_is_a_stall_at_its_step(tmp_path):
    """The job's console alone (a torchrun restart's log, say): the trainer's own watchdog said "STALL: rank 0 has
    waited 10 s for data at step 4"; that is the stall, at its step, said as the rank's watchdog's, not the watch's."""
    log = tmp_path / "console.log"
    shutil.copy(Path(__file__).parent / "fixtures" / "watched" / "train_inside_stalled" / "job.log", log)
    d = diagnose(log)
    assert d["verdict"] == "stalled" and {k: d["culprit"][k] for k in ("rank", "step")} == {"rank": 0, "step": 4}
    assert d["summary"].startswith("the ranks' own stall watchdog found the job stalled: rank 0 has waited"), d


def test_a_collective_timed_out_in_a_watched_job_is_a_stall_caused_by_the_peer_that_never_came():
    """A stranger's loop under the watch (``tests/fixtures/watched/loop_gloo_timeout_rank1_held``): rank 1 holds
    still in its own code, and gloo's own timeout ends rank 0 before the watch's allowance does. The error the
    watch recorded, rank 0's "Timed out waiting 20000ms for recv", is the stall's consequence: the verdict is a
    stall, its culprit rank 1 (its heartbeat held longest, outside any collective), at the step the job printed."""
    d = diagnose(Path(__file__).parent / "fixtures" / "watched" / "loop_gloo_timeout_rank1_held")
    assert (d["verdict"], d["culprit"]["rank"], d["culprit"]["step"]) == ("stalled", 1, 19), d["summary"]
    assert d["summary"].startswith("rank 1 held the others up") and "rank 0 timed out" in d["summary"], d["summary"]


def test_a_launch_that_finished_after_an_earlier_ones_kill_is_finished():
    """Two launches into one EXP (``tests/fixtures/watched/torchrun_killed_then_resumed_from_its_checkpoint``):
    rank 1 killed in the first, the second restored its checkpoint and finished. What the job printed before
    this launch began is the earlier launch's: the verdict is finished, the kill is history."""
    d = diagnose(Path(__file__).parent / "fixtures" / "watched" / "torchrun_killed_then_resumed_from_its_checkpoint")
    assert d["verdict"] == "finished" and d["ok"], d["summary"]
    assert any("earlier" in h and "SIGKILL" in h for h in d["history"]), d["history"]


def test_a_launchers_restart_of_its_ranks_within_one_launch_that_finished_is_finished():
    """torchrun --max-restarts 1 under one watch (``tests/fixtures/watched/torchrun_restarted_its_ranks_after_a_raise_
    then_finished``): rank 1 raised on the first attempt, torchrun started both ranks again and they finished. What
    the first attempt's ranks recorded and printed is history; the verdict is finished."""
    d = diagnose(
        Path(__file__).parent / "fixtures" / "watched" / "torchrun_restarted_its_ranks_after_a_raise_then_finished"
    )
    assert d["verdict"] == "finished" and d["ok"], d["summary"]
    assert any("tripped on purpose" in h for h in d["history"]), d["history"]
    # the first attempt's errors are of this launch (torchrun started its ranks again), rank 0's a consequence
    said = [h for h in d["history"] if h.startswith("an earlier attempt of this launch: rank ")]
    assert said[0].startswith("an earlier attempt of this launch: rank 1 failed: RuntimeError: hum"), said
    assert said[1].startswith("an earlier attempt of this launch: rank 0") and said[1].endswith("not the cause)"), said


def test_the_jobs_lines_are_written_whole_even_where_its_environment_made_it_unbuffered(tmp_path):
    """PYTHONUNBUFFERED=1 in the job's own environment (as many images set it): ``print`` would write its text and
    its newline apart, and two ranks' lines glue; under the watch each stream is line-buffered still."""
    probe = "import sys; print(sys.stdout.line_buffering, sys.stderr.line_buffering, sys.stdout.write_through)"
    watch = [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(tmp_path / "exp")]
    cmd = [*watch, "--", sys.executable, "-c", probe]
    out = subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "True True False" in (tmp_path / "exp" / "job.log").read_text(), out.stdout


def test_a_rank_that_vanished_with_no_word_in_the_jobs_output_was_killed_and_a_stop_is_placed_where_it_says():
    """Lightning's own launcher (strategy="ddp") reports no child's signal: rank 1, SIGKILLed, left no error in its
    folder and none in the job's output, which holds every rank's: a signal ended it, or it left by itself (which,
    nothing says: no claim of a signal), and no checkpoint of asrlab's is claimed missing where the loop keeps its
    own elsewhere. A stop said at a place in the
    job's output names the same place as its culprit."""
    watched = Path(__file__).parent / "fixtures" / "watched"
    d = diagnose(watched / "lightning_ddp_rank1_sigkilled")
    assert (d["verdict"], d["culprit"]["rank"]) == ("crashed", 1), d["summary"]  # a signal or its own exit: unsaid
    assert "shows no error of it: killed by a signal" in d["summary"] and "no checkpoint" not in d["summary"], d[
        "summary"
    ]
    d = diagnose(watched / "fabric_launcher_sigterm")
    assert d["verdict"] == "stopped" and d["summary"].endswith("at epoch 2, batch 2"), d["summary"]
    assert (d["culprit"]["epoch"], d["culprit"]["batch"]) == (2, 2), d["culprit"]
    assert "culprit: epoch 2, batch 2" in format_diagnosis(d)
    assert d["ended_by"] == "SIGTERM to the job's launcher"  # --json says what the text does


def test_a_hang_the_watch_ended_is_at_the_step_each_rank_last_logged_and_its_job_log_alone_no_all_clear():
    """A twenty-seventh stranger's mp.spawn loop ("06:33:51.742 ~ hum/r1 ~ INFO ~ tick=00006 ..."), rank 1 asleep
    before tick 7's all_reduce, the watch ending it on the stall: rank 1 at step 6, its last logged (the host/rank
    tag read as the rank). Its job.log alone ends in mp.spawn's 'Terminating process ...': unknown, not all clear."""
    exp = Path(__file__).parent / "fixtures" / "watched" / "spawn_host_tags_rank1_sleeps_before_all_reduce_tick_7"
    d = diagnose(exp)
    assert (d["verdict"], d["culprit"]["rank"], d["culprit"]["step"]) == ("stalled", 1, 6), d["summary"]
    d = diagnose(exp / "job.log")
    assert d["verdict"] == "unknown" and "Terminating process" in d["summary"], d["summary"]
    assert d["next"].startswith(f"asrlab doctor {exp} reads what the watch recorded"), d["next"]
    assert [(r["rank"], r["last"]) for r in d["ranks"]] == [(0, "step 6"), (1, "step 6")]


def test_a_sigkill_to_mp_spawns_launcher_is_the_launchers_not_rank_0s():
    """A twenty-ninth stranger's mp.spawn job under the watch, its launcher (a process of no rank) SIGKILLed: the
    watch's exit code 137 is the launcher's own (a rank's death makes it exit 1); its ranks ended with it."""
    d = diagnose(Path(__file__).parent / "fixtures" / "watched" / "spawn_launcher_itself_sigkilled")
    assert d["verdict"] == "killed" and d["culprit"]["rank"] is None, d["summary"]
    assert d["summary"].startswith("the job's main process was ended by SIGKILL (exit code 137)"), d["summary"]
    assert d["ended_by"] == "SIGKILL to the job's launcher"


def test_a_finished_watched_run_says_what_its_jobs_output_warned_of():
    """The twenty-ninth stranger's healthy training under the watch whose evaluation printed 'eval wer=nan': the
    folder's verdict is the job's end, FINISHED, with the evaluation's nan said on its first line, as its log's is."""
    d = diagnose(Path(__file__).parent / "fixtures" / "watched" / "spawn_json_lines_healthy_eval_wer_nan")
    assert d["verdict"] == "finished" and d["ok"], d["summary"]
    assert "; but the evaluation printed a non-finite value 6 times: eval wer=nan" in d["summary"], d["summary"]
    assert [w["kind"] for w in d["warnings"]] == ["eval_nonfinite"]


def test_a_process_that_exits_by_itself_without_a_word_is_not_said_to_be_killed():
    """A twenty-sixth stranger's loops: one process that logged its own error and exited 1 (no traceback) is a crash
    with that exit code, not a SIGKILL; under torchrun, the rank that left first with sys.exit(0) is named, its end
    (a signal's, or its own) not claimed, the survivor's lost-peer error said after it."""
    watched = Path(__file__).parent / "fixtures" / "watched"
    d = diagnose(watched / "one_process_exits_1_without_a_traceback")
    assert (d["verdict"], d["culprit"]["rank"]) == ("crashed", 0), d["summary"]
    assert "exited with code 1" in d["summary"] and "SIGKILL" not in d["summary"], d["summary"]
    d = diagnose(watched / "torchrun_rank1_sys_exit_0_early")
    assert (d["verdict"], d["culprit"]["rank"]) == ("crashed", 1), d["summary"]
    assert "or it left on its own without a word" in d["summary"] and "then rank 0 failed" in d["summary"], d["summary"]

"""Stalls: the verdict, the watchdog on 2 gloo ranks (and the doctor on the run it stopped), and the
uneven-data policies.

Every multi-rank case runs ``asrlab train --nproc 2`` under a hard subprocess timeout and then
checks that no process of it is left.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from asrlab.cli import main
from asrlab.data.config import DataConfig
from asrlab.data.preflight import inspect_layout
from asrlab.data.sources import load_sources
from asrlab.doctor import diagnose
from asrlab.lab.stall.heartbeat import Heartbeat, read_timeline
from asrlab.lab.stall.verdict import ranks_text, verdict
from asrlab.lab.stall.watchdog import STALL_EXIT, Watchdog

from conftest import SMALL
from helpers import job_processes, train2


def snap(rank, phase, step, since, detail=""):
    return {"rank": rank, "phase": phase, "step": step, "since": since, "detail": detail}


def test_ranks_text():
    assert ranks_text([1]) == "rank 1"
    assert ranks_text([3, 1, 2]) == "ranks 1-3"
    assert ranks_text([0, 2, 3]) == "ranks 0, 2, 3"
    assert ranks_text([0, 1]) == "ranks 0, 1"


def test_verdict_names_the_rank_waiting_for_data():
    now = 1000.0
    snaps = {
        0: snap(0, "allreduce", 17, 990),
        1: snap(1, "data", 17, 959, "worker 0, reading a.tar"),
        2: snap(2, "allreduce", 17, 991),
        3: snap(3, "allreduce", 17, 992),
    }
    assert verdict(snaps, 4, now) == (
        "rank 1 has waited 41 s for data at step 17 (worker 0, reading a.tar); "
        "ranks 0, 2, 3 are blocked in the gradient all-reduce of step 17"
    )


def test_verdict_names_the_rank_that_finished_its_data():
    snaps = {
        0: snap(0, "epoch_end", 12, 900),
        1: snap(1, "allreduce", 13, 901),
        2: snap(2, "allreduce", 13, 901),
        3: snap(3, "allreduce", 13, 902),
    }
    assert verdict(snaps, 4, 950.0) == (
        "rank 0 finished its data at step 12 and waits at epoch end; "
        "ranks 1-3 are blocked in the gradient all-reduce of step 13"
    )


def test_verdict_picks_the_odd_one_out_and_missing_ranks():
    snaps = {0: snap(0, "allreduce", 9, 900), 1: snap(1, "forward", 9, 880), 2: snap(2, "allreduce", 9, 901)}
    assert verdict(snaps, 3, 925.0) == (
        "rank 1 is in the forward pass of step 9 for 45 s; ranks 0, 2 are blocked in the gradient all-reduce of step 9"
    )
    v = verdict(snaps, 4, 925.0)  # a rank that never reported is the first suspect
    assert v.startswith("rank 3 never wrote a heartbeat") and "rank 1 is in the forward pass of step 9" in v
    assert verdict({}, 2, 0.0).startswith("ranks 0, 1 never wrote a heartbeat")
    # two ranks, one in each phase: the one waiting for its peer in the all-reduce is not named first, though it
    # entered its phase a moment earlier (a stranger's loop under the watch: rank 1 asleep in its own code)
    two = {0: snap(0, "ddp_allreduce", None, 900.0), 1: snap(1, "other", None, 900.1)}
    assert verdict(two, 2, 930.0).startswith("rank 1 is in the loop's own code for 29 s"), verdict(two, 2, 930.0)


def test_verdict_names_a_frozen_rank_first():
    snaps = {0: {**snap(0, "backward", 12, 995), "time": 996.0}, 1: {**snap(1, "allreduce", 13, 998), "time": 1004.0}}
    assert verdict(snaps, 2, 1004.0) == (
        "rank 0 stopped responding 8 s ago (process frozen or gone; last seen in "
        "the backward pass of step 12); rank 1 is blocked in the gradient all-reduce of step 13"
    )


def test_watchdog_fires_only_without_progress(tmp_path):
    """Progress of any kind resets the clock; the first step has its own, longer allowance. The margins
    are wide (a sleep on a loaded machine may last far longer than asked), and the stall is waited for."""
    hb = Heartbeat(0)
    wd = Watchdog(hb, tmp_path, 1, timeout_s=2.0, first_step_s=10.0, poll_s=0.1, exit_on_stall=False)
    wd.start()
    hb.enter("data", 1)
    assert not wd.stalled.wait(4.0)  # longer than timeout_s, well within the first-step allowance
    hb.enter("forward")
    hb.completed = 1
    for _ in range(8):  # a slow phase that ticks (checkpoint bytes, eval batches) is progress
        assert not wd.stalled.wait(0.4)
        hb.tick()
    hb.enter("data", 2)
    assert wd.stalled.wait(60)
    wd.join(timeout=30)
    assert wd.stalled.is_set()
    report = json.loads((tmp_path / "stall_report.json").read_text())
    assert report["verdict"].startswith("rank 0 has waited") and "for data at step 2" in report["verdict"]
    assert "MainThread" in (tmp_path / "stall_report.txt").read_text()


# --------------------------------------------------------------------------- 2 gloo ranks


@pytest.fixture(scope="module")
def uneven(corpus, tmp_path_factory):
    """Three shards: one rank gets one, the other two; returns (data.list, the rank that runs out)."""
    shards = load_sources(corpus / "data.list")[:3]
    path = tmp_path_factory.mktemp("uneven") / "data.list"
    path.write_text("".join(f"{s.path}\n" for s in shards))
    cfg = DataConfig(max_frames_in_batch=800)
    layout = inspect_layout(load_sources(path), cfg, world_size=2, num_workers=0)
    batches = [r["batches"] for r in layout["ranks"]]
    assert batches[0] != batches[1] and layout["warnings"]
    return path, batches.index(min(batches)), min(batches)


def final_steps(exp):
    return [json.loads((exp / "heartbeat" / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_uneven_unprotected_hangs_and_the_report_names_the_rank(uneven, tmp_path):
    data, short, n = uneven
    t0 = time.time()
    out = train2(data, tmp_path / "exp", "--uneven", "none", "--stall-timeout", "5", "train.max_epochs=1")
    assert out.returncode == STALL_EXIT, out.stderr[-3000:]
    assert time.time() - t0 < 120
    report = json.loads((tmp_path / "exp" / "stall_report.json").read_text())
    other = 1 - short
    assert report["verdict"] == (
        f"rank {short} finished its data at step {n} and waits at epoch end; "
        f"rank {other} is blocked in the gradient all-reduce of step {n + 1}"
    )
    assert f"STALL: {report['verdict']}" in out.stderr
    assert all(r["stacks"] for r in report["ranks"])  # both ranks dumped their Python stacks


@pytest.mark.parametrize("policy", ["stop", "join"])
def test_uneven_protected_finishes_with_ranks_at_the_same_step(uneven, tmp_path, policy):
    data, short, n = uneven
    out = train2(data, tmp_path / "exp", "--uneven", policy, "--stall-timeout", "20", "train.max_epochs=2")
    assert out.returncode == 0, out.stderr[-3000:]
    beats = final_steps(tmp_path / "exp")
    assert [b["phase"] for b in beats] == ["done", "done"]
    assert beats[0]["step"] == beats[1]["step"]
    if policy == "stop":  # both ranks stop at the short rank's end, each epoch
        assert beats[0]["step"] == 2 * n
        assert [b["completed"] for b in beats] == [2 * n, 2 * n]
    else:  # the long rank trains on; the short one shadows it and takes its step count after
        assert beats[0]["step"] > 2 * n
        assert beats[short]["completed"] == 2 * n < beats[1 - short]["completed"]


@pytest.fixture(scope="module")
def stalled_in_data(corpus, tmp_path_factory):
    """``asrlab train --nproc 2`` whose rank 1 waits for the batch of step 2 (one loader worker, 120 s of
    injected delay) until the watchdog (5 s) stops the run, with a timeline: (exp, the finished process).
    Made once: the watchdog's tests read its verdict and timeline, the doctor's its diagnosis."""
    exp = tmp_path_factory.mktemp("stalled_in_data") / "exp"
    out = train2(
        corpus / "data.list",
        exp,
        "--stall-timeout",
        "5",
        "train.timeline=true",
        "data.inject_delay_s=120",
        "data.inject_delay_ranks=[1]",
        "data.inject_delay_from_batch=2",
        "data.num_workers=1",
    )
    return exp, out


def test_rank_blocked_in_data_loading_is_named(stalled_in_data):
    exp, out = stalled_in_data
    assert out.returncode == STALL_EXIT, out.stderr[-3000:]
    v = json.loads((exp / "stall_report.json").read_text())["verdict"]
    # the uneven guard fetches a batch ahead: batch 3 is fetched before step 2 is trained, and rank 0
    # waits for rank 1 in step 2's first collective (DDP's)
    assert (
        v.startswith("rank 1 has waited") and "for data at step 2 (reading step 3's batch ahead; worker 0, reading" in v
    ), v
    assert "; rank 0 is " in v and v.endswith(" of step 2"), v
    timeline = read_timeline(exp)
    assert {e["phase"] for e in timeline[0]} >= {"data", "forward", "backward", "allreduce", "optimizer"}


def test_the_doctor_reads_the_stalled_run_as_its_report_says(stalled_in_data, capsys):
    exp, out = stalled_in_data
    assert out.returncode != 0, out.stderr[-3000:]
    capsys.readouterr()
    code, text = main(["doctor", str(exp)]), capsys.readouterr().out
    d = diagnose(exp)
    report = json.loads((exp / "stall_report.json").read_text())
    assert code == 1 and d["verdict"] == "stalled" and d["summary"] == report["verdict"]
    assert (
        d["summary"].startswith("rank 1 has waited") and "for data at step 2" in d["summary"]
    )  # fetched a batch ahead
    assert text.startswith("STALLED: rank 1 has waited") and f"stall report ({exp / 'stall_report.txt'})" in text
    assert [(r["rank"], r["phase"], r["step"]) for r in d["stall"]["ranks"]] == [(0, "forward", 2), (1, "data", 2)]
    assert "rank 1 (" in text and "waiting for data of step 2 for" in text
    assert d["world_size"] == 2 and [r["rank"] for r in d["steps"]["ranks"]] == [0, 1]
    assert d["steps"]["spread"] is not None and "spread: rank" in text


def test_frozen_rank_0_is_reported_by_the_launcher(corpus, tmp_path):
    """Rank 0 stopped (SIGSTOP) cannot write the report; rank 1 dumps, the launcher writes it and stops everything."""
    exp = tmp_path / "exp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asrlab.cli",
            "train",
            "--nproc",
            "2",
            "--data",
            str(corpus / "data.list"),
            "--exp",
            str(exp),
            "--resume",
            "none",
            "--stall-timeout",
            "5",
            *SMALL,
            "train.max_epochs=100",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            hb = exp / "heartbeat" / "rank0.json"
            if hb.exists() and json.loads(hb.read_text())["completed"] >= 3:
                break
            time.sleep(0.2)
        os.kill(json.loads(hb.read_text())["pid"], signal.SIGSTOP)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == STALL_EXIT, err[-3000:]
    v = json.loads((exp / "stall_report.json").read_text())["verdict"]
    # rank 1 waits for rank 0 wherever the freeze caught them: all-reduce, data check, a checkpoint's gather
    assert v.startswith("rank 0 stopped responding") and "; rank 1 is " in v, v

    deadline = time.time() + 1  # a moment for the last kill to land
    while job_processes(exp) and time.time() < deadline:
        time.sleep(0.1)
    assert not job_processes(exp)


def test_a_hang_while_indexing_at_start_up_is_a_stall(corpus, tmp_path):
    """Before the first step the watchdog already watches: a shard whose read never returns while the
    index is built ends the run with the stall report, not silence."""
    lst = tmp_path / "data.list"  # a list of its own: no index yet
    lst.write_text((corpus / "data.list").read_text())
    code = f"""
import sys, time
from asrlab.data import index
real = index.index_source
def stuck(src):
    if src.name.endswith("00003.tar"):
        time.sleep(600)
    return real(src)
index.index_source = stuck
from asrlab.cli import main
sys.exit(main(["train", "--data", {str(lst)!r}, "--exp", {str(tmp_path / "exp")!r},
               "--stall-timeout", "3", "train.first_step_timeout_s=4", *{SMALL!r}]))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == STALL_EXIT, out.stderr[-3000:]
    said = (tmp_path / "exp" / "stall_report.txt").read_text().splitlines()[0]
    assert "reading the data's index" in said, said


def test_a_collective_one_rank_skipped_on_a_group_of_its_own_names_that_rank_behind():
    """Flight Recorder dumps of two process groups (a real job's): rank 0 waits in the stats group's all-reduce #9
    that rank 1 skipped, rank 1 waits for rank 0 in the default group's #16. Each group compared apart, the one
    whose awaited collective came first is the cause: rank 1 is behind, in group 1 (the default group alone named
    rank 0)."""
    from pathlib import Path

    from asrlab.lab.stall.flight import behind_text, collectives_text, last_collectives

    s = last_collectives(
        Path(__file__).parent / "fixtures" / "flight" / "two_groups_rank1_skipped_its_stats_all_reduce"
    )
    assert s["behind"] == [1] and s["group"] == "1" and s["mismatch"] is None, s
    assert [s["ranks"][r]["seq"] for r in ("0", "1")] == [9, 8], s
    assert collectives_text(s)[0].endswith("each rank's last in process group 1):")
    # every rank in a collective, each waiting for the other: the recorder's word leads the verdict
    waiting = {0: {"phase": "collective"}, 1: {"phase": "ddp_allreduce"}}
    said = "rank 1 never entered collective #9 (all_reduce, process group 1) that rank 0 waits in"
    assert behind_text(s, waiting) == said
    assert behind_text(s, {**waiting, 1: {"phase": "data"}}) is None  # a rank waiting for data: the heartbeats say

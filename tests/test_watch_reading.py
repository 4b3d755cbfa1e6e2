"""How a stall and a run are read, on loops that are not asrlab's (tests/loops/): uneven data under
``asrlab watch`` named as a rank that left the loop; the rule that names a rank whose reads hold the others
up, and a crash's text without it; the parts' stall verdict naming the user's lines; the watch's injected code
leaving the job no warning and no file handle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from asrlab.doctor import diagnose, format_diagnosis
from asrlab.lab.metrics import slow_reader
from asrlab.lab.stall.classify import loop_of, step_of, waits_at
from asrlab.lab.stall.verdict import verdict

from helpers import NoStacks

LOOPS = Path(__file__).resolve().parent / "loops"
HF = str(LOOPS / "hf_style_loop.py")


def watch(exp: Path, *cmd: str, watch_args: tuple = (), env: dict | None = None, timeout: float = 150):
    return subprocess.run(
        [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(exp), *watch_args, "--", *cmd],
        cwd=LOOPS,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def left_behind(mark: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if mark in " ".join(p.info["cmdline"] or [])]


def test_uneven_data_is_read_as_a_rank_that_left_the_loop_not_as_a_mismatch(tmp_path):
    """Rank 1's sampler yields 3 batches more than rank 0's: rank 0 leaves the loop after its 10th batch
    (``step`` 9) for the barrier after it, while rank 1 waits for it in DDP's all-reduce of ``step`` 10.
    The Flight Recorder sees one collective number with two calls; the verdict names uneven data, each
    rank's step in the loop's own count, and where rank 0 is; ``asrlab doctor --pid`` reads the same from
    one look. The job ran with ResourceWarnings shown and printed none."""
    exp, out = tmp_path / "exp", tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "asrlab.cli",
        "watch",
        "--exp",
        str(exp),
        "--stall-timeout",
        "6",
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        HF,
        str(out),
    ]
    job = subprocess.Popen(
        cmd,
        cwd=LOOPS,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "EXTRA": "3", "PYTHONWARNINGS": "always::ResourceWarning"},
    )
    try:
        deadline = time.time() + 120
        while not (exp / "stall_report.json").exists() and time.time() < deadline and job.poll() is None:
            time.sleep(0.5)
        v = json.loads((exp / "stall_report.json").read_text())["verdict"]
        assert v.startswith("rank 0 ran out of data after step 9 and left the loop (at hf_style_loop.py:"), v
        assert (
            "in main); rank 1 still trains (step 10) and waits for it in DDP's gradient all-reduce (backward)" in v
        ), v
        assert "disagree" not in v, v
        text = (exp / "stall_report.txt").read_text()
        assert "past the training loop after step 9 (its data ran out)" in text, text[:2000]
        d = diagnose(exp)
        assert d["verdict"] == "stalled" and d["summary"] == v, d["summary"]
        agent = psutil.Process(job.pid).children()[0].pid  # torchrun's agent
        look = subprocess.run(
            [sys.executable, "-m", "asrlab.cli", "doctor", "--pid", str(agent)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        first = look.stdout.splitlines()[0]
        assert first.startswith("STUCK: rank 0 is past the training loop after step 9 (its data ran out) (at "), first
        assert "rank 1 is waiting in DDP's gradient all-reduce (backward) of step 10" in first, first
        job.send_signal(signal.SIGTERM)
        said, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert "ResourceWarning" not in said, said[-3000:]
    assert not left_behind(str(out))


def test_a_rank_waiting_in_its_datasets_own_read_is_said_reading_there_not_at_its_loop():
    """A loader without workers reads in the rank's own process: the innermost frame of the job's code is the
    dataset's ``__getitem__``, which is no line of the loop."""
    assert waits_at(("/tmp/w/kws.py", 91, "__getitem__")) == "reading at kws.py:91 in __getitem__"
    assert waits_at(("/tmp/w/kws.py", 40, "pad_collate")) == "reading at kws.py:40 in pad_collate"
    assert waits_at(("/tmp/w/bare_loop.py", 35, "main")) == "loop at bare_loop.py:35 in main"
    assert waits_at(None) == ""


def test_a_rank_whose_stacks_are_not_read_at_a_look_is_still_there_not_frozen(tmp_path):
    """A look that could not read a live rank's stacks keeps its heartbeat fresh, the phase as last seen: the
    stall report describes a rank with no dump from its heartbeat, and a stale one read "stopped responding"
    of a rank that was there all along (py-spy timing out on it on a loaded machine)."""
    from asrlab.lab.layout import HEARTBEAT
    from asrlab.watch.watcher import JobWatch

    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
    )
    try:
        w = JobWatch(tmp_path / "exp", stall_timeout_s=600)
        w.sampler = NoStacks()
        t0 = time.time()
        w._look(rank.pid, t0)
        beat = tmp_path / "exp" / HEARTBEAT / "rank0.json"
        first = json.loads(beat.read_text())["time"]
        time.sleep(0.2)  # any later look: the heartbeat is as fresh as the look
        w._look(rank.pid, t0)
        again = json.loads(beat.read_text())
        assert again["time"] > first and again["pid"] == rank.pid and again["phase"] == "start", again
    finally:
        rank.kill()
        rank.wait(timeout=30)


def test_ranks_that_left_the_loop_are_named_with_the_ranks_that_wait_for_them():
    def snap(rank, phase, step, detail=""):
        return {"rank": rank, "phase": phase, "step": step, "since": 90.0, "time": 99.0, "detail": detail}

    snaps = {
        0: snap(0, "left_loop", 9, "at train.py:82 in main"),
        1: snap(1, "ddp_allreduce", 10),
        2: snap(2, "left_loop", 9, "at train.py:82 in main"),
        3: snap(3, "ddp_allreduce", 10),
    }
    assert verdict(snaps, 4, 100.0) == (
        "ranks 0, 2 ran out of data after step 9 and left the loop (at train.py:82 in "
        "main); ranks 1, 3 still train (step 10) and wait for them in DDP's gradient "
        "all-reduce (backward)"
    )
    snaps = {
        0: snap(0, "left_loop", None, "at train.py:90 in main"),
        1: snap(1, "collective", None, "at train.py:70 in main"),
    }
    assert verdict(snaps, 2, 100.0) == (
        "rank 0 ran out of data and left the loop (at train.py:90 in main); rank 1 "
        "still trains and waits for it in a collective (at train.py:70 in main)"
    )


def modelled(
    world: int, slow: int, factor: float, noise: list[float], compute_s: float = 0.1, read_s: float = 0.09
) -> dict[int, float]:
    """Each rank's data-wait share under DDP when rank ``slow``'s reads take ``factor`` times as long: its
    batches come every ``read_s * factor`` s against a step's ``compute_s``, and it waits for the rest; the
    others' batches are ready by then (they wait for it in the all-reduce instead). ``noise``: points a
    sampled share is off by, per rank."""
    step = max(compute_s, read_s * factor)
    return {
        r: round(min(1.0, max(0.0, (step - compute_s) / step if r == slow else 0.0) + noise[r]), 3)
        for r in range(world)
    }


@pytest.mark.parametrize("factor", [2, 10])
@pytest.mark.parametrize(
    "world, noise",
    [
        (2, [0.0, 0.0]),
        (2, [0.1, -0.05]),
        (4, [0.08, 0.0, 0.1, 0.02]),
        (8, [0.05, 0.1, 0.0, 0.07, 0.03, 0.1, 0.02, 0.06]),
    ],
)
def test_a_rank_slowed_2x_or_10x_is_named_whatever_the_noise(world, noise, factor):
    shares = modelled(world, 1, factor, noise)
    assert slow_reader(shares) == 1, shares


def test_a_slow_reader_seen_at_a_low_share_is_named():
    """As a watched run of a stranger's loop sampled it (rank 1's reads 0.2 s an item): 19% against 2%."""
    assert slow_reader({0: 0.02, 1: 0.19}) == 1


@pytest.mark.parametrize(
    "shares",
    [
        {0: 0.0, 1: 0.10},  # equal ranks, 10 points of sampling noise
        {0: 0.0, 1: 0.0},
        {0: 0.02, 1: 0.05, 2: 0.0, 3: 0.12},
        {0: 0.31, 1: 0.42, 2: 0.36, 3: 0.29},  # every rank waits for data alike: a slow loader, no one rank
        {0: 0.55, 1: 0.68},
        {0: 0.9},  # one rank: no others to hold up
    ],
)
def test_equal_ranks_with_noise_are_not_named(shares):
    assert slow_reader(shares) is None, shares


def test_a_finished_run_names_its_slow_reader_in_the_text(tmp_path):
    """The loop on even data, rank 1's reads twice as slow: the run finishes (exit 0, no ResourceWarning from
    the watch's code at any process's exit) and the doctor's text names rank 1 by the rule above."""
    exp = tmp_path / "exp"
    run = watch(
        exp,
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        HF,
        str(tmp_path / "out"),
        watch_args=("--stall-timeout", "30"),
        # 60 batches: each rank's wait for its first batch (its workers starting, seconds on a busy machine)
        # stays a small part of its sampled data wait
        env={"SLOW": "1:2", "BATCHES": "60", "PYTHONWARNINGS": "always::ResourceWarning"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ResourceWarning" not in run.stdout + run.stderr, (run.stdout + run.stderr)[-3000:]
    d = diagnose(exp)
    assert d["verdict"] == "finished" and d["steps"]["spread"]["slow_reader"] == 1, d["steps"]
    assert "rank 1 waits for data far more than the others (" in format_diagnosis(d)


def test_a_crash_before_the_first_step_says_no_slow_reader(tmp_path):
    """Rank 1 waits seconds for its first batch (its reads 30 times as slow), then raises on it: the crash is
    the verdict, and the text says nothing of whose reads hold the others up."""
    exp = tmp_path / "exp"
    run = watch(
        exp,
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        HF,
        str(tmp_path / "out"),
        watch_args=("--stall-timeout", "60"),
        env={"RAISE": "1:0", "SLOW": "1:30"},
    )
    assert run.returncode != 0, run.stderr[-3000:]
    d = diagnose(exp)
    assert d["verdict"] == "crashed" and d["summary"].startswith("rank 1 failed: ValueError: input_ids"), d["summary"]
    shares = {r["rank"]: r["data_wait_share"] for r in d["steps"]["ranks"]}
    assert shares[1] > 0.3, d["steps"]  # what the slow-reader line was read from
    text = format_diagnosis(d)
    assert "hold the others up" not in text and "waits for data" not in text, text


def test_the_parts_stall_verdict_names_the_loops_line_and_the_workers(tmp_path):
    """A loop with the stall watch and the uneven guard added: on rank 1 a worker's read never returns. The
    verdict names the loop's own line where it waits and the line the worker is stuck at, as the watch's does."""
    exp = tmp_path / "exp"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(LOOPS / "parts_loop.py"),
            str(exp),
        ],
        cwd=LOOPS,
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HANG": "1:25"},
    )
    assert run.returncode != 0, run.stderr[-3000:]
    v = json.loads((exp / "stall_report.json").read_text())["verdict"]
    assert v.startswith("rank 1 has waited ") and "for data at step 3 (reading step 4's batch ahead; " in v, v
    assert "; loop at parts_loop.py:" in v and " in main; worker pid " in v, v
    assert " at parts_loop.py:" in v.split("worker pid ")[1] and "in read_utterance)" in v, v
    assert diagnose(exp)["summary"] == v
    assert not left_behind(str(exp))


def test_the_watchs_injected_code_leaves_the_job_no_warning_and_no_handle(tmp_path):
    """A DataLoader's forked workers under the watch: each holds only its own stack-dump file (not the one
    inherited from its parent), and nothing is left unclosed to warn about, in a worker or at exit."""
    run = watch(
        tmp_path / "exp",
        sys.executable,
        str(LOOPS / "worker_files.py"),
        timeout=90,
        env={"PYTHONWARNINGS": "always::ResourceWarning"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    said = run.stdout + run.stderr
    assert "ResourceWarning" not in said and "sum 28" in said, said[-3000:]
    held = [line.split() for line in run.stdout.splitlines() if line.startswith("worker ")]
    assert len(held) == 2 and all(words[3:] == [f"['{words[1]}.txt']"] for words in held), held


def test_the_training_loop_and_its_step_are_read_from_the_loops_own_source():
    """The loop a stack is in is the innermost of the job's own (a generator that relays batches is passed
    over); its step is ``enumerate``'s index, else the counter the loop adds 1 to; at the loop's head, waiting
    for the next batch, the step that batch is for (as a heartbeat and the other ranks' collectives say it)."""
    src = Path(HF).read_text().splitlines()
    for_line = next(i for i, s in enumerate(src, 1) if s.strip().startswith("for step, batch in enumerate("))
    backward = next(i for i, s in enumerate(src, 1) if s.strip() == "loss.backward()")
    barrier = next(i for i, s in enumerate(src, 1) if s.strip().startswith("dist.barrier()"))
    torch_file = "/x/site-packages/torch/utils/data/dataloader.py"
    loop = loop_of([(HF, 100, "<module>"), (HF, for_line, "main"), (torch_file, 700, "__next__")])
    assert loop is not None and loop[:3] == (HF, "main", for_line) and for_line < backward <= loop[3] < barrier, loop
    assert loop_of([(HF, barrier, "main")]) is None  # after the loop: in no loop of its function
    assert step_of(loop, backward, {"step": "10", "completed_steps": "10"}, after=False) == 10
    assert step_of(loop, barrier, {"step": "9"}, after=True) == 9
    assert step_of(loop, for_line, {"step": "9"}, after=False) == 10  # step 9 done, step 10's batch awaited
    assert step_of(loop, for_line, {"step": "9"}, after=True) == 9


def test_a_step_of_micro_batches_is_inside_the_loop_of_steps_around_it(tmp_path):
    """Gradient accumulation: ``for micro in range(ACCUM)`` fetching the data inside ``while upd < N``; a rank
    after the micro-batches, in the step's all-reduce, is still in the training loop (not past it: uneven data),
    and the step is the outer loop's own count. An epoch loop around ``for batch in loader`` stays the epoch's."""
    loop_file = tmp_path / "accum.py"
    loop_file.write_text(
        "def main(stream, model, sync, epochs, loader):\n"  # 1
        "    upd = 0\n"
        "    while upd < 100:\n"  # 3
        "        for micro in range(3):\n"
        "            x = next(stream)\n"  # 5
        "            model(x).backward()\n"
        "        sync(model)\n"  # 7
        "        upd += 1\n"
        "    for epoch in range(epochs):\n"  # 9
        "        for batch in loader:\n"
        "            model(batch).backward()\n"  # 11
        "        sync(model)\n"
    )
    f = str(loop_file)
    loop = loop_of([(f, 5, "main")])
    assert loop == (f, "main", 3, 8), loop
    assert step_of(loop, 7, {"upd": "57"}, after=False) == 58  # in the step that will make it 58
    assert loop_of([(f, 11, "main")]) == (f, "main", 10, 11)  # the batches of an epoch, not the epochs
    assert loop_of([(f, 12, "main")]) == (f, "main", 9, 12)  # after them: in the epoch loop only


def test_a_data_workers_error_is_not_recorded_as_its_ranks(tmp_path):
    """A spawned worker starting while its rank dies fails reading from the rank (here: a pipe with no writer)
    outside multiprocessing's own handler: with the rank's RANK and error file inherited, the watch's hook must
    record nothing, neither the rank's error nor torchrun's error file; the rank itself still records its own."""
    from asrlab.watch.watcher import INJECT

    exp, elastic = tmp_path / "exp", tmp_path / "elastic" / "error.json"
    elastic.parent.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(INJECT),
        "ASRLAB_WATCH_EXP": str(exp),
        "RANK": "1",
        "TORCHELASTIC_ERROR_FILE": str(elastic),
    }
    read, write = os.pipe()
    os.close(write)
    worker = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle={read})",
            "--multiprocessing-fork",
        ],
        env=env,
        pass_fds=(read,),
        capture_output=True,
        text=True,
        timeout=60,
    )
    os.close(read)
    assert worker.returncode != 0 and "EOFError" in worker.stderr, worker.stderr[-2000:]
    assert not (exp / "errors" / "rank1.json").exists() and not elastic.exists()
    rank = subprocess.run(
        [sys.executable, "-c", "raise ValueError('bad batch')"], env=env, capture_output=True, timeout=60
    )
    assert rank.returncode != 0
    assert json.loads((exp / "errors" / "rank1.json").read_text())["message"] == "bad batch"
    assert "ValueError: bad batch" in elastic.read_text()


def test_a_rank_back_at_the_loops_head_in_a_collective_ran_out_of_data():
    """Accelerate's prepared loader begins each epoch with a broadcast: with one batch fewer, rank 0 is at the
    loop's own line in that broadcast while rank 1 waits in the all-reduce of its step. Read from the stacks
    (outermost first, as sampled): uneven data, not ranks calling different collectives; a rank at the head in
    a collective while no rank is inside a step is not (every rank starting an epoch together)."""
    from asrlab.watch.procs import Proc
    from asrlab.watch.ranks import Loops, RankView

    src = Path(HF).read_text().splitlines()
    head = next(i for i, s in enumerate(src, 1) if s.strip().startswith("for step, batch in enumerate("))
    backward = next(i for i, s in enumerate(src, 1) if s.strip() == "loss.backward()")
    c10d = "/x/site-packages/torch/distributed/distributed_c10d.py"
    at_head = [(HF, 140, "<module>"), (HF, head, "main"), (HF, 60, "__iter__"), (c10d, 2700, "broadcast")]
    reading = [
        (HF, 140, "<module>"),
        (HF, head, "main"),
        ("/x/site-packages/torch/utils/data/dataloader.py", 700, "__next__"),
    ]
    in_step = [(HF, 140, "<module>"), (HF, backward, "main"), ("/x/site-packages/torch/_tensor.py", 600, "backward")]

    def views(*stacks):
        out = []
        for rank, main in enumerate(stacks):
            v = RankView(Proc(pid=100 + rank, rank=rank, run="r", started=0.0), 0.0)
            v.update({"MainThread": main}, {}, 1.0)
            out.append(v)
        return out

    loops = Loops()
    for v in views(reading, in_step):
        loops.learn(v)
    read = loops.uneven(views(at_head, in_step), 2, None)
    assert {r: x["phase"] for r, x in read.items()} == {0: "next_epoch", 1: "ddp_allreduce"}, read
    assert loops.uneven(views(at_head, at_head), 2, None) == {}
    assert loops.uneven(views(at_head, reading), 2, None) == {}
    said = verdict(
        {
            0: {"rank": 0, "phase": "next_epoch", "step": 9, "since": 90.0, "time": 99.0, "detail": "at a.py:60"},
            1: {"rank": 1, "phase": "ddp_allreduce", "step": 10, "since": 90.0, "time": 99.0},
        },
        2,
        100.0,
    )
    assert said.startswith("rank 0 ran out of data after step 9 and is back at the loop's head"), said
    assert "rank 1 still trains (step 10) and waits for it in DDP's gradient all-reduce" in said, said


def test_a_report_of_ranks_whose_heartbeats_say_nothing_of_rank_known_names_them_by_rank():
    """asrlab's own watchdog (in the ranks) writes no rank_known: its report names rank 1 as rank 1; only a
    process the watch numbered (rank_known false) is named by its pid."""
    from asrlab.lab.stall.report import format_report

    entry = {"rank": 1, "phase": "data", "step": 5, "in_phase_s": 3, "detail": "", "host": "h", "pid": 42,
             "rank_known": None, "stacks": {"MainThread": ['  File "loop.py", line 9, in main']}}  # fmt: skip
    text = format_report({"verdict": "rank 1 has waited 3 s for data", "timeout_s": 3, "failure": None,
                          "ranks": [entry, {**entry, "rank": 2, "pid": 43, "rank_known": False}]})  # fmt: skip
    assert "--- rank 1: Python stacks ---" in text and "rank 1 (h, pid 42)" in text, text
    assert "--- process 43 (rank unknown): Python stacks ---" in text, text


PRINTS = """
import sys, time
for i in range(6000):
    print(f"[r{sys.argv[1]}] step {i} loss=1.2345 " + "x" * 60)
"""


def test_lines_printed_at_once_by_two_processes_come_through_the_watch_whole(tmp_path):
    """The watch makes the job's output unbuffered (for it to come through its pipe as printed): each line is
    still written whole, not its text and its newline apart, so two ranks printing at once never glue their
    lines together in the job's log (unbuffered: about 1 line in 30 glued to another, three processes here)."""
    (tmp_path / "prints.py").write_text(PRINTS)
    job = f"{sys.executable} prints.py 0 & {sys.executable} prints.py 1 & {sys.executable} prints.py 2 & wait"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    cmd = [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(tmp_path / "exp"), "--", "bash", "-c", job]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("[r")]
    assert len(lines) == 18000 and not [line for line in lines if line.count("[r") > 1], lines[:3]


def test_a_live_loop_asleep_between_its_steps_is_running_and_a_busy_one_is_not_stuck(tmp_path):
    """``asrlab doctor --pid`` on a loop whose every sample lands on one line (each step asleep): its own count
    moved during the look, it runs; on one computing at one line (a long step of its own): busy, not stuck (on a
    loaded machine the computing process may be caught moving as well: either way, not stuck); on one 6 s into a
    pause of its own (a slow validation or save): looked at on until it moves, running."""
    pause = "if step == 1:\n            validate()\n        time.sleep(0.3)"  # 6 s still in its own code, then steps
    for body, said in (
        ("time.sleep(0.6)", ("RUNNING: ",)),
        ("sum(range(10**10))", ("BUSY: ", "RUNNING: ")),
        (pause, ("RUNNING: ",)),  # looked at on while it is still in its own code: a pause, not a hang
    ):
        script = tmp_path / "slow.py"
        script.write_text(
            "import time\n\n\ndef validate():\n    time.sleep(6)\n\n\n"
            f"def main():\n    step = 0\n    for item in iter(int, 1):\n        step += 1\n        {body}\n\n\n"
            "main()\n"
        )
        p = subprocess.Popen([sys.executable, str(script)])
        try:
            time.sleep(1.0)
            out = subprocess.run(
                [sys.executable, "-m", "asrlab.cli", "doctor", "--pid", str(p.pid)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0 and out.stdout.startswith(said), (out.stdout[:600], out.stderr[-600:])
        finally:
            p.kill()
            p.wait(timeout=30)


def test_an_evaluation_asleep_on_one_line_that_counts_on_is_moving_and_a_hung_one_is_not(tmp_path):
    """A rank in an evaluation pass whose every sample lands on one line (each batch read from slow storage): its
    own counter goes on, so the watch does not call it stalled; one asleep for good in its evaluation is still."""
    from asrlab.watch.ranks import RankView, counting_on
    from asrlab.watch.procs import Proc
    from asrlab.watch.sample import PySpy

    spy = PySpy()
    if spy.works_on(os.getpid()) is not None:
        pytest.skip("py-spy cannot read a process here (ptrace refused): the watch then has no locals to read")
    seen = {}
    for name, pause in (("slow", "0.4"), ("hung", "3600")):
        script = tmp_path / f"{name}.py"
        script.write_text(
            "import time\n\n\ndef evaluate():\n    n = 0\n    while True:\n"
            f"        time.sleep({pause})\n        n += 1\n\n\nprint('up', flush=True)\nevaluate()\n"
        )
        p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline() == "up\n"
            view = RankView(Proc(pid=p.pid, rank=0, run="r", started=time.time()), time.time())
            deadline = time.time() + 30
            while view.phase != "eval" and time.time() < deadline:
                stacks = spy.sample(p.pid)
                if stacks:
                    view.update(stacks, {}, time.time())
            seen[name] = counting_on([view], spy, wait_s=1.5)
        finally:
            p.kill()
            p.wait(timeout=30)
    assert seen == {"slow": True, "hung": False}

"""asrlab.lab in a loop of the user's own: examples/lab_loop.py (bare_loop.py plus ten lines) under torchrun
with two gloo ranks, with each failure injected; and each part alone.

The injected failures are notebook 05's story: its runs (a finished run, a hung data worker, a rank that
raises, uneven data, an fp16 overflow, a SIGKILL and the resume) are made once by running the notebook
itself with papermill (the ``your_loop`` fixture, the notebook's run in the suite: nbval's is deselected),
and each test here reads one of them closely."""

from __future__ import annotations

from types import SimpleNamespace
import json
import re
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asrlab import lab
from asrlab.doctor import diagnose
from asrlab.lab.state.checkpoint import list_checkpoints
from asrlab.train.launch import kill_tree
from asrlab.lab.stall.heartbeat import Heartbeat
from asrlab.lab.stall.watchdog import PEER_FAILED_EXIT

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
your_loop_notebook = pytest.mark.executes_notebook("05_your_loop")


def report(exp: Path) -> dict:
    return json.loads((exp / "stall_report.json").read_text())


def test_the_lab_loop_is_the_bare_loop_plus_at_most_ten_lines():
    import difflib

    bare = (EXAMPLES / "bare_loop.py").read_text().splitlines()[1:]  # below the docstrings
    labbed = (EXAMPLES / "lab_loop.py").read_text().splitlines()[1:]
    differ = [
        line
        for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, bare, labbed).get_opcodes()
        if tag != "equal"
        for line in labbed[j1:j2]
    ]
    assert all("# +lab" in line or "# ~lab" in line for line in differ), differ  # every change is marked
    assert 1 <= sum("# +lab" in line for line in differ) <= 10


@pytest.fixture(scope="module")
def your_loop(tmp_path_factory) -> tuple[Path, dict]:
    """Notebook 05 run to its end with papermill (every cell ran, none raised): its folder of runs and its
    results.json (with each run's exit code and seconds)."""
    from asrlab.runner import run_notebooks

    out = tmp_path_factory.mktemp("nb")
    [rec] = run_notebooks(
        ROOT / "notebooks",
        out,
        only="05_your_loop",
        params_file=str(ROOT / "notebooks" / "params" / "small.yaml"),
        report=lambda line: None,
        progress=lambda line: None,
    )
    assert rec["ok"], f"{rec.get('error')} (log: {Path(rec['output']).with_suffix('.log')})"
    runs = out / "05_your_loop"
    return runs, json.loads((runs / "results.json").read_text())


@pytest.fixture(scope="module")
def finished(your_loop):
    runs, results = your_loop
    assert results["runs"]["finished"]["exit"] == 0, (runs / "finished.log").read_text()[-3000:]
    return runs / "finished"


@your_loop_notebook
def test_a_finished_run_trains_every_key_once_per_epoch(finished):
    lab_json = json.loads((finished / "lab.json").read_text())
    assert lab_json["status"] == "finished" and lab_json["world_size"] == 2
    for epoch in (0, 1):
        cov = lab.coverage_report(finished, epoch)
        assert cov["exactly_once"] and cov["keys"] == 512, cov
    assert not (finished / "stall_report.json").exists() and not (finished / "errors").exists()
    d = diagnose(finished)  # asrlab doctor reads a loop's run as it reads asrlab train's
    assert (d["verdict"], d["ok"]) == ("finished", True) and all(e["exactly_once"] for e in d["coverage"]["epochs"])
    assert [r["steps"] for r in d["steps"]["ranks"]] == [64, 64]


@your_loop_notebook
def test_a_rank_hung_in_its_data_is_named_with_its_workers_stacks(your_loop):
    runs, results = your_loop
    exp, run = runs / "hang_data", results["runs"]["hang_data"]
    assert run["exit"] != 0
    rep = report(exp)
    # the uneven guard fetches a batch ahead: step 6's batch is fetched before step 5 is trained (the loop
    # waits at its step 5), and rank 0 waits in step 5's gradient all-reduce (inside backward: its watchdog
    # reads that from its stack)
    assert rep["verdict"].startswith("rank 1 has waited"), rep["verdict"]
    assert "for data at step 5 (reading step 6's batch ahead" in rep["verdict"], rep["verdict"]
    assert "rank 0 is waiting in DDP's gradient all-reduce (backward) of step 5" in rep["verdict"], rep["verdict"]
    rank1 = rep["ranks"][1]
    assert "_faulty" in rank1["workers"] and "time.sleep" not in rank1.get("stacks", {})  # the worker's stack
    # the report's stack of rank 1 runs from the loop's own line (below asrlab's and torch's frames) down
    shown = (exp / "stall_report.txt").read_text().split("--- rank 1: Python stacks ---")[1].split("\n---")[0]
    assert "lab_loop.py" in shown.split("[MainThread", 1)[1].split("\n[", 1)[0], shown[:3000]
    assert run["seconds"] < 20 + 60  # the example's 20 s timeout, start-up and the report, with room for a busy machine
    assert json.loads((exp / "lab.json").read_text())["status"] == "stalled"
    d = diagnose(exp)
    assert (d["verdict"], d["ok"]) == ("stalled", False) and d["summary"].startswith("rank 1 has waited")


@your_loop_notebook
def test_a_rank_that_raises_is_named_first_with_its_error(your_loop):
    runs, results = your_loop
    exp = runs / "raises"
    assert results["runs"]["raises"]["exit"] != 0
    rep = report(exp)
    assert rep["verdict"].startswith(
        "rank 1 failed at step 6 (in the step's computation): RuntimeError: shapes do not match"
    ), rep["verdict"]
    assert rep["failure"]["rank"] == 1 and "in forward" in rep["failure"]["traceback"]
    main = "".join(next(f for name, f in rep["ranks"][0]["stacks"].items() if name.startswith("MainThread")))
    # where the survivor waited, as its stack shows it: the gradient all-reduce of its backward, or (a loaded
    # machine: rank 0 slower than rank 1) still its data
    where = "waiting in DDP's gradient all-reduce (backward)" if "backward" in main else "waiting for data"
    assert f"rank 0 is {where} of step 6" in rep["verdict"], (rep["verdict"], main[-1500:])
    assert json.loads((exp / "lab.json").read_text())["status"] == "failed"
    d = diagnose(exp)
    assert (d["verdict"], d["error"]["rank"], d["error"]["type"]) == ("crashed", 1, "RuntimeError")
    # torchrun's own summary, the first thing a user reads, blames the same rank, with its exception
    output = (runs / "raises.log").read_text()
    cause = output[output.index("Root Cause") :]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)", cause) and "RuntimeError: shapes do not match" in cause, cause


def test_without_torchrun_the_survivor_exits_within_seconds_not_at_the_collective_timeout(tmp_path):
    """Ranks started by hand (as srun or a script would): nothing kills rank 0 when rank 1 dies;
    its watch does, on seeing rank 1's error, long before gloo's 30-minute timeout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exp = tmp_path / "srun"
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "TOY_FAULT": "raise:1:6",
            "OMP_NUM_THREADS": "1",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "lab_loop.py", str(exp)],
                cwd=EXAMPLES,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            kill_tree(p.pid)
    assert codes[1] == 1
    # rank 0's watch stops it (gloo may notice the closed connection first: then it fails on its own)
    assert codes[0] in (PEER_FAILED_EXIT, 1), procs[0].stderr.read()[-2000:]
    assert report(exp)["failure"]["rank"] == 1


@your_loop_notebook
def test_uneven_data_ends_every_rank_at_the_same_step(your_loop):
    runs, results = your_loop
    exp = runs / "uneven"
    assert results["runs"]["uneven"]["exit"] == 0, (runs / "uneven.log").read_text()[-3000:]
    steps = [len(lab.read_ledger(exp, rank)) for rank in (0, 1)]
    assert steps[0] == steps[1] == 2 * (512 // 2 * 4 // 5 // 8)  # rank 1's batches per epoch, two epochs


@your_loop_notebook
def test_an_fp16_overflow_is_located_in_its_module_with_its_utterances(your_loop):
    runs, results = your_loop
    exp = runs / "fp16_overflow"
    assert results["runs"]["fp16_overflow"]["exit"] == 0, (runs / "fp16_overflow.log").read_text()[-3000:]
    bundles = sorted(b for b in (exp / "nonfinite").iterdir() if b.is_dir())
    assert [b.name for b in bundles] == ["step00000006-rank0"]  # only the rank whose batch overflowed
    assert [b.name for b in (exp / "nonfinite").iterdir() if not b.is_dir()] == ["rank0.jsonl"]  # its step's line
    meta = json.loads((bundles[0] / "report.json").read_text())
    assert (meta["module"], meta["direction"], meta["kind"]) == ("proj", "forward", "loss")
    assert meta["cause"]["cause"] == "overflow", meta["cause"]  # the same step in fp32 is finite
    assert len(meta["keys"]) == 8 and all(k.startswith("utt") for k in meta["keys"])
    event = diagnose(exp)["nonfinite"]["events"][0]
    assert (event["step"], event["module"], event["direction"], event["keys"]) == (6, "proj", "forward", meta["keys"])
    sys.path.insert(0, str(EXAMPLES))
    try:
        import toy
    finally:
        sys.path.remove(str(EXAMPLES))
    rows = {row["precision"]: row for row in lab.replay_step(bundles[0], toy.Model(), toy.loss_fn)}
    assert rows["fp32"]["finite"] and not rows["fp16"]["finite"]
    assert rows["fp16"]["first_nonfinite"].startswith("proj")


@your_loop_notebook
def test_sigkill_then_resume_trains_every_key_once_and_ends_bitwise_equal(your_loop, finished):
    runs, results = your_loop
    exp, killed = runs / "killed", results["sigkill_resume"]["killed_at"]
    assert 25 <= killed < 64  # the notebook's kill_at of 0.4 of the finished run's 64 steps
    assert results["runs"]["killed, resumed"]["exit"] == 0, (runs / "killed.log").read_text()[-3000:]
    resumed = [
        json.loads(line) for line in (exp / "ledger" / "rank0.jsonl").read_text().splitlines() if "resumed_from" in line
    ]
    assert len(resumed) == 1 and resumed[0]["resumed_from"] <= killed
    for epoch in (0, 1):
        assert lab.coverage_report(exp, epoch)["exactly_once"]
    d = diagnose(exp)
    assert d["ok"] and d["resumes"]["resumed_from"] == [resumed[0]["resumed_from"]]
    last = list_checkpoints(finished / "checkpoints")[-1]["file"]
    a = torch.load(finished / "checkpoints" / last, weights_only=True)["model"]
    b = torch.load(exp / "checkpoints" / last, weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- each part alone -------------------------------------------------------------------------------


def _uneven_rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    result = {}
    for every in (1, 3):
        guard = lab.UnevenGuard(range(10 if rank == 0 else 7), every=every)
        result[every] = [list(guard), guard.stopped_early]
        loader = Counting(10 if rank == 0 else 7)
        guard = lab.UnevenGuard(loader, every=every)
        positions = [(guard.state_dict()["fetched"], loader.fetched) for _ in guard]
        result[f"positions{every}"] = positions + [(guard.state_dict()["fetched"], loader.fetched)]
    # a checkpoint after 3 batches, while the guard holds batches fetched ahead; resumed by a new guard
    guard = lab.UnevenGuard(Counting(10 if rank == 0 else 7), every=2)
    it = iter(guard)
    first = [next(it) for _ in range(3)]
    state = guard.state_dict()
    it.close()
    guard.close()  # the agreement under way settled before the group goes (a gloo work freed after it aborts)
    resumed = lab.UnevenGuard(Counting(10 if rank == 0 else 7), every=2)
    resumed.load_state_dict(state)
    result["resumed"] = [first, state["fetched"], list(resumed)]
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    del guard, resumed, it  # what holds the group let go, then the group left for real (the guide's teardown):
    lab.dist.teardown()  # destroy_process_group() alone left gloo's threads to the exiting interpreter: SIGABRT
    # the guards' agreement is what this test checks; gloo's threads ending at interpreter exit on a loaded machine
    # (an abort after the results are written, once in about a dozen clean-clone runs) is not: leave at once
    os._exit(0)


class Counting:
    """A loader whose position counts the batches fetched from it (as a real loader's does)."""

    def __init__(self, n: int):
        self.n, self.fetched = n, 0

    def __iter__(self):
        for i in range(self.fetched, self.n):
            self.fetched += 1
            yield i

    def state_dict(self) -> dict:
        return {"fetched": self.fetched}

    def load_state_dict(self, state: dict) -> None:
        self.fetched = state["fetched"]


def test_a_fetch_after_a_slow_data_check_is_waiting_for_data(monkeypatch, tmp_path):
    """When the guard's data check has to wait for another rank (under load: the peer's count not in yet),
    the fetch of the next batch that follows it is in phase ``data`` again: a rank whose data hangs there
    is named as waiting for data, not as blocked in the check."""

    class Late:  # the peer's count arrives only when waited for
        def is_completed(self):
            return False

        def wait(self):
            return True

    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: Late())
    hb = Heartbeat(0, timeline=True)
    at_fetch = []

    def batches():
        for i in range(3):
            at_fetch.append(hb.phase)
            yield i

    watch = SimpleNamespace(announced=hb.enter, hb=hb)  # a loop's own keeper of its heartbeat, handed over
    it = iter(lab.UnevenGuard(batches(), group=object(), watch=watch))
    got = []
    while True:  # as StallWatch.data drives it
        hb.enter("data", len(got) + 1)
        b = next(it, None)
        if b is None:
            break
        hb.enter("compute")
        got.append(b)
    assert got == [0, 1, 2]
    assert "sync" in [phase for _, phase, _ in hb.take_events()]  # the checks did wait
    assert at_fetch == ["data", "data", "data"]
    # a guard given no watch tells nobody, the heartbeat above included; a StallWatch hands itself to one it wraps
    list(lab.UnevenGuard(batches(), group=object()))
    assert hb.take_events() == []
    watched = lab.StallWatch(tmp_path, timeout_s=30, timeline=True)
    guard = lab.UnevenGuard(batches(), group=object())
    assert list(watched.data(guard)) == [0, 1, 2] and guard.watch is watched
    assert "sync" in [phase for _, phase, _ in watched.hb.take_events()]


def test_uneven_guard_stops_all_ranks_together_also_when_agreeing_every_few_batches(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_uneven_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for every in ("1", "3"):
        assert r0[every][0] == r1[every][0] == list(range(7))
        assert r0[every][1] is True and r1[every][1] is False
        # the guard's position: the batches handed out, while the loader under it has run ahead
        for r in (r0, r1):
            kept, ahead = zip(*r[f"positions{every}"])
            assert list(kept) == list(range(1, 8)) + [7]
            assert max(a - k for k, a in zip(kept, ahead)) >= 1
        assert r0[f"positions{every}"][-1][1] > 7  # rank 0 fetched data it never trained
    for r in (r0, r1):  # resumed exactly after the 3 batches trained, though the loader had run ahead
        assert r["resumed"] == [[0, 1, 2], 3, [3, 4, 5, 6]]


class Scale(torch.nn.Module):
    """Multiplies by ``factor``: inf makes this module the first non-finite one."""

    factor = 1.0

    def forward(self, x):
        return x * self.factor


def test_numerics_guard_skips_halts_or_asks_for_a_rollback(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Scale(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = {"x": torch.randn(3, 4), "keys": ["a", "b", "c"]}

    def loss_of(bad: bool):
        model[1].factor = math.inf if bad else 1.0
        return model(batch["x"]).pow(2).mean()

    for policy, expect in (("skip", "skip"), ("rollback", "rollback")):
        guard = lab.NumericsGuard(model, tmp_path / policy, policy=policy)
        before = [p.detach().clone() for p in model.parameters()]
        with guard.step(1, batch):
            loss = loss_of(True)
            loss.backward()
        check = guard.optimizer_step(opt, loss, replay=lambda: loss_of(True))
        assert (check.kind, check.action, check.skipped) == ("loss", expect, 1)
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # not stepped
        meta = json.loads(next((tmp_path / policy / "nonfinite").glob("*/report.json")).read_text())
        assert meta["module"] == "1" and meta["direction"] == "forward" and meta["keys"] == ["a", "b", "c"]
        with guard.step(2, batch):
            loss = loss_of(False)
            loss.backward()
        assert guard.optimizer_step(opt, loss).action == "step"
    guard = lab.NumericsGuard(model, tmp_path / "halt", policy="halt")
    with guard.step(1, batch):
        loss = loss_of(True)
        loss.backward()
    with pytest.raises(lab.NonFiniteHalt, match="first non-finite value in 1"):
        guard.optimizer_step(opt, loss, replay=lambda: loss_of(True))


def test_run_state_resumes_bitwise_with_rng_and_refuses_an_unknown_version(tmp_path):
    def run(steps: int, exp: Path, resume: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        state = lab.RunState(exp, model, opt)
        start = (state.load() or {"step": 0})["step"] if resume else 0
        for step in range(start + 1, steps + 1):
            loss = model(torch.randn(5, 4)).pow(2).mean()  # draws from the RNG that the state keeps
            loss.backward()
            opt.step()
            opt.zero_grad()
            state.record(step, 0, [f"k{step}"])
            if step % 3 == 0:
                state.save(step)
        state.close()
        return [p.detach().clone() for p in model.parameters()]

    ref = run(9, tmp_path / "ref", False)
    run(7, tmp_path / "cut", False)  # saved at 3 and 6, stopped at 7
    got = run(9, tmp_path / "cut", True)  # resumes at 6
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert lab.coverage_report(tmp_path / "cut", 0)["exactly_once"]
    newest = tmp_path / "cut" / "checkpoints" / "step_00000009.pt"
    state = torch.load(newest, weights_only=True)
    state["version"] = 99
    torch.save(state, newest)
    from asrlab.lab.state.checkpoint import sha256

    marker = newest.with_suffix(".done")
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "sha256": sha256(newest)}))
    model = torch.nn.Linear(4, 8)
    with pytest.raises(ValueError, match="version 99"):
        lab.RunState(tmp_path / "cut", torch.nn.Sequential(model, torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))).load()


def test_the_readme_and_the_docstring_show_one_snippet_the_example_runs():
    readme = (EXAMPLES.parent / "README.md").read_text()
    block = readme.split("## In your own training loop", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    doc = lab.__doc__.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    assert [line[4:] for line in doc.splitlines()] == block.strip("\n").splitlines()  # the same lines, indented
    example = (EXAMPLES / "lab_loop.py").read_text()
    added = [line for line in example.splitlines() if "# +lab" in line]
    assert len(added) == 10 and "The ten lines added to a plain DDP loop" in readme, added  # the README's count
    shown = [
        line.split("#")[0].strip()
        for line in block.splitlines()
        if "lab." in line or "state." in line or "guard." in line
    ]
    assert len(shown) >= 8
    for line in shown:  # each asrlab call the README shows is in the example a test runs (names aside)
        assert line.replace("loss_fn", "toy.loss_fn") in example or line in example, line


def test_no_false_stall_on_a_slow_first_step_or_a_marked_slow_phase_but_a_real_one_is_seen(tmp_path):
    """Alone, with a 1 s timeout: a 2.5 s first step (first_step_s=6) and a 2.5 s phase marked allow_s=6
    pass; 2.5 s in an unmarked phase is a stall. Waits on the watchdog's event, with generous bounds."""
    watch = lab.StallWatch(tmp_path, timeout_s=1.0, first_step_s=6.0, exit_on_stall=False, poll_s=0.2).start()
    try:
        stalled = watch.watchdog.stalled
        for _ in watch.data([1]):
            watch.enter("forward")
            assert not stalled.wait(2.5)  # the first step: its own allowance
            break
        watch.hb.completed += 1
        watch.enter("eval", allow_s=6.0)
        assert not stalled.wait(2.5)  # marked slow
        watch.enter("forward", step=2)
        assert stalled.wait(30)  # unmarked: a stall within timeout + polling (30: a busy machine)
        watch.watchdog.join(timeout=30)  # the report is written
        verdict = report(tmp_path)["verdict"]
        assert verdict.startswith("rank 0 is in the forward pass of step 2"), verdict
    finally:
        watch.stop()


def test_a_watch_stopped_in_a_finally_while_an_error_goes_by_records_that_error(tmp_path):
    """``try: ... finally: watch.stop()``, the natural way to end it, while the loop raises (a survivor's lost peer
    after another rank was killed): the error is recorded and the run failed, not a clean end the doctor calls
    finished or stopped; an exception the loop handled before the ``finally`` is no error."""
    from asrlab.doctor import diagnose

    watch = lab.StallWatch(tmp_path / "raised", timeout_s=30).start()
    with pytest.raises(RuntimeError):
        try:
            raise RuntimeError("Connection reset by peer")
        finally:
            watch.stop()
    d = diagnose(tmp_path / "raised")
    assert d["verdict"] == "crashed" and "Connection reset by peer" in d["summary"], d["summary"]
    watch = lab.StallWatch(tmp_path / "handled", timeout_s=30).start()
    try:
        try:
            raise ValueError("a retried read")
        except ValueError:
            pass
    finally:
        watch.stop()
    assert diagnose(tmp_path / "handled")["verdict"] == "finished"

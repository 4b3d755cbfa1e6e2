"""Two nodes on 127.0.0.1, each its own torchrun (one rank each) under its own ``asrlab watch``, each writing
into a folder of its own: rank 1 (the second node) hangs in its data. ``asrlab doctor EXP0 EXP1`` reads the
two as one run and names rank 1, whichever node's watch saw the stall."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_two_nodes_watched_apart_are_read_as_one_run(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TOY_FAULT": "hang_data:1:6", "OMP_NUM_THREADS": "1"}
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "asrlab.cli",
            "watch",
            "--exp",
            str(tmp_path / f"node{node}"),
            "--stall-timeout",
            "6",
            "--on-stall",
            "kill",
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--node-rank={node}",
            "--nproc-per-node=1",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "bare_loop.py",
            str(tmp_path / f"out{node}"),
            "1",
        ]
        procs.append(
            subprocess.Popen(cmd, cwd=EXAMPLES, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        )
    try:
        codes = [p.wait(timeout=150) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(c != 0 for c in codes), [p.stderr.read()[-2000:] for p in procs]
    out = subprocess.run(
        [sys.executable, "-m", "asrlab.cli", "doctor", str(tmp_path / "node0"), str(tmp_path / "node1"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    d = json.loads(out.stdout)
    assert d["verdict"] == "stalled" and d["world_size"] == 2, d["summary"]
    assert d["summary"].startswith("rank 1 has waited") and "toy.py" in d["summary"], d["summary"]
    assert "rank 0 is waiting in DDP's gradient all-reduce (backward)" in d["summary"], d["summary"]
    assert not [
        p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp_path / "out") in " ".join(p.info["cmdline"] or [])
    ]


def test_a_node_whose_rank_errored_after_the_other_nodes_kill_is_read_as_it_was_at_the_stall(tmp_path):
    """Node 1's watch saw the stall and ended its rank first; node 0's rank then left DDP's all-reduce with
    the lost peer's error before node 0's watch saw the stall: its last heartbeat says "the loop's own
    code". The merged verdict describes rank 0 as it was when the stall was seen."""
    t = 1_000_000.0

    def write(path: Path, obj) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(obj if isinstance(obj, str) else json.dumps(obj))

    def snap(rank, phase, since, time, detail=""):
        return {
            "rank": rank,
            "phase": phase,
            "step": None,
            "since": since,
            "beats": 20,
            "detail": detail,
            "completed": None,
            "allow_s": 0.0,
            "pid": 100 + rank,
            "host": "h",
            "node": 0,
            "time": time,
            "run": None,
            "watched": True,
        }

    n0, n1 = tmp_path / "node0", tmp_path / "node1"
    for n in (n0, n1):
        write(n / "lab.json", {"started": t - 30, "status": "failed", "world_size": 2, "watched": ["torchrun"]})
    write(n0 / "heartbeat" / "rank0.json", snap(0, "other", t + 1.0, t + 2.0, "at bare_loop.py:32 in main"))
    write(
        n0 / "heartbeat" / "rank0.timeline.jsonl",
        "\n".join(
            json.dumps(e)
            for e in (
                {"t": t - 20, "phase": "start", "step": None},
                {"t": t - 6.5, "phase": "backward", "step": None},
                {"t": t + 1.0, "phase": "other", "step": None},
            )
        )
        + "\n",
    )
    hung = snap(1, "data", t - 6.6, t, "loop at bare_loop.py:29 in main; worker pid 7 at toy.py:54 in _faulty")
    write(n1 / "heartbeat" / "rank1.json", hung)
    write(n1 / "stall" / "rank1.json", hung)
    write(
        n1 / "stall_report.json",
        {
            "verdict": "rank 1 has waited 6 s for data",
            "time": t,
            "timeout_s": 6.0,
            "world_size": 2,
            "ranks": [],
            "failure": None,
        },
    )
    out = subprocess.run(
        [sys.executable, "-m", "asrlab.cli", "doctor", str(n0), str(n1), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    d = json.loads(out.stdout)
    assert d["summary"].startswith("rank 1 has waited 6 s for data"), d["summary"]
    assert "rank 0 is waiting in DDP's gradient all-reduce (backward)" in d["summary"], d["summary"]


WATCHED = Path(__file__).resolve().parent / "fixtures" / "watched"


def test_two_nodes_folders_read_together_say_what_either_nodes_job_printed(tmp_path, monkeypatch):
    """Two real nodes' folders (a stranger's loop, a rank on each): the SIGKILL of node 1's rank, which only node 1's
    job output says, and the hang of node 0's rank in its own code, each with its rank and last iteration; the
    folder the nodes' files were read in together is gone after, and no path of it is said."""
    from asrlab.doctor import diagnose

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    for name, want in (
        ("two_nodes_rank1_sigkilled", ("killed", 1, 63)),
        ("two_nodes_rank0_hangs_in_own_code", ("stalled", 0, 49)),
    ):
        nodes = [str(WATCHED / name / "node0"), str(WATCHED / name / "node1")]
        d = diagnose(nodes)
        assert (d["verdict"], d["culprit"]["rank"], d["culprit"]["step"]) == want, d["summary"]
        assert str(tmp_path) not in json.dumps(d), "a path of the merged folder is said"
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())


def test_one_nodes_folder_blames_no_rank_it_cannot_see():
    """Node 0's own watch sees only its rank: the stall names rank 0 (asleep in its own code) and says rank 1 is on
    another node, not a rank that never wrote a heartbeat; node 1's folder alone names its rank by the pid torchrun
    gives beside its local rank (``local_rank: 0 (pid: N)``: rank 1)."""
    from asrlab.doctor import diagnose
    from asrlab.lab.stall.verdict import verdict

    d = diagnose(WATCHED / "two_nodes_rank0_hangs_in_own_code" / "node0")
    assert d["verdict"] == "stalled" and d["culprit"]["rank"] == 0, d["summary"]
    assert "rank 1 on other nodes, not watched here" in d["summary"], d["summary"]
    d = diagnose(WATCHED / "two_nodes_rank0_hangs_in_own_code" / "node1")
    assert d["culprit"]["rank"] == 1, d["summary"]
    waiting = {"rank": 0, "phase": "collective", "step": 5, "since": 0.0, "time": 30.0, "host": "h", "pid": 1}
    said = verdict({0: waiting}, 2, 30.0, elsewhere=(1,))
    assert "never wrote a heartbeat" not in said and "rank 1 on other nodes" in said, said
    # a survivor's lost-peer error, its peer on the other node: a consequence, the culprit not named from here
    d = diagnose(WATCHED / "two_nodes_rank1_sigkilled" / "node0")
    assert d["verdict"] == "crashed" and d["culprit"]["rank"] is None, d["summary"]
    assert "a consequence" in d["summary"] and d["error"]["lost_peer"], d["summary"]


def test_a_stop_that_came_once_the_ranks_had_hung_is_the_hang():
    """A rank hung in its loader's collate on node 1; 40 s later SIGTERM to node 1's watch ended the job (its stall
    timeout, 300 s, not reached). Node 1's folder and both together: stalled, rank 3 waiting for data, its last
    iteration; node 0's ranks, which failed on the lost peer after the stop, are seen as their timelines had them
    at the stop. The text says how it ended too."""
    from asrlab.doctor import diagnose

    nodes = [str(WATCHED / "two_nodes_hang_then_sigterm_to_a_watch" / n) for n in ("node0", "node1")]
    for paths in (nodes[1:], nodes):
        d = diagnose(paths)
        assert (d["verdict"], d["culprit"]["rank"], d["culprit"]["step"]) == ("stalled", 3, 11), d["summary"]
        assert "waited 39 s for data" in d["summary"] and "SIGTERM to asrlab watch" in d["summary"], d["summary"]
        assert not d["ok"]


def test_two_nodes_consoles_and_folders_name_the_rank_one_node_saw_hang():
    """Both nodes' watches reported the stall; node 0's saw only its ranks waiting on the other node's, 20 ms
    before node 1's named rank 3 waiting for data. Read together, the consoles name rank 3, and the folders point
    at the stall report that holds rank 3's stacks (node 1's), not the first node's."""
    from asrlab.doctor import diagnose

    root = WATCHED / "two_nodes_rank3_hangs_in_collate"
    d = diagnose([str(root / "consoles" / "node0.log"), str(root / "consoles" / "node1.log")])
    assert (d["verdict"], d["culprit"]["rank"], d["culprit"]["step"]) == ("stalled", 3, 11), d["summary"]
    d = diagnose([str(root / "node0"), str(root / "node1")])
    assert (d["verdict"], d["culprit"]["rank"]) == ("stalled", 3), d["summary"]
    assert d["stall"]["report"] == str(root / "node1" / "stall_report.txt"), d["stall"]["report"]
    assert d["next"].startswith(f"read the stacks in {root / 'node1' / 'stall_report.txt'}"), d["next"]  # --json's too


def test_two_nodes_consoles_without_clocks_on_their_step_lines_find_the_first_nan_by_its_step():
    """Node 1's rank printed nan at iteration 10, node 0's from 11; neither's step lines carry a clock, and node 0's
    last clock above them (torchrun's banner) is 3 s earlier: the first is by the step, its time said as no earlier
    than that clock. The watch's closing line in node 0's console is no earlier failure."""
    from asrlab.doctor import diagnose

    root = Path(__file__).resolve().parent / "fixtures" / "own_loops" / "w23_two_nodes_first_nan_on_node1"
    d = diagnose([str(root / "node0.log"), str(root / "node1.log")])
    assert (d["verdict"], d["culprit"]["step"]) == ("nonfinite", 10), d["summary"]
    assert "(after 2026-11-30 04:03:46)" in d["summary"], d["summary"]


def test_a_watched_runs_job_log_given_by_name_is_read_as_its_lines():
    """`asrlab doctor EXP/job.log` (as notebook 06 invites): the job's lines, its step lines and their curves, not
    the run folder beside it read as a table of no series."""
    from asrlab.doctor import diagnose

    log = WATCHED / "two_nodes_rank3_hangs_in_collate" / "node1" / "job.log"
    d = diagnose([str(log)])
    assert d["read"] == "logs" and d["files"] == [str(log)] and sum(d["formats"].values()) >= 20, d["formats"]
    assert not d["sources"], d["sources"]

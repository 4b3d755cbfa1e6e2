"""Two nodes on 127.0.0.1 (two torchrun agents, 2 gloo ranks each), each node with an EXP of its own.

``asrlab train --nnodes 2 --node-rank R --rdzv-endpoint HOST:PORT`` on each "node": the stall watch's
files reach both folders through the rendezvous store, rank 0's node keeps the checkpoints and every
rank's ledger, and a restart on any number of nodes resumes from them. Every case runs under a hard
timeout, and no process of it is left afterwards.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from asrlab.doctor import diagnose
from asrlab.train.launch import kill_tree
from asrlab.lab.stall.watchdog import STALL_EXIT

from conftest import SMALL, tone_utts


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from asrlab.data.shards import write_split

    d = tmp_path_factory.mktemp("nodes")
    write_split(tone_utts(160), d / "train", "train", shard_size=10)  # 16 shards: 4 a rank
    return d / "train" / "data.list"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nodes(data, tmp_path, *args, port=None):
    """Both nodes' ``asrlab train``, each in a session of its own, EXPs tmp_path/node0 and node1."""
    port = port or _port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for node in (0, 1):
        log = open(tmp_path / f"node{node}.log", "w")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "asrlab.cli",
                    "train",
                    "--nnodes",
                    "2",
                    "--node-rank",
                    str(node),
                    "--rdzv-endpoint",
                    f"127.0.0.1:{port}",
                    "--nproc",
                    "2",
                    "--data",
                    str(data),
                    "--exp",
                    str(tmp_path / f"node{node}"),
                    *SMALL,
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
    return procs


def finish(procs, timeout_s: float = 240) -> list[int]:
    """Exit codes of both nodes; whatever is left after ``timeout_s`` is killed (and the test fails)."""
    deadline = time.time() + timeout_s
    try:
        return [p.wait(timeout=max(1.0, deadline - time.time())) for p in procs]
    finally:
        for p in procs:
            kill_tree(p.pid)


def log(tmp_path, node: int) -> str:
    return (tmp_path / f"node{node}.log").read_text()[-4000:]


def test_two_nodes_finish_and_rank_0s_node_proves_coverage(data, tmp_path):
    codes = finish(start_nodes(data, tmp_path, "--ledger", "--save-every-steps", "3", "train.max_epochs=2"))
    assert codes == [0, 0], log(tmp_path, 0) + log(tmp_path, 1)
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    assert sorted(p.name for p in (node0 / "heartbeat").glob("rank?.json")) == [f"rank{r}.json" for r in range(4)]
    assert sorted(p.name for p in (node1 / "heartbeat").glob("rank?.json")) == [f"rank{r}.json" for r in range(4)]
    assert (node1 / "units.txt").read_text() == (node0 / "units.txt").read_text()  # rank 0's, sent
    assert list((node0 / "checkpoints").glob("*.pt")) and not (node1 / "checkpoints").exists()
    d = diagnose(node0)
    assert d["verdict"] == "finished", d["summary"]
    assert [(e["epoch"], e["exactly_once"], e["keys"]) for e in d["coverage"]["epochs"]] == [
        (0, True, 160),
        (1, True, 160),
    ]
    assert diagnose(node1)["verdict"] == "finished"  # the second node knows every rank finished too


def test_a_rank_stalled_on_the_second_node_is_named_on_the_first(data, tmp_path):
    codes = finish(
        start_nodes(
            data,
            tmp_path,
            "--stall-timeout",
            "6",
            "train.first_step_timeout_s=60",
            "data.inject_delay_s=120",
            "data.inject_delay_ranks=[3]",
            "data.inject_delay_from_batch=2",
            "train.max_epochs=5",
        )
    )
    assert codes == [STALL_EXIT, STALL_EXIT], log(tmp_path, 0) + log(tmp_path, 1)
    report = json.loads((tmp_path / "node0" / "stall_report.json").read_text())
    assert report["verdict"].startswith("rank 3 on node 1 ("), report["verdict"]
    assert "waited" in report["verdict"] and "for data" in report["verdict"]
    assert report["ranks"][3]["stacks"], "rank 3's stacks, dumped on node 1, reached node 0's report"


def test_the_second_node_lost_then_a_restart_on_one_node_resumes_exactly_once(data, tmp_path):
    args = [
        "--ledger",
        "--save-every-steps",
        "3",
        "--stall-timeout",
        "60",
        "train.max_epochs=3",
        "data.inject_delay_s=0.1",
    ]
    procs = start_nodes(data, tmp_path, *args)
    metrics = tmp_path / "node0" / "metrics" / "rank0.jsonl"
    deadline = time.time() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 8):
        assert time.time() < deadline and procs[0].poll() is None, log(tmp_path, 0)
        time.sleep(0.2)
    kill_tree(procs[1].pid)  # the second node: its agent, ranks and workers, at once
    killed = time.time()
    code = finish(procs[:1], timeout_s=120)[0]
    procs[1].wait(timeout=10)
    assert code != 0 and time.time() - killed < 30, "the first node's ranks exit with the loss, not a timeout"
    d = diagnose(tmp_path / "node0")
    assert d["verdict"] == "crashed"
    assert "rank 2 on node 1" in d["summary"] and "stopped responding" in d["summary"], d["summary"]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "asrlab.cli",
            "train",
            "--nproc",
            "2",
            "--data",
            str(data),
            "--exp",
            str(tmp_path / "node0"),
            *SMALL,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    d = diagnose(tmp_path / "node0")
    assert d["verdict"] == "finished" and d["resumes"]["resumed_from"], d["summary"]
    assert [(e["epoch"], e["exactly_once"]) for e in d["coverage"]["epochs"]] == [(0, True), (1, True), (2, True)]


def test_the_slurm_example_starts_asrlab_train_with_arguments_it_takes(tmp_path):
    """examples/slurm_train.sh under stand-ins for srun and scontrol: the command each node runs parses,
    names this node's rank, the first node's endpoint and the job's id, and its overrides are known keys."""
    from pathlib import Path

    from asrlab.cli import build_parser
    from asrlab.config import load_config

    bin_ = tmp_path / "bin"
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    bin_.mkdir()
    stubs = {
        bin_ / "srun": 'while [ "${1#--}" != "$1" ]; do shift; done; exec "$@"',
        bin_ / "scontrol": "echo gpu-a; echo gpu-b; seq 100000 | sed s/^/gpu-/",  # a big job: many names
        tmp_path / ".venv" / "bin" / "asrlab": 'printf \'%s\\n\' "$@" > "$ARGS_OUT"',
    }
    for path, body in stubs.items():
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    script = Path(__file__).resolve().parents[1] / "examples" / "slurm_train.sh"
    env = {
        **os.environ,
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "ARGS_OUT": str(tmp_path / "args.txt"),
        "SLURM_JOB_NODELIST": "gpu-[a-b]",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_ID": "77",
        "SLURM_GPUS_ON_NODE": "4",
    }
    out = subprocess.run(
        ["bash", str(script), "/d/train.list", "/d/dev.list", "exp/x"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    a = build_parser().parse_args((tmp_path / "args.txt").read_text().splitlines())
    assert (a.nnodes, a.node_rank, a.rdzv_endpoint, a.rdzv_id, a.nproc) == (2, 1, "gpu-a:29500", "77", 4)
    assert a.data == ["/d/train.list"] and a.exp == "exp/x"
    load_config(a.config, a.overrides)  # an unknown key would raise


def test_the_relay_copies_each_ranks_files_and_never_over_a_newer_one(tmp_path, monkeypatch):
    from datetime import timedelta

    import torch.distributed as tdist

    from asrlab.lab.stall import relay
    from asrlab.lab.stall.heartbeat import read_heartbeats, write_heartbeat

    store = tdist.TCPStore("127.0.0.1", _port(), is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    a, b = tmp_path / "a", tmp_path / "b"  # rank 0's node and rank 1's, each with its folder
    write_heartbeat(a, {"rank": 0, "phase": "forward", "step": 3, "time": 100.0}, "r")
    write_heartbeat(b, {"rank": 1, "phase": "data", "step": 3, "time": 100.0}, "r")
    ra, rb = relay.Relay(a, 0, 2, "r", store), relay.Relay(b, 1, 2, "r", store)
    for r in (ra, rb):
        r.push()
    for r in (ra, rb):
        r.pull()
    assert read_heartbeats(a)[1]["phase"] == "data" and read_heartbeats(b)[0]["phase"] == "forward"
    write_heartbeat(a, {"rank": 1, "phase": "backward", "step": 4, "time": 101.0}, "r")  # newer, by rank 1's clock
    ra.pull()
    assert read_heartbeats(a)[1]["phase"] == "backward"  # (on shared storage, the owner's own newer file)

    # a peer gone: its files stop changing while this rank's error says the connection went
    monkeypatch.setattr(relay, "_ACTIVE", [ra])
    lost = relay.lost_peers("Connection reset by peer", wait_s=1.0)
    assert [x["rank"] for x in lost] == [1]
    assert relay.lost_peers("CUDA out of memory") is None  # not a peer's loss: nothing to ask
    (b / "errors").mkdir()
    (b / "errors" / "rank1.json").write_text(json.dumps({"rank": 1, "time": 102.0}))
    rb.push()
    assert relay.lost_peers("Connection reset by peer", wait_s=0.5) == []  # it failed itself: its error says so


def test_torch_elastic_restarts_a_killed_rank_and_the_run_finishes_from_its_checkpoint(data, tmp_path):
    """``--max-restarts 1``: rank 1 SIGKILLed mid-epoch, torchrun starts every rank again, they resume from
    the last checkpoint, and every utterance is trained exactly once in each epoch."""
    import signal

    exp = tmp_path / "exp"
    with open(tmp_path / "run.log", "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "asrlab.cli",
                "train",
                "--nproc",
                "2",
                "--max-restarts",
                "1",
                "--data",
                str(data),
                "--exp",
                str(exp),
                "--ledger",
                "--save-every-steps",
                "3",
                *SMALL,
                "train.max_epochs=2",
                "data.inject_delay_s=0.1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            start_new_session=True,
        )
    metrics = exp / "metrics" / "rank0.jsonl"
    deadline = time.time() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
        assert time.time() < deadline and proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        time.sleep(0.2)
    os.kill(json.loads((exp / "heartbeat" / "rank1.json").read_text())["pid"], signal.SIGKILL)
    assert finish([proc])[0] == 0, (tmp_path / "run.log").read_text()[-3000:]
    d = diagnose(exp)
    assert d["verdict"] == "finished" and d["resumes"]["resumed_from"], d["summary"]
    assert [(e["epoch"], e["exactly_once"]) for e in d["coverage"]["epochs"]] == [(0, True), (1, True)]

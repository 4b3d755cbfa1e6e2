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
        cmd = [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(tmp_path / f"node{node}"),
               "--stall-timeout", "6", "--on-stall", "kill", "--",
               sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
               "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}",
               "bare_loop.py", str(tmp_path / f"out{node}"), "1"]
        procs.append(subprocess.Popen(cmd, cwd=EXAMPLES, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
    try:
        codes = [p.wait(timeout=150) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(c != 0 for c in codes), [p.stderr.read()[-2000:] for p in procs]
    out = subprocess.run([sys.executable, "-m", "asrlab.cli", "doctor", str(tmp_path / "node0"),
                          str(tmp_path / "node1"), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr[-2000:]
    d = json.loads(out.stdout)
    assert d["verdict"] == "stalled" and d["world_size"] == 2, d["summary"]
    assert d["summary"].startswith("rank 1 has waited") and "toy.py" in d["summary"], d["summary"]
    assert "rank 0 is waiting in DDP's gradient all-reduce (backward)" in d["summary"], d["summary"]
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp_path / "out") in " ".join(p.info["cmdline"] or [])]

"""What stall protection costs: the heartbeat, the watchdog thread, and each uneven-data policy.

1. Heartbeat: nanoseconds per ``Heartbeat.enter`` / ``tick`` (timeit), times the phase
   changes a real step makes, as a share of a step.
2. Watchdog thread: milliseconds per poll (write this rank's file, read every rank's), once a
   second, as a share of one core.
3. The collective ``stop`` adds to each step (one 1-element all-reduce, ``dist.all_have``) timed
   alone on 2 gloo processes: microseconds per call.
4. Policies: ``asrlab train --nproc 2`` (gloo, 1 thread per rank) on *even* data (4 equal
   shards, static batches) for ``--steps`` steps with ``--uneven none``, ``stop`` and ``join``,
   interleaved over ``--rounds`` rounds; steps/s from rank 0's metrics (first 5 steps left out).
   A small model (fast steps) so that per-step costs show; the tiny config's steps are ~5x longer.

    .venv/bin/python benchmarks/stall_overhead.py --steps 100 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from asrlab.data.synth import synthesize_corpus
from asrlab.lab.stall.heartbeat import Heartbeat, read_heartbeats, write_heartbeat
from asrlab.lab.metrics import read_metrics

MODEL = ["model.d_model=64", "model.n_heads=2", "model.n_layers=2", "model.ff_dim=128", "model.conv_channels=16"]


def heartbeat_cost() -> dict:
    hb = Heartbeat(0)
    n = 200_000
    enter_ns = min(timeit.repeat(lambda: hb.enter("forward"), number=n, repeat=5)) / n * 1e9
    tick_ns = min(timeit.repeat(hb.tick, number=n, repeat=5)) / n * 1e9
    with tempfile.TemporaryDirectory() as d:
        exp = Path(d)
        for r in range(8):
            write_heartbeat(exp, Heartbeat(r).snapshot(), "bench")
        poll_ms = (
            min(
                timeit.repeat(
                    lambda: (write_heartbeat(exp, hb.snapshot(), "bench"), read_heartbeats(exp, "bench")),
                    number=200,
                    repeat=3,
                )
            )
            / 200
            * 1e3
        )
    return {"enter_ns": enter_ns, "tick_ns": tick_ns, "poll_ms_8_ranks": poll_ms}


def _all_have_worker(rank: int, port: int, n: int, out) -> None:
    import torch.distributed as dist

    from asrlab.lab.dist import DistInfo, all_have

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    info = DistInfo(rank, 2, rank, __import__("torch").device("cpu"), "gloo")
    for _ in range(200):
        all_have(True, info)
    t0 = time.perf_counter()
    for _ in range(n):
        all_have(True, info)
    if rank == 0:
        out.put((time.perf_counter() - t0) / n)
    dist.destroy_process_group()


def all_have_cost(n: int = 5000) -> float:
    """Seconds per ``all_have`` call between 2 gloo processes on this machine."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_all_have_worker, args=(r, port, n, q)) for r in range(2)]
    for p in procs:
        p.start()
    cost = q.get(timeout=300)
    for p in procs:
        p.join(60)
    return cost


def run(data: Path, exp: Path, policy: str, steps: int) -> float:
    """Steps/s of rank 0 over steps 6..N of one run."""
    cmd = [
        sys.executable,
        "-m",
        "asrlab.cli",
        "train",
        "--nproc",
        "2",
        "--data",
        str(data),
        "--exp",
        str(exp),
        "--resume",
        "none",
        "--uneven",
        policy,
        "--max-steps",
        str(steps),
        *MODEL,
        "data.num_workers=1",
        "data.batch_type=static",
        "data.batch_size=8",
        "data.shuffle_size=100",
        "train.progress=false",
        "train.max_epochs=100",
        "train.preflight=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=900)
    m = read_metrics(exp)[5:]
    return len(m) / sum(x["step_s"] for x in m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()

    hb = heartbeat_cost()
    sync_s = all_have_cost()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        synthesize_corpus(d / "c", utts=400, shard_size=100, progress=False)  # 4 equal shards: 2 per rank
        data = d / "c" / "train" / "data.list"
        rates: dict[str, list[float]] = {"none": [], "stop": [], "join": []}
        for r in range(a.rounds):
            for policy in rates:
                rates[policy].append(run(data, d / f"{policy}{r}", policy, a.steps))
                print(f"round {r}: {policy:4s} {rates[policy][-1]:.2f} steps/s", flush=True)
        timeline = Path(d) / "tl"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "asrlab.cli",
                "train",
                "--data",
                str(data),
                "--exp",
                str(timeline),
                "--resume",
                "none",
                "--max-steps",
                "10",
                *MODEL,
                "train.timeline=true",
                "train.progress=false",
                "data.batch_type=static",
                "data.batch_size=8",
            ],
            check=True,
            capture_output=True,
        )
        lines = (timeline / "heartbeat" / "rank0.timeline.jsonl").read_text().splitlines()
        changes_per_step = len(lines) / 10
        step_s = statistics.median(x["step_s"] for x in read_metrics(timeline)[2:])

    print(
        f"\nheartbeat: enter {hb['enter_ns']:.0f} ns, tick {hb['tick_ns']:.0f} ns; {changes_per_step:.1f} phase "
        f"changes per step (1 rank, incl. timeline) = {changes_per_step * hb['enter_ns'] / 1e3:.1f} us per step, "
        f"{100 * changes_per_step * hb['enter_ns'] * 1e-9 / step_s:.4f}% of a {1e3 * step_s:.0f} ms step"
    )
    print(
        f"watchdog thread: {hb['poll_ms_8_ranks']:.2f} ms per poll with 8 ranks' files, once a second "
        f"= {hb['poll_ms_8_ranks'] / 10:.3f}% of one core"
    )
    print(
        f"the data check of --uneven stop: one all_have per step, {1e6 * sync_s:.0f} us on 2 gloo processes "
        f"= {100 * sync_s / step_s:.2f}% of a {1e3 * step_s:.0f} ms step of this small model"
    )
    base = statistics.median(rates["none"])
    print(f"\nuneven-data policies, 2 gloo ranks, even data, {a.steps} steps x {a.rounds} rounds (median steps/s):")
    for policy, rs in rates.items():
        med = statistics.median(rs)
        print(
            f"  {policy:4s} {med:6.2f} steps/s  ({100 * (base / med - 1):+.1f}% time per step vs none; "
            f"rounds {', '.join(f'{x:.2f}' for x in rs)})"
        )


if __name__ == "__main__":
    main()

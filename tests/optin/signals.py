"""SIGTERM and SIGINT to the launcher, to ``asrlab watch`` and to one rank, under torchrun and under
``accelerate launch``: a real Accelerate loop (``accel_loop.py``) watched with no line of asrlab in it, each
signal sent once rank 0 has logged optimizer step 6, then ``asrlab doctor`` on the watched folder. Prints one
line per run (the launcher, the target, the signal, the watch's exit code, the verdict, the culprit and the
summary) and, at the end, whether every run read as it should: to the launcher or to the watch, ``stopped`` by
that signal; to one rank, that rank named (``killed`` by SIGTERM; ``stopped`` by SIGINT: a Ctrl-C of its own).

    .venv/bin/python tests/optin/signals.py --venv /work/optin/venv [--corpus DIR] [--only torchrun]

The toolkit environment (``--venv``: Accelerate installed, made outside the repository as
``tests/fixtures/toolkit_runs/README.md`` says) runs the job; this checkout's asrlab watches it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
STEP = "rank 0 epoch 0 step 6 loss"  # rank 0's line for optimizer step 6: the moment the signal goes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_cmd(kind: str, venv: Path) -> list[str]:
    if kind == "torchrun":
        return [str(venv / "bin" / "python"), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return [str(venv / "bin" / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
            "--main_process_port", str(free_port())]  # fmt: skip


def target_of(watch: subprocess.Popen, target: str) -> psutil.Process:
    """The watch itself, the launcher (torchrun's agent or accelerate's launcher: the job's first process, below
    the watch's keeper), or rank 1."""
    if target == "watch":
        return psutil.Process(watch.pid)
    for p in psutil.Process(watch.pid).children(recursive=True):
        try:
            line = " ".join(p.cmdline())
            if "keeper" in line:
                continue
            if target == "launcher" and ("torch.distributed.run" in line or "accelerate launch" in line
                                         or line.split()[1:2] == ["launch"]):  # fmt: skip
                return p
            if target == "rank" and "accel_loop.py" in line and p.environ().get("RANK") == "1":
                return p
        except (psutil.Error, IndexError):
            continue
    raise LookupError(f"no {target} process found")


def run(kind: str, target: str, sig: signal.Signals, venv: Path, data: Path, work: Path) -> dict:
    exp = work / f"{kind}_{target}_{sig.name}"
    cmd = [sys.executable, "-m", "asrlab.cli", "watch", "--exp", str(exp), "--stall-timeout", "120", "--",
           *launcher_cmd(kind, venv), str(HERE / "accel_loop.py"), "--out", str(exp / "out"), "--cpu",
           "--data", str(data), "--epochs", "20"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    watch = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    try:
        while STEP not in ((exp / "job.log").read_text(errors="replace") if (exp / "job.log").exists() else ""):
            if time.time() > deadline or watch.poll() is not None:
                raise RuntimeError(f"{exp.name}: no step 6 (exit {watch.poll()})")
            time.sleep(0.2)
        target_of(watch, target).send_signal(sig)
        rc = watch.wait(timeout=120)
    finally:
        if watch.poll() is None:
            os.killpg(watch.pid, signal.SIGKILL)
            watch.wait()
    said = subprocess.run([sys.executable, "-m", "asrlab.cli", "doctor", "--json", str(exp)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    d = json.loads(said.stdout)
    return {"launcher": kind, "target": target, "signal": sig.name, "exit": rc, "verdict": d["verdict"],
            "culprit": {k: d["culprit"][k] for k in ("rank", "step")}, "summary": d["summary"]}  # fmt: skip


def right(r: dict) -> bool:
    if r["target"] in ("launcher", "watch"):
        return r["verdict"] == "stopped" and r["signal"] in r["summary"]
    want = "killed" if r["signal"] == "SIGTERM" else "stopped"
    return r["verdict"] == want and r["culprit"]["rank"] == 1 and r["signal"] in r["summary"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, default=Path("/work/optin/corpus"))
    ap.add_argument("--only", default="", help="the runs whose 'launcher target signal' holds this")
    ap.add_argument("--keep", type=Path, help="keep each run's folder under this one")
    a = ap.parse_args()
    data = a.corpus / "train" / "raw.list"
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = a.keep or tmp
        for kind in ("torchrun", "accelerate"):
            for target in ("launcher", "watch", "rank"):
                for sig in (signal.SIGTERM, signal.SIGINT):
                    if a.only and a.only not in f"{kind} {target} {sig.name}":
                        continue
                    r = run(kind, target, sig, a.venv, data, Path(tmp))
                    results.append(r)
                    print(f"{'ok ' if right(r) else 'BAD'} {kind:10s} {target:8s} {r['signal']:7s} exit {r['exit']:3d} "
                          f"{r['verdict']:9s} culprit {r['culprit']}: {r['summary'][:200]}", flush=True)  # fmt: skip
    good = sum(right(r) for r in results)
    print(f"{good} of {len(results)} runs read as they should")
    return 0 if good == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Helpers several test modules share (a module of its own: test modules do not import each other)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import torch

from asrlab.config import load_config
from asrlab.lab.dist import DistInfo
from asrlab.train.launch import JOB_ENV
from asrlab.train.trainer import Trainer

from conftest import SMALL

CPU = DistInfo(0, 1, 0, torch.device("cpu"), None)


def make_trainer(corpus, exp, *extra):
    """A one-rank CPU trainer of the small model on ``corpus``."""
    cfg = load_config("tiny", SMALL + list(extra))
    return Trainer(cfg, str(corpus / "data.list"), None, exp, CPU)


def job_processes(exp) -> list[psutil.Process]:
    """The live processes of the job writing ``exp``: its command line names it (the launcher, torchrun's agent, a
    rank started as a program), or its environment does (the ranks the launcher forks, and their workers)."""
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            if (
                str(exp) in " ".join(p.info["cmdline"] or []) or (p.info["environ"] or {}).get(JOB_ENV) == str(exp)
            ) and (p.status() != psutil.STATUS_ZOMBIE):
                out.append(p)
        except psutil.Error:
            continue
    return out


def train2(data, exp, *args, timeout=150):
    """``asrlab train --nproc 2`` of the small model; fails the test if any of its processes outlives it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
        *SMALL,
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    leftover = []
    for _ in range(20):  # give torchrun's SIGTERM a moment to land
        leftover = job_processes(exp)
        if not leftover:
            break
        time.sleep(0.5)
    assert not leftover, f"processes left running: {[p.info['cmdline'] for p in leftover]}"
    return out


class NoStacks:
    """A watch's sampler whose every look fails, as py-spy's does when it times out on a loaded machine."""

    def sample(self, pid):
        return None

"""``asrlab watch -- CMD``: any training command, watched from outside with no line of it changed."""

from __future__ import annotations

import argparse
import sys

from ..errors import UsageError


def cmd_watch(a: argparse.Namespace) -> int:
    from ..watch.watcher import JobWatch

    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        raise UsageError("nothing to watch: asrlab watch [--exp DIR] [options] -- CMD [ARGS...]")
    try:
        watch = JobWatch(
            a.exp, a.stall_timeout, a.on_stall, a.sample_hz, a.sampler, a.first_step_timeout, yield_cpu=True
        )
        rc = watch.run(cmd)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if watch.stalled is not None:
        v = watch.stalled["verdict"]  # a stall the ranks then got past: the job finished, the report is history
        said = (
            f"finished; the ranks moved on after the stall it reported ({v})" if watch.stall_passed else f"stalled: {v}"
        )
        print(f"asrlab watch: {said}\n  report: {a.exp}/stall_report.txt; asrlab doctor {a.exp}", file=sys.stderr)
    elif (said := _what_went_wrong(a.exp)) is not None:
        print(f"asrlab watch: {said}\n  asrlab doctor {a.exp}", file=sys.stderr)
    return rc


def _what_went_wrong(exp: str, timeout_s: float = 30.0) -> str | None:
    """The doctor's verdict on the watched run, where something went wrong (a crash, a killed rank, a loss that
    went non-finite though the job exited 0) or a signal stopped it (the console then says how it ended); None for
    a run that finished well, or one the doctor cannot read within ``timeout_s`` (a process of its own, ended then:
    a run's large checkpoints are hashed when read)."""
    import json
    import subprocess

    try:
        out = subprocess.run(
            [sys.executable, "-m", "asrlab.cli", "doctor", str(exp), "--json"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        d = json.loads(out.stdout)
    except (subprocess.TimeoutExpired, OSError, ValueError):  # the job's exit code is what the watch owes
        return None
    if not isinstance(d, dict) or "verdict" not in d:  # the doctor's usage error: nothing there to read
        return None
    return None if d["verdict"] == "finished" and d["ok"] else f"{d['verdict']}: {d['summary']}"


def add_commands(sub) -> None:
    w = sub.add_parser(
        "watch",
        help="run any training command (torchrun ..., python train.py, a recipe's script) "
        "and watch every rank from outside for stalls and errors",
        description="Runs CMD as it is and watches every rank and DataLoader worker under it: "
        "their stacks sampled with py-spy (or faulthandler where ptrace is refused), "
        "a stall verdict and report into EXP, CMD's exit code passed through.",
    )
    w.add_argument(
        "--exp",
        default="exp/watch",
        help="where the heartbeats, stall report and errors go (asrlab doctor EXP reads them; default exp/watch)",
    )
    w.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="a stall: no rank's stacks moved for S seconds (default 60)",
    )
    w.add_argument(
        "--first-step-timeout",
        type=float,
        default=None,
        metavar="S",
        help="the allowance before the ranks are seen training (default 3x --stall-timeout)",
    )
    w.add_argument(
        "--on-stall",
        choices=("report", "kill"),
        default="report",
        help="report: write the verdict and stacks and let the job be; kill: then end the job",
    )
    w.add_argument("--sample-hz", type=float, default=2.0, help="samples per second of each process (default 2)")
    w.add_argument(
        "--sampler",
        choices=("auto", "py-spy", "faulthandler"),
        default="auto",
        help="how stacks are read (auto: py-spy where ptrace is allowed, else faulthandler)",
    )
    w.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]: the training command, as you would run it")
    w.set_defaults(func=cmd_watch)

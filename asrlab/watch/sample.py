"""Python stacks of another process, read from outside without pausing it.

:class:`PySpy` runs ``py-spy dump --nonblocking --json`` (it reads the process's memory, which needs
the ptrace permission a parent has over its children on ordinary Linux). Where that is refused (a
container without CAP_SYS_PTRACE, a Yama ptrace_scope of 3), :class:`FaultHandler` needs none: the
``sitecustomize`` that ``asrlab watch`` puts on the job's ``PYTHONPATH`` has every Python process of the
job dump its stacks with ``faulthandler`` when sent a signal. A stack is a list of frames
``(file, line, function)``, outermost first; a process's sample is ``{thread name: stack}``.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..lab.stall.classify import Frame, parse_faulthandler
from ..lab.stall.watchdog import catches

DUMP_SIGNAL = signal.SIGRTMIN + 7  # rarely used by training code; sent only to processes that asked for it


def py_spy_path() -> str | None:
    """The py-spy executable beside this Python (the pinned wheel), else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


class PySpy:
    name = "py-spy"

    def __init__(self, exe: str | None = None, timeout_s: float = 5.0):
        self.exe = exe or py_spy_path()
        self.timeout_s = timeout_s
        self.cpu_s = 0.0  # the CPU its dumps took, what watching costs the machine beyond the watcher itself
        self.dumps = 0

    def works_on(self, pid: int) -> str | None:
        """None when it can read ``pid``'s stacks, else why not."""
        if self.exe is None:
            return "py-spy is not installed"
        try:
            out = subprocess.run(
                [self.exe, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
        if out.returncode == 0:
            return None
        return (out.stderr.strip().splitlines() or ["py-spy failed"])[0]

    def sample(self, pid: int) -> dict[str, list[Frame]] | None:
        before = _children_cpu()
        try:
            out = subprocess.run(
                [self.exe, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        finally:  # the dump is the only child reaped in between
            self.cpu_s += _children_cpu() - before
            self.dumps += 1
        if out.returncode != 0:
            return None
        try:
            threads = json.loads(out.stdout)
        except ValueError:
            return None
        stacks = {}
        for i, t in enumerate(threads):
            name = t.get("thread_name") or f"thread {t.get('os_thread_id') or i}"
            if t.get("os_thread_id") == pid:
                name = "MainThread"
            stacks[name] = [(f["filename"], int(f["line"]), f["name"].split(".")[-1]) for f in reversed(t["frames"])]
        return stacks

    def locals_of(self, pid: int, file: str, fn: str) -> dict[str, str]:
        """``{name: repr}`` of the locals of the innermost call of ``fn`` in ``file`` on ``pid``'s main thread
        (one dump that also reads the values; empty when it cannot)."""
        try:
            out = subprocess.run(
                [self.exe, "dump", "--pid", str(pid), "--json", "--nonblocking", "--locals"],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
            threads = json.loads(out.stdout) if out.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return {}
        for t in threads:
            if t.get("os_thread_id") != pid:
                continue
            for f in t.get("frames") or []:  # innermost first
                if f.get("filename") == file and f.get("name", "").split(".")[-1] == fn:
                    return {v["name"]: v.get("repr") for v in f.get("locals") or [] if "name" in v}
        return {}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class FaultHandler:
    """Stacks through the job's own ``faulthandler`` (see the module docstring): only processes that
    registered for the signal (their file exists in ``folder``) are sent it."""

    name = "faulthandler"

    def __init__(self, folder: Path, wait_s: float = 0.5):
        self.folder, self.wait_s = Path(folder), wait_s

    def env(self) -> dict[str, str]:
        return {"ASRLAB_WATCH_DIR": str(self.folder), "ASRLAB_WATCH_SIGNAL": str(int(DUMP_SIGNAL))}

    def sample(self, pid: int) -> dict[str, list[Frame]] | None:
        path = self.folder / f"{pid}.txt"
        # its file is not enough: a process forked by a registered one and then exec'd (torchrun starting a
        # rank) has it before its new interpreter registers, and the signal's default action would end it
        if not path.exists() or not catches(pid, DUMP_SIGNAL):
            return None
        try:
            os.truncate(path, 0)
            os.kill(pid, DUMP_SIGNAL)
        except OSError:
            return None
        deadline, size = time.monotonic() + self.wait_s, -1
        while time.monotonic() < deadline:  # written from a signal handler: done when it stops growing
            time.sleep(0.02)
            now = path.stat().st_size
            if now and now == size:
                break
            size = now
        return parse_faulthandler(path.read_text(errors="replace")) or None


def format_stack(frames: list[Frame]) -> list[str]:
    """A stack as traceback's lines (innermost call last), as the stall reports show them."""
    return [f'  File "{f}", line {n}, in {fn}' for f, n, fn in frames]


__all__ = [
    "DUMP_SIGNAL",
    "FaultHandler",
    "catches",
    "Frame",
    "PySpy",
    "format_stack",
    "parse_faulthandler",
    "py_spy_path",
]

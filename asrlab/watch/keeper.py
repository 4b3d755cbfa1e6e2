"""The watched job's keeper: a small process between ``asrlab watch`` and the job that ends the whole job
when the watch ends, however the watch ends (SIGKILL included).

A parent-death signal reaches the watch's direct child only: when that child is ``bash train.sh``, bash
dies of it and the torchrun it started, re-parented to PID 1, trains on with its ranks and workers. The
keeper instead is the job's parent and a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): whatever of the
job is orphaned (torchrun after its shell died, a stage's background process) is re-parented to the keeper,
not to PID 1, so every process of the job stays below it. It waits on a pipe whose writing end only the
watch holds; when the pipe closes (the watch asked for it, or the kernel closed it because the watch died),
the keeper sends SIGTERM to every process below it, SIGKILL after a grace period to what is left, and exits.
It lives in a session of its own, so that a signal to the watch's process group (Ctrl-C, ``kill -- -PGID``)
does not take it with the watch; SIGTERM or SIGINT sent to the keeper itself is passed on to the job.

Run as ``python -I -S keeper.py CONTROL_FD REPORT_FD STATUS CMD...``: standard library only (it must start
fast and load neither asrlab nor the ``sitecustomize`` put on the job's path). The watch writes ``end`` before
it closes the pipe; a pipe closed without it is a watch that died (SIGKILL), and the keeper then marks the run
stopped in ``STATUS`` (the run's ``lab.json``; ``-``: none) before it ends the job, as the watch itself does
when a signal ends it, so that ``asrlab doctor`` reads a stop, not ranks that vanished. On ``REPORT_FD`` it
writes ``pid N`` once the job's command has been executed (or ``error MESSAGE`` when it could not be), then
``exit CODE`` when the job's process ends (``-N``: ended by signal N). :class:`KeptJob` is the watch's side,
with the part of :class:`subprocess.Popen` the watch uses.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # prctl(2)
GRACE_S = 5.0  # between the SIGTERM to every process of the job and the SIGKILL to what is left


# -- the keeper process (standard library only) --------------------------------------------------------
def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _below(root: int) -> list[int]:
    """Every process below ``root`` now, parents first (one pass over ``/proc``)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after the command's name, which may hold anything
        if len(fields) > 1 and fields[0] != b"Z":  # a zombie has ended already: only reaping is left
            kids.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(0), ()):
            out.append(c)
            todo.append(c)
    return out


def _send(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


class _Keeper:
    def __init__(self, control: int, report: int, status: str = "-"):
        self.control, self.report, self.status, self.job = control, report, status, 0
        self.code: int | None = None

    def say(self, line: str) -> None:
        try:
            os.write(self.report, (line + "\n").encode())
        except OSError:  # the watch is gone: nobody to tell
            pass

    def reap(self) -> None:
        """Collect every child that ended (the job's, and orphans re-parented here)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.job and self.code is None:
                self.code = os.waitstatus_to_exitcode(status)
                self.say(f"exit {self.code}")

    def start(self, cmd: list[str]) -> bool:
        inherited = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        keeper = os.getpid()
        failed_r, failed_w = os.pipe()  # closed by a successful exec; an error message otherwise
        pid = os.fork()
        if pid == 0:
            try:
                os.close(failed_r)
                os.close(self.control)
                os.close(self.report)
                os.setsid()  # a terminal's Ctrl-C to the watch's group does not reach the job
                for s, before in inherited.items():  # an ignored signal stays ignored, as without the keeper
                    signal.signal(s, signal.SIG_IGN if before == signal.SIG_IGN else signal.SIG_DFL)
                signal.signal(signal.SIGHUP, signal.SIG_DFL)
                _prctl(PR_SET_PDEATHSIG, signal.SIGHUP)  # should the keeper itself be killed
                if os.getppid() != keeper:
                    os.kill(os.getpid(), signal.SIGHUP)
                os.set_inheritable(failed_w, False)
                os.execvp(cmd[0], cmd)
            except BaseException as e:  # noqa: BLE001 (reported to the watch, whatever it is)
                try:
                    os.write(
                        failed_w,
                        f"[Errno {getattr(e, 'errno', None)}] {getattr(e, 'strerror', None) or e}: {cmd[0]!r}".encode(),
                    )
                finally:
                    os._exit(127)
        self.job = pid
        # a signal sent to the keeper itself (its command line holds the job's: ``pkill -f torchrun`` finds it
        # first) is meant for the job: passed on to it, as to the command run without a watch
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, self._pass_on)
        os.close(failed_w)
        failed = b""
        while chunk := os.read(failed_r, 4096):
            failed += chunk
        os.close(failed_r)
        if failed:
            self.say("error " + failed.decode(errors="replace"))
            return False
        self.say(f"pid {pid}")
        return True

    def _pass_on(self, sig: int, _frame) -> None:
        if self.code is None:
            try:
                os.kill(self.job, sig)
            except OSError:
                pass

    def keep(self) -> None:
        """Until the control pipe closes; then end everything below."""
        asked = False
        while True:
            self.reap()
            ready, _, _ = select.select([self.control], [], [], 0.1)
            if ready:
                said = os.read(self.control, 4096)
                if not said:
                    break
                asked = asked or b"end" in said
        if not asked and self.code is None:
            self.mark_stopped()
        self.end_all()

    def mark_stopped(self) -> None:
        """The watch died with the job running: the run's status says it was stopped, and by what."""
        if self.status == "-":
            return
        try:
            with open(self.status) as f:
                status = json.load(f)
            status.update(
                status="stopped",
                stop_time=time.time(),
                stopped_by="the death of asrlab watch (its keeper ended the job)",
            )
            with open(self.status + ".keeper", "w") as f:
                json.dump(status, f, indent=1)
            os.replace(self.status + ".keeper", self.status)
        except (OSError, ValueError):
            pass

    def end_all(self, grace_s: float = GRACE_S) -> None:
        me = os.getpid()
        _send(_below(me), signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self.reap()
            if not _below(me):
                return
            time.sleep(0.05)
        for _ in range(100):  # what forks while it is being killed is killed too
            left = _below(me)
            if not left:
                break
            _send(left, signal.SIGKILL)
            time.sleep(0.05)
            self.reap()
        self.reap()


def main(argv: list[str]) -> int:
    keeper = _Keeper(int(argv[1]), int(argv[2]), argv[3])
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if not keeper.start(argv[4:]):
        keeper.reap()
        return 127
    # the job holds the output pipes now; the keeper must not keep them open after the job ends
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    keeper.keep()
    return 0


# -- the watch's side ------------------------------------------------------------------------------
class KeptJob:
    """``cmd`` started under a keeper: ``pid`` is the job's process, ``poll``/``wait``/``returncode`` its
    exit code (``-N`` when ended by signal N), ``stdout``/``stderr`` its output pipes. :meth:`close` has the
    keeper end whatever of the job is left and waits for it. Raises ``OSError`` when ``cmd`` cannot run."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None, stdout=None, stderr=None, status=None):
        control_r, self._control = os.pipe()
        report_r, report_w = os.pipe()
        self.keeper = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, str(control_r), str(report_w), str(status or "-"), *cmd],
            env=env,
            stdout=stdout,
            stderr=stderr,
            pass_fds=(control_r, report_w),
            start_new_session=True,
        )
        os.close(control_r)
        os.close(report_w)
        self.stdout, self.stderr = self.keeper.stdout, self.keeper.stderr
        self._report, self._buf, self.returncode = report_r, b"", None
        self.pid = 0
        while not self.pid:
            line = self._line(None)
            if line is None or line.startswith("error "):
                self.close()
                raise OSError(line[len("error ") :] if line else "its keeper failed to start")
            if line.startswith("pid "):
                self.pid = int(line.split()[1])

    def _line(self, timeout: float | None) -> str | None:
        """The keeper's next line; None when it said nothing within ``timeout`` or has ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._report < 0 or not select.select([self._report], [], [], left)[0]:
                return None
            chunk = os.read(self._report, 4096)
            if not chunk:  # the keeper is gone; killed itself, the job with it
                os.close(self._report)
                self._report = -1
                if self.returncode is None and self.pid:
                    self.returncode = self.keeper.wait()
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def _read(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            line = self._line(left)
            if line is None:
                return
            if line.startswith("exit "):
                self.returncode = int(line.split()[1])

    def poll(self) -> int | None:
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired("the watched job", timeout)
        return self.returncode

    def close(self, timeout_s: float = GRACE_S + 5.0) -> None:
        if self._control >= 0:
            try:
                os.write(self._control, b"end")  # asked: not a watch that died
            except OSError:
                pass
            os.close(self._control)
            self._control = -1
        try:
            self.keeper.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.keeper.kill()
            self.keeper.wait()
        if self._report >= 0:
            os.close(self._report)
            self._report = -1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

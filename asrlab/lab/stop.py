"""A clean stop asked for from outside a run: the file ``EXP/STOP``, or a signal.

Whoever wants the run to end (a notebook's Stop button, ``asrlab stop EXP``, a scheduler's
pre-emption hook) creates the file; every rank looks for it after each step, the ranks agree on it
in the all-reduce they already make for the time limit, and the run ends as if its budget were
spent: a checkpoint, an evaluation, exit code 0. A file, not a signal, because it reaches every
rank of every node the same way and cannot kill a rank halfway through a checkpoint.

Signals are what ``kill``, ``timeout``, Ctrl-C and job managers send, though: inside
:func:`stop_on_signals` the first SIGTERM or SIGINT is taken as that same request (only noted in the
handler; the loop sees it through :func:`stop_requested` at its next check), and a second takes its
usual course. A process started to do a run's work gets SIGHUP when whoever started it ends
(:func:`end_with_parent`), so that nothing of a run keeps training once its starter is gone; SIGHUP
asks for the same clean stop but never more, since the kernel sends it again each time the process
passes to another thread of its ending parent. An ignored SIGHUP is inherited through exec (``nohup``,
some job schedulers): such a process gets SIGHUP's default back first, or the signal would be lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

STOP_FILE = "STOP"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PARENT_GONE = signal.SIGHUP  # the parent-death signal: may come several times, so it never escalates
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends

_SIGNALLED: list[signal.Signals] = []  # the signal that asked this process to stop, once one did
_ASKED: list[signal.Signals] = []  # the same, kept after the body ends (how the run ended, said at exit)


def request_stop(exp: str | Path, reason: str = "requested") -> Path:
    """Ask the run writing to ``exp`` to stop after its current step."""
    path = Path(exp) / STOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason + "\n")
    return path


def stop_requested(exp: str | Path) -> bool:
    """``EXP/STOP`` exists, or this process was signalled inside :func:`stop_on_signals`."""
    return bool(_SIGNALLED) or (Path(exp) / STOP_FILE).exists()


def clear_stop(exp: str | Path) -> None:
    """Forget a request (the run that honoured it is over, or a new run starts)."""
    (Path(exp) / STOP_FILE).unlink(missing_ok=True)


def stop_signal() -> signal.Signals | None:
    """The signal that asked this process to stop (inside :func:`stop_on_signals`), else None."""
    return _SIGNALLED[0] if _SIGNALLED else None


def stopped_by() -> signal.Signals | None:
    """The signal that asked the last :func:`stop_on_signals` body to stop, after the body too; else None."""
    return _ASKED[0] if _ASKED else None


@contextlib.contextmanager
def stop_on_signals(signals: tuple = STOP_SIGNALS):
    """While the body runs, the first of ``signals`` asks for a clean stop (see the module docstring);
    a second one (but ``PARENT_GONE``) gets the handler that was there before, as if this one had never
    been. Only the main thread can set handlers: elsewhere the body runs with the signals as they are.
    Forked children (data-loader workers) inherit the handler and ignore the signal: their parent stops them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner, before = os.getpid(), {}

    def handler(sig, frame):
        if os.getpid() != owner:
            return
        if not _SIGNALLED:
            _SIGNALLED.append(signal.Signals(sig))
            _ASKED[:] = _SIGNALLED
            return
        if sig == PARENT_GONE:
            return
        signal.signal(sig, before[sig] if before[sig] is not None else signal.SIG_DFL)
        os.kill(owner, sig)  # delivered as soon as this handler returns, to the handler it had before

    _SIGNALLED.clear()
    _ASKED.clear()
    for sig in signals:
        before[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        _SIGNALLED.clear()


@functools.cache
def _prctl() -> Callable | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def end_with_parent(parent: int, sig: int = PARENT_GONE) -> bool:
    """Have this process get ``sig`` when its parent ``parent`` ends (Linux; False elsewhere). The
    parent may have gone just before: then ``sig`` comes at once."""
    prctl = _prctl()
    if prctl is None:
        return False
    if signal.getsignal(sig) == signal.SIG_IGN:
        signal.signal(sig, signal.SIG_DFL)
    prctl(PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def workers_ignore_stop_signals(then: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """A DataLoader's ``worker_init_fn`` for a loop inside :func:`stop_on_signals` under a launcher that signals
    each rank's whole process group (torchrun does): torch's workers die of a SIGTERM that their own rank did not
    send, so the rank fails ("DataLoader worker ... killed by signal: Terminated") before it can stop cleanly.
    With this the workers ignore the stop signals; their rank stops them as it ends. ``then``: the loader's own
    ``worker_init_fn``, called after."""

    def init(worker_id: int) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # over the handler torch's worker loop set in C at its start
        if then is not None:
            then(worker_id)

    return init


def own_session_ending_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` for a child that does a run's work: a session of its own (a signal to the
    starter's process group, a terminal's Ctrl-C say, does not reach it), and ``PARENT_GONE`` when the
    starter ends. Made in the starter, so that nothing is loaded between fork and exec."""
    parent, prctl = os.getpid(), _prctl()

    def preexec() -> None:
        os.setsid()
        if prctl is not None:
            signal.signal(PARENT_GONE, signal.SIG_DFL)  # not ignored, as nohup would leave it
            prctl(PR_SET_PDEATHSIG, int(PARENT_GONE))
            if os.getppid() != parent:
                os.kill(os.getpid(), PARENT_GONE)

    return preexec

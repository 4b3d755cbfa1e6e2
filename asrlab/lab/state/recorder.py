"""Which :class:`~asrlab.lab.state.run_state.RunState` records this process's steps in its ledger: the last one
whose ``record()`` was called, until it is closed. An :class:`~asrlab.lab.UnevenGuard` given no ``state=`` writes
what its rank left untrained there. A module of its own, under both: the run state imports the guard (to tell a
guard's position from a loader's) and the guard asks this, so neither imports the other for it."""

from __future__ import annotations

import weakref

_RECORDING: weakref.ref | None = None  # the RunState whose record() wrote this process's last ledger step


def records(state) -> None:
    """``state`` (a RunState with a ledger) records this process's steps from now on."""
    global _RECORDING
    if _RECORDING is None or _RECORDING() is not state:
        _RECORDING = weakref.ref(state)


def closed(state) -> None:
    """``state`` is closed: if it recorded this process's steps, none does now."""
    global _RECORDING
    if _RECORDING is not None and _RECORDING() is state:
        _RECORDING = None


def recording():
    """The :class:`~asrlab.lab.state.run_state.RunState` that records this process's steps in its ledger (the
    last one whose ``record()`` was called, until closed), or None: where an :class:`~asrlab.lab.UnevenGuard`
    given no ``state=`` writes what its rank left untrained."""
    state = _RECORDING() if _RECORDING is not None else None
    return state if state is not None and state.ledger is not None else None


__all__ = ["closed", "records", "recording"]

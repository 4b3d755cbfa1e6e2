"""Which ranks on this host ended while this one was alive, and when.

A rank killed with SIGKILL (the OOM killer, a scheduler) records nothing, and its launcher then ends the
others within a fraction of a second: their heartbeats, written once a second, cannot say which went
first. Each rank's watchdog therefore watches its peers' processes on the same host through pidfds
(Linux 5.3+): a thread wakes the moment one ends and appends one line, ``RANK TIME``, to
``EXP/heartbeat/rank{R}.peers`` with a single write, before the launcher's signal can end this rank too.
``asrlab doctor`` names the rank that others saw end first as the one that vanished.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from pathlib import Path

from .. import layout
from .heartbeat import read_heartbeats


def peers_path(exp: Path, rank: int) -> Path:
    """A rank's file of the peers it saw end (``watch.peers`` for ``asrlab watch``, which sees every rank)."""
    return Path(exp) / layout.HEARTBEAT / (f"rank{rank}.peers" if rank >= 0 else "watch.peers")


class PeerExits(threading.Thread):
    """``watch(rank, pid)`` each peer on this host; their ends are appended to this rank's ``.peers`` file."""

    def __init__(self, exp: Path, rank: int, world_size: int, rid: str | None = None, find: bool = True):
        super().__init__(name="asrlab-peer-exits", daemon=True)
        self.exp, self.world_size, self.rid, self.find = Path(exp), world_size, rid, find
        self.path, self.rank = peers_path(exp, rank), rank
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._poll = select.poll()
        self._wake_r, self._wake_w = os.pipe()
        self._poll.register(self._wake_r, select.POLLIN)
        self._watched: dict[int, tuple[int, int]] = {}  # pidfd -> (rank, pid)
        self._pids: set[int] = set()
        self._lock = threading.Lock()
        self._ending = False

    @staticmethod
    def available() -> bool:
        return hasattr(os, "pidfd_open")

    def watch(self, rank: int, pid: int) -> None:
        with self._lock:
            if pid in self._pids or rank == self.rank:
                return
            self._pids.add(pid)
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # already gone, or not ours to see
                return
            self._watched[fd] = (rank, pid)
            self._poll.register(fd, select.POLLIN)
        os.write(self._wake_w, b"x")

    def look(self) -> int:
        """Watch every peer on this host that has written a heartbeat; returns how many ranks wrote one."""
        host = socket.gethostname()
        beats = read_heartbeats(self.exp, self.rid)
        for r, b in beats.items():
            if b.get("host") == host and b.get("pid"):
                self.watch(r, int(b["pid"]))
        return len(beats)

    def run(self) -> None:
        if self.find:  # a rank finds its peers in their heartbeats; asrlab watch names them itself
            threading.Thread(target=self._find, name="asrlab-peer-find", daemon=True).start()
        while not self._ending:
            for fd, _ in self._poll.poll():
                if fd == self._wake_r:
                    os.read(self._wake_r, 512)
                    continue
                with self._lock:
                    rank, pid = self._watched.pop(fd, (None, None))
                    self._poll.unregister(fd)
                os.close(fd)
                if rank is not None:
                    os.write(self._fd, f"{rank} {time.time():.6f} {pid}\n".encode())  # one write: no time to lose

    def _find(self, within_s: float = 30.0) -> None:
        """The peers as their first heartbeats appear, at once: a rank may be killed in its first second."""
        deadline = time.time() + within_s
        while not self._ending and time.time() < deadline and self.look() < self.world_size:
            time.sleep(0.1)

    def stop(self) -> None:
        self._ending = True
        os.write(self._wake_w, b"x")


def read_peer_exits(exp: Path) -> dict[int, float]:
    """``{rank: the earliest time another rank saw its process end}`` over every rank's ``.peers`` file."""
    seen: dict[int, float] = {}
    for path in (Path(exp) / layout.HEARTBEAT).glob("*.peers"):
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) >= 2 and parts[0].isdigit():
                rank, t = int(parts[0]), float(parts[1])
                seen[rank] = min(t, seen.get(rank, t))
    return seen


__all__ = ["PeerExits", "peers_path", "read_peer_exits"]

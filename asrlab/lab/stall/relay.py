"""Across nodes that share no experiment folder: each rank's own files, relayed through the rendezvous store.

The stall watch talks through files in ``EXP`` that each rank writes about itself: its heartbeat
(``heartbeat/rank{R}.json``), its stacks when stalled (``stall/rank{R}.json``, ``stall/rank{R}.workers.txt``)
and its error (``errors/rank{R}.json``). On one node, or with ``EXP`` on shared storage, every rank reads
every file. When a run's nodes each have an ``EXP`` of their own, a :class:`Relay` thread in each rank
puts its own files in torch.distributed's TCPStore (the one torchrun's rendezvous serves on the first
node) and writes every other rank's into its own ``EXP``, once a second. The watchdog, its report
(written on rank 0's node), the launcher and ``asrlab doctor`` then read ``EXP`` as on one node.

A copy replaces a local file only when it is newer by its owner's own clock (the ``time`` in it), so a
relay on shared storage never puts an older copy over the owner's file. The store is never used for
anything the training waits on; a store that stops answering (its node is gone) leaves the files as
they were, which the watchdog then sees as ranks that stopped responding.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

from ...files import atomic_write

log = logging.getLogger(__name__)

OWN = ("heartbeat/rank{r}.json", "stall/rank{r}.json", "stall/rank{r}.workers.txt", "errors/rank{r}.json")
PERIOD_S = 1.0  # as often as the watchdog writes the heartbeat
_ACTIVE: list["Relay"] = []  # the relay of this process, for flush() from where files are written


def across_nodes() -> bool:
    """Whether this rank's job spans more than one node (torchrun's LOCAL_WORLD_SIZE below WORLD_SIZE)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world > int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))


def node_rank() -> int:
    """This rank's node (torchrun's GROUP_RANK; 0 when started otherwise)."""
    return int(os.environ.get("GROUP_RANK", "0"))


def open_store(timeout_s: float = 10.0):
    """A client of the store torchrun's rendezvous serves (MASTER_ADDR:MASTER_PORT)."""
    import torch.distributed as tdist

    return tdist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


class Relay(threading.Thread):
    """Copies this rank's own files to the store and the other ranks' files from it, every ``period_s``."""

    def __init__(self, exp: str | Path, rank: int, world_size: int, rid: str, store, period_s: float = PERIOD_S):
        super().__init__(name="asrlab-relay", daemon=True)
        self.exp, self.rank, self.world_size, self.store = Path(exp), rank, world_size, store
        self.prefix, self.period_s = f"asrlab/{rid}/", period_s
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._sent: str | None = None
        self._seen = {r: False for r in range(world_size) if r != rank}  # whose key exists yet
        self.failing_since: float | None = None

    def _key(self, rank: int) -> str:
        return f"{self.prefix}rank{rank}"

    def push(self) -> None:
        """Put this rank's files in the store (when they changed)."""
        bundle = {}
        for rel in OWN:
            path = self.exp / rel.format(r=self.rank)
            try:
                bundle[rel] = path.read_text()
            except OSError:
                continue
        text = json.dumps(bundle)
        with self._lock:
            if text != self._sent:
                self.store.set(self._key(self.rank), text)
                self._sent = text

    def pull(self) -> None:
        """Write the other ranks' files from the store where they are newer than this node's copies."""
        for r, seen in self._seen.items():
            if not seen:
                self._seen[r] = seen = self.store.check([self._key(r)])
        ranks = [r for r, seen in self._seen.items() if seen]
        if not ranks:
            return
        for r, raw in zip(ranks, self.store.multi_get([self._key(r) for r in ranks])):
            for rel, text in json.loads(raw).items():
                _write_if_newer(self.exp / rel.format(r=r), text)

    def run(self) -> None:
        while not self._halt.wait(self.period_s):
            try:
                self.push()
                self.pull()
                self.failing_since = None
            except Exception as e:  # the store's node gone, or a torn copy: the files stay as they were
                if self.failing_since is None:
                    self.failing_since = time.time()
                    log.warning(
                        "rank %d: the relay to the other nodes fails (%s); their files stay as last seen", self.rank, e
                    )

    def stop(self, wait_s: float = 3.0) -> None:
        """Stop relaying, after a last push of this rank's files (its final heartbeat) and, for up to
        ``wait_s``, pulls until every rank's last heartbeat here says it is done or it recorded an error
        (so each node's ``EXP`` ends with how every rank ended)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        flush(self)
        deadline = time.time() + wait_s
        while True:
            try:
                self.pull()
            except Exception:
                return
            if self._all_ended() or time.time() >= deadline:
                return
            time.sleep(0.2)

    def _all_ended(self) -> bool:
        for r in self._seen:
            if (self.exp / f"errors/rank{r}.json").exists():
                continue
            try:
                if json.loads((self.exp / f"heartbeat/rank{r}.json").read_text()).get("phase") != "done":
                    return False
            except (OSError, ValueError):
                return False
        return True


def _write_if_newer(path: Path, text: str) -> None:
    try:
        old = path.read_text()
    except OSError:
        old = None
    if old == text:
        return
    if old is not None:
        if path.suffix == ".txt":  # stacks appended as they are dumped: the longer copy is the newer
            if len(old) >= len(text):
                return
        else:
            try:
                if json.loads(old).get("time", 0) >= json.loads(text).get("time", 0):
                    return
            except ValueError:
                pass  # a torn local copy: replace it
    atomic_write(path, text)


def start(exp: str | Path, rank: int, world_size: int, rid: str) -> Relay | None:
    """A running relay when the job spans nodes (else None); its store is torchrun's."""
    if not across_nodes() or "MASTER_ADDR" not in os.environ:
        return None
    try:
        store = open_store()
    except Exception as e:
        log.warning("rank %d: no store to relay the stall watch's files across nodes (%s)", rank, e)
        return None
    relay = Relay(exp, rank, world_size, rid, store)
    flush(relay)  # at once: a rank that fails in its first second is known everywhere
    relay.start()
    _ACTIVE[:] = [relay]
    return relay


# what a collective says when a peer's process or node went away (gloo, NCCL)
PEER_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "remote process exited",
    "NCCL communicator was aborted",
    "Connection refused",
)


def lost_peers(message: str, wait_s: float = 3.0) -> list[dict] | str | None:
    """After an error that says a peer went away (:data:`PEER_LOST`), which ranks did: those whose
    files in the store do not change for ``wait_s`` (a live rank's heartbeat changes every second), as
    their last heartbeats; a string when the store itself stopped answering (the first node is gone);
    None when there is nothing to ask (no relay, or another kind of error)."""
    relay = _ACTIVE[0] if _ACTIVE else None
    if relay is None or not any(m in message for m in PEER_LOST):
        return None
    keys = [relay._key(r) for r in range(relay.world_size) if r != relay.rank]
    try:
        first = last = relay.store.multi_get(keys)
        changed = set()
        deadline = time.time() + wait_s
        while time.time() < deadline and len(changed) < len(keys):
            time.sleep(0.25)
            last = relay.store.multi_get(keys)
            changed |= {k for k, a, b in zip(keys, first, last) if a != b}
    except Exception as e:
        return f"the store on the first node ({os.environ.get('MASTER_ADDR')}) stopped answering ({e})"
    lost = []
    for key, raw in zip(keys, last):
        if key in changed:
            continue
        files = json.loads(raw)
        if any(rel.startswith("errors/") for rel in files):  # it failed itself: its own error says so
            continue
        beat = files.get("heartbeat/rank{r}.json")
        lost.append(json.loads(beat) if beat else {"rank": int(key.rsplit("rank", 1)[1])})
    return lost


def flush(relay: Relay | None = None) -> None:
    """Push this rank's files now (before it exits, or once it has recorded an error); no-op without a relay."""
    relay = relay or (_ACTIVE[0] if _ACTIVE else None)
    if relay is None:
        return
    try:
        relay.push()
    except Exception as e:
        log.warning("rank %d: could not relay its last files (%s)", relay.rank, e)


__all__ = ["OWN", "PEER_LOST", "Relay", "across_nodes", "flush", "lost_peers", "node_rank", "open_store", "start"]

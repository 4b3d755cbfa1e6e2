"""Process-group set-up: one code path for 1 process and for N under torchrun (nccl on GPUs, gloo on CPU)."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import gc
import logging
import os
import secrets
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

# before any process group exists: its functions take the default group as a default argument, so
# importing it later (DDP does, lazily) would hold the group past destroy_process_group (see teardown)
import torch.distributed.nn

from ..errors import UsageError
from .stall.heartbeat import run_id
from .stall.relay import across_nodes, open_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None when not distributed

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(backend: str | None = None, timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group torchrun describes in the environment, or run alone without one.

    Also arms ``faulthandler`` for fatal signals: a rank killed by SIGSEGV, or by SIGABRT from a
    C++ ``std::terminate``, prints every thread's Python stack to stderr before it dies.
    """
    _stacks_on_fatal_signals()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world == 1:
        return DistInfo(0, 1, 0, device, None)
    if backend in (None, "auto"):
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise UsageError("backend nccl needs GPUs; this machine has none (use gloo)")
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend,
            timeout=timeout,
            device_id=device if backend == "nccl" else None,
            **_attempt_store(rank, world, timeout),
        )
    return DistInfo(rank, world, local, device, backend)


def _attempt_store(rank: int, world: int, timeout: datetime.timedelta) -> dict:
    """After a torch elastic restart, the process group's keys under a prefix of their own: the agent's
    store still holds the failed attempt's, and a rank that read a dead peer's address from them could
    not connect. Nothing for a first attempt or a launch without torchrun's agent store."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt == "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = open_store(timeout.total_seconds())
    return {"store": dist.PrefixStore(f"asrlab/attempt{attempt}", store), "rank": rank, "world_size": world}


def _stacks_on_fatal_signals() -> None:
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError):  # no real stderr (embedded interpreters)
        pass


_CPU_GROUP: list = []  # [group] once made: the gloo group for control messages next to an NCCL one


def cpu_group():
    """A gloo process group over every rank, for agreements about control (is there data, stop now,
    which run is this) that must never queue behind, or force a wait on, GPU work. The default group
    when it is gloo already. Every rank must make the first call (it creates a group); None when alone."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    if not _CPU_GROUP:
        _CPU_GROUP.append(dist.new_group(backend="gloo"))
    return _CPU_GROUP[0]


def world() -> tuple[int, int]:
    """(rank, world size) of this process: from the process group when there is one, else the environment."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


GLOO_THREAD = "pt_gloo_runloop"  # the name torch gives gloo's worker threads
PENDING_S = 10.0  # a collective every rank has sent completes at once; one still open this long has lost a peer


def settle(work, timeout_s: float = PENDING_S) -> bool:
    """Wait for an asynchronous collective left under way (True when it completed; False when it failed or
    did not complete in ``timeout_s``: abandoned). What a part does before its process group goes."""
    if work is None:
        return True
    try:
        work.wait(datetime.timedelta(seconds=timeout_s))
        return True
    except RuntimeError as e:  # a peer gone, or the time up
        log.debug("a pending collective abandoned: %s", e)
        return False


def gloo_threads() -> int:
    """How many of gloo's worker threads run in this process (Linux; 0 elsewhere)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    count = 0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                count += f.read().strip() == GLOO_THREAD
        except OSError:  # ended meanwhile
            continue
    return count


def teardown() -> None:
    """Leave the process group; its threads have ended when this returns.

    ``destroy_process_group()`` alone leaves gloo's worker threads running while anything still holds the
    group (DDP, a guard, the run state). They then free their last works while the interpreter exits; a
    work whose tensor has a Python object takes the GIL there, the exiting interpreter ends that thread
    in a C++ frame that must not unwind, and the process aborts ("terminate called without an active
    exception", exit 134) after its work is done. So the parts wait for their pending collectives and let
    go of the groups first (``close``), and the group is destroyed here for real, its threads joined;
    objects in reference cycles that still hold it are collected first."""
    _CPU_GROUP.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
    if gloo_threads():
        gc.collect()
    left = gloo_threads()
    if left:
        log.warning(
            "%d gloo threads outlive the process group (something still holds it): the process may abort at exit", left
        )


@contextlib.contextmanager
def process_group(backend: str | None = None):
    """:func:`setup` for the body, :func:`teardown` after it, also when it raises: then the locals of the
    frames the exception passed through are let go first, since they hold the parts that hold the group
    (DDP in a step's frame, say). The traceback's text stays."""
    info = setup(backend)
    try:
        yield info
    except BaseException as e:
        seen = set()
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            traceback.clear_frames(e.__traceback__)
            e = e.__cause__ or e.__context__
        raise
    finally:
        teardown()


def broadcast_object(obj, info: DistInfo):
    """Rank 0's ``obj`` on every rank (over the gloo control group: a checkpoint stays off the GPUs)."""
    if info.backend is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=cpu_group())
    return box[0]


def shared_folder(path: str | Path, info: DistInfo) -> bool:
    """Whether every rank sees the same folder at ``path`` (True on one node, where nothing is asked):
    rank 0 writes a token there, and every rank looks for it."""
    if info.backend is None or not across_nodes():
        return True
    mark = Path(path) / ".asrlab_shared"
    token = secrets.token_hex(8) if info.is_main else None
    if info.is_main:
        mark.write_text(token)
    token = broadcast_object(token, info)
    try:
        mine = mark.read_text() == token
    except OSError:
        mine = False
    return all_have(mine, info)


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    """Element-wise sum of a list of numbers over ranks."""
    if info.backend is None:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=info.device if info.backend == "nccl" else "cpu")
    dist.all_reduce(t)
    return t.tolist()


def _reduce_one(value, dtype, op, info: DistInfo):
    """One number all-reduced with ``op`` over the ranks (one tiny all-reduce)."""
    t = torch.tensor([value], dtype=dtype, device=info.device if info.backend == "nccl" else "cpu")
    dist.all_reduce(t, op=op)
    return t.item()


def all_have(flag: bool, info: DistInfo) -> bool:
    """True when every rank says True (one tiny all-reduce)."""
    if info.backend is None:
        return flag
    return bool(_reduce_one(1 if flag else 0, torch.int32, dist.ReduceOp.MIN, info))


def all_max(value: float, info: DistInfo) -> float:
    """The largest of every rank's ``value`` (one tiny all-reduce)."""
    if info.backend is None:
        return value
    return float(_reduce_one(value, torch.float64, dist.ReduceOp.MAX, info))


def store_barrier(name: str, info: DistInfo, poll_s: float = 0.02) -> None:
    """Wait until every rank has arrived at ``name``, through the rendezvous store.

    Not a collective: a rank that arrives while the others are inside a collective (an
    unprotected uneven epoch end) waits here, visibly, instead of pairing its call with
    someone else's gradient all-reduce. ``name`` must be unique within the run.
    """
    if info.backend is None:
        return
    store = dist.distributed_c10d._get_default_store()
    key = f"asrlab/{run_id()}/{name}"
    store.add(key, 1)
    while store.add(key, 0) < info.world_size:
        time.sleep(poll_s)


def barrier(info: DistInfo) -> None:
    if info.backend is not None:
        dist.barrier()

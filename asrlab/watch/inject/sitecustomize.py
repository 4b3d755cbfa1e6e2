"""Put on a watched job's PYTHONPATH by ``asrlab watch``: standard library only, and nothing else runs.

In every Python process of the job (ranks, DataLoader workers, the torchrun agent):

* a rank's uncaught exception (a ``multiprocessing.Process`` target's too) is recorded in
  ``$ASRLAB_WATCH_EXP/errors/rank{RANK}.json`` (what ``asrlab doctor`` reads), before the process ends and its peers
  fail after it;
* where the watcher cannot read stacks from outside (ptrace refused), ``faulthandler`` dumps all
  threads' stacks to ``$ASRLAB_WATCH_DIR/{pid}.txt`` on the signal ``ASRLAB_WATCH_SIGNAL``; the file's
  existence tells the watcher that this process may be sent it;
* in a process no launcher gave a rank (``torch.multiprocessing.spawn``'s), a thread that looks twice a second
  for its process group and, once it is made, records its rank in ``$ASRLAB_WATCH_EXP/watch/ranks/{pid}.json``
  (the process group's own word, read by the watch): from then on it is that rank here too; a process whose main
  thread is in ``torch.multiprocessing.spawn`` records that it is the ranks' launcher, not a rank of its own;
* the output written a whole line at a time, where the watch made it unbuffered (not the job itself);
* in a rank, a thread that looks twice a second for ``$ASRLAB_WATCH_EXP/flight/request`` and, when the
  watcher writes it (a stall), writes PyTorch's Flight Recorder (the collectives this rank took part in) to
  ``flight/rank{RANK}.json``: a thread, since a rank stuck in a collective never returns to run a handler.

A ``sitecustomize`` the job had of its own is imported after this one.
"""

import os
import sys


# a launcher's own process (torchrun's agent, which srun or mpirun start with their rank variables) is no rank;
# a process forked from it (getpid differs) may be one, its variables set after the fork. The watch's procs.LAUNCHERS
# and procs.MPI name the same (this module imports nothing of asrlab's: it runs in the job's processes)
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch/distributed/run.py", "torch.distributed.launch",
              "asrlab.train.launch")  # fmt: skip
_LAUNCHER = any(x in a for a in getattr(sys, "orig_argv", ()) for x in _LAUNCHERS)


def _rank():
    """This process's global rank, as its launcher said it: RANK (torchrun, Accelerate, DeepSpeed), srun's
    SLURM_PROCID, an MPI launcher's (mpirun's, hydra's, PMIx's, horovodrun's), or Lightning's LOCAL_RANK on a
    single node (its launcher sets LOCAL_RANK and WORLD_SIZE, no RANK, in rank 0 and in the ranks it starts)."""
    if _LAUNCHER and os.getpid() == _PID:
        return None
    e = os.environ
    said = (e.get("RANK"), e.get("SLURM_PROCID") if e.get("SLURM_NTASKS", "1") != "1" else None)
    for r in said + tuple(e.get(n) for n in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "HOROVOD_RANK")):
        if r and r.isdigit():
            return int(r)
    r = e.get("LOCAL_RANK")
    if r and r.isdigit() and e.get("WORLD_SIZE") and e.get("NODE_RANK", "0") == "0":
        return int(r)
    return _GROUP[0]


_GROUP = [None]  # the rank this process's group said it is, where no launcher said (see _rank_from_group)


_PID = os.getpid()


def _worker():
    """A process multiprocessing started (a DataLoader worker, forked or spawned): it inherits its rank's RANK
    and error file, but its error is not the rank's (a worker whose rank was killed fails reading from it), and
    must not become the rank's error in torchrun's report."""
    if os.getpid() != _PID:  # forked after this module ran
        return True
    if _GROUP[0] is not None:  # a rank its process group named: torch.multiprocessing.spawn starts ranks this way
        return False
    if _group_made():  # a rank a script started itself as a multiprocessing.Process (no worker makes a group)
        return False
    return _spawned()


def _group_made() -> bool:
    """Whether this process made its process group (False while torch is half-imported)."""
    d = sys.modules.get("torch.distributed")
    try:
        return d is not None and d.is_available() and d.is_initialized()
    except Exception:
        return False


def _spawned():
    return any("multiprocessing.spawn" in a or "multiprocessing.forkserver" in a for a in getattr(sys, "orig_argv", ()))


def _record(exc_type, exc, tb, _previous=sys.excepthook):
    try:
        exp, rank = os.environ.get("ASRLAB_WATCH_EXP"), _rank()
        if exp and rank is not None and not issubclass(exc_type, KeyboardInterrupt) and not _worker():
            import json
            import socket
            import time
            import traceback

            rid = os.environ.get("TORCHELASTIC_RUN_ID")
            rid = (
                f"{rid}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
                if rid
                else os.environ.get("ASRLAB_WATCH_RUN") or f"{socket.gethostname()}.{os.getpid()}"
            )
            folder = os.path.join(exp, "errors")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"rank{rank}.json")
            record = {
                "rank": rank,
                "time": time.time(),
                "type": exc_type.__name__,
                "message": str(exc),
                "usage": False,
                "run": rid,
                "phase": None,
                "step": None,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "by": "asrlab watch",
                "traceback": "".join(traceback.format_exception(exc_type, exc, tb)),
            }
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(record, f)
            os.replace(tmp, path)  # whole or absent: the watcher polls this folder
            elastic = os.environ.get("TORCHELASTIC_ERROR_FILE")
            if elastic and not os.path.exists(elastic):
                # as torch's @record writes it: torchrun's summary shows the exception, and its root cause
                # is the rank whose error came first, by this time
                with open(elastic, "w") as f:
                    json.dump(
                        {
                            "message": {
                                "message": f"{exc_type.__name__}: {exc}",
                                "extraInfo": {
                                    "py_callstack": record["traceback"],
                                    "timestamp": str(int(record["time"])),
                                },
                            }
                        },
                        f,
                    )
    except Exception:  # recording must never hide the error itself
        pass
    _previous(exc_type, exc, tb)


def _dumps_on_signal():
    folder, sig = os.environ.get("ASRLAB_WATCH_DIR"), os.environ.get("ASRLAB_WATCH_SIGNAL")
    if not folder or not sig:
        return
    import atexit
    import faulthandler

    held = []  # the open dump file: closed when replaced and at exit, so the job is left no handle to warn about

    def register():
        path = os.path.join(folder, f"{os.getpid()}.txt")
        f = open(path, "a")  # appends: the watcher empties it before each dump
        faulthandler.register(int(sig), file=f, all_threads=True, chain=False)
        close()  # a forked worker's copy of its parent's file, now that the handler writes to its own
        held.append(f)

    def close():
        while held:
            held.pop().close()

    def in_child():
        try:
            register()
        except (OSError, ValueError, RuntimeError):
            close()

    def at_exit():
        if held:
            faulthandler.unregister(int(sig))
            close()

    try:
        os.makedirs(folder, exist_ok=True)
        register()
        os.register_at_fork(after_in_child=in_child)  # a forked worker dumps to a file of its own
        atexit.register(at_exit)
    except (OSError, ValueError, RuntimeError):
        pass


def _rank_from_group():
    """Where no launcher named this process's rank (torch.multiprocessing.spawn, a forked rank): once its launcher
    sets RANK in it or its process group is made, its rank and world, recorded for the watch; then the same thread
    serves the flight recorder."""
    exp = os.environ.get("ASRLAB_WATCH_EXP")
    if not exp or _rank() is not None:
        return  # (a DataLoader worker spawned looks on too, and never finds a group)
    if os.getpid() == _PID:
        os.register_at_fork(after_in_child=_forked)
    import threading
    import time

    def write(**record):
        import json

        folder = os.path.join(exp, "watch", "ranks")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{os.getpid()}.json")
        with open(f"{path}.tmp", "w") as f:
            json.dump({**record, "time": time.time()}, f)
        os.replace(f"{path}.tmp", path)

    def look():
        spawning = False
        while True:
            time.sleep(0.5)
            d = sys.modules.get("torch.distributed")
            # a forked rank's launcher sets RANK in it after the fork; a process that sets RANK in its own environment
            # sets it for the ranks it starts (a script of one's own), and is a rank only where its group says so
            said = _rank() if os.getpid() != _PID else _GROUP[0]
            try:
                if said is not None:
                    rank, world = said, int(os.environ.get("WORLD_SIZE") or 1)  # a job of one rank makes no group
                elif d is not None and d.is_available() and d.is_initialized():
                    rank, world = d.get_rank(), d.get_world_size()
                else:
                    if not spawning and "torch.multiprocessing" in sys.modules and _in_spawn(threading.main_thread()):
                        spawning = True  # the ranks' launcher: its children are the ranks, still starting or not
                        write(launcher="torch.multiprocessing.spawn")
                    continue
            except Exception:  # a half-imported torch: look again
                continue
            write(rank=rank, world=world)
            _GROUP[0] = rank
            # this thread serves the flight recorder from now on: a thread a forked process started in its
            # fork hook, once ended, has Python's threading complain of it
            _serve_flight(exp, rank)

    threading.Thread(target=look, name="asrlab-watch-rank", daemon=True).start()


def _in_spawn(thread) -> bool:
    """Whether ``thread`` is in torch.multiprocessing.spawn, starting its processes or joining them (not a spawned
    rank, whose stack starts in that module's ``_wrap``)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("start_processes", "join") and code.co_filename.endswith("multiprocessing/spawn.py"):
            return True
        frame = frame.f_back
    return False


def _forked():
    """A process forked before its parent made a process group may make one of its own (the ranks a forkserver or
    the fork start method starts: their launcher's RANK is set after the fork, where the watch cannot read it);
    one forked after is a worker of its parent's rank."""
    if not _group_made():  # (a half-imported torch: the child looks on)
        _rank_from_group()


def _flight_on_request():
    exp, rank = os.environ.get("ASRLAB_WATCH_EXP"), _rank()
    if not exp or rank is None:
        return
    import threading

    threading.Thread(target=_serve_flight, args=(exp, rank), name="asrlab-watch-flight", daemon=True).start()


def _serve_flight(exp, rank):
    """Forever: the flight recorder's record of this rank's collectives, each time the watch asks for it."""
    import time

    request, done = os.path.join(exp, "flight", "request"), 0.0
    while True:
        time.sleep(0.5)
        try:
            asked = os.stat(request).st_mtime
        except OSError:
            continue
        if asked <= done:
            continue
        done = asked
        torch = sys.modules.get("torch")
        try:
            if torch is None or not torch.distributed.is_initialized():
                continue
            from torch._C._distributed_c10d import _dump_fr_trace_json

            data = _dump_fr_trace_json(True, True)
            path = os.path.join(exp, "flight", f"rank{rank}.json")
            with open(f"{path}.{os.getpid()}.tmp", "wb") as f:
                f.write(data if isinstance(data, bytes) else data.encode())
            os.replace(f"{path}.{os.getpid()}.tmp", path)
        except Exception:  # a report's extra: never the job's problem
            pass


def _record_process_errors():
    """A rank a script started as a ``multiprocessing.Process``: multiprocessing catches its target's exception
    (prints it, exits 1), so ``sys.excepthook`` never sees it; recorded here, on its way out of ``run``."""
    import multiprocessing.process

    run = multiprocessing.process.BaseProcess.run

    def recorded(self):
        try:
            return run(self)
        except Exception:
            _record(*sys.exc_info(), _previous=lambda *a: None)
            raise

    multiprocessing.process.BaseProcess.run = recorded


def _whole_lines():
    """Each line written whole: unbuffered (PYTHONUNBUFFERED, which the watch sets for the job's output to come
    through its pipe as it is printed, and many images set too), ``print`` writes its text and its newline apart,
    and two ranks' lines printed at once glue together, which no reader of the log can take apart."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except Exception:  # not a text stream of its own kind: left as it is
            pass


if os.environ.get("ASRLAB_WATCH_LINES"):
    _whole_lines()
if os.environ.get("ASRLAB_WATCH_EXP"):
    sys.excepthook = _record
    _dumps_on_signal()
    _flight_on_request()
    _rank_from_group()
    if _spawned():
        _record_process_errors()

# the job's own sitecustomize, if it had one, shadowed by this one
_here = os.path.dirname(os.path.abspath(__file__))
_path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
for _p in _path:
    _own = os.path.join(_p or ".", "sitecustomize.py")
    if os.path.isfile(_own):
        import importlib.util

        _spec = importlib.util.spec_from_file_location("_job_sitecustomize", _own)
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break

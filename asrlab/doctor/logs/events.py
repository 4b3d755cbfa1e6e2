"""The lines of a log that say something went wrong (or right), in any toolkit's words (tracebacks, exit codes,
timeouts, out-of-memory, loss scale, resumes), kept by :class:`Events` as event dicts (``kind``, ``rank``, ...)."""

from __future__ import annotations

from ...lab.stall.verdict import culprit_of
from .words import (
    AGENT_FAIL,
    AGENT_TERM,
    ASRLAB,
    ASRLAB_RANK,
    BAR_GLUED_EXC,
    BARE_EXC,
    BASH_KILLED,
    CONNECT,
    CUDA_ERROR,
    ENDED_ITSELF,
    EXC_LINE,
)
from .words import FATAL, GLOO, HANGUP, HYDRA, INTERRUPTED, ITEM, JAX_BARRIER, LOADER_TIMEOUT, LUA_ERROR, MPIRUN
from .words import NAN_VALUE, NOT_SUSPECT, RECOVERED, RENDEZVOUS, RESUME, SCALE, SCHEDULER_STOP, SHELL_SIGNAL
from .words import SHELL_SIGNALS, SHELL_STOP, SRUN_TASK, STATUS, STORE, STORE_KEY, SUSPECT, TERMINATE, TF_COORDINATOR
from .words import UNHANDLED, WATCH_SAID, WATCH_VERDICT, death_signal, exit_signal, nonfinite_row, nonfinite_said
from .words import SCALE_VALUE, SIGNAL_EXIT, WARNED, norm_only, shell_pid, signame
from .counters import counter_of
from .toolkits import num
from .nccl import nccl_events
from .summary import TorchrunSummary
from .tracebacks import CHILD_RANK, COLLECTIVE_TIMEOUT, SPAWNED, CONSEQUENCE, FRAME, MONITORED, NONFINITE_EXC
from .tracebacks import MONITORED_PEER, OOM, ORIGINAL, RICH_FRAME, WORKER, exception_kind, Traceback


KEEP = 2000  # events kept of each kind (a log can warn at every step): their count is kept in full


class Events:
    """Failure lines of a log, fed a line at a time: :meth:`feed` (file, rank, time, text)."""

    def __init__(self):
        self.events: list[dict] = []
        self._tb: dict[tuple, Traceback] = {}
        self._summary = TorchrunSummary()  # torchrun's failure block being read
        self.counts: dict[str, int] = {}
        self._last: dict[str, dict] = {}
        self.order = 0  # the line's place in the whole read, set by the reader before each feed
        # what the reader says of that line's clock, put on its events: "stamped" (a clock of its own, or the last
        # one above it), "year_guessed" (glog's month and day alone), "date_guessed" (a time of day alone); a
        # traceback's, its first line's
        self.stamp: dict = {}
        self.source = ""
        self._terminate: tuple | None = None  # a C++ "terminate called" line whose what() comes next
        self._spawned: int | None = None  # torch.multiprocessing said whose traceback comes next
        self._alias: dict[tuple, tuple] = {}  # (file, None) -> (file, rank) while a spawned rank's traceback runs
        self._item: dict = {}  # rank -> the data item a toolkit said it was reading when an error came
        self._ignored = None  # the (file, rank) whose next traceback Python printed and ignored
        self._stalled: str | None = None  # the file whose last line was Horovod's "Stalled ranks:"
        self._place: dict[str, tuple] = {}  # file -> the last step a line of it named ("batch 90"), that line's order
        # file -> (the child a launcher quoted, lines since): its status on the next line, or after the command wrapped
        self._quoted: dict[str, tuple] = {}
        # file -> (order, rank, time, line, type): an exception a hook or a logger named, its own line yet to come
        self._unhandled: dict[str, tuple] = {}
        self._nccl: dict = {}  # (host, pid) -> NCCL's last WARN there, True once its error was said
        self._empty_mean: set[str] = set()  # the files where numpy warned of a mean of nothing: its nan is no failure
        self._scaled: set[str] = set()  # the files that print a loss scale's value: fp16 with a scaler that skips

    def _add(self, kind: str, rank, time, text: str, **more) -> None:
        e = dict(kind=kind, rank=rank, time=time, order=self.order, file=self.source, text=text.strip()[:500])
        e.update(self.stamp)
        e.update(self._where(self.source), **more)
        if kind in ("exception", "oom") and not more.get("cut"):  # the pending exception's own line, however read
            self._unhandled.pop(self.source, None)
        self._keep(e)

    def _keep(self, e: dict) -> None:
        self.counts[e["kind"]] = self.counts.get(e["kind"], 0) + 1
        if self.counts[e["kind"]] <= KEEP:  # memory bounded whatever the log: the first ones, then only the last
            self.events.append(e)
        else:
            self._last[e["kind"]] = e

    def _end_tb(self, key) -> None:
        tb = self._tb.pop(key, None)
        self._alias = {k: v for k, v in self._alias.items() if v != key}
        if tb is None:
            return
        outer, self.stamp = self.stamp, tb.stamp  # what it says is of its first line's clock
        self._ended(tb)
        self.stamp = outer

    def _ended(self, tb: Traceback) -> None:
        e = {**tb.event(), **tb.stamp}
        if not tb.ignored:  # (ignored: an error Python printed and went on from)
            self.source = tb.source  # a traceback the next file's first line ended: its events are its own file's
            self._unhandled.pop(tb.source, None)
        # Ctrl-C, or SIGINT from outside (also where it interrupted an ignored error, a __del__)
        if e.get("type") in ("KeyboardInterrupt", "InterruptException"):
            self._add("stop", e["rank"], e["time"], e["text"], signal="SIGINT")
        if tb.ignored:
            return
        e["place"], e["placed_at"] = tb.place, tb.placed_at  # the last step a line named before it began
        if e.get("spawned_rank") is not None:  # the spawned process's own traceback follows: its rank
            self._spawned = e["spawned_rank"]
        item = self._item.pop(e.get("rank"), None)
        if item and e["kind"] in ("exception", "consequence") and (not e["message"] or "str() failed" in e["message"]):
            # the exception could not say itself; the line before it named the item being read
            e.update(message=item["text"][:300], text=f"{e['type']}: {item['text']}"[:500], item=item["id"])
        line, self.order = self.order, e["order"]  # what it says is said where it began; then the line that ended it
        if e["kind"] == "consequence":
            self._consequence(e["rank"], e["time"], e["text"])
        # a signal's status is the child's death by it; the child's rank, where its command names it
        if (sig := exit_signal(code := e.pop("child_code", None))) is not None:
            who = e.get("culprit_rank", e["rank"])
            self._add("exit", who, e["time"], e["text"], exitcode=code, signal=sig, root=False, source="status")
            e["kind"] = "consequence"
        self._keep(e)
        self.order = line

    def _stalled_rank(self, rank: int) -> None:
        """A rank Horovod's stall inspector lists as one that never submitted the tensors the others wait with."""
        t = next((e for e in reversed(self.events) if e["kind"] == "timeout" and e.get("source") == "horovod"), None)
        if t is not None:
            t.setdefault("missing", []).append(rank)
            if len(t["missing"]) == 1:
                t.update(behind=rank, basis="never submitted the tensors")
            else:
                t.pop("behind", None)

    def _consequence(self, rank, time, text: str) -> None:
        """What an exception another failure caused says besides: a wait that gave up (the hang's evidence), a signal."""
        if COLLECTIVE_TIMEOUT.search(text):
            op, ms, source = None, None, "traceback"
            if g := GLOO.search(text):
                op, ms, source = g[2], int(g[1]), "gloo"
            elif g := STORE_KEY.search(text):
                op, ms = f"a wait for the store's key {g[1]}", int(g[2])
            elif g := JAX_BARRIER.search(text):
                op = f"JAX's barrier {g[1]} (its tasks that never came are listed below it)"
            self._add("timeout", rank, time, text, op=op, timeout_ms=ms, source=source)
        if sig := death_signal(text):
            self._add("stop", rank, time, text, signal=sig)

    def feed(self, source: str, rank: int | None, time: float | None, text: str, bar: int | None = None) -> None:
        """Read one line of ``source``; ``bar``: the count of a progress bar on it (glued to what follows)."""
        self.source = source
        if bar is not None:
            self._place[source] = (bar, self.order)
        if self._stalled == source and rank is not None and text.lstrip().startswith("["):
            self._stalled_rank(rank)  # Horovod's "2: [tensor, ...]" under its "Stalled ranks:" ("2: " a rank mark)
            return
        self._stalled = source if "Stalled ranks:" in text and text.strip() == "Stalled ranks:" else None
        if text.startswith("^C") and len(text) > 2:  # the terminal's echo of Ctrl-C, the traceback glued after it
            self._add("stop", rank, time, text, signal="SIGINT", by="terminal")
            text = text[2:]
        key = self._alias.get((source, rank), (source, rank))  # unmarked lines of a spawned rank's traceback
        tb = self._tb.get(key)
        if tb is None:  # the exception line of the one traceback waiting for it
            waiting = [k for k, t in self._tb.items() if k[0] == source and t.awaits(text, rank is None)]
            if len(waiting) == 1:
                key, tb = waiting[0], self._tb[waiting[0]]
        if tb is not None:
            if tb.feed(text):
                return
            if text.startswith("Message: ") and tb.sections[-1]["exc"] is None:
                tb.ignored = True  # the logging module's call stack of a record it could not write, then the record
            self._end_tb(key)
        # torchrun's summary, or a line that may open one (its feed says)
        if self._summary.kind is not None or "Root Cause" in text or "(local_rank:" in text or "Failures:" in text:
            used = self._summary.feed(text)
            self._exits()
            if used:
                return
        if text.startswith("Exception ignored in"):  # Python's word for an error it printed and went on from
            self._ignored = key
            return
        if "Traceback (most recent call last)" in text and not text.strip().startswith(ORIGINAL):
            if self._ignored == key:  # the traceback of an ignored exception: not a failure
                self._ignored = None
                self._tb[key] = Traceback(
                    rank, time, self.order, source, stamp=self.stamp, ignored=True, **self._where(source)
                )
                return
            if rank is None and self._spawned is not None:  # the spawned process's traceback is that rank's
                rank, key = self._spawned, (source, self._spawned)
                self._alias[(source, None)] = key
            self._spawned = None
            # one a logger wrote at warning level ("[WARNING] Traceback ...": dynamo's fallback to eager) was gone on from
            warned = WARNED.search(text[: text.find("Traceback (most recent")]) is not None
            self._tb[key] = Traceback(
                rank, time, self.order, source, stamp=self.stamp, head=text, ignored=warned, **self._where(source)
            )
            return
        if FRAME.match(text) or RICH_FRAME.match(text.lstrip()):  # a traceback whose first line the log does not have
            self._tb[key] = tb = Traceback(rank, time, self.order, source, stamp=self.stamp, **self._where(source))
            tb.feed(text)
            return
        self._line(rank, time, text)

    def finish(self) -> None:
        for key in list(self._tb):
            self._end_tb(key)
        self._summary.close()
        self._exits()
        # a C++ terminate aborts its process: where a launcher said a process ended by SIGABRT, that says it
        exits = [e for e in self.events if e["kind"] == "exit"]
        aborted = any(e.get("exitcode") == -6 or e.get("signal") == "SIGABRT" for e in exits)
        for self.source, (self.order, rank, time, text, typ) in self._unhandled.items():  # its own line never came
            if not (aborted and text.startswith("terminate called")):
                self._add("exception", rank, time, text, type=typ, message="", where=None, cut=True)
        self.events.extend(self._last.values())
        for e in self.events:  # a gradient norm alone not finite beside a loss scale: a step the scaler skipped
            if e["kind"] == "nonfinite_line" and e.get("norm") and e["file"] in self._scaled:
                e["kind"] = "norm_skip"
                self.counts["nonfinite_line"] -= 1
                if not self.counts["nonfinite_line"]:
                    del self.counts["nonfinite_line"]
                self.counts["norm_skip"] = self.counts.get("norm_skip", 0) + 1

    def _where(self, source: str) -> dict:
        """The last step a line of ``source`` named, and the order of that line."""
        return dict(zip(("place", "placed_at"), self._place.get(source, (None, None))))

    def _exits(self) -> None:
        """The ranks' records of torchrun's summary read to their end, as exit events."""
        for rank, time, said, more in self._summary.take():
            self._add("exit", rank, time, said, **more)

    def _line(self, rank, time, text: str) -> None:
        n = counter_of(text, named=True) if any(c.isdigit() for c in text) else None
        if n is not None:
            self._place[self.source] = (n, self.order)
        quoted, wrapped = self._quoted.pop(self.source, (None, 0))
        if quoted is not None and wrapped < 8 and "return code" not in text and not text.startswith("["):
            self._quoted[self.source] = (quoted, wrapped + 1)  # the command wrapped onto this line: its status to come
        if "sigkill_handler" in text and (c := CHILD_RANK.search(text)):  # DeepSpeed's launcher quotes the child
            self._quoted[self.source] = (int(c[1]), 0)
        if text.startswith(("terminate called after throwing an instance of", "terminate called without an active")):
            # a C++ exception (or std::terminate with none: a thread still joinable, a pure virtual call) aborts it
            m = TERMINATE.search(text)
            self._terminate = (rank, time, m.group(1) if m else None)
            if m and OOM.search(m.group(1)):  # c10::OutOfMemoryError: said by its type, whatever follows
                self._add("oom", rank, time, text, type=m.group(1))
            else:  # an uncaught C++ exception, its what() yet to come (where the log is cut, the failure)
                self._unhandled.setdefault(self.source, (self.order, rank, time, text, m.group(1) if m else None))
            return
        if "checkTimeout" in text and text.startswith("frame #") and not self.counts.get("timeout"):
            self._add("timeout", rank, time, text, seq=None, op=None, timeout_ms=None, source="nccl")  # its watchdog's
            return
        if ("asrlab watch: " in text or "STALL: " in text) and (m := WATCH_SAID.search(text)):
            if m.group(3):  # a signal to the watch, which ended the job
                self._add("stop", rank, time, text, signal=m.group(3), by="asrlab watch")
            elif m.group(5):
                self._add("watch_passed", rank, time, text)
            else:  # the stall the watch found from the ranks' stacks: its verdict names the rank
                said = m.group(1) or m.group(2) or m.group(4)
                self._add("watch_stall", culprit_of(said), time, text, said=said)
            return
        if text.startswith("asrlab watch: ") and (m := WATCH_VERDICT.match(text)):
            self._add("watch_verdict", culprit_of(m[2]), time, text, said=m[2], said_verdict=m[1])
            return
        mpirun = "rank" in text or "Primary job" in text or "uncaught" in text or "Process name" in text
        if mpirun and (m := MPIRUN.search(text)):
            if m.group(1):  # mpirun's word on a rank a signal ended
                sig = signame(m.group(2))
                self._add("exit", int(m.group(1)), time, text, exitcode=-int(m.group(2)), signal=sig, root=True)
            elif m.group(4) or m.group(5):  # mpirun's (Horovod's) first process to fail, its exit code on the next line
                self._add("exit", int(m.group(4) or m.group(5)), time, text, exitcode=None, root=True, source="mpirun")
            else:  # that something failed, not what: the failure where nothing else says
                self._add("consequence", rank, time, text, type=None, message=(m.group(3) or text.strip())[:300])
            return
        # a logger's word on Ctrl-C (Lightning's, a loop's own, Intel Fortran's runtime)
        if ("eyboard" in text or "control-C" in text or "InterruptEx" in text) and INTERRUPTED.search(text):
            self._add("stop", rank, time, text, signal="SIGINT")
            return
        if text.startswith("Connection ") and HANGUP.match(text):  # the terminal's session ended under the job
            self._add("stop", rank, time, text, signal="SIGHUP", by="terminal")
            return
        if self._terminate is not None and "what():" in text:  # its message, on the next line, read on below too
            r, t, kind = self._terminate
            self._terminate = None
            self._unhandled.pop(self.source, None)
            said = text.split("what():", 1)[1].strip()
            if not COLLECTIVE_TIMEOUT.search(said):  # a watchdog's timeout is read from this line below, in full
                what = "oom" if OOM.search(f"{kind} {said}") else "abort"  # what it was, in its own words
                self._add(what, rank if r is None else r, time if t is None else t, text, type=kind, message=said[:300])
        if "terminated with" in text and (m := SPAWNED.search(text)):
            # torch.multiprocessing's word on a spawned rank, on a line of its own (a paste that starts there)
            if m.group(0).endswith("following error"):
                self._spawned = int(m.group(1))
            code = int(m.group(3)) if m.group(3) else 1 if self._spawned is not None else None
            self._add("exit", int(m.group(1)), time, text, exitcode=code, signal=m.group(2) or exit_signal(code),
                      root=True, source="torch.multiprocessing")  # fmt: skip
            return
        signalled = "death signal" in text or "ot signal" in text or "eceived" in text or "SIG" in text
        if signalled and (sig := death_signal(text)):
            self._add("stop", rank, time, text, signal=sig)
            return
        if "Error happened with" in text and (m := ITEM.search(text)):
            self._item[rank] = {"id": m.group(2), "text": text.split("Error happened with", 1)[1].strip()}
        if ("atchdog" in text or "NCCL" in text or " ranks" in text) and (said := nccl_events(text, self._nccl)):
            for kind, words, more in said:
                self._add(kind, more.pop("rank", rank), time, words if words is not None else text, **more)
            if self._terminate is not None and any(k == "timeout" for k, _, _ in said):
                self._terminate = None  # what the "terminate called" line above announced: this timeout
                self._unhandled.pop(self.source, None)
            return
        if "timed out after" in text and (m := LOADER_TIMEOUT.search(text)):  # a data worker never gave its batch
            self._add("timeout", rank, time, text, op="data loading", timeout_ms=int(m[1]) * 1000, source="data loader")
            return
        if "while trying to connect" in text and (m := CONNECT.search(text)):
            self._add("timeout", rank, time, text, op="connect", timeout_ms=int(m.group(1)) * 1000, source="store")
            return
        if "Timed out waiting" in text and (m := GLOO.search(text)):
            self._add("timeout", rank, time, text, timeout_ms=int(m.group(1)), op=m.group(2), source="gloo")
            return
        if "monitoredBarrier" in text:
            if m := MONITORED.search(text):
                self._add("timeout", rank, time, text, op="monitored_barrier", timeout_ms=int(m.group(2)),
                          behind=int(m.group(1)), source="monitored barrier")  # fmt: skip
                return
            if m := MONITORED_PEER.search(text):
                self._add("timeout", int(m.group(1)), time, text, op="monitored_barrier", behind=int(m.group(2)),
                          source="monitored barrier")  # fmt: skip
                return
        if "ompleted store-based barrier" in text:  # every rank joined: the waits before it were passed
            self._add("barrier_done", rank, time, text)
            return
        # still waiting ("Waiting in ...") or timed out: a hang at start-up if no step follows
        if "store based barrier" in text and (m := STORE.search(text)):
            self._add("timeout", int(m.group(1)), time, text, op="store_barrier", source="store",
                      world=int(m.group(2)), joined=int(m.group(3)), waiting="Waiting" in text)  # fmt: skip
            return
        if "exitcode" in text and (m := AGENT_FAIL.search(text)):
            code = int(m.group(1))
            self._add("exit", int(m.group(2)), time, text, exitcode=code, local=True, source="torchrun", root=False,
                      signal=exit_signal(code), pid=int(m.group(3)))  # fmt: skip
            return
        if ("closing signal" in text or "via signal" in text) and (m := AGENT_TERM.search(text)):
            self._add("agent_stop", rank, time, text, pid=int(m[1] or m[2]), signal=m[3])
            if m[3] in ("SIGHUP", "SIGINT") and not self.counts.get("stop"):  # the signal torchrun's agent got,
                self._add("stop", rank, time, text, signal=m[3], by="launcher")  # passed on (a failure's: SIGTERM)
            else:  # a job that ended abnormally: where no line says why, no all-clear
                self._add("suspect", rank, time, text)
            return
        if ("DataLoader worker" in text or "encountered in worker" in text) and (m := WORKER.search(text)):
            self._add("worker_killed", rank, time, text, signal=(m[2] or m[3] or "").strip().capitalize() or None)
            return
        # the shell's word for a SIGKILLed child (in its locale: not ASCII), by its pid: a rank, where heartbeats know it
        # (DeepSpeed's sigkill_handler too: its kill of the ranks follows)
        killed = "Kill" in text or "(killed)" in text or not text.isascii()
        if killed and BASH_KILLED.search(text.strip()):
            self._add("exit", rank, time, text, exitcode=-9, signal="SIGKILL", root=False, source="shell",
                      pid=shell_pid(text), consequence="subprocess" in text)  # fmt: skip
            return
        if m := SHELL_SIGNAL.search(text.strip()):
            t = SRUN_TASK.search(text)  # "srun: error: host: task 0: Segmentation fault": that task's rank
            who = int(t[1]) if t else rank
            self._add("exit", who, time, text, exitcode=None, signal=SHELL_SIGNALS[m.group(m.lastindex)], root=False,
                      source="shell", pid=shell_pid(text))  # fmt: skip
            return
        if (" with " in text or " by " in text) and (m := SIGNAL_EXIT.search(text)):
            sig = signame(m[2] or m[3])
            who = int(m[1]) if m[1] else rank
            self._add("exit", who, time, text, exitcode=None, signal=sig, root=False, source="status")
            return
        if ("Terminated" in text or "^C" in text or "Hangup" in text) and (m := SHELL_STOP.search(text)):
            sig = {"Terminated": "SIGTERM", "Hangup": "SIGHUP"}.get(m.group(1), "SIGINT")
            self._add("stop", rank, time, text, signal=sig, by="shell")
            return
        if "crash.pt" in text and "heckpoint" in text:  # fairseq saves crash.pt from its handler of an exception
            self._add("exception", rank, time, text, type=None, message="fairseq saved crash.pt", where=None, bare=True)
            return
        if ("CANCELLED AT" in text or text.startswith("TERM_")) and (m := SCHEDULER_STOP.search(text)):
            # srun's, after a failed task: a consequence
            ended = not m.group(1) and "STEP" in text and any(e["kind"] == "exit" for e in self.events)
            by = "time limit" if m.group(2) else "preemption" if m.group(3) else (m.group(1) or "cancel").lower()
            self._add("stop", rank, time, text, signal="SIGTERM", by=by, consequence=ended or None)
            return
        if m := STATUS.search(text):
            said = m[1] or m[2] or m[4] or m[5] or m[7] or m[8] or m[10] or m[11] or m[13] or m[14] or m[15]
            code = int(said) if said else 1
            code = 128 - code if 128 < code <= 128 + 64 else code  # a shell's 128+N: signal N
            if code != 0:  # by the rank where the line names it: Paddle's, DeepSpeed's --local_rank, srun's task
                t = SRUN_TASK.search(text) or CHILD_RANK.search(text)
                named = m[3] or m[6] or m[9] or m[12] or (t and t[1]) or quoted
                who = int(named) if named else rank
                # below -64: Windows' status (0xC0000409 a stack overrun), no signal, but for its SIGSEGV (0xC0000005)
                # wandb's word on its script's exit: the failure only where no line of the job's own says more
                self._add("exit", who, time, text, exitcode=code, root=False, source="status", signal=exit_signal(code),
                          **({"consequence": True} if m[15] else {}))  # fmt: skip
                return
        if "failed at step" in text and (m := ASRLAB_RANK.search(text)):
            self._add("exception", int(m.group(1)), time, text, type=m.group(3), message=m.group(4)[:300], where=None)
            return
        if text.startswith("asrlab: error:"):
            m = ASRLAB.match(text)
            self._add("exception", int(m.group(1)) if m.group(1) else rank, time, text, type=None,
                      message=m.group(2)[:300], where=None)  # fmt: skip
            return
        if text.rstrip().endswith("Exception during training:"):  # detectron2's train loop, its traceback to come
            self._unhandled.setdefault(self.source, (self.order, rank, time, text, None))
            return
        if text.startswith("Unhandled exc") and (m := UNHANDLED.match(text)):
            self._unhandled.setdefault(self.source, (self.order, rank, time, text, m[1]))
            return
        if "skipping batch" in text and RECOVERED.search(text):
            # gone on from by design: a failure only where training did not go on after it
            last = self.events[-1] if self.events else None
            if last and last["kind"] == "oom" and last["file"] == self.source:
                last["recoverable"] = True  # the allocator's word on the batch it then skipped
            self._add("oom", rank, time, text, recoverable=True)
            return
        if OOM.search(text) and not text.lstrip().startswith(("File ", "warnings.warn")):
            self._add("oom", rank, time, text)
            return
        if ".lua:" in text and (m := LUA_ERROR.search(text)):
            self._add("exception", rank, time, text, type="Lua error", message=m[1][:300], where=None, bare=True)
            return
        if "xecuting job" in text and HYDRA.search(text.strip()):  # Hydra's line before the job's exception
            self._unhandled.setdefault(self.source, (self.order, rank, time, text, None))
            return
        if "cale" in text and SCALE_VALUE.search(text):
            self._scaled.add(self.source)
        if said := nonfinite_said(text):
            self._add("nonfinite_line", rank, time, text, said=said, **({"norm": True} if norm_only(text) else {}))
            return
        if row := nonfinite_row(text):
            place = None if row[1] is None else {"step": row[1], "epoch": None, "batch": None}
            self._add("nonfinite_line", rank, time, text, said=row[0], record=place)
            return
        if ("] " in text or "ABORT" in text) and (m := FATAL.search(text.strip())):
            who = rank if m[2] is None else int(m[2]) if m[2].isdigit() else None  # Paddle's: one rank, or several
            kind = "nonfinite_error" if NONFINITE_EXC.search(m[1] or "") else "exception"  # a CHECK on the loss
            self._add(kind, who, time, text, type=None if m[2] else "FATAL (glog)",
                      message=(m[1] or text.strip())[:300], where=None, bare=True)  # fmt: skip
            return
        if "to Coordinator" in text and (m := TF_COORDINATOR.search(text)):  # TF 1.x's supervisor, its step's error
            kind = exception_kind(m[2])
            self._add(kind, rank, time, text, type=m[1], message=m[2][:300], where=None, bare=True)
            return
        errs = "Error" in text or "Exception" in text or "ERROR" in text or "ASSERT" in text
        if errs and (m := BARE_EXC.match(text)):  # a traceback's last line, its frames not in the log
            self._add(exception_kind(text), rank, time, text, type=m[1], message="", where=None, bare=True)
            return
        barred = self._place.get(self.source, (None, None))[1] == self.order  # a progress bar on this very line
        if errs and ((m := EXC_LINE.match(text.strip())) or barred and (m := BAR_GLUED_EXC.search(text))):
            # an exception's line with no traceback before it (a logger's one-line error, a trimmed paste)
            text = text[m.start() :] if m.re is BAR_GLUED_EXC else text  # the error, not the bar it was glued to
            self._unhandled.pop(self.source, None)
            kind = "consequence" if CONSEQUENCE.search(text) else exception_kind(text)
            typ, msg = (m.group(1), m.group(2)) if m.group(1) else (f"ERROR {m.group(3)}", m.group(4))
            self._add(kind, rank, time, text, type=typ, message=msg[:300], where=None, bare=True)
            if kind == "consequence":
                self._consequence(rank, time, text)
            return
        cuda = "CUDA error" in text or "side assert trig" in text or "cuda runtime error" in text
        if cuda and (m := CUDA_ERROR.search(text)):
            said = m[1] or m[2] or m[3] or m[4]
            self._add("exception", rank, time, text, type="CUDA error", message=said, where=None, bare=True)
            return
        if text.startswith("Command terminated by signal ") and text[29:].strip().isdigit():  # GNU time's word
            n = int(text[29:])
            self._add("exit", rank, time, text, exitcode=-n, signal=signame(str(n)), root=True, source="time")
            return
        ended = "Aborted from" in text or "!!!!" in text or " died " in text or "ERROR in" in text
        if ended and (m := ENDED_ITSELF.search(text)):
            typ, who = next(g for g in m.groups() if g and not g.isdigit()), int(m[4]) if m[4] else rank
            self._add("exception", who, time, text, type=typ, message=text.strip()[:300], where=None, bare=True)
            return
        for pattern, who in SCALE:
            if m := pattern.search(text):
                fatal = who == "icefall" and "too small" in text.lower()
                to, grad = (None, m.group(1)) if who in ("espnet", "asrlab") else (num(m.groups()[-1] or ""), None)
                self._add("scale", rank, time, text, toolkit=who, fatal=fatal, to=to, grad=grad)
                return
        if "Traceback" not in text and (m := RESUME.search(text)):
            self._add("resume", rank, time, text, path=m.group(1))
            return
        # TensorFlow's heartbeat on workers that stopped answering, at INFO level; a notebook kernel's word, at WARNING
        # level, that its runner (papermill, a Jupyter server) was gone before the notebook ended: ended from outside
        if "lame workers found" in text or "Parent appears to have exited, shutting down" in text:
            self._add("suspect", rank, time, text)
            return
        suspect = SUSPECT.search(text) or self.source not in self._empty_mean and NAN_VALUE.search(text)
        if RENDEZVOUS.search(text) and not NOT_SUSPECT.search(text):
            self._add("exception", rank, time, text, type="rendezvous", message=text.strip()[:300], where=None)
        elif suspect and not NOT_SUSPECT.search(text):
            self._add("suspect", rank, time, text)
        elif "Mean of empty slice" in text:
            self._empty_mean.add(self.source)


__all__ = ["Events"]

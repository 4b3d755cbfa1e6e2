"""A Python traceback in a log, fed a line at a time (:class:`Traceback`), and the line that raised as a person
would point at it (:func:`user_frame`): chains, a DataLoader worker's or a datapipe's wrapped exception, a cut traceback."""

from __future__ import annotations

import re

from ...lab.stall.classify import own_code
from .words import DIED, JAX_BARRIER, SOCKET_IN_USE, STATUS, STORE_KEY, exit_signal


TB = "Traceback (most recent call last):"
ORIGINAL = "Original Traceback (most recent call last):"
CHAIN = ("During handling of the above exception", "The above exception was the direct cause")

_FRAME = r'File "([^"]+)", line (\d+), in (\S+)'
FRAME = re.compile(rf"^\s*{_FRAME}")
# a frame of rich's boxed traceback (Lightning's, Typer's, kohya's): "│ /path/train.py:481 in <module>   │"
RICH_FRAME = re.compile(r"^[│┃]\s+(\S.*?\.py):(\d+) in (\S+)")
# "...    raise RuntimeError("Model diverged with loss = NaN.")RuntimeError: Model diverged with loss = NaN."
_GLUED_EXC = re.compile(r"\)((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): (.+)$")
_GLUED_FRAME = re.compile(_FRAME)

EXC = re.compile(
    r"^((?:[A-Za-z_][\w.]*)?(?:Error|Exception|Interrupt|Exit|Failure|Timeout|Warning|Halt|Killed)|"
    r"[A-Za-z_][\w]*\.[\w.]*[A-Z]\w*|AssertionError|KeyboardInterrupt|StopIteration)(?::\s?(.*))?$"
)

# a wait that gave up, in words both lists below hold: "Operation timed out!" is older torch's c10d's (a
# collective's work.wait()), STORE_KEY c10d's store's (a key a peer never wrote)
_GAVE_UP = (
    r"Watchdog caught collective operation timeout|Timeout at NCCL work|failed to pass monitoredBarrier|"
    r"client socket has timed out after \d+m?s while trying to connect|\bOperation timed out!|" + STORE_KEY.pattern
)
# a failure another failure causes: not the cause, whatever prints first
CONSEQUENCE = re.compile(
    rf"{_GAVE_UP}|Timed out waiting \d+ms|Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(?:abort|timeout)|failed to recv|SignalException|"
    r"got signal: (?:15|2|1)\b|KeyboardInterrupt|ChildFailedError|DistNetworkError|DistStoreError|Socket Timeout|"
    r"recvBytes|Some NCCL operations have failed or timed out|DistBackendError|store based barrier|"
    r"TCPStore.*(?:timeout|failed)|Detected mismatch between collectives|has already been aborted|"
    r"Horovod has been shut down|"
    rf"DEADLINE_EXCEEDED: {JAX_BARRIER.pattern}|"  # JAX's coordination service: tasks that never reached a barrier
    r"PapermillExecutionError|CellExecutionError",  # a notebook's runner on the cell's own error, printed after it
    re.I,
)

_OWN_SOCKET = re.compile(SOCKET_IN_USE)  # a DistNetworkError of its own port, not a peer's

# any wording of running out of memory: torch's, older torch's and the driver's ("cuda runtime error (2) : out of
# memory", "THCudaCheck FAIL ... out of memory"), cuDNN's and cuBLAS's, the host's (the kernel's OOM killer), XLA's;
# not an allocator's retry that says it is "not a failure" (TensorFlow's BFC allocator)
OOM = re.compile(
    r"(?<!avoid )(?<!prevent )(?<!reduce )(?<!avoid CUDA )\bout of memory\b(?!.*\bnot a failure)|OutOfMemoryError|OutOfMemory\b|"
    r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
    r"^MemoryError|Cannot allocate memory|oom-kill|oom_kill|std::bad_alloc|RESOURCE_EXHAUSTED|"
    r"Tried to allocate [\d.]+ [KMGT]i?B|ResourceExhausted|\bOOM when allocating|not enough memory|"
    r"[Aa]llocation (?:of [^,]{0,60})?failed|failed to allocate|low on resource: memory|"  # Kubernetes' eviction
    r"\bOOMKilled\b|^TERM_(?:MEMLIMIT|SWAP): job killed",  # a container's status; IBM LSF's memory or swap limit
    re.I,
)
# torch.multiprocessing's word on a spawned process that died: the rank and how ("process 1 terminated with
# signal SIGKILL", "process 0 terminated with exit code 1"), or that its traceback follows
SPAWNED = re.compile(r"[Pp]rocess (\d+) terminated with (?:signal (SIG\w+)|exit code (-?\d+)|the following error)")
# a collective, a barrier or the store that gave up waiting, in any backend's words
COLLECTIVE_TIMEOUT = re.compile(
    rf"{_GAVE_UP}|Timed out waiting (\d+)ms for (send|recv) operation|wait timeout after (\d+)ms|"
    r"(?:[Bb]arrier|[Ss]tore|[Ss]ocket)\w* [Tt]ime(?:d )?out|Timed out after \d+ seconds? waiting for clients"
)
NONFINITE_EXC = re.compile(
    r"(?:loss|grad\w*|gnorm)\b[^.]{0,40}?\b(?:nan|inf|infinite|NaN/inf)\b|"
    r"grad_scale is too small|[Ll]oss is (?:not finite|nan|inf)|non-?finite loss|"
    r"[Nn]a[Nn] (?:or Inf )?(?:found|detected) in|\b(?:found|detected) (?:a )?(?:nan|inf)\b|Function '\w+' returned nan|"
    r"Minimum loss scale reached|[Ll]oss is probably exploding|FloatingPointError|"  # fairseq's, numpy's
    r"\bTensor had (?:NaN|Inf) values|"  # TensorFlow's CheckNumerics
    r"\b(?:nan|inf) loss\b",  # a loop's own check: DDSP-SVC's "ValueError:  [x] nan loss"
    re.I,
)


def exception_kind(words: str) -> str:
    """What an exception's words make it: ``oom``, ``nonfinite_error`` (a check on the loss), else ``exception``."""
    return "oom" if OOM.search(words) else "nonfinite_error" if NONFINITE_EXC.search(words) else "exception"


MONITORED = re.compile(r"[Rr]ank (\d+) failed to pass monitoredBarrier in (\d+) ms")
MONITORED_PEER = re.compile(
    r"[Rr]ank (\d+) successfully reached monitoredBarrier, but received errors while waiting "
    r"for send/recv from rank (\d+)"
)
# the rank a launcher gave the child whose command it quotes ("Command '['python', 'train.py', '--local_rank=3']'")
CHILD_RANK = re.compile(r"--local[_-]rank(?:=|',\s*')(\d+)")
WORKER = re.compile(  # and the worker's own handler's word before it dies of that signal ("ERROR: Unexpected bus error
    # encountered in worker. This might be caused by insufficient shared memory (shm).")
    r"DataLoader worker \(pids?\)? ?\(?([\d, ]+)\)? (?:is killed by signal: ([^.]+)|exited unexpectedly)|"
    r"Unexpected (bus error|segmentation fault|floating-point exception) encountered in worker"
)


def user_frame(frames: list[tuple[str, int, str]]) -> list | None:
    """The line that raised, as a person would point at it: the innermost frame of the job's own code,
    else of a toolkit installed as a package (not torch), else the innermost."""
    own = [f for f in frames if own_code(f[0])]
    paths = [f[0].replace("\\", "/") for f in frames]
    toolkit = [f for f, p in zip(frames, paths) if "site-packages/" in p and "site-packages/torch/" not in p]
    return list((own or toolkit or frames)[-1]) if frames else None


WRAP_AT = 120  # a source line this long may go on, wrapped, on the next line at column 0
# lines that start something of their own, never the rest of an exception's message
_NOT_MESSAGE = re.compile(
    r"^(?:\[|#|Epoch|epoch|\d{4}-\d\d-\d\d|[EWIF]\d{4} \d\d:|Root Cause|Failures:|===|---|"
    r"rank\s*:|time\s*:|host\s*:|exitcode\s*:|error_file\s*:|traceback\s*:|\w+:\w+:|"
    r"WARNING|ERROR|INFO|DEBUG|Traceback|Exception (?:ignored in|in thread)|Process \w+-\d+:$|asrlab (?:watch|doctor)\b|"  # the watch's own closing lines
    r"(?:[Ss]teps?|[Ii]ter(?:ation)?) ?:? *\d|"  # the loop's next step line, printed after an exception it went on from
    r"(?:[Rr]ank|[Tt]ask|[Ww]orker|[Pp]rocess) \d+ (?:exited|died|terminated) with|"  # a launcher's word on the child
    r"\S+\.py:\d+: \w*Warning\b|"  # a warning printed after it
    r"This exception is thrown by __iter__ of)"  # a datapipe's note under its wrapped exception
)
# an exception's message that opens with the rank that raised it (Megatron's "Rank 3: found NaN in local grad norm")
OWN_RANK = re.compile(r"\[?[Rr]ank (\d+)\]?: ")
IPYTHON_HEAD = re.compile(r"^(\w+)\s{2,}Traceback \(most recent call last\)")


class Traceback:
    def __init__(self, rank, time, order=0, source="", ignored=False, place=None, head="", placed_at=None, stamp=None):
        self.rank, self.time, self.order, self.source, self.ignored = rank, time, order, source, ignored
        self.stamp = stamp or {}  # its first line's clock, as the reader said it (Events.stamp)
        self.place, self.placed_at = place, placed_at  # the last step a line named before it, and that line's order
        named = IPYTHON_HEAD.match(head.strip())  # IPython's traceback names its exception at its head
        # a terminal's echo of Ctrl-C glued before it ("^CTraceback ..."): the traceback of that interrupt
        self.named = named.group(1) if named else "KeyboardInterrupt" if "^CTraceback" in head else None
        self.sections: list[dict] = [{"frames": [], "exc": None, "message": [], "original": False}]
        # a loop's own tag before its head ("(JOB 2/2) !! Traceback ..."): on each of its lines, taken off (its clock's
        # and counters' digits may change from line to line)
        tag = head[: head.find(TB)] if TB in head and not self.named else ""
        parts = re.split(r"(\d+)", tag)
        self.tag = re.compile("".join(r"\d+" if x.isdigit() else re.escape(x) for x in parts)) if tag.strip() else None

    def awaits(self, text: str, unmarked: bool) -> bool:
        """Whether ``text`` is what this traceback waits for: the exception line after its frames (its message may
        name a rank), or, on a line without a rank's mark, its next frame (a logger marks only its first line)."""
        s = self.sections[-1]
        if s["exc"] is not None:
            return False
        if unmarked and (FRAME.match(text) or (s["frames"] and text[:1].isspace())):
            return True
        return bool(s["frames"]) and EXC.match(text.strip()) is not None

    def feed(self, text: str) -> bool:
        """Take a line; False when the line is not part of this traceback (and it has ended)."""
        s = self.sections[-1]
        if self.tag is not None and (m := self.tag.match(text)):
            text = text[m.end() :]
        stripped = text.strip()
        after_frame = s.pop("after_frame", False)
        if (original := stripped.endswith(ORIGINAL)) or stripped.startswith(CHAIN):  # a wrapped exception, or a chain's
            self.sections.append({"frames": [], "exc": None, "message": [], "original": original})
            return True
        if stripped == TB:  # its own head again, or a chained one's: else the next traceback's
            return (s["exc"] is None and not s["frames"]) or len(self.sections) > 1
        if stripped[:1] in ("│", "╭", "╰", "┃", "┏", "┗") and s["exc"] is None:  # rich's boxed traceback
            s["boxed"] = True
            if m := RICH_FRAME.match(stripped):
                s["frames"].append((m.group(1), int(m.group(2)), m.group(3)))
            return True
        if m := FRAME.match(text):
            if s["exc"] is not None:  # frames after an exception line: a new traceback of its own
                return False
            s["frames"].append((m.group(1), int(m.group(2)), m.group(3)))
            s["wrap"] = False
            s["after_frame"] = not text[:1].isspace()  # a paste that lost the indents: its source line comes bare
            if glued := _GLUED_EXC.search(text):  # a paste that lost its line breaks: its frames, then its exception
                s["frames"] += [(f, int(n), fn) for f, n, fn in _GLUED_FRAME.findall(text[m.end() :])]
                s["exc"], s["message"] = glued[1], [glued[2]]
            return True
        if s["exc"] is None:
            exc = EXC.match(stripped)
            bare = (after_frame or s.get("wrap")) and stripped and not exc  # unindented, or a long one wrapped
            if text[:1].isspace() or bare or (stripped and set(stripped) <= {"^", "~"}):
                s["wrap"] = len(text) >= WRAP_AT
                return True  # a frame's source line, or ^^^^ markers (their indent gone with a collector's prefix)
            if exc and (s["frames"] or s.get("original") or s.get("boxed")):
                s["exc"], s["message"] = exc.group(1), [exc.group(2) or ""]
                return True
            return len(self.sections) > 1  # a chain's or a wrapper's lines before its frames
        if stripped and len(s["message"]) < 6 and not any(r.match(stripped) for r in (EXC, _NOT_MESSAGE)):
            s["message"].append(stripped)  # a message of several lines (a worker's "Caught ... Original ...")
            return True
        return False

    def _event(self, kind: str, **said) -> dict:
        """An event of this traceback's: where and when it began, then what it says."""
        return {"kind": kind, "rank": self.rank, "time": self.time, "order": self.order, "file": self.source, **said}

    def event(self) -> dict:
        done = [s for s in self.sections if s["exc"]]
        if not done:
            # cut before its exception line, its frames too where the log ends at its header: an exception all the
            # same (the header is printed only for one), the failure where nothing else is (a notebook's frames
            # after a worker's death are not read as frames)
            frames = [f for sec in self.sections for f in sec["frames"]]
            where, named = user_frame(frames), self.named
            kind = "exception" if frames and not (named and CONSEQUENCE.search(named)) else "consequence"
            text = f"{named or 'a traceback'} that the log cuts off before its exception line"
            e = self._event(kind, type=named, message="", text=text, where=where, raised=None)
            return {**e, "frames": len(frames), "cut": True}
        # the exception inside a DataLoader worker's or a datapipe's wrapper, else the first of a chain
        originals = [s for s in done if s["original"]]
        s = originals[-1] if originals else done[0]
        frames = [f for sec in self.sections for f in sec["frames"]] if not originals else s["frames"]
        where = user_frame(s["frames"] or frames)
        message = " ".join(m for m in s["message"] if m).strip()
        text = f"{s['exc']}: {message}" if message else s["exc"]
        whole = " ".join(f"{d['exc']}: {' '.join(d['message'])}" for d in done)
        kind = exception_kind(whole)
        if kind == "exception" and WORKER.search(whole):
            kind = "worker_killed"
        elif kind == "exception" and CONSEQUENCE.search(text) and not originals and not MONITORED_PEER.search(text):
            kind = "exception" if _OWN_SOCKET.search(text) else "consequence"
        spawned = SPAWNED.search(whole)
        if spawned and kind not in ("oom", "nonfinite_error"):
            # torch.multiprocessing's report of the first process it saw end (root): that rank's exit (its own
            # traceback, "with the following error", follows and says what it raised)
            following = spawned.group(0).endswith("following error")
            code = int(spawned.group(3)) if spawned.group(3) else 1 if following else None
            rank = int(spawned.group(1))
            sig = spawned.group(2) or exit_signal(code)  # (Windows' status of a fault: its signal)
            e = self._event("exit", rank=rank, text=text[:500], exitcode=code, signal=sig, root=True)
            e["source"] = "torch.multiprocessing"
            return {**e, "spawned_rank": rank} if following else e
        # "-- Process N terminated with the following error:", then that process's traceback
        more = {"spawned_rank": int(spawned.group(1))} if spawned else {}
        if w := WORKER.search(whole):
            more["signal"] = (w.group(2) or "").strip() or None
        peer = MONITORED_PEER.search(whole) or MONITORED.search(whole)
        if peer:  # this rank raised because another did not come: that one is the culprit
            more["culprit_rank"] = int(peer.group(2) if peer.re is MONITORED_PEER else peer.group(1))
        elif self.rank is None and "CalledProcessError" in whole and (child := CHILD_RANK.search(whole)):
            more["culprit_rank"] = int(child.group(1))  # a launcher's word on the child it started: that rank's
        elif self.rank is None and (own := OWN_RANK.match(message)):
            more["culprit_rank"] = int(own.group(1))  # "Rank 3: found NaN in local grad norm": the rank says itself
        if (s["exc"] or "").endswith("CalledProcessError"):  # its child's status, read before a long command cuts it
            # "returned non-zero exit status N", "died with <Signals.SIGSEGV: 11>"
            st, died = STATUS.search(message), DIED.search(message)
            more["child_code"] = int(st[2]) if st and st[2] else -int(died[1]) if died else None
        e = self._event(kind, type=s["exc"], message=message[:500], text=text[:500], where=where)
        return {**more, **e, "raised": done[-1]["exc"], "frames": len(frames)}

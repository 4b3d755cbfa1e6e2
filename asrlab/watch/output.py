"""The watched job's own output: passed through to the terminal unchanged, and kept in ``EXP/job.log``
(stdout and stderr, whole lines of each, in the order they came) for ``asrlab doctor`` to read with the
toolkits' log readers. Bounded: past :data:`MAX_BYTES` the file starts again and the previous one is
kept as ``job.log.1``, so the newest output, where a failure is, always stays.

The job's lines are kept as the job printed them, with no stamp added; when each stretch came is kept beside
them (``job.times``: a byte offset and the time it came, at most every :data:`CLOCK_S`), so that the doctor
places what the job printed on the same clock as the run folder's heartbeats, errors and reports."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import BinaryIO

from ..lab.layout import JOB_LOG, JOB_TIMES

MAX_BYTES = 64 << 20
CLOCK_S = 0.2  # the job.times resolution: a line's time is when the stretch it came in was kept, within this
# a line that reports a training step: a loss's value and a counter ("step 15 | loss 0.52", "it 7 ctc=0.3",
# tqdm's "12/40 [...] loss=0.5", a loss written L: "L=2.3", JSON's "L": 2.3); not a config's "loss_weight: 0.3"
_LOSS = re.compile(
    rb"(?i)(?:(?:loss\w*|\b(?:[a-z]+_)?(?:ctc|xent|nll|mse|rnnt|objf))['\"]?\s*[=:]?|(?-i:\bL)['\"]?\s*[=:])"
    rb"\s*['\"]?[-+]?(?:\d|nan|inf)"
)
_COUNTER = re.compile(
    rb"(?i)\b(?:step|iter|iteration|it|i|upd|updates?|epoch|ep|batch|tick)\b\W{0,3}\d|\d+/\d+|it/s|s/it"
)


class JobOutput:
    """Pumps a child's stdout and stderr pipes to ours and to the log."""

    def __init__(self, exp: str | Path, max_bytes: int = MAX_BYTES):
        self.path, self.max_bytes = Path(exp) / JOB_LOG, max_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")
        self._times = open(Path(exp) / JOB_TIMES, "a")
        self._stamped = 0.0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._steps_at: list[float] = []  # when step lines came, a second apart at least (the first two kept)
        self._last_step = b""
        self.stepped = 0.0  # when the job last printed a step line unlike the one before (a bar's redraw is alike)

    def pump(self, pipe: BinaryIO, out: BinaryIO) -> None:
        t = threading.Thread(target=self._run, args=(pipe, out), daemon=True, name="asrlab-job-output")
        t.start()
        self._threads.append(t)

    def _run(self, pipe: BinaryIO, out: BinaryIO) -> None:
        fd, partial = pipe.fileno(), b""
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            try:
                out.write(data)
                out.flush()
            except (OSError, ValueError):  # our own terminal went away: the log still gets it
                pass
            self._saw(data)
            data = partial + data
            # whole lines only, so that the job's two pipes never glue half lines; a bar's redraws (``\r``) are lines
            # too: held to its newline, a bar's hour of output would land after what the other pipe said meanwhile
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            partial = data[cut:]
            if cut:
                self._keep(data[:cut])
        if partial:
            self._keep(partial + b"\n")
        pipe.close()

    def _keep(self, data: bytes) -> None:
        with self._lock:
            if self._file.tell() + len(data) > self.max_bytes:
                self._file.close()
                self._times.close()
                os.replace(self.path, self.path.with_name(JOB_LOG + ".1"))
                times = Path(self.path.parent) / JOB_TIMES
                os.replace(times, times.with_name(JOB_TIMES + ".1"))
                self._file, self._times, self._stamped = open(self.path, "ab"), open(times, "a"), 0.0
            now = time.time()
            if now - self._stamped >= CLOCK_S:
                self._times.write(f"{self._file.tell()} {now:.3f}\n")
                self._times.flush()
                self._stamped = now
            self._file.write(data)
            self._file.flush()

    def _saw(self, data: bytes) -> None:
        """Note when the job printed a step line (a bar's redraw after a ``\\r`` too, kept only at its newline);
        looked for at most once a second, the job's output costing the watch no more than that."""
        now = time.time()
        if now - self.stepped < 1.0:
            return
        steps = [line for line in re.split(rb"[\r\n]", data) if _LOSS.search(line) and _COUNTER.search(line)]
        if not steps:
            return
        with self._lock:  # stdout's and stderr's pumps: the second moment a second after the first
            if steps[-1] != self._last_step:  # a new step printed: the job moves, whatever its stacks were sampled at
                self._last_step, self.stepped = steps[-1], now
            if len(self._steps_at) < 2 and (not self._steps_at or now - self._steps_at[0] >= 1.0):
                self._steps_at.append(now)

    def training(self) -> bool:
        """Whether the job has printed step lines (a loss and a counter) at two moments a second apart: its ranks
        are past their start-up, whatever their stacks were sampled doing."""
        return len(self._steps_at) >= 2

    def close(self, timeout_s: float = 5.0) -> None:
        for t in self._threads:
            t.join(timeout_s)
        with self._lock:
            self._file.close()
            self._times.close()


__all__ = ["JobOutput"]

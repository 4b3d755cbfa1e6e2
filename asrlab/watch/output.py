"""The watched job's own output: passed through to the terminal unchanged, and kept in ``EXP/job.log``
(stdout and stderr, whole lines of each, in the order they came) for ``asrlab doctor`` to read with the
toolkits' log readers. Bounded: past :data:`MAX_BYTES` the file starts again and the previous one is
kept as ``job.log.1``, so the newest output, where a failure is, always stays."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import BinaryIO

from ..lab.layout import JOB_LOG, job_log

MAX_BYTES = 64 << 20


class JobOutput:
    """Pumps a child's stdout and stderr pipes to ours and to the log."""

    def __init__(self, exp: str | Path, max_bytes: int = MAX_BYTES):
        self.path, self.max_bytes = job_log(exp), max_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

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
            data = partial + data
            cut = data.rfind(b"\n") + 1
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
                os.replace(self.path, self.path.with_name(JOB_LOG + ".1"))
                self._file = open(self.path, "ab")
            self._file.write(data)
            self._file.flush()

    def close(self, timeout_s: float = 5.0) -> None:
        for t in self._threads:
            t.join(timeout_s)
        with self._lock:
            self._file.close()


__all__ = ["JobOutput"]

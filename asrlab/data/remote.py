"""Shards and audio named by URL (``http(s)://``, ``s3://``, ``gs://``, ...: whatever fsspec opens), read
as streams, front to back, with bounded retries.

A connection that breaks mid-shard is common on object storage under load. :class:`RetryingReader`
opens the file again after a back-off and skips to where it was, at most ``retries`` times in a row;
then the error stands, and the reader above it (:func:`asrlab.data.sources.read_source`) turns it
into a bad-input item (``remote_read_failed``) that ``data.bad_input`` skips and counts or raises.
Nothing is written to disk, and no shell command is run.
"""

from __future__ import annotations

import io
import logging
import time

log = logging.getLogger(__name__)

RETRIES = 4  # failed reads in a row before the error stands
BACKOFF_S = 0.2  # the first wait; doubled after each failure


class RemoteReadError(OSError):
    """A remote file that could not be read, after its retries."""


def is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _fsspec_open(url: str):
    import fsspec

    return fsspec.open(url, "rb", block_size=0).open()  # a stream: no range requests needed


class RetryingReader(io.RawIOBase):
    """``url`` read front to back; see the module docstring. ``retried``: reads that failed and were retried."""

    def __init__(self, url: str, retries: int = RETRIES, backoff_s: float = BACKOFF_S, opener=_fsspec_open):
        super().__init__()
        self.url, self.retries, self.backoff_s, self.opener = url, retries, backoff_s, opener
        self.pos = self.retried = 0
        self._f = opener(url)  # a missing file raises here (FileNotFoundError), not retried

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        failures = 0
        while True:
            try:
                if self._f is None:
                    self._f = self._reopen()
                data = self._f.read(len(buf))
                break
            except FileNotFoundError:
                raise
            except Exception as e:  # aiohttp, fsspec and the OS each raise their own kinds
                failures += 1
                self.retried += 1
                self._drop()
                if failures > self.retries:
                    raise RemoteReadError(
                        f"{self.url}: {failures} reads in a row failed at byte {self.pos} ({type(e).__name__}: {e})"
                    ) from e
                wait = self.backoff_s * 2 ** (failures - 1)
                log.warning("%s: read failed at byte %d (%s); again in %.1f s", self.url, self.pos, e, wait)
                time.sleep(wait)
        n = len(data)
        buf[:n] = data
        self.pos += n
        return n

    def _reopen(self):
        f = self.opener(self.url)
        left = self.pos
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                f.close()
                raise EOFError(f"{self.url} is shorter than the {self.pos} bytes read before")
            left -= len(chunk)
        return f

    def _drop(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except Exception:  # a broken connection may not close cleanly either
                pass
            self._f = None

    def close(self) -> None:
        self._drop()
        super().close()


def open_binary(path: str, retries: int = RETRIES):
    """A local file, or a URL through :class:`RetryingReader`, as a buffered binary stream."""
    if is_url(path):
        return io.BufferedReader(RetryingReader(path, retries), buffer_size=1 << 20)
    return open(path, "rb")


def stamp_of(url: str):
    """What changes when a remote file does (size and ETag or modification time); None if unknown."""
    try:
        import fsspec

        fs, p = fsspec.core.url_to_fs(url)
        info = fs.info(p)
    except Exception:  # a store that does not say: the index entry is then kept until the list changes
        return None
    return (
        info.get("size"),
        str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")),
    )


__all__ = ["RemoteReadError", "RetryingReader", "is_url", "open_binary", "stamp_of"]

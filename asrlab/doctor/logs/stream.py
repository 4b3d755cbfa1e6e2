"""A log file as a stream of clean text lines, whatever state it is in.

Compressed logs (gzip, bz2, xz, zstd) are recognised from their first bytes, not their names. A line is
cut at ``\\n``; a progress bar redrawn with ``\\r`` gives each of its drawings as a line; ANSI colour codes
go; bytes that are not UTF-8 become U+FFFD; a NUL-filled or binary stretch gives nothing; two ranks'
lines glued together (one wrote without its newline before the other's timestamp or rank mark) are cut
apart. A file still being written is read up to its last complete line, plus the partial one.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 22  # bytes read at a time: lines are cut in C, a chunk at a time

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]")
# where a second line starts inside one: a timestamp or a rank mark that follows text with no newline
_GLUED = re.compile(
    rb"(?<=[^\s\[(])(?=\[rank\d+\]:|\[default\d+\]:|\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d[,.]\d)|"
    rb"(?<=\S)(?=\[\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d|\[[EWI] ?[\w.]+\.cpp:\d+\])"
)
# where a date is (its "-MM-DD hh:mm:ss"): a search that starts at a literal byte, for glued's first look
_DATE = re.compile(rb"-\d\d-\d\d[ T_]\d\d:\d\d:\d\d")
_MAGIC = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))
_ZSTD = b"\x28\xb5\x2f\xfd"


def open_log(path: str | Path) -> BinaryIO:
    """The file's bytes, decompressed when its first bytes say it is compressed."""
    raw = open(path, "rb")
    head = raw.peek(8)[:8] if hasattr(raw, "peek") else b""
    for magic, opener in _MAGIC:
        if head.startswith(magic):
            raw.close()
            return opener(path, "rb")
    if head.startswith(_ZSTD):
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def chunks(path, size: int = CHUNK) -> Iterator[bytes]:
    """The file (a path, or a binary stream such as standard input) in pieces that each end at a line's
    end (the last may not: a file still being written).

    Read into one buffer, reused: a piece is copied out of it once (a fresh ``read`` per piece, then the
    partial line glued on and the piece cut, copied each piece three times over and took 1.1 s a GiB)."""
    with open_log(path) if isinstance(path, (str, Path)) else contextlib.nullcontext(path) as f:
        buf = bytearray(2 * size)
        have = 0  # bytes in buf: the partial line carried over, then what was read after it
        eof = False
        while not eof:
            want = have + size
            if len(buf) < want:
                buf.extend(bytes(want - len(buf)))
            with memoryview(buf) as view:
                while have < want:  # a pipe or a decompressor gives less than asked: fill the piece
                    try:
                        n = f.readinto(view[have:want])
                    except (EOFError, OSError, lzma.LZMAError, zlib.error):  # a cut compressed file: what it had
                        n = 0
                    if not n:
                        eof = True
                        break
                    have += n
                cut = buf.rfind(b"\n", 0, have) + 1
                if eof:
                    cut = have
                elif cut == 0:
                    if have <= 16 * size:  # no newline yet: read on
                        continue
                    cut = have  # a file without newlines: read it as it comes
                if cut:
                    yield bytes(view[:cut])
            buf[: have - cut] = buf[cut:have]
            have -= cut


def clean(raw: bytes) -> list[str]:
    """One raw line (no ``\\n``) as the text lines it holds."""
    if b"\x1b" in raw:
        raw = _ANSI.sub(b"", raw)
    if b"\x00" in raw:
        raw = raw.replace(b"\x00", b"")
    parts = raw.split(b"\r") if b"\r" in raw else [raw]
    out = []
    for part in parts:
        if not part.strip():
            continue
        for piece in _GLUED.split(part) if len(part) > 30 and _glued(part) else (part,):
            if piece.strip():
                out.append(piece.decode("utf-8", "replace").rstrip())
    return out


def _glued(part: bytes) -> bool:
    """Whether ``part`` may hold a second line (where _GLUED, slow, may cut it): a rank mark after its
    start, a glog bracket, or a date after text. Byte searches: a line's cost drops from ~30 us to ~2 us."""
    if part.find(b"[rank", 1) > 0 or part.find(b"[default", 1) > 0 or b".cpp:" in part:
        return True
    for m in _DATE.finditer(part):
        i = m.start() - 5  # the byte before the year
        if i >= 0 and part[i] == 91:  # "[2024-...": glued where that bracket follows text
            i -= 1
        if i >= 0 and part[i] not in b" \t\x0b\x0c([":
            return True
    return False


def is_text(path: str | Path, sample: int = 65536) -> bool:
    """Whether a file reads as text (a log), not as binary (a checkpoint, an archive)."""
    try:
        with open_log(path) as f:
            head = f.read(sample)
    except (OSError, EOFError, lzma.LZMAError, zlib.error):
        return False
    if not head:
        return True
    printable = sum(1 for b in head if b >= 32 or b in (9, 10, 13, 27))
    return printable / len(head) > 0.9


__all__ = ["chunks", "clean", "is_text", "open_log"]

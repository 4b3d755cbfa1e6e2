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
    end (the last may not: a file still being written)."""
    with open_log(path) if isinstance(path, (str, Path)) else contextlib.nullcontext(path) as f:
        rest = b""
        while True:
            try:
                block = f.read(size)
            except (EOFError, OSError, lzma.LZMAError, zlib.error):  # a cut compressed file: what it had
                block = b""
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                rest = block
                if len(rest) > 16 * size:  # a file without newlines: read it as it comes
                    yield rest
                    rest = b""
                continue
            rest = block[cut:]
            yield block[:cut]
        if rest:
            yield rest


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
        for piece in _GLUED.split(part) if len(part) > 30 else (part,):
            if piece.strip():
                out.append(piece.decode("utf-8", "replace").rstrip())
    return out


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

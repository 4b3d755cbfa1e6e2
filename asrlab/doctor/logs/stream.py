"""A log file as clean text lines: compressed logs known by their first bytes, not their names; a bar
redrawn with ``\\r`` a line per drawing; ANSI codes and NULs gone; two ranks' lines glued together cut apart."""

from __future__ import annotations

import bz2
import contextlib
import io
import gzip
import lzma
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 22  # bytes read at a time: lines are cut in C, a chunk at a time

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]")
# the same colour codes where a copy lost their escape byte ("[36m05-07 13:05:33[0m"): known by the reset, "[0m"
_BARE_ANSI = re.compile(rb"\[[0-9;]{1,8}m")
# where a second line starts inside one: a timestamp or a rank mark (PyTorch's "[rank1]:", Lightning's "[rank: 1] ")
# that follows text with no newline, or a second JSON object
_GLUED = re.compile(
    rb"(?<=[^\s\[(])(?=\[rank\d+\]:|\[rank: \d+\] |\[default\d+\]:|\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d[,.]\d)|"
    rb"(?<=\S)(?<!\]:)(?=\[\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d|\[[EWI] ?[\w.]+\.cpp:\d+\])|"  # not after "[rank0]:"
    rb"(?<=\})(?=\{\")|"  # two ranks' JSON lines, printed at once: '{"step": 5, "rank": 1}{"step": 5, "rank": 0}'
    rb"(?<=\])(?=[IWEF][01]\d{3} \d\d:\d\d:\d\d\.\d+ +\d+ )|"  # glog's line after a bar left without its newline
    rb"(?<=\])(?=\d\d:\d\d:\d\d[.,]\d+ )"  # a logger's, stamped with a time of day, after a bar the same way
)
_GLOG = re.compile(rb"\](?:[IWEF][01]\d{3} )?\d\d:\d\d:\d\d")
# where a date is (its "-MM-DD hh:mm:ss"): a search that starts at a literal byte, for glued's first look
_DATE = re.compile(rb"-\d\d-\d\d[ T_]\d\d:\d\d:\d\d")
_MAGIC = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))
_ZSTD = b"\x28\xb5\x2f\xfd"


def open_log(path: str | Path) -> BinaryIO:
    """The file's bytes, decompressed when its first bytes say it is compressed; an executed notebook's, the console
    its run printed (:mod:`.notebook`)."""
    if str(path).endswith(".ipynb"):
        from .notebook import console

        try:
            return io.BytesIO(console(path).encode())
        except (ValueError, AttributeError, TypeError):  # not a notebook's JSON: read as it is
            pass
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


def ends(path: str, size: int = 1 << 16) -> str:
    """The file's first and last ``size`` bytes as text (its first only where it is compressed or a notebook)."""
    try:
        with open_log(path) as f:
            head = f.read(size)
            if isinstance(f, io.BufferedReader) and f.seek(0, 2) > 2 * size:
                f.seek(-size, 2)
                head += b"\n" + f.read(size)
    except (OSError, EOFError, lzma.LZMAError, zlib.error):
        return ""
    return head.decode("utf-8", "replace")


def pieces(path, size: int = CHUNK) -> Iterator[tuple[bytes, int, int]]:
    """The file (a path or a binary stream) as ``(data, lo, hi)``, ``data[lo:hi]`` whole lines (the last may end
    mid-line). ``data`` is one read's, not copied (copying each piece took 1.1 s a GiB; this, 0.2)."""
    with open_log(path) if isinstance(path, (str, Path)) else contextlib.nullcontext(path) as f:
        rest = b""  # the end of the last read: a line cut
        while True:
            try:
                data = f.read(size)
            except (EOFError, OSError, lzma.LZMAError, zlib.error):  # a cut compressed file: what it had
                data = b""
            if not data:
                break
            first = 0
            if rest:
                if not (nl := data.find(b"\n") + 1):
                    rest += data
                    if len(rest) > 16 * size:  # a file without newlines: read it as it comes
                        yield rest, 0, len(rest)
                        rest = b""
                    continue
                glued = rest + data[:nl]
                yield glued, 0, len(glued)
                first = nl
            last = data.rfind(b"\n", first) + 1
            if last > first:
                yield data, first, last
            rest = data[max(first, last) :]
        if rest:
            yield rest, 0, len(rest)


def clean(raw: bytes) -> list[str]:
    """One raw line (no ``\\n``) as the text lines it holds."""
    if b"\x1b" in raw:
        raw = _ANSI.sub(b"", raw)
    if b"[0m" in raw:
        raw = _BARE_ANSI.sub(b"", raw)
    if b"\x00" in raw or b"\x08" in raw:  # NULs; a bar's backspaces (Keras' redraws, "\\b" x 57 then "\\r")
        raw = raw.replace(b"\x00", b"").replace(b"\x08", b"")
    if raw[:1] == b">" and raw[:2] in (b"> ", b">"):  # a log quoted in a markdown comment: "> [rank10]: ..."
        raw = raw[2:]
    if raw[:2] == b"**" and raw[2:3] != b"*":  # set in bold in a markdown comment: "**RuntimeError: ...**"
        raw = raw.replace(b"**", b"")
    out = []
    for part in raw.split(b"\r"):
        for piece in _GLUED.split(part) if len(part) > 30 and _glued(part) else (part,):
            if piece.strip():
                out.append(piece.decode("utf-8", "replace").rstrip())
    return out


def _glued(part: bytes) -> bool:
    """Whether ``part`` may hold a second line for _GLUED, slow, to cut: byte searches (~2 us a line, not ~30)."""
    if part.find(b"[rank", 1) > 0 or part.find(b"[default", 1) > 0 or b".cpp:" in part or b'}{"' in part:
        return True
    if b"]" in part and _GLOG.search(part):
        return True
    for m in _DATE.finditer(part, 5):
        i = m.start() - 5  # the byte before the year
        if part[i] == 91 and i and part[i - 1] not in b" \t\n\r\x0b\x0c":  # "[2024-..." after text
            return True
        if part[i] not in b" \t\n\r\x0b\x0c([" and not part[: i + 1].endswith((b"<stderr>:", b"<stdout>:")):
            return True  # "2024-..." after text, not after mpirun's "[1,1]<stderr>:"
    return False


def is_text(path: str | Path, sample: int = 65536) -> bool:
    """Whether a file reads as text (a log), not as binary (a checkpoint, an archive)."""
    try:
        with open_log(path) as f:
            head = f.read(sample)
    except (OSError, EOFError, lzma.LZMAError, zlib.error):
        return False
    printable = sum(1 for b in head if b >= 32 or b in (8, 9, 10, 13, 27))  # 8: a bar's backspaces
    return not head or printable / len(head) > 0.9


__all__ = ["clean", "is_text", "open_log", "pieces"]

"""WeNet tar shards: write them deterministically, read them whatever their compression.

Layout (WeNet's): ``<split>/shards/<split>_%09d.tar`` holding ``KEY.txt`` then ``KEY.wav``
for each utterance, and ``<split>/data.list`` with one shard path per line. Compressed
shards get a suffix (``.tar.gz``, ``.tar.bz2``, ``.tar.xz``, ``.tar.zst``); readers detect
compression from the magic bytes, so a user's shards load whatever they are named.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tarfile
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import zstandard

from ..errors import UsageError

COMPRESSIONS = ("none", "gz", "bz2", "xz", "zst")
_MAGIC = {b"\x1f\x8b": "gz", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zst"}


def shard_name(split: str, index: int, compression: str) -> str:
    return f"{split}_{index:09d}.tar" + ("" if compression == "none" else f".{compression}")


def compress(data: bytes, compression: str) -> bytes:
    """Deterministic compression (no timestamps or file names in the headers)."""
    if compression == "none":
        return data
    if compression == "gz":
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as f:
            f.write(data)
        return buf.getvalue()
    if compression == "bz2":
        return bz2.compress(data)
    if compression == "xz":
        return lzma.compress(data)
    if compression == "zst":
        return zstandard.ZstdCompressor(level=3).compress(data)
    raise UsageError(f"unknown compression {compression!r}; choose from {', '.join(COMPRESSIONS)}")


def detect_compression(head: bytes) -> str:
    """Compression of a stream from its first bytes ('none' when no magic matches)."""
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    return "none"


def open_stream(fileobj: BinaryIO) -> BinaryIO:
    """Wrap ``fileobj`` so reads return decompressed bytes, detecting the compression.

    An uncompressed seekable file comes back as itself, rewound.
    """
    head = fileobj.read(6)
    if fileobj.seekable():
        fileobj.seek(-len(head), io.SEEK_CUR)
        raw = fileobj
    else:
        raw = _Prefixed(head, fileobj)
    kind = detect_compression(head)
    if kind == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if kind == "bz2":
        return bz2.BZ2File(raw, mode="rb")
    if kind == "xz":
        return lzma.LZMAFile(raw, mode="rb")
    if kind == "zst":
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


class _Prefixed(io.RawIOBase):
    """A read-only stream that first returns ``head`` then the rest of ``f``."""

    def __init__(self, head: bytes, f: BinaryIO):
        self._head, self._f = head, f

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n], self._head = self._head[:n], self._head[n:]
            return n
        data = self._f.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._f.close()
        super().close()


def tar_bytes(members: Iterable[tuple[str, bytes]]) -> bytes:
    """An uncompressed tar of ``(name, data)`` with fixed metadata, so equal input gives equal bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_split(
    utts: Iterable[tuple[str, str, bytes]],
    split_dir: str | Path,
    split: str,
    shard_size: int = 500,
    compression: str = "none",
    raw: bool = False,
) -> list[Path]:
    """Write ``(key, text, wav_bytes)`` utterances as WeNet shards (and a raw list with ``raw``).

    Returns the shard paths. ``data.list`` (and ``raw.list``) hold absolute paths.
    """
    if shard_size < 1:
        raise UsageError("shard_size must be at least 1")
    if compression not in COMPRESSIONS:
        raise UsageError(f"unknown compression {compression!r}; choose from {', '.join(COMPRESSIONS)}")
    split_dir = Path(split_dir).resolve()
    (split_dir / "shards").mkdir(parents=True, exist_ok=True)
    if raw:
        (split_dir / "wavs").mkdir(exist_ok=True)
    paths: list[Path] = []
    raw_lines: list[str] = []
    pending: list[tuple[str, bytes]] = []

    def flush() -> None:
        path = split_dir / "shards" / shard_name(split, len(paths), compression)
        path.write_bytes(compress(tar_bytes(pending), compression))
        paths.append(path)
        pending.clear()

    for key, text, wav in utts:
        pending += [(f"{key}.txt", text.encode("utf-8")), (f"{key}.wav", wav)]
        if raw:
            wav_path = split_dir / "wavs" / f"{key}.wav"
            wav_path.write_bytes(wav)
            raw_lines.append(json.dumps({"key": key, "wav": str(wav_path), "txt": text}, ensure_ascii=False))
        if len(pending) == 2 * shard_size:
            flush()
    if pending:
        flush()
    (split_dir / "data.list").write_text("".join(f"{p}\n" for p in paths))
    if raw:
        (split_dir / "raw.list").write_text("".join(f"{line}\n" for line in raw_lines), encoding="utf-8")
    return paths


def iter_tar(fileobj: BinaryIO) -> Iterator[tuple[str, bytes]]:
    """Stream ``(member name, bytes)`` from a tar in any supported compression.

    Plain ustar members (what WeNet's and asrlab's shard writers make) are read here, header by header,
    several times faster than ``tarfile`` makes its member objects; from the first header that is anything
    else (pax or GNU extensions, a bad checksum, the end) ``tarfile`` reads the rest, so what it accepts
    and refuses is unchanged. Raises ``tarfile.ReadError`` (or ``EOFError``) when the tar is truncated or
    corrupt.
    """
    stream = open_stream(fileobj)
    seekable = stream is fileobj
    while True:
        head = _read(stream, 512)
        member = _ustar_member(head)
        if member is None:
            break
        name, size, is_file = member
        data = _read(stream, size)
        if len(data) != size:
            raise tarfile.ReadError(f"member {name} truncated ({len(data)} of {size} bytes)")
        pad = -size % 512
        if pad and len(_read(stream, pad)) != pad:
            raise tarfile.ReadError(f"member {name} truncated (its padding)")
        if is_file:
            yield name, data
    # the rest through tarfile, from the header just read
    if seekable:
        stream.seek(-len(head), io.SEEK_CUR)
    else:
        stream = _Prefixed(head, stream)
    # an uncompressed tar on a seekable file is read in random-access mode (no copying through a stream)
    with tarfile.open(fileobj=stream, mode="r:" if seekable else "r|") as tar:
        for info in tar:
            if not info.isfile():
                continue
            f = tar.extractfile(info)
            data = f.read() if f is not None else b""
            if len(data) != info.size:
                raise tarfile.ReadError(f"member {info.name} truncated ({len(data)} of {info.size} bytes)")
            yield info.name, data


def _read(stream: BinaryIO, n: int) -> bytes:
    """``n`` bytes, fewer only at the end (a decompressing reader may return less than asked before it)."""
    data = stream.read(n)
    while len(data) < n:
        more = stream.read(n - len(data))
        if not more:
            break
        data += more
    return data


def _ustar_member(head: bytes) -> tuple[str, int, bool] | None:
    """``(name, size, regular file?)`` of a plain ustar header (a regular file or a directory, a valid
    checksum, an octal size), else None."""
    if len(head) != 512 or head[257:262] != b"ustar" or head[156:157] not in (b"0", b"\0", b"5"):
        return None
    try:
        checksum = int(head[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
        size = int(head[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:  # base-256 sizes, odd fields: tarfile's
        return None
    if checksum != sum(head) - sum(head[148:156]) + 8 * 32:
        return None
    name = head[:100].split(b"\0", 1)[0]
    prefix = head[345:500].split(b"\0", 1)[0]
    if prefix:
        name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape"), size, head[156:157] != b"5"

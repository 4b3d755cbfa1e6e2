"""What users already have, read as a list of sources: WeNet shard lists, raw lists, Kaldi dirs.

A *source* is the unit the loader deals to ranks and workers: one tar shard, or a chunk of
``chunk`` lines of a raw list or Kaldi dir. Reading a source yields ``Item``s in a fixed order,
so a position inside it is just an item offset, and ``read_source(src, start)`` seeks there.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import UsageError
from .shards import iter_tar

AUDIO_EXTENSIONS = {"wav", "flac", "ogg", "opus", "mp3", "sph"}


class DataError(UsageError, RuntimeError):
    """Bad input under the ``fail`` policy, or a data list that cannot be used at all."""


@dataclass(frozen=True)
class Source:
    """A tar shard (``path``) or a chunk of raw items ``(key, audio location, text)``."""

    name: str
    path: str | None = None
    items: tuple[tuple[str, str, str | None], ...] = ()


@dataclass
class Item:
    """One utterance as read, before decoding; ``error`` names what is wrong with it, if anything."""

    key: str
    text: str | None
    audio: bytes | None
    where: str
    error: str | None = None


def load_sources(path: str | Path, chunk: int = 1000) -> list[Source]:
    """Sources of a WeNet ``data.list`` (shard or raw mode) or a Kaldi dir (``wav.scp`` + ``text``).

    Raises ``DataError`` for a missing list, an empty one, or an unreadable line.
    """
    path = Path(path)
    if path.is_dir():
        return _kaldi_sources(path, chunk)
    if not path.exists():
        raise DataError(f"{path}: no such data list (expected a WeNet data.list or a Kaldi dir)")
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise DataError(f"{path}: the data list is empty")
    if lines[0].startswith("{"):
        items = []
        for n, line in enumerate(lines, 1):
            try:
                obj = json.loads(line)
                items.append((str(obj["key"]), _resolve(obj["wav"], path), obj.get("txt")))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise DataError(f"{path}:{n}: not a WeNet raw line with key/wav/txt ({e})") from None
        return _chunks(items, chunk, path.name)
    return [Source(name=Path(p).name, path=_resolve(p, path)) for p in lines]


def _resolve(p: str, list_path: Path) -> str:
    """A path as given, or relative to the list's folder if that is where it exists."""
    if Path(p).is_absolute() or Path(p).exists() or p.rstrip().endswith("|"):
        return p
    beside = list_path.parent / p
    return str(beside) if beside.exists() else p


def _chunks(items: list, chunk: int, name: str) -> list[Source]:
    return [Source(name=f"{name}[{i}:{i + len(items[i:i + chunk])}]", items=tuple(items[i:i + chunk]))
            for i in range(0, len(items), chunk)]


def _kaldi_sources(d: Path, chunk: int) -> list[Source]:
    scp, text = d / "wav.scp", d / "text"
    for f in (scp, text):
        if not f.exists():
            raise DataError(f"{d}: a Kaldi data dir needs {f.name}")
    texts = {}
    for line in text.read_text(encoding="utf-8").splitlines():
        parts = line.strip().split(maxsplit=1)
        if parts:
            texts[parts[0]] = parts[1] if len(parts) > 1 else ""
    items = []
    for line in scp.read_text(encoding="utf-8").splitlines():
        parts = line.strip().split(maxsplit=1)
        if len(parts) == 2:
            items.append((parts[0], _resolve(parts[1], scp), texts.get(parts[0])))
    if not items:
        raise DataError(f"{scp}: no entries")
    return _chunks(items, chunk, d.name)


def iter_items(sources: list[Source]) -> Iterator[Item]:
    """Every item of every source, in list order."""
    for src in sources:
        yield from read_source(src)


def transcripts(sources: list[Source]) -> Iterator[str]:
    """The non-empty transcripts of ``sources`` (what a tokenizer is built from)."""
    return (item.text for item in iter_items(sources) if item.text)


def read_source(src: Source, start: int = 0) -> Iterator[Item]:
    """Items of ``src`` from offset ``start`` on; audio is not read for the skipped ones.

    A source that breaks off (missing file, truncated tar) ends with one ``Item`` whose
    ``error`` says so; every item before it still comes out.
    """
    if src.path is None:
        for key, loc, text in src.items[start:]:
            yield _read_location(key, loc, text, f"{src.name}:{key}")
        return
    yield from _read_tar(src, start)


def _read_location(key: str, loc: str, text: str | None, where: str) -> Item:
    if text is None:
        return Item(key, None, None, where, "missing_text")
    if loc.endswith("|"):  # Kaldi pipe: a command whose stdout is the audio
        try:
            out = subprocess.run(loc[:-1], shell=True, capture_output=True, timeout=60, check=True)
        except (subprocess.SubprocessError, OSError) as e:
            return Item(key, text, None, where, "pipe_failed" if not isinstance(e, FileNotFoundError)
                        else "missing_file")
        return Item(key, text, out.stdout, where)
    if ":" in Path(loc).name and not Path(loc).exists():  # ark:offset, which we do not read
        return Item(key, text, None, where, "unsupported_location")
    try:
        return Item(key, text, Path(loc).read_bytes(), where)
    except FileNotFoundError:
        return Item(key, text, None, where, "missing_file")
    except OSError:
        return Item(key, text, None, where, "unreadable_file")


def _read_tar(src: Source, start: int) -> Iterator[Item]:
    """Group consecutive tar members by key prefix (WeNet's ``tar_file_and_group``)."""
    try:
        f = open(src.path, "rb")
    except FileNotFoundError:
        if start == 0:  # the error counts as the source's item 0, so a seek past it skips it
            yield Item("", None, None, src.name, "missing_file")
        return
    index = 0
    key, text, audio = None, None, None

    def finish() -> Item | None:
        nonlocal index
        index += 1
        if index <= start:
            return None
        where = f"{src.name}:{key}"
        if audio is None:
            return Item(key, text, None, where, "missing_audio")
        if text is None:
            return Item(key, None, audio, where, "missing_text")
        return Item(key, text, audio, where)

    try:
        with f:
            for name, data in iter_tar(f):
                prefix, _, ext = name.rpartition(".")
                if prefix != key and key is not None:
                    item = finish()
                    if item is not None:
                        yield item
                    text, audio = None, None
                key = prefix
                if ext == "txt":
                    text = data.decode("utf-8", errors="replace").strip()
                elif ext in AUDIO_EXTENSIONS:
                    audio = data
            if key is not None:
                item = finish()
                if item is not None:
                    yield item
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        if index >= start:  # the error is item number ``index``: a seek past it skips it
            yield Item("", None, None, f"{src.name} after {index} utterances ({e})", "truncated_tar")

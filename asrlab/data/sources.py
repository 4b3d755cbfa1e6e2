"""What users already have, read as a list of sources: WeNet shard lists, raw lists (with ``start`` and
``end`` in seconds where an utterance is cut from a longer file), NeMo JSONL manifests
(``audio_filepath``, ``text``, ``offset`` and ``duration``), Kaldi dirs (``wav.scp``, ``text``, and
``segments`` where there is one).

A *source* is the unit the loader deals to ranks and workers: one tar shard, or a chunk of
``chunk`` lines of a raw list or Kaldi dir. Reading a source yields ``Item``s in a fixed order,
so a position inside it is just an item offset, and ``read_source(src, start)`` seeks there.

The lists' lines themselves, read and checked one by one, are :mod:`.lines`'s.
"""

from __future__ import annotations

import errno
import subprocess
import tarfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from ..errors import UsageError
from .lines import (
    DataError,
    bad_path,
    kaldi_items,
    list_entries,
    list_items,
    list_lines,
    resolve_path,
    shorten,
    source_name,
)
from .remote import RemoteReadError, is_url, open_binary
from .shards import iter_tar

AUDIO_EXTENSIONS = {"wav", "flac", "ogg", "opus", "mp3", "sph"}


def bad_input(where: str, reason: str, policy: str, skipped: Counter) -> None:
    """What every reader does with an unusable item: under ``data.bad_input=fail`` a ``DataError`` naming it,
    under ``skip`` one more in ``skipped[reason]``."""
    if policy == "fail":
        raise DataError(f"{where}: {reason}")
    skipped[reason] += 1


@dataclass(frozen=True)
class Source:
    """A tar shard (``path``) or a chunk of raw items ``(key, audio location, text)``."""

    name: str
    path: str | None = None
    items: tuple[tuple[str, str, str | None], ...] = ()
    corpus: str = ""  # in a mix of several lists: the list's name (keys are qualified by it), else ""
    weight: float = 1.0  # in a mix: how often the loader draws from this source's list
    origin: str = ""  # the list or Kaldi dir it was read from: where an error about its items points

    @property
    def label(self) -> str:
        """The source's name, qualified by its corpus in a mix (shard names repeat across corpora)."""
        return f"{self.corpus}/{self.name}" if self.corpus else self.name


@dataclass
class Item:
    """One utterance as read, before decoding; ``error`` names what is wrong with it, if anything."""

    key: str
    text: str | None
    audio: bytes | None
    where: str
    error: str | None = None
    samples: int | None = None  # the length, where an index gave it instead of the audio
    rate: int | None = None
    speed: float = 1.0  # the speed perturbation the loader drew for it this epoch
    corpus: str = ""  # in a mix: its corpus (the loader counts and times each)
    load_s: float = 0.0  # in a mix: the worker's time reading and decoding it


def load_sources(path: str | Path, chunk: int = 1000) -> list[Source]:
    """Sources of a WeNet ``data.list`` (shard or raw mode) or a Kaldi dir (``wav.scp`` + ``text``).

    Any bytes in any line give a ``DataError`` naming the file, the line and why (a line that is not UTF-8, a
    raw line that is not a JSON object with key/wav/txt), or an item that the loader skips and counts (a path
    that names no file: ``bad_path`` for one with a NUL byte, ``missing_file``, ``unreadable_file``). Raises
    ``DataError`` for a missing list or an empty one too.
    """
    path = Path(path)
    if path.is_dir():
        return _chunks(kaldi_items(path), chunk, path.name, str(path))
    if not path.exists():
        raise DataError(f"{path}: no such data list (expected a WeNet data.list or a Kaldi dir)")
    rows = list_lines(path)
    if not rows:
        raise DataError(f"{path}: the data list is empty")
    if rows[0][1].startswith("{"):
        return _chunks(list_items(path, rows), chunk, path.name, str(path))
    return [Source(name=source_name(p), path=resolve_path(p, path), origin=str(path)) for _, p in rows]


def corpus_specs(data: str | Path | list) -> list[tuple[str, str, float]]:
    """``(name, list, weight)`` of each corpus in ``data``: one list, or several as ``[NAME=]LIST[:WEIGHT]``
    (a list of them, or one string with commas). Without ``NAME=`` a corpus is named after its list (its
    folder's name for a ``data.list`` or a Kaldi dir), made unique with a number; the weight defaults to 1."""
    specs = [str(d) for d in data] if isinstance(data, (list, tuple)) else [str(data)]
    if len(specs) == 1 and "," in specs[0] and not Path(specs[0]).exists():
        specs = [x.strip() for x in specs[0].split(",") if x.strip()]
    out, seen = [], Counter()
    for spec in specs:
        name, _, rest = spec.partition("=") if "=" in spec.split("/")[0] else ("", "", spec)
        path, weight = rest, 1.0
        head, sep, tail = rest.rpartition(":")
        if sep and head:
            try:
                path, weight = head, float(tail)
            except ValueError:
                pass
        if not weight > 0:
            raise UsageError(f"{spec}: a corpus weight must be above 0")
        name = name or _corpus_name(path)
        seen[name] += 1
        out.append((name if seen[name] == 1 else f"{name}{seen[name]}", path, weight))
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise UsageError(f"corpus names repeat: {names}")
    return out


_GENERIC = {"data", "train", "dev", "test", "wav", "shards", "list", "raw", "manifest", ""}


def _corpus_name(path: str) -> str:
    """The first name on the list's path, from the list up, that says more than "data" or "train"."""
    p = Path(path).resolve()
    for part in [p.name if p.is_dir() else p.stem] + [q.name for q in p.parents]:
        if part.lower() not in _GENERIC:
            return part
    return "data"


def load_data(data: str | Path | list, chunk: int = 1000) -> list[Source]:
    """The sources of ``data``: one list as :func:`load_sources` reads it, or several lists mixed (see
    :func:`corpus_specs`), each source tagged with its corpus and weight."""
    specs = corpus_specs(data)
    if len(specs) == 1:  # one list: no corpus to tell apart, its weight moot
        return load_sources(specs[0][1], chunk)
    return [
        replace(src, corpus=name, weight=weight) for name, path, weight in specs for src in load_sources(path, chunk)
    ]


def _chunks(items: list, chunk: int, name: str, origin: str) -> list[Source]:
    return [
        Source(name=f"{name}[{i}:{i + len(items[i : i + chunk])}]", items=tuple(items[i : i + chunk]), origin=origin)
        for i in range(0, len(items), chunk)
    ]


def locate(sources: list[Source], bad) -> list[dict]:
    """Where each unusable item ``(source index, item offset, key, reason)`` of ``sources`` sits in its list:
    dicts with ``list``, ``file``, ``line`` (None where the list cannot tell), ``text`` (the line, shortened),
    ``key`` and ``reason``."""
    start, seen = [], Counter()
    for src in sources:  # a source's first entry: the entries of the sources before it from the same list
        start.append(seen[src.corpus, src.origin])
        seen[src.corpus, src.origin] += 1 if src.path is not None else len(src.items)
    entries: dict[str, list] = {}
    out = []
    for i, k, key, reason in bad:
        src = sources[i]
        if src.origin and src.origin not in entries:
            entries[src.origin] = list_entries(src.origin)
        rows = entries.get(src.origin, [])
        e = start[i] + (0 if src.path is not None else k)
        file, n, text = rows[e] if src.origin and e < len(rows) else (src.label, None, "")
        out.append(
            {
                "list": src.origin or src.label,
                "file": file,
                "line": n,
                "text": shorten(text),
                "key": key,
                "reason": reason,
            }
        )
    return out


def line_ref(x: dict, one_list: bool = True) -> str:
    """``line 3`` (of the only list), ``wav.scp line 3`` (of a Kaldi dir), ``LIST:3`` (among several)."""
    if x["line"] is None:
        return x["file"]
    if not one_list:
        return f"{x['file']}:{x['line']}"
    return f"line {x['line']}" if x["file"] == x["list"] else f"{Path(x['file']).name} line {x['line']}"


def no_usable_error(located: list[dict]) -> DataError:
    """``no usable utterance in LIST: N lines, each REASON``, or per reason its count and first line."""
    lines: dict[tuple, tuple[dict, Counter]] = {}  # a shard's line holds many items: it counts once, by its commonest
    for x in located:
        lines.setdefault((x["file"], x["line"]), (x, Counter()))[1][x["reason"]] += 1
    first: dict[str, dict] = {}
    per_reason: Counter = Counter()
    for x, reasons in lines.values():
        reason = reasons.most_common(1)[0][0]
        per_reason[reason] += 1
        first.setdefault(reason, x)
    lists = list(dict.fromkeys(x["list"] for x in located))
    ref = lambda x: line_ref(x, len(lists) == 1)  # noqa: E731
    n = f"{len(lines)} line" + ("s" if len(lines) != 1 else "")
    if len(per_reason) == 1:
        ((reason, _),) = per_reason.items()
        x = first[reason]
        tail = f"{n}, {'each ' if len(lines) > 1 else ''}{reason}"
        tail += f" ({ref(x)}: {x['text']!r})" if x["text"] else ""
    else:
        tail = f"{n}: " + ", ".join(f"{c} {r} (first: {ref(first[r])})" for r, c in per_reason.most_common())
    return DataError(f"no usable utterance in {', '.join(lists)}: {tail}")


def iter_items(sources: list[Source]) -> Iterator[Item]:
    """Every item of every source, in list order."""
    for src in sources:
        yield from read_source(src)


def transcripts(sources: list[Source]) -> Iterator[str]:
    """The non-empty transcripts of ``sources`` (what a tokenizer is built from)."""
    return (item.text for item in iter_items(sources) if item.text)


def check_item(item: Item) -> tuple[str | None, int, int]:
    """Why the loader would skip ``item`` (None: usable), and its sample count and rate from the audio
    header (0, 0 when unusable). Reads the header only, no decoding."""
    from . import audio  # torch: reading lists and shards does not need it

    reason = item.error or (None if item.text else "empty_text")
    if reason is not None:
        return reason, 0, 0
    try:
        samples, rate = audio.audio_info(item.audio)
    except audio.AudioError as e:
        return e.reason, 0, 0
    return None, samples, rate


def read_source(src: Source, start: int = 0) -> Iterator[Item]:
    """Items of ``src`` from offset ``start`` on; audio is not read for the skipped ones.

    A source that breaks off (missing file, truncated tar) ends with one ``Item`` whose
    ``error`` says so; every item before it still comes out.
    """
    if src.path is None:
        for key, loc, text, *seg in src.items[start:]:
            item = _read_location(key, loc, text, f"{src.name}:{key}")
            yield _cut(item, *seg) if seg and item.audio is not None else item
        return
    yield from _read_tar(src, start)


def _read_location(key: str, loc: str, text: str | None, where: str) -> Item:
    if text is None:
        return Item(key, None, None, where, "missing_text")
    if bad_path(loc):
        return Item(key, text, None, where, "bad_path")
    if loc.endswith("|"):  # Kaldi pipe: a command whose stdout is the audio
        try:
            out = subprocess.run(loc[:-1], shell=True, capture_output=True, timeout=60, check=True)
        except (subprocess.SubprocessError, OSError, ValueError) as e:
            return Item(
                key, text, None, where, "pipe_failed" if not isinstance(e, FileNotFoundError) else "missing_file"
            )
        return Item(key, text, out.stdout, where)
    if is_url(loc):
        try:
            with open_binary(loc) as f:
                return Item(key, text, f.read(), where)
        except Exception as e:  # fsspec: ValueError for an unknown protocol, ImportError for a missing driver, ...
            return Item(key, text, None, where, _open_failure(e, loc))
    try:
        if ":" in Path(loc).name and not Path(loc).exists():  # ark:offset (Kaldi's wav-copy or kaldiio's arks)
            return _read_ark(key, loc, text, where)
        return Item(key, text, Path(loc).read_bytes(), where)
    except (OSError, ValueError) as e:
        return Item(key, text, None, where, _open_failure(e, loc))


def _open_failure(e: BaseException, path: str) -> str:
    """The bad-input reason for a file or URL that could not be opened or read."""
    if isinstance(e, FileNotFoundError):
        return "missing_file"
    if bad_path(path):
        return "bad_path"
    if is_url(path):
        return "remote_read_failed" if isinstance(e, OSError) else "unsupported_location"
    if isinstance(e, OSError) and e.errno != errno.ENAMETOOLONG:
        return "unreadable_file"
    return "bad_path"  # a NUL byte, or a name longer than any file's


def _read_ark(key: str, loc: str, text: str, where: str) -> Item:
    """Audio stored in a Kaldi archive at a byte offset (``file.ark:1234``), read with kaldiio."""
    from .audio import encode_wav  # torch: reading lists and shards does not need it

    try:
        import kaldiio
    except ImportError:
        return Item(key, text, None, where, "unsupported_location")
    if not Path(loc.rsplit(":", 1)[0]).exists():
        return Item(key, text, None, where, "missing_file")
    try:
        got = kaldiio.load_mat(loc)
    except Exception:  # kaldiio raises several types for a bad offset or a torn archive
        return Item(key, text, None, where, "undecodable_audio")
    if not isinstance(got, tuple):  # a feature matrix, not audio
        return Item(key, text, None, where, "unsupported_location")
    rate, samples = got
    return Item(key, text, encode_wav(samples, rate), where)


def _cut(item: Item, start: float, end: float | None) -> Item:
    """The item with its audio cut to ``[start, end)`` seconds (16-bit WAV of that stretch)."""
    from .audio import AudioError, cut  # torch: reading lists and shards does not need it

    try:
        item.audio = cut(item.audio, start, end)
    except AudioError as e:
        item.audio, item.error = None, e.reason
    return item


def _read_tar(src: Source, start: int) -> Iterator[Item]:
    """Group consecutive tar members by key prefix (WeNet's ``tar_file_and_group``)."""
    try:
        if bad_path(src.path):
            raise ValueError("a NUL byte in the path")
        f = open_binary(src.path)
    except Exception as e:  # a URL's opener raises its own kinds (see _read_location); a local file OSError
        if not (is_url(src.path) or isinstance(e, (OSError, ValueError))):
            raise
        if start == 0:  # the error counts as the source's item 0, so a seek past it skips it
            yield Item("", None, None, src.name, _open_failure(e, src.path))
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
            reason = "remote_read_failed" if isinstance(e, RemoteReadError) else "truncated_tar"
            yield Item("", None, None, f"{src.name} after {index} utterances ({e})", reason)

"""The lines of a data list, read and checked one by one: a WeNet shard list's paths, a raw list's and a NeMo
manifest's JSON objects, a Kaldi dir's ``wav.scp``, ``text`` and ``segments``. Any bytes in a line give either a
``DataError`` naming the file, the line and why, or an entry whose reading the loader skips and counts (a path
that names no file). :mod:`.sources` makes sources of what they say; :func:`list_entries` finds a line again for
a message about its item.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from ..errors import UsageError
from .remote import is_url


class DataError(UsageError, RuntimeError):
    """Bad input under the ``fail`` policy, or a data list that cannot be used at all (here, under everything
    that raises it; :mod:`.sources` shows it too)."""


class _LineError(ValueError):
    """Why one line of a list is not what its list holds."""


def list_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, line)`` of each non-blank line of the list ``path``, stripped: lines end at ``\\n`` only
    (a lone ``\\r`` is a byte inside its line, as an editor counts lines; a UTF-8 BOM is dropped). A line that
    is not UTF-8 is a ``DataError`` naming it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: the data list cannot be read ({e.strerror or e})") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    out = []
    for n, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise DataError(
                f"{path}:{n}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}: {shorten(repr(raw))})"
            ) from None
        if line:
            out.append((n, line))
    return out


def _json_object(line: str):
    """``line`` as a JSON object (dict), or None when it is anything else."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
        return None
    return obj if isinstance(obj, dict) else None


def _parse_object(line: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise _LineError(f"not JSON: {e}") from None
    except (ValueError, RecursionError) as e:
        raise _LineError(f"not JSON: {type(e).__name__}") from None
    if not isinstance(obj, dict):
        raise _LineError(f"a JSON {_json_type(obj)}, not an object")
    return obj


def _json_type(x) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(x), "number")


def _field(obj: dict, name: str, kinds: tuple, optional: bool = False):
    """``obj[name]`` when it is one of ``kinds`` (None where ``optional`` and absent or null)."""
    if name not in obj or obj[name] is None:
        if optional:
            return None
        raise _LineError(f"no {name!r}")
    x = obj[name]
    if isinstance(x, bool) or not isinstance(x, kinds):
        raise _LineError(f"{name!r} is a JSON {_json_type(x)}")
    return x


def _raw_item(line: str, list_path: Path) -> tuple:
    """A WeNet raw line: ``key``, ``wav``, ``txt`` and, for a stretch of a longer file, ``start``/``end`` (s)."""
    obj = _parse_object(line)
    key = _field(obj, "key", (str, int))
    wav = _field(obj, "wav", (str,))
    text = _field(obj, "txt", (str,), optional=True)
    start = _field(obj, "start", (int, float), optional=True)
    end = _field(obj, "end", (int, float), optional=True)
    return (str(key), resolve_path(wav, list_path), text, *_segment(start, end))


def list_items(path: Path, rows: list[tuple[int, str]]) -> list[tuple]:
    """The items ``(key, audio location, text[, start, end])`` of a raw list or a NeMo manifest (its first line
    tells which), from its ``rows`` (:func:`list_lines`); a line that is not one is a ``DataError`` naming it."""
    first = _json_object(rows[0][1])
    nemo = first is not None and "audio_filepath" in first
    what = "a NeMo manifest line with audio_filepath/text" if nemo else "a WeNet raw line with key/wav/txt"
    items = []
    for n, line in rows:
        try:
            items.append(_nemo_item(line, path) if nemo else _raw_item(line, path))
        except _LineError as e:
            raise DataError(f"{path}:{n}: not {what} ({e})") from None
    return items


def _segment(start, end) -> tuple:
    """``(start, end)`` in seconds for an utterance cut from a longer file; () for the whole file."""
    if start is None and end is None:
        return ()
    try:
        start, end = float(start or 0.0), (float(end) if end is not None else None)
    except (TypeError, ValueError, OverflowError) as e:
        raise _LineError(f"a segment's start and end are seconds ({e})") from None
    if not math.isfinite(start) or (end is not None and not math.isfinite(end)):
        raise _LineError(f"a segment needs finite seconds, not start={start}, end={end}")
    if start < 0 or (end is not None and end <= start):
        raise _LineError(f"a segment needs 0 <= start < end, not start={start}, end={end}")
    return (start, end)


def _nemo_item(line: str, list_path: Path) -> tuple:
    """A NeMo manifest line: the key from the file's name (and offset), the segment from offset/duration."""
    obj = _parse_object(line)
    audio_path = resolve_path(_field(obj, "audio_filepath", (str,)), list_path)
    text = _field(obj, "text", (str,), optional=True)
    offset = _field(obj, "offset", (int, float), optional=True)
    duration = _field(obj, "duration", (int, float), optional=True)
    if offset and duration is None:
        raise _LineError("an offset without a duration")
    seg = _segment(offset, float(offset) + float(duration)) if offset else ()
    key = Path(audio_path).stem + (f"-{float(offset):.2f}" if offset else "")
    return (key, audio_path, text, *seg)


def source_name(p: str) -> str:
    """A source's name: the last part of its path, control characters escaped and a name of more than 200
    characters cut (with its hash, to stay unique): it is shown in messages."""
    name = Path(p).name or p
    name = name if name.isprintable() else repr(name)[1:-1]
    if len(name) > 200:
        name = f"{name[:80]}...{hashlib.sha256(name.encode('utf-8', 'replace')).hexdigest()[:12]}"
    return name


def bad_path(p: str) -> bool:
    """Whether ``p`` can name no file at all (a NUL byte: no system call takes it)."""
    return "\x00" in p


def resolve_path(p: str, list_path: Path) -> str:
    """A path as given, or relative to the list's folder if that is where it exists. A path that cannot exist
    (a NUL byte, too long a name) stays as given: reading it is the item's failure, skipped and counted."""
    if bad_path(p) or is_url(p) or p.rstrip().endswith("|"):
        return p
    try:
        if Path(p).is_absolute() or Path(p).exists():
            return p
        beside = list_path.parent / p
        return str(beside) if beside.exists() else p
    except (OSError, ValueError):  # a name too long for the file system, ...
        return p


def kaldi_items(d: Path) -> list[tuple]:
    """The items ``(key, audio location, text[, start, end])`` of a Kaldi dir: one per recording of ``wav.scp``,
    or per utterance of ``segments`` where there is one."""
    scp, text = d / "wav.scp", d / "text"
    for f in (scp, text):
        if not f.exists():
            raise DataError(f"{d}: a Kaldi data dir needs {f.name}")
    texts = {}
    for _, line in list_lines(text):
        parts = line.split(maxsplit=1)
        texts[parts[0]] = parts[1] if len(parts) > 1 else ""
    wavs = {}
    for n, line in list_lines(scp):
        parts = line.split(maxsplit=1)
        if len(parts) != 2:
            raise DataError(f"{scp}:{n}: not 'recording location' ({shorten(repr(line))})")
        wavs[parts[0]] = resolve_path(parts[1], scp)
    items = []
    segments = d / "segments"
    if segments.exists():  # utterance, recording, start, end (s): utterances cut from longer recordings
        for n, line in list_lines(segments):
            parts = line.split()
            try:
                utt, rec, start, end = parts[0], parts[1], float(parts[2]), float(parts[3])
                items.append((utt, wavs[rec], texts.get(utt), *_segment(start, None if end < 0 else end)))
            except (IndexError, ValueError) as e:
                raise DataError(f"{segments}:{n}: not 'utterance recording start end' ({e})") from None
            except KeyError:
                raise DataError(f"{segments}:{n}: recording {parts[1]} is not in wav.scp") from None
    else:
        items = [(key, loc, texts.get(key)) for key, loc in wavs.items()]
    if not items:
        raise DataError(f"{scp}: no entries")
    return items


def list_entries(origin: str | Path) -> list[tuple[str, int, str]]:
    """``(file, line number, line)`` of each entry of a list or Kaldi dir, in the order
    :func:`~asrlab.data.sources.load_sources` reads them: a shard list's line is a source, a raw list's (or a
    Kaldi dir's) an item. [] if unreadable."""
    path = Path(origin)
    f = (path / "segments" if (path / "segments").exists() else path / "wav.scp") if path.is_dir() else path
    try:
        rows = list_lines(f)
    except DataError:
        return []
    if f.name == "wav.scp" and path.is_dir():  # one item per recording, where its key first appears
        first: dict[str, tuple[int, str]] = {}
        for n, ln in rows:
            if len(ln.split(maxsplit=1)) == 2:
                first.setdefault(ln.split()[0], (n, ln))
        rows = list(first.values())
    return [(str(f), n, ln) for n, ln in rows]


def shorten(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` characters (its end ``...``), to quote in a message."""
    return text if len(text) <= width else text[: width - 3] + "..."


__all__ = [
    "DataError",
    "bad_path",
    "kaldi_items",
    "list_entries",
    "list_items",
    "list_lines",
    "resolve_path",
    "shorten",
    "source_name",
]

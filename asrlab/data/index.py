"""A data list's index: what start-up needs to know about every utterance, read once and kept.

Before the first step a run needs, per utterance, its length (the pre-flight balance check, the LR
horizon, bucketing estimates) and its transcript (the tokenizer). Reading them means a pass over every
shard, several times, on every start. The index does that pass once: per source its stamp (a shard's
size and mtime; a raw chunk's files' sizes and mtimes) and per utterance its key, sample count, sample
rate and transcript, or why the loader would skip it. It is kept next to the list (``LIST.index.json``)
or, where the list's folder is not writable, under ``$ASRLAB_CACHE`` (default ``~/.cache/asrlab``).
A source whose stamp changed is indexed again, alone; the others are reused. Building runs one process
per source in parallel with a progress bar; ``asrlab index LIST`` builds it ahead of time.

Once :func:`use_index` has loaded an index, :func:`indexed` answers for its sources in this process,
and the readers that need lengths or transcripts (:func:`asrlab.data.preflight.source_stats`,
:func:`asrlab.data.sources.transcripts`) take them from there instead of the audio.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..files import atomic_write
from .remote import is_url, stamp_of
from .sources import Item, Source, check_item, corpus_specs, locate, no_usable_error, read_source

log = logging.getLogger(__name__)

VERSION = 1
_LOADED: dict[tuple, list] = {}  # source identity -> [stamp, its utterances, when the stamp was last checked]
RECHECK_S = 30.0  # a stamp checked this recently is trusted: checking a shard over HTTP costs a request


@dataclass(frozen=True)
class Utt:
    """One utterance as the index knows it; ``bad``: why the loader would skip it (None: usable)."""

    key: str
    samples: int
    rate: int
    text: str | None
    bad: str | None = None

    @property
    def seconds(self) -> float:
        return self.samples / self.rate if self.rate else 0.0


def _identity(src: Source) -> tuple:
    if src.path is not None:
        return src.name, src.path
    return src.name, src.items[0][0] if src.items else "", len(src.items)


def stamp(src: Source) -> tuple:
    """What changes when the source's data does: size and mtime of the shard, or of each raw file."""

    def of(path: str):
        if is_url(path):
            return stamp_of(path)
        try:
            st = os.stat(path)
            return (st.st_size, st.st_mtime_ns)
        except (OSError, ValueError):  # ValueError: a NUL byte in the path (the reader skips it: bad_path)
            return None

    if src.path is not None:
        return (of(src.path),)
    return tuple(
        (key, loc, of(loc) if not loc.endswith("|") else loc, text, *seg) for key, loc, text, *seg in src.items
    )


def index_source(src: Source) -> list[Utt]:
    """Read ``src`` once: every item's length from its audio header, its transcript, or why it is unusable."""
    return [
        Utt(item.key, samples, rate, item.text, bad)
        for item in read_source(src)
        for bad, samples, rate in [check_item(item)]
    ]


def index_path(list_path: str | Path) -> Path:
    """``LIST.index.json`` next to the list, or under the cache folder when the list's folder is read-only."""
    list_path = Path(list_path).resolve()
    beside = list_path.parent / f"{list_path.name}.index.json"
    if os.access(list_path.parent, os.W_OK):
        return beside
    cache = Path(os.environ.get("ASRLAB_CACHE", Path.home() / ".cache" / "asrlab")) / "index"
    return cache / f"{hashlib.sha256(str(list_path).encode()).hexdigest()[:16]}-{list_path.name}.index.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    if data.get("version") != VERSION:  # another layout: built again, not guessed at
        return {}
    return data.get("sources", {})


def _entry_key(src: Source) -> str:
    return json.dumps(_identity(src))


def use_index(
    list_path: str | Path,
    sources: list[Source],
    processes: int | None = None,
    progress: Callable | bool = True,
    write: bool = True,
    on_source: Callable | None = None,
) -> dict:
    """Load the index of ``list_path`` (its ``sources``), indexing the sources it lacks or whose stamp
    changed, in parallel; write it back and register it for :func:`indexed`. ``progress``: a tqdm bar
    (True), none (False), or a callable that makes one; ``on_source``: called as each source is indexed
    (a heartbeat's tick: a hang while indexing is a stall like any other). Returns a summary: path, sources, reused,
    indexed, utterances, usable, hours, skipped (what the loader would skip, by reason; lengths and
    vocabulary are the run's to check), seconds taken."""
    t0 = time.perf_counter()
    path = index_path(list_path)
    known = _read(path)
    stamps = [stamp(s) for s in sources]
    todo = [
        i
        for i, (s, st) in enumerate(zip(sources, stamps))
        if (e := known.get(_entry_key(s))) is None or tuple(map(_tuple, e["stamp"])) != st
    ]
    fresh: dict[int, list[Utt]] = {}
    if todo:
        make = progress if callable(progress) else (_tqdm if progress else _Quiet)
        bar = make(total=len(todo), desc=f"index {Path(list_path).name}", unit="source")
        n = processes or min(len(todo), os.cpu_count() or 1)
        try:
            if n <= 1 or len(todo) == 1:
                for i in todo:
                    fresh[i] = index_source(sources[i])
                    bar.update(1)
                    if on_source is not None:
                        on_source()
            else:
                with ProcessPoolExecutor(n) as pool:
                    for i, utts in zip(todo, pool.map(index_source, [sources[i] for i in todo])):
                        fresh[i] = utts
                        bar.update(1)
                        if on_source is not None:
                            on_source()
        finally:
            bar.close()
    entries = {}
    for i, (src, st) in enumerate(zip(sources, stamps)):
        utts = fresh[i] if i in fresh else [Utt(*u) for u in known[_entry_key(src)]["utts"]]
        entries[_entry_key(src)] = {"stamp": st, "utts": [[u.key, u.samples, u.rate, u.text, u.bad] for u in utts]}
        _LOADED[_identity(src)] = [st, utts, time.monotonic()]
    if todo and write:
        atomic_write(
            path, json.dumps({"version": VERSION, "list": str(Path(list_path).resolve()), "sources": entries})
        )  # sources gone from the list: dropped
    utts = [u for s in sources for u in _LOADED[_identity(s)][1]]
    usable = [u for u in utts if u.bad is None]
    return {
        "path": str(path),
        "sources": len(sources),
        "reused": len(sources) - len(todo),
        "indexed": len(todo),
        "utterances": len(utts),
        "usable": len(usable),
        "hours": sum(u.seconds for u in usable) / 3600,
        "skipped": dict(Counter(u.bad for u in utts if u.bad is not None)),
        "seconds": time.perf_counter() - t0,
    }


def use_indexes(
    data, sources: list[Source], progress: Callable | bool = True, write: bool = True, on_source: Callable | None = None
) -> list[dict]:
    """:func:`use_index` for each list of ``data`` (one list, or several mixed: its sources are the
    ones of that corpus); returns their summaries."""
    specs = corpus_specs(data)
    return [
        use_index(
            path,
            [s for s in sources if s.corpus == name] if len(specs) > 1 else sources,
            progress=progress,
            write=write,
            on_source=on_source,
        )
        for name, path, _ in specs
    ]


def indexed(src: Source, recheck_s: float = RECHECK_S) -> list[Utt] | None:
    """The utterances of ``src`` from an index loaded in this process, while its stamp still holds
    (checked again when the last check is more than ``recheck_s`` old)."""
    got = _LOADED.get(_identity(src))
    if got is None:
        return None
    st, utts, checked = got
    if time.monotonic() - checked > recheck_s:
        if st != stamp(src):
            return None
        got[2] = time.monotonic()
    return utts


def share(source: Source, piece: Source, start: int) -> None:
    """``piece`` (``source.items[start:start + len(piece.items)]``, cut by :func:`asrlab.data.plan.fed`) knows
    its utterances from its source's index, where one is loaded."""
    got = _LOADED.get(_identity(source))
    if got is not None and source.items:
        st, utts, checked = got
        end = start + len(piece.items)
        _LOADED[_identity(piece)] = [st[start:end], utts[start:end], checked]


def header_items(src: Source, start: int = 0):
    """Items of ``src`` from ``start`` on, as the loader plans with them (length, transcript, or why it is
    unusable; no audio): from the index where one is loaded, else read."""
    utts = indexed(src)
    if utts is None:
        yield from read_source(src, start)
        return
    for u in utts[start:]:
        error = None if u.bad in (None, "empty_text") else u.bad  # an empty text the loader finds itself
        yield Item(u.key, u.text, None, f"{src.name}:{u.key}", error, u.samples, u.rate)


def transcripts(sources: list[Source]):
    """The non-empty transcripts of ``sources``, from the index where one is loaded, else read.

    What the vocabulary is built from, so the place to find that nothing is usable: a ``DataError`` at the end,
    naming each unusable line and why, instead of a one-unit vocabulary failing somewhere later."""
    usable, bad = False, []
    for i, src in enumerate(sources):
        utts = indexed(src)
        rows = (
            ((u.key, u.text, u.bad) for u in utts)
            if utts is not None
            else ((item.key, item.text, check_item(item)[0] if not usable else None) for item in read_source(src))
        )
        for k, (key, text, reason) in enumerate(rows):
            if not usable:
                if reason is None:
                    usable = True
                else:
                    bad.append((i, k, key, reason))
            if text:
                yield text
    if not usable and bad:
        raise no_usable_error(locate(sources, bad))


def forget() -> None:
    """Drop the indexes loaded in this process (readers go back to the audio)."""
    _LOADED.clear()


def _tuple(x):
    return tuple(_tuple(y) for y in x) if isinstance(x, list) else x


class _Quiet:
    def __init__(self, **kw):
        pass

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _tqdm(**kw):
    from tqdm.auto import tqdm

    return tqdm(**kw)


__all__ = [
    "Utt",
    "forget",
    "header_items",
    "index_path",
    "index_source",
    "indexed",
    "stamp",
    "transcripts",
    "use_index",
    "use_indexes",
]

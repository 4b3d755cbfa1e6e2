"""A run's data, checked before any work: enough sources for the ranks, the tokenizer, the pre-flight layout."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Iterator

from ..lab import layout
from ..data.config import DataConfig
from ..data.loader import AsrLoader
from ..data.index import transcripts, use_indexes
from ..data.preflight import inspect_layout
from ..data.plan import fed
from ..data.sources import DataError, Source, load_data, load_sources
from ..data.tokenizer import CharTokenizer
from ..lab import dist

log = logging.getLogger(__name__)


def load_train_sources(data: str | list, raw_chunk: int, world_size: int, uneven: str) -> list[Source]:
    """The training sources (one list, or several mixed: :func:`asrlab.data.sources.corpus_specs`); an
    error when some rank would get none (unless ``uneven`` is ``join``)."""
    sources = load_data(data, raw_chunk)
    if len(fed(sources, world_size)) < world_size and uneven != "join":  # a list of items is cut to feed every rank
        raise DataError(
            f"{data}: {len(sources)} source(s) for {world_size} ranks, so {world_size - len(sources)} of them get no "
            "data and "
            + ("no rank would ever take a step" if uneven == "stop" else "the first all-reduce would hang")
            + ": write smaller shards (asrlab synth --shard-size), use fewer ranks, or let the others train alone "
            "(--uneven join)"
        )
    return sources


def index_sources(
    data: str | list, sources: list[Source], info: dist.DistInfo, progress: bool = False, on_source=None
) -> None:
    """Load the index of each of ``data``'s lists (:mod:`asrlab.data.index`), indexing what is new or
    changed: rank 0 first (in parallel, writing it), then the others read what it wrote."""

    def run(write: bool) -> None:
        for s in use_indexes(data, sources, progress=progress, write=write, on_source=on_source):
            log.info(
                "index %s: %d sources (%d reused, %d indexed), %d utterances, %.1f h usable, %.1f s",
                s["path"],
                s["sources"],
                s["reused"],
                s["indexed"],
                s["utterances"],
                s["hours"],
                s["seconds"],
            )

    if info.is_main:
        run(True)
    dist.barrier(info)
    if not info.is_main:
        run(False)


def build_tokenizer(exp: Path, sources: list[Source], info: dist.DistInfo, shared: bool = True) -> CharTokenizer:
    """The experiment's ``units.txt``: made from the training transcripts on first start, reused after;
    rank 0's, sent to every rank whose node has an ``EXP`` of its own (not ``shared``)."""
    units = exp / layout.UNITS
    if info.is_main and not units.exists():
        CharTokenizer.build(transcripts(sources)).save(units)
    if not shared:
        text = dist.broadcast_object(units.read_text(encoding="utf-8") if info.is_main else None, info)
        if not units.exists() or units.read_text(encoding="utf-8") != text:
            units.write_text(text, encoding="utf-8")
    dist.barrier(info)
    return CharTokenizer.load(units)


def epoch_batches(sources: list[Source], d: DataConfig, world_size: int) -> int:
    """The fewest batches any rank gets in an epoch, as the pre-flight layout estimates them."""
    return min(r["batches"] for r in inspect_layout(sources, d, world_size, d.num_workers)["ranks"])


def preflight(d: DataConfig, sources: list[Source], world_size: int, uneven: str) -> None:
    """Warn, before any step, when this epoch's data will leave a rank short (and what ``uneven`` does then)."""
    layout = inspect_layout(sources, d, world_size, d.num_workers)
    for w in layout["warnings"]:
        log.warning("pre-flight: %s", w)
    if any(r["batches"] != layout["ranks"][0]["batches"] for r in layout["ranks"]):
        log.warning(
            "pre-flight: uneven=%s: %s",
            uneven,
            {
                "stop": "all ranks will stop this epoch when the first one runs out",
                "join": "ranks that run out will shadow the others' all-reduces (DDP Join)",
                "none": "UNPROTECTED: this epoch will hang; the stall watchdog will stop it",
            }[uneven],
        )


def start_data(
    d: DataConfig,
    data,
    cv: str | None,
    train_sources: list[Source],
    exp: Path,
    info: dist.DistInfo,
    shared: bool,
    hb,
    progress: bool = False,
    check_layout: str | None = None,
) -> tuple[CharTokenizer, AsrLoader, AsrLoader | None]:
    """A run's data before its first step: the index (each source indexed is a tick of the heartbeat
    ``hb``; a bar with ``progress``), the tokenizer, the training and validation loaders (``hb``
    describes the first's position in stall reports) and, with ``check_layout`` (the uneven-data policy),
    the pre-flight check."""
    if d.index:  # lengths and transcripts for start-up from the index, not from every shard
        show = progress and info.is_main and (sys.stderr.isatty() or "ipykernel" in sys.modules)
        index_sources(data, train_sources, info, progress=show, on_source=hb.tick)
    cv_sources = load_sources(cv, d.raw_chunk) if cv else None
    tok = build_tokenizer(exp, train_sources, info, shared)
    loader = AsrLoader(train_sources, tok, d, info.rank, info.world_size)
    hb.describe = loader.where
    if check_layout and info.is_main and info.world_size > 1:
        preflight(d, train_sources, info.world_size, check_layout)
    cv_loader = AsrLoader(cv_sources, tok, d.for_eval(), info.rank, info.world_size) if cv_sources else None
    return tok, loader, cv_loader


def skip_batches(it: Iterator[dict], n: int) -> Iterator[dict]:
    """``it`` without its first ``n`` items (a generator, so ``close()`` stops the loader under it)."""
    for i, x in enumerate(it):
        if i >= n:
            yield x


__all__ = [
    "build_tokenizer",
    "epoch_batches",
    "index_sources",
    "load_train_sources",
    "preflight",
    "skip_batches",
    "start_data",
]

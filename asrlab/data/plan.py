"""How an epoch is planned: which sources each rank and worker reads (each corpus shuffled and dealt on its
own), how a shuffle block's items are ordered and cut into batches, and how corpora interleave by weight.
Each is a pure function of the config, the epoch and the seed, so a resume plans the very same batches."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from . import index
from .config import DataConfig
from .sources import Source


def batch_sizes(frames: list[int], cfg: DataConfig) -> list[int]:
    """Cut a sequence of utterance lengths (frames) into batches; returns the batch sizes.

    Dynamic batches keep (utterances x longest) <= max_frames_in_batch, as WeNet does (or the limit
    ``max_frames_by_length`` gives for the batch's longest utterance).
    """
    sizes: list[int] = []
    n, longest = 0, 0
    for f in frames:
        if cfg.batch_type == "static":
            full = n == cfg.batch_size
        else:
            t = max(longest, f)
            full = n > 0 and (n + 1) * t > cfg.frame_limit(t)
        if full:
            sizes.append(n)
            n, longest = 0, 0
        n, longest = n + 1, max(longest, f)
    if n:
        sizes.append(n)
    return sizes


def batching_order(frames: list[int], cfg: DataConfig) -> list[int]:
    """The order a shuffle block's items (lengths ``frames``, already shuffled) are cut into batches in:
    the whole block sorted by length (``bucketing``: each batch holds neighbouring lengths), sorted in
    windows of ``sort_size`` (WeNet's), or as they are. Ties keep their shuffled order."""
    idx = list(range(len(frames)))
    if cfg.bucketing:
        return sorted(idx, key=frames.__getitem__)
    if cfg.sort_size > 0:
        return [
            i
            for s in range(0, len(idx), cfg.sort_size)
            for i in sorted(idx[s : s + cfg.sort_size], key=frames.__getitem__)
        ]
    return idx


def epoch_sources(sources: list[Source], epoch: int, cfg: DataConfig) -> list[Source]:
    """The epoch's source order (shuffled with ``(seed, epoch)`` when ``cfg.shuffle``)."""
    if not cfg.shuffle:
        return list(sources)
    perm = np.random.default_rng([cfg.seed, epoch]).permutation(len(sources))
    return [sources[i] for i in perm]


def deal(sources: list[Source], rank: int, world_size: int, worker: int, num_workers: int) -> list[Source]:
    """The sources of (rank, worker): every ``world_size``-th one to the rank, then every ``num_workers``-th
    of those to the worker (WeNet's order), so each goes to exactly one and ranks differ by at most one
    source. (Dealing to rank x worker slots instead would give 40 shards on 8 ranks x 4 workers as 8, 8, 4, ... 4.)"""
    return sources[rank::world_size][worker::num_workers]


def fed(sources: list[Source], slots: int) -> list[Source]:
    """``sources`` cut finer where there are fewer of them than ``slots`` (ranks x workers), so that every
    rank and worker gets one to read: a source of items (a raw list's, a manifest's, a Kaldi dir's chunk) is
    cut into contiguous pieces; a tar shard stays whole (its readers would each read all of it). The cut
    depends on the layout only, so a resume on the same layout reads the same pieces; another layout
    resumes by the keys already trained (the loader's elastic resume)."""
    if len(sources) >= slots or not any(s.items for s in sources):
        return sources
    per = math.ceil(slots / len(sources))
    out = []
    for src in sources:
        if not src.items:
            out.append(src)
            continue
        size = math.ceil(len(src.items) / min(per, len(src.items)))
        for a in range(0, len(src.items), size):
            items = src.items[a : a + size]
            piece = replace(src, name=f"{src.name}[{a}:{a + len(items)}]", items=items)
            index.share(src, piece, a)
            out.append(piece)
    return out


def corpora(sources: list[Source]) -> list[list[Source]]:
    """``sources`` grouped by corpus, in the order the corpora first appear (one group without a mix)."""
    groups: dict[str, list[Source]] = {}
    for src in sources:
        groups.setdefault(src.corpus, []).append(src)
    return list(groups.values())


def worker_streams(
    sources: list[Source], epoch: int, cfg: "DataConfig", rank: int, world_size: int, worker: int, num_workers: int
) -> list[list[Source]]:
    """The sources (rank, worker) reads this epoch, per corpus: each corpus shuffled and dealt on its own,
    so every rank and worker gets its share of each."""
    return [
        deal(
            fed(epoch_sources(group, epoch, cfg), world_size * max(1, num_workers)),
            rank,
            world_size,
            worker,
            num_workers,
        )
        for group in corpora(sources)
    ]


def mix_counts(batches: list[dict]) -> dict | None:
    """Per corpus, what ``batches`` (or metrics lines, which log the same) hold:
    ``{corpus: [utterances, audio seconds, worker seconds]}`` (None
    without a mix). Worker seconds are the loader's time reading and decoding them, so audio seconds
    over worker seconds is a corpus's throughput per loader worker."""
    total: dict[str, list] = {}
    for b in batches:
        for name, (n, audio_s, load_s) in (b.get("corpora") or {}).items():
            t = total.setdefault(name, [0, 0.0, 0.0])
            t[0] += n
            t[1] += audio_s
            t[2] += load_s
    return {k: [n, round(a, 3), round(w, 4)] for k, (n, a, w) in total.items()} or None


MUX = 2**32 - 1  # marks the RNG that draws a block's corpora apart from the block's other RNGs


def draw_corpus(live: list[int], weights: list[float], u: float) -> int:
    """The corpus of ``live`` that ``u`` (uniform in [0, 1)) falls on, by weight."""
    total = sum(weights[k] for k in live)
    acc = 0.0
    for k in live:
        acc += weights[k] / total
        if u < acc:
            return k
    return live[-1]


def corpus_throughput(lines: list[dict]) -> dict | None:
    """Per corpus of a mixed run, over every rank's metrics (the steps that count): utterances, audio
    hours, and audio seconds per second of loader work (reading and decoding), the slowest named: a
    corpus far slower than the rest starves the ranks that draw it. ``lines``: every rank's metrics lines of the
    steps that count. None for a run on one list."""
    total = mix_counts(lines)
    if not total:
        return None
    out = {
        c: {"utts": n, "hours": round(a / 3600, 4), "audio_per_load_s": round(a / w, 1) if w > 0 else None}
        for c, (n, a, w) in sorted(total.items())
    }
    rated = [c for c in out if out[c]["audio_per_load_s"]]
    return {"corpora": out, "slowest": min(rated, key=lambda c: out[c]["audio_per_load_s"]) if len(rated) > 1 else None}

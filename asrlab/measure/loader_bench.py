"""Loader benchmarks: throughput per setting, WebDataset side by side, the features-only ceiling,
and what shard compression costs.

Numbers are wall-clock throughput of a whole epoch (or ``max_batches``) on this machine; the
README quotes them with the command that made them.
"""

from __future__ import annotations

import itertools
import tempfile
from collections import Counter
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ..data import audio
from ..data.loader import AsrLoader
from ..data.config import DataConfig
from ..data.features import FBANKS
from ..data.shards import COMPRESSIONS, compress, tar_bytes
from ..data.sources import Source, bad_input, check_item, iter_items, read_source
from ..data.tokenizer import CharTokenizer
from ..errors import UsageError


def _measure(batches, max_batches: int | None) -> dict:
    """Drain ``batches``: throughput over the whole run, the time to the first batch (start-up:
    worker processes, the first block's read), and the steady throughput after it."""
    t0 = time.perf_counter()
    n = utts = frames = 0
    t_first, first_frames = None, 0
    for b in itertools.islice(batches, max_batches):
        n += 1
        utts += len(b["feat_lens"])
        frames += int(b["feat_lens"].sum())
        if t_first is None:
            t_first, first_frames = time.perf_counter(), frames
    end = time.perf_counter()
    dt, steady = end - t0, end - (t_first or t0)
    return {
        "batches": n,
        "utts": utts,
        "seconds": round(dt, 3),
        "utts_per_s": round(utts / dt, 1),
        "audio_s_per_s": round(frames / 100.0 / dt, 1),
        "batches_per_s": round(n / dt, 2),
        "first_batch_s": round((t_first or end) - t0, 3),
        "steady_audio_s_per_s": round((frames - first_frames) / 100.0 / steady, 1) if steady > 0 else None,
    }


def _usable(sources: list[Source], cfg: DataConfig, skipped: Counter):
    """Items read whole whose audio header reads, as the loader would take them; the others follow
    ``cfg.bad_input`` (counted by reason in ``skipped``, or a ``DataError``)."""
    for item in iter_items(sources):
        reason = check_item(item)[0]
        if reason is None:
            yield item
        else:
            bad_input(item.where, reason, cfg.bad_input, skipped)


def bench_asrlab(sources: list[Source], tok: CharTokenizer, cfg: DataConfig, max_batches: int | None = None) -> dict:
    return _measure(iter(AsrLoader(sources, tok, cfg)), max_batches)


def bench_webdataset(
    sources: list[Source], tok: CharTokenizer, cfg: DataConfig, max_batches: int | None = None
) -> dict:
    """The same shards through WebDataset with the same decode, fbank, shuffle and static batches."""
    return _measure(iter(webdataset_loader(sources, tok, cfg)), max_batches)


def webdataset_loader(sources: list[Source], tok: CharTokenizer, cfg: DataConfig, fbank=None) -> DataLoader:
    """A WebDataset pipeline over the shards of ``sources``: asrlab's decode, ``fbank`` (default: the
    config's, ``data.fbank``), the config's shuffle buffer and static batches of ``cfg.batch_size``."""
    import webdataset as wds

    make = fbank or FBANKS[cfg.fbank]

    def features(sample):
        wav, sr = audio.decode(sample["wav"])
        wav = audio.resample(wav, sr, cfg.sample_rate)
        f = make(wav, cfg.sample_rate, cfg.num_mel_bins, cfg.frame_length_ms, cfg.frame_shift_ms, cfg.dither)
        return f, torch.tensor(tok.encode(sample["txt"].decode("utf-8").strip()))

    def collate(samples):
        feats, targets = zip(*samples)
        return {
            "feats": torch.nn.utils.rnn.pad_sequence(feats, batch_first=True),
            "feat_lens": torch.tensor([len(f) for f in feats]),
            "targets": torch.nn.utils.rnn.pad_sequence(targets, batch_first=True),
        }

    urls = [s.path for s in sources if s.path]
    if len(urls) != len(sources):
        raise UsageError("the WebDataset comparison needs a shard list (not raw or Kaldi)")
    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False, workersplitter=wds.split_by_worker)
        .shuffle(cfg.shuffle_size if cfg.shuffle else 0)
        .map(features)
        .batched(cfg.batch_size, collation_fn=collate, partial=True)
    )
    return DataLoader(
        ds,
        batch_size=None,
        num_workers=cfg.num_workers,
        prefetch_factor=cfg.prefetch_factor if cfg.num_workers else None,
    )


def features_ceiling(sources: list[Source], cfg: DataConfig, max_utts: int = 2000, repeats: int = 3) -> dict:
    """Fbank alone on audio already decoded in memory: the most a loader could deliver on one core.

    The best of ``repeats`` timed passes; compare loaders with it in audio seconds/s, which does
    not depend on which utterances the ceiling used.
    """
    skipped: Counter = Counter()
    wavs = []
    for item in itertools.islice(_usable(sources, cfg, skipped), max_utts):
        try:
            wavs.append(audio.resample(*audio.decode(item.audio), cfg.sample_rate))
        except audio.AudioError as e:  # a header that reads over samples that do not
            bad_input(item.where, e.reason, cfg.bad_input, skipped)

    def fbank(w):
        return audio.fbank(w, cfg.sample_rate, cfg.num_mel_bins, cfg.frame_length_ms, cfg.frame_shift_ms, cfg.dither)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a loader worker computes on one thread
    try:
        for w in wavs[:20]:  # warm-up: first calls pay one-time set-up
            fbank(w)
        dt = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            frames = sum(len(fbank(w)) for w in wavs)
            dt = min(dt, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return {
        "utts": len(wavs),
        "seconds": round(dt, 3),
        "utts_per_s": round(len(wavs) / dt, 1),
        "audio_s_per_s": round(frames / 100.0 / dt, 1),
        "skipped": dict(skipped),
    }


def sweep(
    sources: list[Source],
    tok: CharTokenizer,
    cfg: DataConfig,
    num_workers=(0, 1, 2),
    prefetch=(2,),
    batch=(None,),
    max_batches: int | None = None,
    against: str | None = None,
    progress=None,
) -> list[dict]:
    """One row per (num_workers, prefetch_factor, batch) setting; ``batch`` values are
    utterances for static batching, None keeps the config's batching."""
    rows = []
    for nw, pf, bs in itertools.product(num_workers, prefetch, batch):
        if nw == 0 and pf != prefetch[0]:
            continue  # prefetch means nothing without workers
        c = replace(
            cfg, num_workers=nw, prefetch_factor=pf, **({"batch_type": "static", "batch_size": bs} if bs else {})
        )
        row = {"num_workers": nw, "prefetch": pf if nw else None, "batch": bs or c.batch_type}
        row["asrlab"] = bench_asrlab(sources, tok, c, max_batches)
        if against == "webdataset":
            c_static = c if bs else replace(c, batch_type="static")
            row["webdataset"] = bench_webdataset(sources, tok, c_static, max_batches)
            row["ratio"] = round(row["asrlab"]["utts_per_s"] / row["webdataset"]["utts_per_s"], 3)
        rows.append(row)
        if progress:
            progress(row)
    return rows


def compression_cost(
    sources: list[Source], tok: CharTokenizer, cfg: DataConfig, compressions=COMPRESSIONS, max_utts: int = 1000
) -> list[dict]:
    """Re-pack up to ``max_utts`` utterances in each compression; size, read cost and loader speed.

    ``read_ms_per_utt``: decompress + untar only; ``loader_ms_per_utt``: the whole pipeline
    (num_workers=0, so the cost is not hidden behind other processes).
    """
    members, skipped = [], Counter()
    for item in itertools.islice(_usable(sources, cfg, skipped), max_utts):
        members += [(f"{item.key}.txt", item.text.encode()), (f"{item.key}.wav", item.audio)]
    plain = tar_bytes(members)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for comp in ("none", *compressions):  # the first pass is a warm-up, not reported
            path = Path(tmp) / f"bench.tar.{comp}"
            path.write_bytes(compress(plain, comp))
            src = [Source(name=path.name, path=str(path))]
            t0 = time.perf_counter()
            count = sum(1 for _ in read_source(src[0]))
            read_s = time.perf_counter() - t0
            run = bench_asrlab(src, tok, replace(cfg, num_workers=0))
            rows.append(
                {
                    "compression": comp,
                    "utts": count,
                    "mb": round(path.stat().st_size / 1e6, 2),
                    "ratio": round(len(plain) / path.stat().st_size, 2),
                    "read_ms_per_utt": round(1000 * read_s / count, 3),
                    "loader_ms_per_utt": round(1000 * run["seconds"] / max(1, run["utts"]), 3),
                }
            )
    return rows[1:]

"""The streaming loader: sources dealt to ranks then workers, block shuffle, sort windows, batches.

It mirrors WeNet's pipeline (shard list -> tar groups -> decode -> shuffle buffer -> sort
buffer -> batch), with one change that makes it *know where it is*: each worker reads its
sources in blocks of ``shuffle_size`` items, and everything random about a block (its shuffle,
its SpecAugment masks) is drawn from an RNG seeded by ``(seed, epoch, worker, block)``. A
position is therefore just ``(epoch, source, offset, block, batch)``: resuming seeks to the
block's first item and skips the block's consumed batches, re-reading at most one block
whatever the position in the epoch, and the batches that follow are the very same.

Features are computed per batch, after batching (lengths for sorting come from the audio
headers), so skipping consumed batches on resume costs I/O only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from . import audio, faults
from .config import DataConfig
from .features import FBANKS
from .index import header_items
from .plan import MUX, batch_sizes, batching_order, corpora, draw_corpus, worker_streams
from .sources import DataError, Item, Source, bad_input, read_source
from .tokenizer import CharTokenizer

log = logging.getLogger(__name__)

STATE_VERSION = 1  # of AsrLoader.state_dict(); a state without one has this layout (written before it was recorded)
_STATE_KEYS = ("epoch", "positions", "next_worker", "num_workers", "world_size")


def checked_state(state: dict) -> dict:
    """``state`` if it is a loader state this asrlab understands, else a ValueError that says why (a newer
    asrlab's state, or another loader's): a resume must not guess at a position."""
    if not isinstance(state, dict):
        raise ValueError(f"not a loader state of asrlab's AsrLoader: {type(state).__name__}")
    version = state.get("version", STATE_VERSION)
    if version != STATE_VERSION:
        raise ValueError(f"a loader state of version {version!r}; this asrlab reads version {STATE_VERSION}")
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        raise ValueError(f"not a loader state of asrlab's AsrLoader (it has no {', '.join(missing)})")
    return state


@dataclass
class Position:
    """Where one worker is in its epoch: the next batch is batch ``batch`` of block ``block``,
    which starts at item ``offset`` of the worker's source number ``source``.

    ``skipped`` counts bad input by reason, this epoch, up to here.
    """

    epoch: int = 0
    source: int = 0
    offset: int = 0
    block: int = 0
    batch: int = 0
    skipped: dict | None = None
    done: bool = False


class AsrDataset(IterableDataset):
    """Batches for one rank. Use it through ``AsrLoader``, which tracks the consumed position."""

    def __init__(
        self, sources: list[Source], tokenizer: CharTokenizer, cfg: DataConfig, rank: int = 0, world_size: int = 1
    ):
        if not sources:
            raise DataError("no data: the data list has no sources")
        self.sources, self.tokenizer, self.cfg = sources, tokenizer, cfg
        self.exclude: frozenset = frozenset()  # keys consumed this epoch under another layout (elastic resume)
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.positions: dict[int, Position] = {}  # logical worker -> where to start
        self.rotate = 0  # physical DataLoader worker w plays logical worker (w + rotate) % W
        groups = corpora(sources)
        self.mixed = len(groups) > 1
        self.weights = [g[0].weight for g in groups]

    @property
    def num_workers(self) -> int:
        return max(1, self.cfg.num_workers)

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        physical = info.id if info is not None else 0
        worker = (physical + self.rotate) % self.num_workers
        pos = self.positions.get(worker, Position(epoch=self.epoch))
        if pos.epoch != self.epoch:
            pos = Position(epoch=self.epoch)
        yield from faults.delayed(self._batches(self.streams(worker), worker, pos), self.cfg, self.rank)

    def streams(self, worker: int) -> list[list[Source]]:
        """The sources a worker reads this epoch, per corpus (:func:`worker_streams`)."""
        return worker_streams(self.sources, self.epoch, self.cfg, self.rank, self.world_size, worker, self.num_workers)

    def _start(self, pos: Position, n: int) -> tuple[list[int], list[int]]:
        """A position's (source, offset) per corpus."""
        if isinstance(pos.source, list):
            if len(pos.source) != n:
                raise ValueError(f"a loader position for {len(pos.source)} corpora, this data has {n}")
            return list(pos.source), list(pos.offset)
        if n > 1 and (pos.source, pos.offset) != (0, 0):
            raise ValueError(f"a loader position for one data list, this data mixes {n}")
        return [pos.source] * n, [pos.offset] * n

    @staticmethod
    def _packed(src: list[int], off: list[int]) -> tuple:
        """(source, offset) as a position holds them: numbers for one corpus, lists for a mix."""
        return (src[0], off[0]) if len(src) == 1 else (list(src), list(off))

    # -- one worker's stream -------------------------------------------------------------
    def _blocks(
        self,
        streams: list[list[Source]],
        src: list[int] | None = None,
        off: list[int] | None = None,
        block: int = 0,
        g: int = 0,
        headers: bool = False,
    ):
        """A worker's items in shuffle blocks: ``(start, end, items)``, start and end as (source, offset)
        lists, one entry per corpus. In a mix each item comes from a corpus drawn by weight among those
        with items left (drawn with the block's RNG, so a block read again holds the same items), as
        lhotse's ``mux`` does; keys are qualified by the corpus. ``headers``: lengths without audio, from
        the index where one is loaded (for planning only)."""
        read = header_items if headers else read_source
        n = len(streams)
        src, off = list(src or [0] * n), list(off or [0] * n)
        its: list = [None] * n
        clock = time.perf_counter
        while True:
            start = (list(src), list(off))
            items: list[Item] = []
            live = [k for k in range(n) if src[k] < len(streams[k])]
            mux = np.random.default_rng([self.cfg.seed, self.epoch, g, block, MUX]) if self.mixed else None
            while len(items) < self.cfg.shuffle_size and live:
                k = live[0] if mux is None else draw_corpus(live, self.weights, mux.random())
                if its[k] is None:
                    its[k] = read(streams[k][src[k]], off[k])
                t0 = clock() if mux is not None else 0.0
                item = next(its[k], None)
                if item is None:
                    src[k], off[k], its[k] = src[k] + 1, 0, None
                    if src[k] >= len(streams[k]):
                        live.remove(k)
                    continue
                off[k] += 1
                if mux is not None:
                    corpus = streams[k][src[k]].corpus
                    item.key, item.where, item.corpus = f"{corpus}/{item.key}", f"{corpus}/{item.where}", corpus
                    item.load_s = clock() - t0
                if item.key not in self.exclude:
                    items.append(item)
            if not items:
                return
            yield start, (list(src), list(off)), items
            block += 1

    def plan(self, worker: int = 0, sources: list[list[Source]] | None = None) -> Iterator[list[list[Item]]]:
        """The batches (lists of items) of each shuffle block a worker serves this epoch, planned from
        the item headers (no decoding), block by block; bad input left out. ``sources``: the worker's,
        per corpus (default: :meth:`streams`)."""
        streams = self.streams(worker) if sources is None else sources
        g = self.rank * self.num_workers + worker
        for block, (_, _, items) in enumerate(self._blocks(streams, g=g, headers=True)):
            yield self._plan_block(items, np.random.default_rng([self.cfg.seed, self.epoch, g, block]), Counter())

    def consumed(self, sources: list[list[Source]], worker: int, pos: Position) -> set[str]:
        """The keys of the batches a worker served before ``pos``, planned again from the item headers
        (no decoding): what an elastic resume must leave out of the rest of the epoch."""
        keys: set[str] = set()
        for block, plan in enumerate(self.plan(worker, sources)):
            if not pos.done and block > pos.block:
                break
            for batch_items in plan if pos.done or block < pos.block else plan[: pos.batch]:
                keys.update(item.key for item in batch_items)
        return keys

    def _batches(self, sources: list[list[Source]], worker: int, pos: Position) -> Iterator[dict]:
        cfg = self.cfg
        g = self.rank * self.num_workers + worker  # global worker id, seeds this worker's RNGs
        block = pos.block
        resume_batch, resume_skipped = pos.batch, Counter(pos.skipped or {})
        skipped = Counter(resume_skipped)
        first = self._start(pos, len(sources))
        for start, (src_i, offset), items in [] if pos.done else self._blocks(sources, *first, block, g):
            rng = np.random.default_rng([cfg.seed, self.epoch, g, block])
            plan = self._plan_block(items, rng, skipped)
            if resume_batch:  # resuming inside this block: its first batches were consumed
                skipped = Counter(resume_skipped)
            for b, batch_items in enumerate(plan):
                if b < resume_batch:
                    continue
                batch = self._collate(batch_items, np.random.default_rng([cfg.seed, self.epoch, g, block, b]), skipped)
                last = b + 1 == len(plan)
                nxt = (
                    Position(self.epoch, *self._packed(src_i, offset), block + 1, 0)
                    if last
                    else Position(self.epoch, *self._packed(*start), block, b + 1)
                )
                nxt.skipped = dict(skipped)
                if batch is not None:
                    batch["worker"], batch["pos"] = worker, asdict(nxt)
                    yield batch
            resume_batch = 0
            block += 1

    def _bad(self, item: Item, reason: str, skipped: Counter) -> None:
        bad_input(item.where, reason, self.cfg.bad_input, skipped)
        log.debug("skipping %s: %s", item.where, reason)

    def _plan_block(self, items: list[Item], rng: np.random.Generator, skipped: Counter) -> list[list]:
        """Check items from their headers, shuffle, sort (:func:`batching_order`), cut into batches."""
        cfg = self.cfg
        good = []
        for item in items:
            reason = item.error or self._check_text(item.text)
            if reason is None:
                try:
                    if item.samples is not None:  # from the index (a plan made without the audio)
                        samples, sr = item.samples, item.rate
                    else:
                        samples, sr = audio.audio_info(item.audio)
                except audio.AudioError as e:
                    reason = e.reason
                else:
                    reason = self._check_length(samples, sr)
            if reason is not None:
                self._bad(item, reason, skipped)
                continue
            good.append((item, samples, sr))
        if cfg.speed_perturb:  # drawn with the block's RNG before its shuffle: a resume plans the same speeds
            for (item, _, _), speed in zip(good, rng.choice(cfg.speed_perturb, size=len(good))):
                item.speed = float(speed)
        good = [(item, cfg.frames(samples, sr, item.speed)) for item, samples, sr in good]
        if cfg.shuffle:
            good = [good[i] for i in rng.permutation(len(good))]
        good = [good[i] for i in batching_order([f for _, f in good], cfg)]
        plan, s = [], 0
        for n in batch_sizes([f for _, f in good], cfg):
            plan.append([it for it, _ in good[s : s + n]])
            s += n
        if cfg.bucketing and cfg.shuffle:  # else the batches would run from short to long through the block
            plan = [plan[i] for i in rng.permutation(len(plan))]
        return plan

    def _check_text(self, text: str | None) -> str | None:
        if not text:
            return "empty_text"
        if self.tokenizer.oov(text):
            return "oov_text"
        return None

    def _check_length(self, samples: int, sr: int) -> str | None:
        if samples == 0:
            return "empty_audio"
        if sr != self.cfg.sample_rate and not self.cfg.resample:
            return "sample_rate"
        seconds = samples / sr
        if seconds < self.cfg.min_duration_s:
            return "too_short"
        if seconds > self.cfg.max_duration_s:
            return "too_long"
        return None

    def _collate(self, items: list[Item], rng: np.random.Generator, skipped: Counter) -> dict | None:
        """Decode, resample, (add noise,) fbank (and SpecAugment) a batch, then pad it (``features=device``: pad the
        waveforms)."""
        cfg = self.cfg
        feats, keys, targets = [], [], []
        mix: dict[str, list] = {}
        for item in items:
            t0 = time.perf_counter()
            try:
                wav, sr = audio.decode(item.audio)
            except audio.AudioError as e:
                self._bad(item, e.reason, skipped)
                continue
            x = audio.resample(wav, sr, cfg.rate(item.speed))
            if cfg.noise_aug and rng.random() < cfg.noise_aug:
                x = audio.add_babble(x, rng, cfg.noise_aug_snr)
            if cfg.features == "cpu":  # else the waveform itself goes in the batch (data.features=device)
                x = FBANKS[cfg.fbank](
                    x, cfg.sample_rate, cfg.num_mel_bins, cfg.frame_length_ms, cfg.frame_shift_ms, cfg.dither
                )
                if cfg.spec_augment:
                    x = audio.spec_augment(x, rng)
            feats.append(x)
            keys.append(item.key)
            targets.append(torch.tensor(self.tokenizer.encode(item.text), dtype=torch.long))
            if self.mixed:
                m = mix.setdefault(item.corpus, [0, 0.0, 0.0])
                m[0] += 1
                m[1] += len(wav) / sr
                m[2] += item.load_s + time.perf_counter() - t0
        if not feats:
            return None
        lens = torch.tensor([len(x) for x in feats], dtype=torch.long)
        batch = {
            "keys": keys,
            "targets": torch.nn.utils.rnn.pad_sequence(targets, batch_first=True),
            "target_lens": torch.tensor([len(t) for t in targets], dtype=torch.long),
        }
        padded = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
        if cfg.features == "device":  # waveforms; the trainer makes fbank after the copy
            batch.update(
                wavs=padded,
                wav_lens=lens,
                feat_lens=torch.tensor(
                    [
                        audio.num_frames(n, cfg.sample_rate, cfg.frame_length_ms, cfg.frame_shift_ms)
                        for n in lens.tolist()
                    ],
                    dtype=torch.long,
                ),
            )
        else:
            batch.update(feats=padded, feat_lens=lens)
        if self.mixed:
            batch["corpora"] = mix
        return batch


class AsrLoader:
    """Iterates one rank's batches and remembers the position of what was *consumed*.

    ``state_dict()`` after a batch has been trained on resumes right after that batch, not
    where prefetching workers had read ahead to. Each batch is a dict with ``keys``, ``feats``
    (B, T, mel), ``feat_lens``, ``targets`` (B, L, zero-padded), ``target_lens``, ``worker``, ``pos``.
    """

    def __init__(
        self, sources: list[Source], tokenizer: CharTokenizer, cfg: DataConfig, rank: int = 0, world_size: int = 1
    ):
        self.dataset = AsrDataset(sources, tokenizer, cfg, rank, world_size)
        self.cfg = cfg
        self.epoch = 0
        self.positions: dict[int, dict] = {}
        self.next_worker = 0
        self._exclude_sorted: tuple[frozenset | None, list[str]] = (None, [])

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``; keeps the saved position when it is the epoch already under way."""
        if epoch != self.epoch:
            self.restart(epoch)

    def reseed(self, seed: int) -> None:
        """Shuffle with another seed from now on (for demonstrating what a reshuffled resume loses)."""
        self.cfg = self.dataset.cfg = replace(self.cfg, seed=seed)

    def restart(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning, forgetting any position."""
        self.epoch, self.positions, self.next_worker = epoch, {}, 0
        self.dataset.exclude = frozenset()

    def __iter__(self) -> Iterator[dict]:
        ds, W = self.dataset, self.dataset.num_workers
        ds.epoch, ds.rotate = self.epoch, self.next_worker
        ds.positions = {w: Position(**p) for w, p in self.positions.items()}
        loader = DataLoader(
            ds,
            batch_size=None,
            num_workers=self.cfg.num_workers,
            prefetch_factor=self.cfg.prefetch_factor if self.cfg.num_workers else None,
            pin_memory=self.cfg.pin_memory,
            generator=torch.Generator(),
        )  # leave the global RNG (dropout) untouched
        for batch in loader:
            w = batch["worker"]
            self.positions[w] = batch["pos"]
            self.next_worker = (w + 1) % W
            yield batch
        for w in range(W):  # every worker has run dry: the epoch is complete
            self.positions[w] = {**self.positions.get(w, asdict(Position(self.epoch))), "done": True}
        log.info("epoch %d on rank %d: skipped %s", self.epoch, ds.rank, dict(self.skipped()) or "nothing")

    def where(self) -> str:
        """Which worker the next batch is due from, and the shard it was last reading (for stall reports)."""
        ds, W = self.dataset, self.dataset.num_workers
        w = self.next_worker
        pos = self.positions.get(w)
        if pos is None:
            return f"worker {w}, before its first batch"
        if pos.get("done"):
            return f"worker {w}, after its last shard"
        streams = worker_streams(ds.sources, self.epoch, self.cfg, ds.rank, ds.world_size, w, W)
        src, _ = ds._start(Position(**pos), len(streams))
        reading = [mine[i].label for mine, i in zip(streams, src) if i < len(mine)]
        return f"worker {w}, reading {', '.join(reading)}" if reading else f"worker {w}, after its last shard"

    def skipped(self) -> Counter:
        """Bad input skipped so far this epoch on this rank, by reason."""
        total: Counter = Counter()
        for p in self.positions.values():
            total.update(p.get("skipped") or {})
        return total

    def state_dict(self) -> dict:
        """The position; ``exclude`` is a list shared between calls (sorted once per resume, since the
        uneven guard asks for a state per batch): read it, do not change it."""
        ex = self.dataset.exclude
        if self._exclude_sorted[0] is not ex:
            self._exclude_sorted = (ex, sorted(ex))
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "positions": {str(w): p for w, p in self.positions.items()},
            "next_worker": self.next_worker,
            "num_workers": self.dataset.num_workers,
            "world_size": self.dataset.world_size,
            "exclude": self._exclude_sorted[1],
        }

    def load_states(self, states: list[dict]) -> None:
        """Continue from a checkpoint's loader states (one per rank): this rank's own when the ranks x
        workers layout is this one, else the elastic way (:meth:`load_elastic`)."""
        ds = self.dataset
        states = [checked_state(s) for s in states]
        if (len(states), states[0]["num_workers"]) == (ds.world_size, ds.num_workers):
            self.load_state_dict(states[ds.rank])
        else:
            self.load_elastic(states)

    def load_elastic(self, states: list[dict]) -> int:
        """Continue the epoch of ``states`` (every rank's loader state, from another ranks x workers
        layout): the utterances they had consumed are left out, the rest is dealt to this layout.
        Returns how many were left out."""
        states = [checked_state(s) for s in states]
        ds, epoch = self.dataset, states[0]["epoch"]
        consumed: set[str] = set()
        for rank, st in enumerate(states):
            old = AsrDataset(
                ds.sources, ds.tokenizer, replace(self.cfg, num_workers=st["num_workers"]), rank, st["world_size"]
            )
            old.epoch, old.exclude = epoch, frozenset(st.get("exclude", ()))
            consumed |= old.exclude
            for w, p in st["positions"].items():
                consumed |= old.consumed(old.streams(int(w)), int(w), Position(**p))
        self.restart(epoch)
        ds.exclude = frozenset(consumed)
        log.info(
            "elastic resume: epoch %d continues on %d ranks x %d workers without the %d utterances "
            "%d ranks x %d workers had consumed",
            epoch,
            ds.world_size,
            ds.num_workers,
            len(consumed),
            states[0]["world_size"],
            states[0]["num_workers"],
        )
        return len(consumed)

    def load_state_dict(self, state: dict) -> None:
        state = checked_state(state)
        if (state["num_workers"], state["world_size"]) != (self.dataset.num_workers, self.dataset.world_size):
            raise ValueError(
                f"loader state is for {state['world_size']} ranks x {state['num_workers']} workers, "
                f"this run has {self.dataset.world_size} x {self.dataset.num_workers}"
            )
        self.epoch, self.next_worker = state["epoch"], state["next_worker"]
        self.positions = {int(w): dict(p) for w, p in state["positions"].items()}
        self.dataset.exclude = frozenset(state.get("exclude", ()))

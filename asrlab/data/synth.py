"""The embedded corpus: spoken digit strings and voice commands, synthesized with eSpeak NG.

``synthesize_corpus(out_dir, utts=2000)`` writes three WeNet shard splits under
``out_dir`` (``train/``, ``dev/``, ``test/``, see :mod:`asrlab.data.shards`) in
seconds, with no download: every notebook can make its own data on the spot.

Content
    Half the utterances are digit strings of 1-8 digits spoken as words
    (``"three seven nine one"``, vocabulary ``zero`` .. ``nine``), half are
    commands from a fixed list of ~40 (``"turn on the light"``, ``"next track"``,
    some with a number: ``"set timer for five minutes"``). Transcripts hold only
    ``a-z`` and single spaces; the model's tokenizer is characters.

Splits
    ``train`` (``utts``), ``dev`` (train's voices and conditions, other utterances) and ``test`` (held-out
    accents and variants, its own noise and reverberation); ``hard=True`` makes every split harder. The
    voices, the conditions and why the test split differs this much: ``docs/corpus.md``.

Audio
    eSpeak renders at 22050 Hz; a windowed-sinc polyphase resampler in numpy
    (float64) takes it to 16 kHz (speed perturbation folds into the same
    step; rates are rounded to multiples of 50 Hz). Noise and reverberation
    are numpy too. WAVs are 16 kHz mono
    ``PCM_16``.

Determinism
    Each utterance draws everything (text, voice, prosody, eSpeak's noise
    seed, conditions) from its own ``numpy.random.default_rng((seed, split,
    index))``. eSpeak carries hidden state from one utterance to the next
    (see :mod:`asrlab.data.espeak`), so it is reset at the start of every
    block of ``RESET_EVERY`` (16) utterances, blocks starting at fixed
    indices. An utterance's bytes thus depend only on ``(seed, split, its
    block, hard, noise_snr)``: not on the worker count, on what else ran in
    the process, or on ``utts`` (a bigger corpus extends a smaller one). The
    same arguments give byte-identical shard files. The generated variants'
    files are a fixed function of GEN_VARIANT_SEED, so they are the same in
    every process and run.

Keys are ``<split>-<accent>_<variant>-<index:06d>``, e.g.
``train-en-gb-x-rp_m3-000123`` or ``train-en-us_g017-000042``.
"""

from __future__ import annotations

import io
import logging
import math
import multiprocessing as mp
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import soundfile as sf

from . import espeak
from .acoustics import SAMPLE_RATE, add_reverb, babble_noise, coloured_noise, resample
from ..errors import UsageError
from .shards import write_split
from .voices import (
    GEN_KLATT,
    GEN_VARIANT_SEED,
    GEN_VARIANT_SHARE,
    GEN_VARIANTS,
    TEST_ACCENTS,
    TEST_VARIANTS,
    TRAIN_ACCENTS,
    TRAIN_VARIANTS,
    generated_variants,
    voice_of,
    voice_tag,
)

log = logging.getLogger(__name__)

__all__ = [
    "SAMPLE_RATE",
    "TRAIN_ACCENTS",
    "TEST_ACCENTS",
    "TRAIN_VARIANTS",
    "TEST_VARIANTS",
    "DIGIT_WORDS",
    "COMMANDS",
    "split_voices",
    "voice_of",
    "generated_variants",
    "GEN_VARIANTS",
    "GEN_KLATT",
    "GEN_VARIANT_SEED",
    "split_sizes",
    "Utterance",
    "make_utterance",
    "iter_split",
    "synthesize_corpus",
    "resample",
]

SPLITS = ("train", "dev", "test")
_SPLIT_ID = {"train": 0, "dev": 1, "test": 2}


DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
COMMANDS = (
    "stop",
    "go",
    "yes",
    "no",
    "cancel",
    "mute",
    "go left",
    "go right",
    "go back",
    "go forward",
    "turn on the light",
    "turn off the light",
    "lights on",
    "lights off",
    "turn on the radio",
    "turn off the radio",
    "volume up",
    "volume down",
    "next track",
    "previous track",
    "play music",
    "pause music",
    "open the door",
    "close the door",
    "lock the door",
    "unlock the door",
    "what time is it",
    "start recording",
    "stop recording",
    "call home",
)
# Commands with a number ({n}: one..nine spoken as a word).
COMMAND_TEMPLATES = (
    "set timer for {n} minutes",
    "set volume to {n}",
    "go to floor {n}",
    "play track {n}",
    "turn up the heat by {n} degrees",
    "wait {n} seconds",
    "move {n} steps forward",
    "skip {n} songs",
    "open window {n}",
    "call room {n}",
)

# Prosody, shared by all splits (eSpeak parameter units).
RATE_WPM = (130, 210)
PITCH = (25, 75)
PITCH_RANGE = (20, 90)
WORD_GAP = (0, 3)  # x 10 ms

# Train/dev speed/VTLP factor: eSpeak's output read as if recorded at 22050 * factor Hz.
TRAIN_SPEED = (0.88, 1.12)

# Condition constants.
LEAD_TRAIL_S = (0.05, 0.3)
PEAK_DBFS = (-9.0, -1.0)
HARD_SNR_SHIFT_DB = 5.0
SPEEDS = (0.9, 1.0, 1.1)
# eSpeak is reset at utterances 0, 16, 32, ... of each split; part of what defines the output.
RESET_EVERY = 16
_NOISE_EXPONENT = {"white": 0.0, "pink": 1.0, "brown": 2.0}
TRAIN_NOISES = (*_NOISE_EXPONENT, "babble")
TRAIN_REVERB_SHARE = 0.3  # of train/dev utterances, unless hard (then 0.5)
TEST_NOISES = ("babble",)


def split_voices(split: str) -> list[str]:
    """The eSpeak voice names a split draws from (train and dev share theirs, generated variants included)."""
    if split not in _SPLIT_ID:
        raise UsageError(f"unknown split {split!r}; choose from {SPLITS}")
    if split == "test":
        accents, variants = TEST_ACCENTS, TEST_VARIANTS
    else:
        accents, variants = TRAIN_ACCENTS, (*TRAIN_VARIANTS, *generated_variants())
    return [f"{a}+{v}" for a in accents for v in variants]


def split_sizes(utts: int, held: int | None = None) -> dict[str, int]:
    """Utterances per split: train ``utts``; dev and test ``held`` each (default ``utts // 10``, at least 50)."""
    if utts < 1:
        raise UsageError("utts must be at least 1")
    if held is None:
        held = max(50, utts // 10)
    if held < 1:
        raise UsageError("held (dev and test utterances) must be at least 1")
    return {"train": utts, "dev": held, "test": held}


# --------------------------------------------------------------------------- text


def _make_text(rng: np.random.Generator) -> str:
    if rng.random() < 0.5:
        n = int(rng.integers(1, 9))
        return " ".join(DIGIT_WORDS[int(d)] for d in rng.integers(0, 10, size=n))
    if rng.random() < 0.25:
        template = COMMAND_TEMPLATES[int(rng.integers(len(COMMAND_TEMPLATES)))]
        return template.format(n=DIGIT_WORDS[int(rng.integers(1, 10))])
    return COMMANDS[int(rng.integers(len(COMMANDS)))]


def _encode_wav(x: np.ndarray) -> bytes:
    pcm = np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)
    buf = io.BytesIO()
    sf.write(buf, pcm, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@dataclass(frozen=True)
class Utterance:
    """One synthesized utterance and how it was made."""

    key: str
    text: str
    wav: bytes
    seconds: float
    voice: str
    condition: dict


def make_utterance(
    seed: int,
    split: str,
    index: int,
    *,
    hard: bool = False,
    noise_snr: tuple[float, float] = (10.0, 30.0),
    fresh: bool = True,
) -> Utterance:
    """Synthesize utterance ``index`` of ``split``.

    With ``fresh=True`` eSpeak is reset first, making this a pure function of its
    arguments. The corpus resets once per block of :data:`RESET_EVERY` utterances
    instead (a reset makes eSpeak re-read the voice's data), calling this with
    ``fresh=True`` for a block's first utterance and ``fresh=False`` after; so the
    bytes in the corpus equal this function's only for the first of each block.
    """
    if split not in _SPLIT_ID:
        raise UsageError(f"unknown split {split!r}; choose from {SPLITS}")
    rng = np.random.default_rng((int(seed), _SPLIT_ID[split], int(index)))
    text = _make_text(rng)
    if split == "test":
        voices = split_voices(split)
        voice = voices[int(rng.integers(len(voices)))]
    else:
        accent = TRAIN_ACCENTS[int(rng.integers(len(TRAIN_ACCENTS)))]
        if rng.random() < GEN_VARIANT_SHARE:
            variant = f"g{int(rng.integers(GEN_VARIANTS)):03d}"
        else:
            variant = TRAIN_VARIANTS[int(rng.integers(len(TRAIN_VARIANTS)))]
        voice = f"{accent}+{variant}"
    rate = int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1))
    pitch = int(rng.integers(PITCH[0], PITCH[1] + 1))
    prange = int(rng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1))
    gap = int(rng.integers(WORD_GAP[0], WORD_GAP[1] + 1))
    espeak_seed = int(rng.integers(1, 2**31 - 1))

    lo, hi = float(noise_snr[0]), float(noise_snr[1])
    if hi < lo:
        raise UsageError(f"noise_snr must be (low, high), got {noise_snr}")
    if hard:
        lo, hi = lo - HARD_SNR_SHIFT_DB, hi - HARD_SNR_SHIFT_DB
    if split == "test":
        noise = TEST_NOISES[int(rng.integers(len(TEST_NOISES)))]
        snr = rng.uniform(lo, (lo + hi) / 2.0)
        rt60 = rng.uniform(0.3, 0.8) if hard else rng.uniform(0.15, 0.35)
        drr = rng.uniform(-3.0, 3.0) if hard else rng.uniform(2.0, 8.0)
        reverb = True
    else:
        noise = TRAIN_NOISES[int(rng.integers(len(TRAIN_NOISES)))]
        snr = rng.uniform(lo, hi)
        reverb = bool(rng.random() < (0.5 if hard else TRAIN_REVERB_SHARE))
        rt60 = rng.uniform(0.2, 0.6) if hard else rng.uniform(0.1, 0.35)
        drr = rng.uniform(0.0, 6.0) if hard else rng.uniform(2.0, 8.0)
    speed = float(SPEEDS[int(rng.integers(len(SPEEDS)))]) if hard else 1.0
    lead = int(rng.uniform(*LEAD_TRAIL_S) * SAMPLE_RATE)
    trail = int(rng.uniform(*LEAD_TRAIL_S) * SAMPLE_RATE)
    peak = 10.0 ** (rng.uniform(*PEAK_DBFS) / 20.0)
    if split != "test":
        speed *= float(rng.uniform(*TRAIN_SPEED))

    espeak.add_variants(generated_variants())  # a no-op once they are there
    pcm, sr = espeak.synthesize(text, voice, rate, pitch, prange, word_gap=gap, seed=espeak_seed, fresh=fresh)
    if pcm.size == 0:
        raise espeak.EspeakError(f"eSpeak returned no audio for {text!r} ({voice})")
    # Speed perturbation = reading the samples as if recorded at ~sr * speed; the rate is
    # rounded to a multiple of 50 Hz (0.9 -> 0.9002, 1.1 -> 1.0998) to keep the resampling
    # ratio 320/397, 320/441, 320/485 (a small filter bank).
    orig_sr = sr if speed == 1.0 else 50 * int(round(sr * speed / 50))
    speed = orig_sr / sr
    x = resample(pcm.astype(np.float64) / 32768.0, orig_sr, SAMPLE_RATE)
    if reverb:
        x = add_reverb(rng, x, rt60, drr)
    speech_power = float(np.mean(x**2)) + 1e-12
    x = np.concatenate([np.zeros(lead), x, np.zeros(trail)])
    if noise == "babble":
        n = babble_noise(rng, len(x))
    else:
        n = coloured_noise(rng, len(x), _NOISE_EXPONENT[noise])
    x = x + n * math.sqrt(speech_power / 10.0 ** (snr / 10.0))
    x *= peak / (np.max(np.abs(x)) + 1e-12)

    key = f"{split}-{voice_tag(voice)}-{index:06d}"
    condition = {
        "rate_wpm": rate,
        "pitch": pitch,
        "pitch_range": prange,
        "word_gap": gap,
        "noise": noise,
        "snr_db": round(float(snr), 2),
        "speed": round(speed, 3),
        "reverb_rt60_s": round(float(rt60), 3) if reverb else 0.0,
    }
    return Utterance(key, text, _encode_wav(x), len(x) / SAMPLE_RATE, voice, condition)


def _render_block(args: tuple) -> list[Utterance]:
    seed, split, start, stop, hard, noise_snr = args
    return [
        make_utterance(seed, split, i, hard=hard, noise_snr=noise_snr, fresh=(i == start)) for i in range(start, stop)
    ]


def _default_workers() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def iter_split(
    split: str,
    n: int,
    seed: int = 0,
    *,
    hard: bool = False,
    noise_snr: tuple[float, float] = (10.0, 30.0),
    workers: int = 1,
) -> Iterator[Utterance]:
    """Yield utterances ``0 .. n-1`` of ``split`` in order, synthesized lazily.

    Work goes in blocks of :data:`RESET_EVERY` utterances starting at multiples of
    it, eSpeak reset at each block's start, so the bytes do not depend on
    ``workers`` or ``n``. With ``workers > 1`` a process pool renders blocks, at
    most ``2 * workers`` in flight (memory stays flat).
    """
    noise_snr = (float(noise_snr[0]), float(noise_snr[1]))
    tasks = [(seed, split, s, min(s + RESET_EVERY, n), hard, noise_snr) for s in range(0, n, RESET_EVERY)]
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield from _render_block(task)
        return
    # fork: workers need no re-import (works from notebooks and unguarded scripts);
    # they only run numpy and eSpeak, never torch, so a forked torch is harmless.
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else None)
    with ctx.Pool(processes=min(workers, len(tasks))) as pool:
        pending = []
        todo = iter(tasks)
        for task in todo:
            pending.append(pool.apply_async(_render_block, (task,)))
            if len(pending) >= 2 * workers:
                break
        while pending:
            result = pending.pop(0).get()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.apply_async(_render_block, (nxt,)))
            yield from result


# --------------------------------------------------------------------------- corpus


def synthesize_corpus(
    out_dir: str | Path,
    utts: int = 2000,
    seed: int = 0,
    shard_size: int = 500,
    compression: str = "none",
    noise_snr: tuple[float, float] = (10.0, 30.0),
    raw: bool = False,
    hard: bool = False,
    progress=True,
    workers: int | None = None,
    held: int | None = None,
) -> dict:
    """Synthesize the train/dev/test corpus into WeNet shards under ``out_dir``.

    Args:
        out_dir: root; each split goes to ``out_dir/<split>/`` (``shards/``, ``data.list``,
            and with ``raw`` ``wavs/`` + ``raw.list``).
        utts: training utterances; dev and test get ``utts // 10`` each (at least 50).
        seed: everything random derives from it; same arguments, same bytes.
        shard_size: utterances per tar shard.
        compression: shard compression, one of :data:`asrlab.data.shards.COMPRESSIONS`.
        noise_snr: (low, high) SNR in dB for additive noise (test uses the lower half).
        raw: also write individual WAVs and ``raw.list``.
        hard: harder conditions (lower SNR, speed perturbation, reverberation).
        progress: show progress bars: True (tqdm), False, or a function making a tqdm-like bar from
            ``total``, ``desc`` and ``unit`` (``asrlab.widgets.progress`` in a notebook).
        workers: processes for synthesis; ``None`` = number of usable CPUs (max 8),
            1 = in this process. Does not change the output.
        held: dev and test utterances each, instead of ``utts // 10``. A split's first n
            utterances are the same in every corpus of this seed that has n or more.

    Returns:
        A summary: per split ``utterances``, ``seconds`` of audio, ``shards`` (count),
        ``shard_paths``, ``voices`` used and a ``conditions`` line; plus ``elapsed_s``.
    """
    from tqdm.auto import tqdm

    sizes = split_sizes(int(utts), held)
    if workers is None:
        workers = _default_workers()
    out_dir = Path(out_dir)
    noise_snr = (float(noise_snr[0]), float(noise_snr[1]))
    summary: dict = {
        "out_dir": str(out_dir.resolve()),
        "seed": int(seed),
        "sample_rate": SAMPLE_RATE,
        "hard": bool(hard),
        "noise_snr": list(noise_snr),
        "splits": {},
    }
    t_all = time.perf_counter()
    for split in SPLITS:
        n = sizes[split]
        stats = {"seconds": 0.0, "voices": Counter(), "noises": Counter()}
        t0 = time.perf_counter()
        bar = (
            progress(total=n, desc=f"synth {split}", unit="utt")
            if callable(progress)
            else tqdm(total=n, desc=f"synth {split}", unit="utt", disable=not progress, leave=True)
        )

        def stream(split=split, n=n, stats=stats, bar=bar):
            for u in iter_split(split, n, seed, hard=hard, noise_snr=noise_snr, workers=workers):
                stats["seconds"] += u.seconds
                stats["voices"][u.voice] += 1
                stats["noises"][u.condition["noise"]] += 1
                bar.update(1)
                yield u.key, u.text, u.wav

        try:
            paths = write_split(stream(), out_dir / split, split, shard_size, compression, raw)
        finally:
            bar.close()
        elapsed = time.perf_counter() - t0
        summary["splits"][split] = {
            "utterances": n,
            "seconds": round(stats["seconds"], 3),
            "shards": len(paths),
            "shard_paths": [str(p) for p in paths],
            "voices": sorted(stats["voices"]),
            "noises": dict(sorted(stats["noises"].items())),
            "conditions": _describe_conditions(split, noise_snr, hard),
            "elapsed_s": round(elapsed, 3),
        }
        log.info(
            "%s: %d utterances, %.1f s of audio, %d shards, %d voices, %.1f s (%.0f utt/s)",
            split,
            n,
            stats["seconds"],
            len(paths),
            len(stats["voices"]),
            elapsed,
            n / max(elapsed, 1e-9),
        )
    summary["elapsed_s"] = round(time.perf_counter() - t_all, 3)
    return summary


def _describe_conditions(split: str, noise_snr: tuple[float, float], hard: bool) -> str:
    lo, hi = noise_snr
    if hard:
        lo, hi = lo - HARD_SNR_SHIFT_DB, hi - HARD_SNR_SHIFT_DB
    if split == "test":
        rev = "RT60 0.3-0.8 s" if hard else "RT60 0.15-0.35 s"
        text = f"babble-like noise, SNR {lo:g}-{(lo + hi) / 2:g} dB, reverb always ({rev})"
    else:
        text = f"white/pink/brown/babble noise, SNR {lo:g}-{hi:g} dB"
        text += ", reverb on half (RT60 0.2-0.6 s)" if hard else ", reverb on 30% (RT60 0.1-0.35 s)"
        text += f", resampled x{TRAIN_SPEED[0]:g}-{TRAIN_SPEED[1]:g}"
    if hard:
        text += ", speed 0.9/1.0/1.1"
    return text

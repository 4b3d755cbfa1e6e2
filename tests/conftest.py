"""Shared fixtures: a small corpus of tone WAVs in WeNet shards (fast; no eSpeak needed).

The notebooks' kernels under nbval inherit this process's environment: explorers draw their static
views there, as under ``asrlab notebooks`` (a test that wants widgets sets ``ASRLAB_WIDGETS`` itself).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from asrlab.data.audio import encode_wav
from asrlab.data.shards import write_split
from asrlab.data.tokenizer import CharTokenizer

os.environ.setdefault("ASRLAB_WIDGETS", "static")

WORDS = ["one", "two", "three", "stop", "go"]


def tone_utts(n: int, seed: int = 0, sr: int = 16000):
    """``n`` utterances ``(key, text, wav_bytes)``: 0.3-1.2 s tones with short word transcripts."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        samples = int(sr * rng.uniform(0.3, 1.2))
        wav = (0.2 * np.sin(np.arange(samples) * rng.uniform(0.02, 0.2)) * 32767).astype(np.int16)
        text = " ".join(rng.choice(WORDS, size=rng.integers(1, 4)))
        yield f"utt{i:05d}", text, encode_wav(wav, sr)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """120 utterances in 10 uncompressed shards of 12, with a raw list."""
    d = tmp_path_factory.mktemp("corpus")
    write_split(tone_utts(120), d / "train", "train", shard_size=12, raw=True)
    return d / "train"


@pytest.fixture(scope="session")
def tok():
    return CharTokenizer.build(WORDS + [" "])

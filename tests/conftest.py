"""Shared fixtures: a small corpus of tone WAVs in WeNet shards (fast; no eSpeak needed).

Explorers draw their static views in the tests, as under ``asrlab notebooks`` (a test that wants widgets
sets ``ASRLAB_WIDGETS`` itself). The notebooks under nbval: the project's root ``conftest.py``.
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

# The tests' model: the tiny config cut to one narrow block, still every kind of layer (attention, the
# conv module, the x2 front end). A step takes milliseconds, so a training test's time is its processes'
# start-up and its own timeouts, not compute.
SMALL_MODEL = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.ff_dim=64",
    "model.conv_kernel=3",
    "model.conv_channels=8",
]
# ... in the tests' runs: batches of 800 frames read in the training process, a 2-step warm-up, no progress bar
SMALL = [
    *SMALL_MODEL,
    "data.num_workers=0",
    "data.max_frames_in_batch=800",
    "optim.warmup_steps=2",
    "train.progress=false",
]


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

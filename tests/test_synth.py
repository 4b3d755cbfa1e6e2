"""The eSpeak binding and the embedded-corpus synthesizer (fast: a few seconds in all)."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asrlab.data import acoustics, espeak, synth

UTTS, SHARD = 40, 16  # dev/test get the minimum of 50 each


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(root: Path) -> dict[str, str]:
    """Hashes of every file except the lists (they hold absolute paths)."""
    return {
        str(p.relative_to(root)): _digest(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".list")
    }


def _members(split_dir: Path) -> list[tuple[str, bytes]]:
    out = []
    for line in (split_dir / "data.list").read_text().splitlines():
        with tarfile.open(line) as tar:
            out += [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    summary = synth.synthesize_corpus(root / "a", utts=UTTS, seed=0, shard_size=SHARD, progress=False, workers=1)
    return root, summary


# --------------------------------------------------------------------------- espeak


def test_espeak_audio_and_duration():
    audio, sr = espeak.synthesize("three seven nine one", "en-us+m3")
    assert sr == espeak.sample_rate() == 22050
    assert audio.dtype == np.int16 and audio.ndim == 1
    assert 0.6 < len(audio) / sr < 3.0  # four digits at 175 wpm
    assert np.abs(audio).max() > 2000  # not silence


def test_espeak_float_and_rate():
    slow, _ = espeak.synthesize("turn on the light", "en-us", rate_wpm=120, dtype="float32")
    fast, _ = espeak.synthesize("turn on the light", "en-us", rate_wpm=300, dtype="float32")
    assert slow.dtype == np.float32 and np.abs(slow).max() <= 1.0
    assert len(fast) < 0.7 * len(slow)


def test_espeak_voices_differ_and_fresh_is_reproducible():
    a, _ = espeak.synthesize("set volume to five", "en-us+m3", fresh=True)
    b, _ = espeak.synthesize("set volume to five", "en-us+f2", fresh=True)
    a2, _ = espeak.synthesize("set volume to five", "en-us+m3", fresh=True)
    assert not (len(a) == len(b) and np.array_equal(a, b))
    assert np.array_equal(a, a2)


def test_espeak_bad_voice():
    with pytest.raises(espeak.EspeakError):
        espeak.synthesize("stop", "xx-nope+m1")
    with pytest.raises(ValueError):
        espeak.synthesize("stop", "en-us", rate_wpm=10)


def test_voice_pools_exist_and_are_disjoint():
    langs, variants = set(espeak.list_languages()), set(espeak.list_variants())
    for accent in synth.TRAIN_ACCENTS + synth.TEST_ACCENTS:
        assert accent in langs
    for variant in synth.TRAIN_VARIANTS + synth.TEST_VARIANTS:
        assert variant in variants
    assert not set(synth.TRAIN_ACCENTS) & set(synth.TEST_ACCENTS)
    assert not set(synth.TRAIN_VARIANTS) & set(synth.TEST_VARIANTS)
    assert synth.split_voices("dev") == synth.split_voices("train")


# --------------------------------------------------------------------------- dsp


def test_resample_keeps_a_tone():
    t = np.arange(22050) / 22050
    y = acoustics.resample(np.sin(2 * np.pi * 1000 * t), 22050, 16000)
    assert len(y) == 16000
    ref = np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000)
    assert np.max(np.abs(y - ref)[200:-200]) < 1e-2
    alias = acoustics.resample(np.sin(2 * np.pi * 10000 * t), 22050, 16000)  # above 8 kHz: removed
    assert np.sqrt(np.mean(alias[200:-200] ** 2)) < 0.01


def test_make_utterance_is_pure():
    a = synth.make_utterance(3, "test", 7, hard=True)
    b = synth.make_utterance(3, "test", 7, hard=True)
    assert a == b
    assert a.key == f"test-{a.voice.replace('+', '_')}-000007"
    assert a.voice in synth.split_voices("test")
    assert a.condition["noise"] in synth.TEST_NOISES


# --------------------------------------------------------------------------- corpus


def test_corpus_layout_and_summary(corpus):
    root, summary = corpus
    sizes = synth.split_sizes(UTTS)
    assert sizes == {"train": 40, "dev": 50, "test": 50}
    for split, n in sizes.items():
        s = summary["splits"][split]
        assert s["utterances"] == n
        assert s["shards"] == len(s["shard_paths"]) == -(-n // SHARD)
        assert s["seconds"] > 0.3 * n
        members = _members(root / "a" / split)
        keys = [name[:-4] for name, _ in members if name.endswith(".wav")]
        assert len(keys) == len(set(keys)) == n
        assert all(re.fullmatch(r"[A-Za-z0-9_-]+", k) and k.startswith(f"{split}-") for k in keys)


def test_transcripts_and_wavs(corpus):
    root, _ = corpus
    for split in synth.SPLITS:
        for name, data in _members(root / "a" / split):
            if name.endswith(".txt"):
                text = data.decode()
                assert re.fullmatch(r"[a-z]+( [a-z]+)*", text), text
            else:
                info = sf.info(io.BytesIO(data))
                assert (info.samplerate, info.channels) == (16000, 1)
                assert (info.format, info.subtype) == ("WAV", "PCM_16")
                assert 0.3 < info.duration < 10


def test_split_voices(corpus):
    _, summary = corpus
    train = set(summary["splits"]["train"]["voices"])
    dev = set(summary["splits"]["dev"]["voices"])
    test = set(summary["splits"]["test"]["voices"])
    pool = set(synth.split_voices("train"))
    assert train <= pool and dev <= pool  # dev: same voices as train
    assert not test & pool  # test: held-out voices
    accents = lambda vs: {v.split("+")[0] for v in vs}  # noqa: E731
    variants = lambda vs: {v.split("+")[1] for v in vs}  # noqa: E731
    assert not accents(test) & accents(pool) and not variants(test) & variants(pool)


def test_same_seed_same_bytes_other_seed_differs(corpus):
    root, _ = corpus
    # Another process count and another order of work in this process: still the same bytes.
    synth.synthesize_corpus(root / "b", utts=UTTS, seed=0, shard_size=SHARD, progress=False, workers=2)
    synth.synthesize_corpus(root / "c", utts=UTTS, seed=1, shard_size=SHARD, progress=False, workers=1)
    a, b, c = _tree(root / "a"), _tree(root / "b"), _tree(root / "c")
    assert a and a == b
    assert a.keys() == c.keys() and all(a[k] != c[k] for k in a)


def test_held_sizes_dev_and_test_and_splits_extend_each_other(corpus):
    root, _ = corpus
    assert synth.split_sizes(5000, held=300) == {"train": 5000, "dev": 300, "test": 300}
    with pytest.raises(ValueError, match="held"):
        synth.split_sizes(100, held=0)
    summary = synth.synthesize_corpus(
        root / "held", utts=UTTS + 8, held=20, seed=0, shard_size=SHARD, progress=False, workers=1
    )
    assert [summary["splits"][s]["utterances"] for s in ("train", "dev", "test")] == [UTTS + 8, 20, 20]
    for split, n in (("train", UTTS), ("dev", 20), ("test", 20)):
        small, big = _members(root / "a" / split), _members(root / "held" / split)
        assert big[: 2 * n] == small[: 2 * n]  # the same first n utterances (.txt and .wav each)


def test_hard_conditions():
    utts = [synth.make_utterance(0, "test", i, hard=True) for i in range(12)]
    assert {u.condition["speed"] for u in utts} == {0.9, 1.0, 1.1}
    utts = [synth.make_utterance(0, "train", i, hard=True) for i in range(24)]
    lo, hi = 0.9 * synth.TRAIN_SPEED[0], 1.1 * synth.TRAIN_SPEED[1]
    assert all(lo - 0.005 <= u.condition["speed"] <= hi + 0.005 for u in utts)
    assert any(u.condition["reverb_rt60_s"] > 0 for u in utts)
    lo, hi = 10.0 - synth.HARD_SNR_SHIFT_DB, 30.0 - synth.HARD_SNR_SHIFT_DB
    assert all(lo <= u.condition["snr_db"] <= hi for u in utts)
    for u in utts:
        audio, sr = sf.read(io.BytesIO(u.wav), dtype="int16")
        assert sr == 16000 and audio.ndim == 1 and np.abs(audio).max() > 1000


# --------------------------------------------------------------------------- generated voices


def test_generated_variants_are_fixed_and_distinct():
    pool = synth.generated_variants()
    assert len(pool) == synth.GEN_VARIANTS and list(pool)[0] == "g000"
    assert len(set(pool.values())) == len(pool)
    assert not set(pool) & set(espeak.list_variants())  # no clash with a bundled name
    for name, text in pool.items():
        assert text.startswith("language variant\n") and f"name {name}\n" in text
        klatt = [line for line in text.splitlines() if line.startswith("klatt")]
        assert all(int(line.split()[1]) in synth.GEN_KLATT for line in klatt)
    assert all(k not in (4, 5) for k in synth.GEN_KLATT)  # test's Klatt source models stay held out
    # Same text however often it is made (a fixed seed, not the corpus seed).
    synth.generated_variants.cache_clear()
    assert synth.generated_variants() == pool


def test_generated_variant_changes_the_voice_and_keeps_bundled_ones():
    plain, _ = espeak.synthesize("three seven nine", "en-us", fresh=True)
    m3, _ = espeak.synthesize("three seven nine", "en-us+m3", fresh=True)
    espeak.add_variants(synth.generated_variants())
    assert espeak.voice_exists("en-us+g007")
    gen, _ = espeak.synthesize("three seven nine", "en-us+g007", fresh=True)
    gen2, _ = espeak.synthesize("three seven nine", "en-us+g007", fresh=True)
    m3_again, _ = espeak.synthesize("three seven nine", "en-us+m3", fresh=True)
    assert np.array_equal(gen, gen2)
    assert not (len(gen) == len(plain) and np.array_equal(gen, plain))
    assert np.array_equal(m3, m3_again)  # the private data dir leaves bundled variants as they were
    with pytest.raises(ValueError):
        espeak.add_variants({"g007": "language variant\npitch 100 120\n"})  # other text, same name
    with pytest.raises(ValueError):
        espeak.add_variants({"m3": "language variant\n"})  # a bundled name


def test_train_voices_and_speed():
    utts = [synth.make_utterance(0, "train", i) for i in range(24)]
    variants = [u.voice.split("+")[1] for u in utts]
    assert any(v in synth.generated_variants() for v in variants)
    assert all(v in synth.generated_variants() or v in synth.TRAIN_VARIANTS for v in variants)
    assert all(u.voice in synth.split_voices("train") for u in utts)
    speeds = [u.condition["speed"] for u in utts]
    assert all(synth.TRAIN_SPEED[0] - 0.005 <= s <= synth.TRAIN_SPEED[1] + 0.005 for s in speeds)
    assert len(set(speeds)) > 10  # continuous, not three values
    test = [synth.make_utterance(0, "test", i) for i in range(8)]
    assert all(u.condition["speed"] == 1.0 for u in test)  # test: eSpeak's own rate, no resampling

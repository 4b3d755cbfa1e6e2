"""asrlab's Kaldi fbank equals torchaudio's (as asrlab calls it) on real utterances and edge cases, and is faster;
batched fbank after the copy (data.features=device) equals the loader's per-utterance fbank."""

import time

import numpy as np
import pytest
import torch
import torchaudio

from asrlab.config import load_config
from asrlab.data import audio
from asrlab.data import synth
from asrlab.data.features import BatchFbank, batch_features, fbank
from asrlab.data.loader import AsrLoader
from asrlab.data.config import DataConfig
from asrlab.data.sources import load_sources
from asrlab.decode import eval_loader
from asrlab.lab.dist import DistInfo
from asrlab.train.trainer import Trainer

from conftest import SMALL_MODEL


def kaldi(wav: torch.Tensor, sr: int = 16000) -> torch.Tensor:
    """torchaudio's Kaldi fbank with asrlab's settings: the reference."""
    return torchaudio.compliance.kaldi.fbank(
        (wav * 32768.0).unsqueeze(0),
        num_mel_bins=80,
        frame_length=25.0,
        frame_shift=10.0,
        dither=0.0,
        energy_floor=0.0,
        sample_frequency=sr,
    )


@pytest.fixture(scope="module")
def spoken():
    """Utterances of the embedded corpus (eSpeak NG, noise, reverberation), as the loader decodes them."""
    return [audio.decode(u.wav)[0] for split, n in (("train", 30), ("test", 10)) for u in synth.iter_split(split, n)]


def test_fbank_matches_torchaudio_on_real_utterances_and_edge_cases(spoken):
    cases = {f"utterance {i}": w for i, w in enumerate(spoken)}
    cases["silence"] = torch.zeros(16000)
    cases["clipping"] = (spoken[0] * 40).clamp(-1, 1)
    cases["8 kHz resampled"] = audio.resample(audio.resample(spoken[1], 16000, 8000), 8000, 16000)
    cases["one frame (400 samples)"] = spoken[2][:400]
    cases["one frame (559 samples)"] = spoken[2][:559]
    for name, w in cases.items():
        ref, ours = kaldi(w), fbank(w)
        assert ours.shape == ref.shape, name
        assert (ours - ref).abs().max() <= 1e-3, (name, float((ours - ref).abs().max()))
    assert fbank(spoken[0][:399]).shape == (0, 80)  # shorter than a frame: no frame, as Kaldi's snip_edges


def test_fbank_is_at_least_one_and_a_half_times_torchaudio_per_core(spoken):
    """Side by side on one thread, interleaved, best of several rounds each, in the process's CPU time: on a
    shared machine the wall clock also counts the time other processes had the core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:

        def best(f, rounds=7):
            times = []
            for _ in range(rounds):
                t0 = time.process_time()
                for w in spoken:
                    f(w)
                times.append(time.process_time() - t0)
            return min(times)

        ta, ours = [], []
        for _ in range(3):
            ta.append(best(kaldi))
            ours.append(best(fbank))
        assert min(ta) / min(ours) >= 1.5, f"torchaudio {min(ta):.4f} s, asrlab {min(ours):.4f} s"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/on_gpu.sh gputests runs it on one)")
def test_fbank_on_the_gpu_matches_the_cpu(spoken):
    cuda = torch.device("cuda")
    for w in spoken[:8]:
        assert (fbank(w.to(cuda)).cpu() - fbank(w)).abs().max() <= 1e-3
    lens = torch.tensor([len(w) for w in spoken[:8]])
    wavs = torch.nn.utils.rnn.pad_sequence(spoken[:8], batch_first=True)
    feats, _ = BatchFbank().to(cuda)(wavs.to(cuda), lens.to(cuda))
    for i, w in enumerate(spoken[:8]):
        assert (feats[i, : len(kaldi(w))].cpu() - kaldi(w)).abs().max() <= 1e-3


def test_batch_fbank_matches_kaldi_fbank_per_utterance():
    g = torch.Generator().manual_seed(0)
    lens = [16000, 9000, 400, 399, 30001]
    wavs = torch.zeros(len(lens), max(lens))
    for i, n in enumerate(lens):
        wavs[i, :n] = 0.1 * torch.randn(n, generator=g) + 0.05 * torch.sin(torch.arange(n) * 0.03)
    feats, feat_lens = BatchFbank()(wavs, torch.tensor(lens))
    for i, n in enumerate(lens):
        ref = kaldi(wavs[i, :n]) if n >= 400 else torch.zeros(0, 80)
        assert int(feat_lens[i]) == len(ref) == audio.num_frames(n, 16000)
        assert torch.allclose(feats[i, : len(ref)], ref, atol=1e-3)
        assert not feats[i, len(ref) :].any()  # padded frames are zero


def test_loader_hands_over_waveforms_and_the_features_agree(corpus, tok):
    sources = load_sources(corpus / "data.list")
    cpu = next(iter(AsrLoader(sources, tok, DataConfig(max_frames_in_batch=800))))
    dev = next(iter(AsrLoader(sources, tok, DataConfig(max_frames_in_batch=800, features="device"))))
    assert "feats" not in dev and dev["keys"] == cpu["keys"]
    feats, lens = batch_features(dev, torch.device("cpu"), BatchFbank())
    assert torch.equal(lens, cpu["feat_lens"])
    assert torch.allclose(feats, cpu["feats"], atol=1e-3)
    with pytest.raises(ValueError, match="spec_augment"):
        DataConfig(features="device", spec_augment=True)


def test_trainer_steps_with_device_features(corpus, tmp_path):
    cfg = load_config(
        "tiny",
        [
            *SMALL_MODEL,
            "data.max_frames_in_batch=800",
            "data.features=device",
            "train.max_steps=2",
            "train.progress=false",
        ],
    )
    tr = Trainer(
        cfg,
        str(corpus / "data.list"),
        str(corpus / "data.list"),
        tmp_path / "exp",
        DistInfo(0, 1, 0, torch.device("cpu"), None),
    )
    result = tr.fit()
    tr.close()
    assert tr.step == 2 and result["utts"] > 100


def test_spec_augment_masks_with_the_bin_mean_and_scales_time_masks_to_the_utterance():
    feats = torch.randn(64, 80) * 3.0 + 12.0  # a 0.64-second command's raw log-mel
    out = audio.spec_augment(feats, np.random.default_rng(0))
    mean = feats.mean(dim=0)
    time_masked = torch.isclose(out, mean.expand_as(out)).all(dim=1)
    assert 1 <= int(time_masked.sum()) <= 2 * 6  # two bands of at most 10% of 64 frames
    constant_bins = (out == out[0]).all(dim=0) & ~torch.isclose(feats, feats[0]).all(dim=0)
    assert 1 <= int(constant_bins.sum()) <= 2 * 10
    assert torch.allclose(out[:, constant_bins], mean[constant_bins].expand(64, -1))
    assert not (out == 0).any()  # nothing reads as digital silence
    assert torch.equal(out, audio.spec_augment(feats, np.random.default_rng(0)))  # follows the rng


def test_babble_noise_is_added_at_the_drawn_snr_and_follows_the_rng():
    wav = 0.1 * torch.sin(torch.arange(32000) * 0.05)
    out = audio.add_babble(wav, np.random.default_rng(0), (10.0, 10.0))
    noise = out - wav
    assert float(10 * torch.log10(wav.pow(2).mean() / noise.pow(2).mean())) == pytest.approx(10.0, abs=0.01)
    assert torch.equal(out, audio.add_babble(wav, np.random.default_rng(0), (10.0, 10.0)))
    assert not torch.equal(out, audio.add_babble(wav, np.random.default_rng(1), (10.0, 10.0)))
    # babble comes in syllable-rate bursts: its power over 50-ms windows swings far more than white noise's
    power = noise.reshape(-1, 800).pow(2).mean(1)
    assert float(power.max() / power.min()) > 4.0


def test_noise_augmentation_touches_training_batches_only(corpus, tok):
    sources = load_sources(corpus / "data.list")
    clean = next(iter(AsrLoader(sources, tok, DataConfig(max_frames_in_batch=800))))
    noisy = next(iter(AsrLoader(sources, tok, DataConfig(max_frames_in_batch=800, noise_aug=1.0))))
    assert noisy["keys"] == clean["keys"] and not torch.allclose(noisy["feats"], clean["feats"], atol=0.1)
    plain, augmented = (
        next(iter(eval_loader(load_config("tiny", extra), tok, corpus / "data.list")))
        for extra in ([], ["data.noise_aug=1.0"])
    )
    assert torch.equal(plain["feats"], augmented["feats"])  # dev and decoding never get noise
    for bad in ({"noise_aug": 1.5}, {"noise_aug_snr": (20.0, 5.0)}, {"noise_aug": 0.5, "sample_rate": 8000}):
        with pytest.raises(ValueError, match="noise_aug"):
            DataConfig(**bad)

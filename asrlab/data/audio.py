"""Audio from bytes to features: decode, resample, Kaldi fbank, SpecAugment.

Every input kind (tar member, file, pipe) arrives here as ``bytes``; there is one
decode path, so a sample can never leave it without ``wav`` and ``sample_rate``
set (a decoder that sets them in one branch only cannot happen by construction).
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf
import torch
import torchaudio

from .acoustics import babble_noise
from .features import fbank  # noqa: F401 (Kaldi fbank, asrlab's own: one step of the way from bytes)
from .config import num_frames  # noqa: F401 (the frames fbank makes, beside it)


class AudioError(ValueError):
    """Audio that cannot be used: undecodable, empty, or at a refused sample rate."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _pcm16_wav(data: bytes) -> tuple[int, int, int, int] | None:
    """(channels, sample_rate, data offset, data bytes) of a plain 16-bit PCM WAV, else None.

    The common case parsed with ``struct`` (microseconds); anything else goes to soundfile.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos, fmt = 12, None
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if cid == b"fmt " and size >= 16:
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, pos + 8)
            fmt = (tag, channels, rate, bits)
        elif cid == b"data":
            if fmt is None or fmt[0] != 1 or fmt[3] != 16 or fmt[1] < 1:
                return None
            n = min(size, len(data) - pos - 8)
            return fmt[1], fmt[2], pos + 8, n - n % (2 * fmt[1])
        pos += 8 + size + (size & 1)
    return None


def audio_info(data: bytes) -> tuple[int, int]:
    """(frames, sample_rate) from the header alone, without decoding samples."""
    wav = _pcm16_wav(data)
    if wav is not None:
        channels, rate, _, nbytes = wav
        return nbytes // (2 * channels), rate
    try:
        info = sf.info(io.BytesIO(data))
    except Exception as e:  # soundfile raises several types (RuntimeError, LibsndfileError)
        raise AudioError("undecodable_audio", str(e)) from None
    return info.frames, info.samplerate


def decode(data: bytes) -> tuple[torch.Tensor, int]:
    """Decode WAV/FLAC/OGG bytes to a mono float32 waveform (samples,) in [-1, 1] and its rate (Hz)."""
    pcm = _pcm16_wav(data)
    if pcm is not None:
        channels, rate, offset, nbytes = pcm
        if nbytes == 0:
            raise AudioError("empty_audio")
        x = np.frombuffer(data, dtype="<i2", count=nbytes // 2, offset=offset).astype(np.float32) / 32768.0
        if channels > 1:
            x = x.reshape(-1, channels).mean(axis=1)
        return torch.from_numpy(x), rate
    try:
        wav, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as e:
        raise AudioError("undecodable_audio", str(e)) from None
    if wav.shape[0] == 0:
        raise AudioError("empty_audio")
    return torch.from_numpy(wav.mean(axis=1) if wav.shape[1] > 1 else wav[:, 0]), sr


def resample(wav: torch.Tensor, sr: int, target_sr: int) -> torch.Tensor:
    """Resample (samples,) from ``sr`` to ``target_sr`` Hz; a no-op when they agree."""
    if sr == target_sr:
        return wav
    return torchaudio.functional.resample(wav, sr, target_sr)


def spec_augment(
    feats: torch.Tensor,
    rng: np.random.Generator,
    num_t_mask: int = 2,
    num_f_mask: int = 2,
    max_t: int = 50,
    max_t_ratio: float = 0.1,
    max_f: int = 10,
) -> torch.Tensor:
    """SpecAugment on one utterance's log-mel (frames, bins): ``num_t_mask`` time bands of at most
    ``max_t`` frames and ``max_t_ratio`` of the utterance, ``num_f_mask`` bands of at most ``max_f`` bins.

    A masked value becomes its bin's mean over the utterance, so after the model's per-utterance
    CMVN a mask reads as 0 (average), not as the deep silence a raw 0 would be in log-mel.
    The width cap follows the utterance, so a short command is never mostly masked.
    Draws from ``rng`` so a batch's masks follow from the loader's position (exact resume).
    """
    out = feats.clone()
    frames, bins = out.shape
    mean = feats.mean(dim=0)
    widest_t = max(1, min(max_t, int(frames * max_t_ratio)))
    for _ in range(num_t_mask):
        width = int(rng.integers(1, widest_t + 1))
        start = int(rng.integers(0, max(1, frames - width)))
        out[start : start + width, :] = mean
    for _ in range(num_f_mask):
        width = int(rng.integers(1, max_f + 1))
        start = int(rng.integers(0, max(1, bins - width)))
        out[:, start : start + width] = mean[start : start + width]
    return out


def add_babble(wav: torch.Tensor, rng: np.random.Generator, snr_db: tuple[float, float]) -> torch.Tensor:
    """``wav`` (samples, 16 kHz) plus babble-like noise at an SNR drawn from U(``snr_db``) (dB, against
    the power of ``wav`` as it is, its own noise included)."""
    noise = torch.from_numpy(babble_noise(rng, len(wav))).to(wav.dtype)
    snr = rng.uniform(*snr_db)
    return wav + noise * (wav.pow(2).mean().sqrt() * 10.0 ** (-snr / 20.0))


def cut(data: bytes, start: float, end: float | None) -> bytes:
    """The stretch ``[start, end)`` (seconds; ``end`` None: to the end) of any audio soundfile reads, as
    16-bit WAV; an ``AudioError`` when it does not decode or the stretch is empty."""
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate = f.samplerate
            first = int(round(start * rate))
            last = f.frames if end is None else min(f.frames, int(round(end * rate)))
            if first >= last:
                raise AudioError("empty_audio", f"segment {start}-{end} s of {f.frames / rate:.2f} s")
            f.seek(first)
            x = f.read(last - first, dtype="int16", always_2d=True)
    except AudioError:
        raise
    except Exception as e:  # soundfile raises several types (RuntimeError, LibsndfileError)
        raise AudioError("undecodable_audio", str(e)) from None
    return encode_wav(x.mean(axis=1).astype(np.int16) if x.shape[1] > 1 else x[:, 0], rate)


def encode_wav(samples: np.ndarray, sample_rate: int) -> bytes:
    """16-bit PCM WAV bytes for int16 or float ([-1, 1]) mono ``samples``."""
    buf = io.BytesIO()
    sf.write(buf, samples, sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()

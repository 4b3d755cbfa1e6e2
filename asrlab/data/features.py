"""Kaldi fbank of asrlab's own: one utterance, or a padded batch on any device.

It reproduces ``torchaudio.compliance.kaldi.fbank`` as asrlab calls it (povey window, DC removal,
pre-emphasis 0.97, 512-point power spectrum, Kaldi mel banks from 20 Hz to Nyquist, natural log,
``snip_edges``, int16-scaled samples) to within 1e-3 on the log-mel values, and is faster than it for two
reasons: the window and the mel matrix are made once per setting, not at every call, and the power
spectrum is two squares and a sum (not ``abs()``'s square root, then a square). On a CPU one utterance at
a time is the fastest: its frames stay in the cache, while the frames of a whole batch put through one FFT
do not (docs/benchmarks.md). The loader makes its
features with it (``data.features: cpu``); with ``data.features: device`` the loader hands over padded
waveforms and :class:`BatchFbank` makes the same features for the whole batch after the copy, on the GPU.
"""

from __future__ import annotations

import functools

import torch
import torchaudio
from torch import nn
from torchaudio.compliance.kaldi import get_mel_banks

EPS = torch.finfo(torch.float32).eps
PREEMPH = 0.97


@functools.lru_cache(maxsize=16)
def _constants(sample_rate: int, num_mel_bins: int, frame_length_ms: float, frame_shift_ms: float):
    """(win, hop, n_fft, povey window (win,), mel matrix (n_fft // 2 + 1, mel)) of a setting, on the CPU."""
    win = int(sample_rate * frame_length_ms / 1000)
    hop = int(sample_rate * frame_shift_ms / 1000)
    n_fft = 1 << (win - 1).bit_length()
    banks, _ = get_mel_banks(num_mel_bins, n_fft, float(sample_rate), 20.0, 0.0, 100.0, -500.0, 1.0)
    mel = nn.functional.pad(banks, (0, 1)).T.contiguous()  # the Nyquist bin has no weight
    window = torch.hann_window(win, periodic=False).pow(0.85)  # in float32, as torchaudio makes it
    return win, hop, n_fft, window, mel


def _log_mel(
    frames: torch.Tensor,
    window: torch.Tensor,
    mel: torch.Tensor,
    n_fft: int,
    dither: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(..., T, win) frames of int16-scaled samples -> (..., T, mel) Kaldi log-mel.

    Up to the FFT every operation is torchaudio's, in its order: the lowest mel bins hold what is left of
    a frame after DC removal and pre-emphasis, a small difference of large numbers, and another rounding
    there moves their log by a few 1e-3. After the FFT the power is two squares and a sum (not ``abs()``'s
    square root, then a square), which changes nothing that matters."""
    if dither:
        frames = frames + dither * torch.randn(
            frames.shape, generator=generator, dtype=frames.dtype, device=frames.device
        )
    f = frames - frames.mean(dim=-1, keepdim=True)
    g = torch.empty_like(f)
    g[..., 1:] = f[..., 1:] - PREEMPH * f[..., :-1]
    g[..., 0] = f[..., 0] - PREEMPH * f[..., 0]  # Kaldi's pre-emphasis: the first sample against itself
    spec = torch.view_as_real(torch.fft.rfft(g.mul_(window), n=n_fft)).square()
    return torch.clamp((spec[..., 0] + spec[..., 1]) @ mel, min=EPS).log_()


def fbank(
    wav: torch.Tensor,
    sample_rate: int = 16000,
    num_mel_bins: int = 80,
    frame_length_ms: float = 25.0,
    frame_shift_ms: float = 10.0,
    dither: float = 0.0,
) -> torch.Tensor:
    """One utterance's samples in [-1, 1] (S,) -> its log-mel (frames, num_mel_bins)."""
    win, hop, n_fft, window, mel = _constants(sample_rate, num_mel_bins, frame_length_ms, frame_shift_ms)
    if len(wav) < win:
        return torch.zeros(0, num_mel_bins, device=wav.device)
    if wav.device != window.device:  # a waveform on the GPU: the constants go there
        window, mel = window.to(wav.device), mel.to(wav.device)
    return _log_mel((wav.float() * 32768.0).unfold(0, win, hop), window, mel, n_fft, dither)


def torchaudio_fbank(
    wav: torch.Tensor,
    sample_rate: int = 16000,
    num_mel_bins: int = 80,
    frame_length_ms: float = 25.0,
    frame_shift_ms: float = 10.0,
    dither: float = 0.0,
) -> torch.Tensor:
    """``torchaudio.compliance.kaldi.fbank`` with the same settings (``data.fbank: torchaudio``): the reference."""
    return torchaudio.compliance.kaldi.fbank(
        (wav * 32768.0).unsqueeze(0),
        num_mel_bins=num_mel_bins,
        frame_length=frame_length_ms,
        frame_shift=frame_shift_ms,
        dither=dither,
        energy_floor=0.0,
        sample_frequency=sample_rate,
    )


FBANKS = {"asrlab": fbank, "torchaudio": torchaudio_fbank}  # data.fbank


class BatchFbank(nn.Module):
    """``(wavs (B, S) in [-1, 1], wav_lens (B,))`` -> ``(feats (B, T, mel), feat_lens (B,))``; padded frames are 0.
    The same features as :func:`fbank`, made on the device the waveforms are on (``data.features: device``)."""

    def __init__(
        self,
        sample_rate: int = 16000,
        num_mel_bins: int = 80,
        frame_length_ms: float = 25.0,
        frame_shift_ms: float = 10.0,
    ):
        super().__init__()
        self.win, self.hop, self.n_fft, window, mel = _constants(
            sample_rate, num_mel_bins, frame_length_ms, frame_shift_ms
        )
        self.register_buffer("mel", mel.clone(), persistent=False)  # (F, mel)
        self.register_buffer("window", window.clone(), persistent=False)

    @classmethod
    def for_data(cls, cfg) -> "BatchFbank | None":
        """The module a ``DataConfig`` asks for: one with ``features: device``, else None."""
        if cfg.features != "device":
            return None
        return cls(cfg.sample_rate, cfg.num_mel_bins, cfg.frame_length_ms, cfg.frame_shift_ms)

    def frames(self, wav_lens: torch.Tensor) -> torch.Tensor:
        return torch.where(wav_lens >= self.win, 1 + (wav_lens - self.win) // self.hop, torch.zeros_like(wav_lens))

    @torch.no_grad()
    def forward(self, wavs: torch.Tensor, wav_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = wavs.float() * 32768.0  # Kaldi works on int16-scaled samples
        if x.shape[1] < self.win:
            x = nn.functional.pad(x, (0, self.win - x.shape[1]))
        feats = _log_mel(x.unfold(1, self.win, self.hop), self.window, self.mel, self.n_fft)  # (B, T, mel)
        lens = self.frames(wav_lens.to(feats.device))
        mask = torch.arange(feats.shape[1], device=feats.device)[None, :] < lens[:, None]
        return feats * mask[..., None], lens


def batch_features(
    batch: dict, device: torch.device, fbank: BatchFbank | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's input for a loader batch: its fbank, or fbank made now from its waveforms."""
    if "feats" in batch:
        return batch["feats"].to(device, non_blocking=True), batch["feat_lens"].to(device, non_blocking=True)
    if fbank is None:
        raise ValueError("this batch holds waveforms (data.features=device) but no BatchFbank was given")
    feats, lens = fbank(batch["wavs"].to(device, non_blocking=True), batch["wav_lens"].to(device, non_blocking=True))
    return feats, lens

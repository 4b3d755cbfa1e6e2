"""The signal processing of the embedded corpus, in numpy: a windowed-sinc polyphase resampler (eSpeak's
22,050 Hz to 16 kHz, with speed perturbation folded into the same step), coloured and babble-like noise, and
a simple reverberation. Also the loader's on-the-fly noise augmentation (``data.noise_aug``)."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

SAMPLE_RATE = 16000  # Hz: the corpus's rate, and the rate noise and reverberation are shaped at


@lru_cache(maxsize=16)
def _sinc_bank(up: int, down: int, zero_crossings: int = 8, rolloff: float = 0.94):
    """Hann-windowed sinc filter bank: one row of 2K taps per output phase (``up`` rows)."""
    fc = min(1.0, up / down) * rolloff  # cutoff, as a fraction of the input Nyquist rate
    k_half = int(math.ceil(zero_crossings / fc))
    taps = np.arange(-k_half + 1, k_half + 1)
    tau = taps[None, :] - (np.arange(up) / up)[:, None]
    window = np.where(np.abs(tau) < k_half, 0.5 * (1.0 + np.cos(np.pi * tau / k_half)), 0.0)
    bank = fc * np.sinc(fc * tau) * window
    bank /= bank.sum(axis=1, keepdims=True)  # unit DC gain for every phase
    return k_half, bank


@lru_cache(maxsize=16)
def _polyphase_plan(up: int, down: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """For output phase r (0..up-1): first input column and the 2K taps, as arrays."""
    k_half, bank = _sinc_bank(up, down)
    r = np.arange(up)
    first = (r * down) // up + 1
    return k_half, down + 2 * k_half, first, np.ascontiguousarray(bank[(r * down) % up].T)


def resample(x: np.ndarray, orig_sr: int, new_sr: int) -> np.ndarray:
    """Band-limited resampling of a 1-D float signal from ``orig_sr`` to ``new_sr`` Hz (integers).

    A Hann-windowed sinc (8 zero crossings, cutoff 0.94 x the lower Nyquist
    rate), polyphase, in float64 numpy without BLAS (no threads, so the result
    does not depend on the process). Returns ``len(x) * new_sr // orig_sr`` samples.
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    g = math.gcd(int(orig_sr), int(new_sr))
    up, down = int(new_sr) // g, int(orig_sr) // g
    if up == down:
        return x.copy()
    n_out = (len(x) * up) // down
    if n_out == 0:
        return np.zeros(0)
    k_half, width, first, taps = _polyphase_plan(up, down)
    # Output block q (samples q*up .. q*up + up-1) reads the input window starting at
    # padded[q*down]: a strided view of overlapping windows, then one multiply-add per tap.
    blocks = -(-n_out // up)
    padded = np.zeros(blocks * down + width + 1)
    padded[k_half : k_half + len(x)] = x
    windows = np.lib.stride_tricks.as_strided(
        padded, shape=(blocks, width), strides=(down * padded.itemsize, padded.itemsize), writeable=False
    )
    out = windows[:, first] * taps[0]
    for k in range(1, 2 * k_half):
        out += windows[:, first + k] * taps[k]
    return out.reshape(-1)[:n_out]


def _fft_len(n: int) -> int:
    """Smallest 2**a * 3**b * 5**c >= n (a fast FFT size)."""
    best = 1 << max(int(n) - 1, 0).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _shaped(rng_noise: np.ndarray, gain) -> np.ndarray:
    """Filter ``rng_noise`` (1-D) by the magnitude response ``gain(freqs_hz)``, unit variance."""
    n = len(rng_noise)
    m = _fft_len(n)
    freqs = np.fft.rfftfreq(m, 1.0 / SAMPLE_RATE)
    y = np.fft.irfft(np.fft.rfft(rng_noise, m) * gain(freqs), m)[:n]
    return y / (y.std() + 1e-12)


def coloured_noise(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """Unit-variance noise with power spectral density ~ 1/f**exponent (floored at 20 Hz)."""
    white = rng.standard_normal(n)
    if exponent == 0.0:
        return white
    return _shaped(white, lambda f: np.maximum(f, 20.0) ** (-exponent / 2.0))


def babble_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Babble-like noise: 3-6 'talkers' gated at syllable rates, speech-shaped.

    Each talker is white noise times a syllable-rate envelope (2.5-6 Hz bursts,
    slowly swelling); their sum goes through a speech-like band-pass (peak at
    300-900 Hz, -15 dB/oct above it). A sum of independent Gaussian noises with
    envelopes e_k is Gaussian noise with envelope sqrt(sum e_k**2), computed on
    a 2 ms grid.
    """
    hop = 32
    talkers = int(rng.integers(3, 7))
    blocks = -(-n // hop)
    t = (np.arange(blocks) + 0.5) * hop / SAMPLE_RATE
    rate = rng.uniform(2.5, 6.0, size=(talkers, 1))  # syllables per second
    swell = rng.uniform(0.2, 0.6, size=(talkers, 1))
    phases = rng.uniform(0.0, 2 * np.pi, size=(talkers, 2))
    env = 0.15 + np.maximum(np.sin(2 * np.pi * rate * t + phases[:, :1]), 0.0) ** 2
    env *= 0.6 + 0.4 * np.sin(2 * np.pi * swell * t + phases[:, 1:])
    level = np.sqrt(np.sum(env**2, axis=0))
    mix = (rng.standard_normal((blocks, hop)) * level[:, None]).reshape(-1)[:n]
    f0 = rng.uniform(300.0, 900.0)
    return _shaped(mix, lambda f: (f / f0) / (1.0 + (f / f0) ** 2) ** 1.25)


def add_reverb(rng: np.random.Generator, x: np.ndarray, rt60: float, drr_db: float) -> np.ndarray:
    """Convolve with a synthetic room response: direct path + exponentially decaying noise tail."""
    n = max(int(rt60 * SAMPLE_RATE), 16)
    t = np.arange(n) / SAMPLE_RATE
    tail = rng.standard_normal(n) * np.exp(-6.9078 * t / rt60)  # -60 dB at rt60
    tail[: int(rng.uniform(0.002, 0.01) * SAMPLE_RATE)] = 0.0  # first reflections arrive later
    tail /= np.sqrt(np.sum(tail**2)) + 1e-12
    ir = tail * 10.0 ** (-drr_db / 20.0)
    ir[0] = 1.0
    size = len(x) + n - 1
    nfft = 1 << (size - 1).bit_length()
    y = np.fft.irfft(np.fft.rfft(x, nfft) * np.fft.rfft(ir, nfft), nfft)[:size]
    return y

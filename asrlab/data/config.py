"""The ``data`` section of a config: audio, features, augmentation, shuffling, batching, the loader's workers."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UsageError


@dataclass
class DataConfig:
    """The ``data`` section of a config."""

    sample_rate: int = 16000  # Hz, audio is resampled to it
    resample: bool = True  # False: audio at another rate is bad input ("sample_rate")
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 0.0
    features: str = "cpu"  # "cpu": fbank in the loader; "device": padded waveforms, fbank after the copy
    fbank: str = "asrlab"  # the loader's Kaldi fbank: asrlab's own, or torchaudio's (the same values, slower)
    spec_augment: bool = False
    noise_aug: float = 0.0  # share of training utterances given babble-like noise on the fly (0: off)
    noise_aug_snr: tuple = (5.0, 20.0)  # dB, U(low, high), against the utterance as stored
    speed: float = 1.0  # play every utterance this much faster (tempo, pitch and formants move
    #                                  together; by resampling to a multiple of 100 Hz): decoding's test-time warps
    speed_perturb: tuple = ()  # training: each utterance at one of these speeds, e.g. [0.9, 1.0, 1.1] (WeNet's
    #                                  and ESPnet's recipes), drawn per utterance per epoch, planned with its length
    shuffle: bool = True  # shuffle sources per epoch and items per block
    shuffle_size: int = 500  # items per shuffle block (WeNet's shuffle buffer)
    sort_size: int = 100  # items per length-sorting window; 0 disables sorting
    bucketing: bool = False  # duration buckets: sort each whole shuffle block by length, cut it into
    #                                  batches, shuffle the batches' order (least padding; sort_size unused)
    batch_type: str = "dynamic"  # "dynamic": by max_frames_in_batch; "static": batch_size
    batch_size: int = 16  # utterances per batch (static)
    max_frames_in_batch: int = 5000  # padded fbank frames per batch (dynamic)
    max_frames_by_length: tuple = ()  # [[up_to_frames, max_frames], ...]: a batch whose longest utterance has at
    #                                  most up_to_frames gets max_frames (asrlab tune measures it on a GPU); longer
    #                                  than the last row: the last row's; empty: max_frames_in_batch for all
    min_duration_s: float = 0.05
    max_duration_s: float = 30.0
    num_workers: int = 0
    prefetch_factor: int = 2
    pin_memory: bool = False
    bad_input: str = "skip"  # "skip": count by reason and go on; "fail": raise
    raw_chunk: int = 1000  # items per source for raw lists and Kaldi dirs
    index: bool = True  # start-up reads lengths and transcripts from LIST.index.json (asrlab.data.index)
    seed: int = 0
    # a fault put in on purpose (asrlab.data.faults), for the stall notebook and tests: a slow or hung rank
    inject_delay_s: float = 0.0  # seconds per batch (0: off)
    inject_delay_ranks: tuple = ()  # ranks that sleep (empty: every rank)
    inject_delay_from_batch: int = 0  # first batch of each worker's epoch that sleeps

    def __post_init__(self):
        if self.batch_type not in ("dynamic", "static"):
            raise UsageError(f"data.batch_type must be 'dynamic' or 'static', not {self.batch_type!r}")
        if self.bad_input not in ("skip", "fail"):
            raise UsageError(f"data.bad_input must be 'skip' or 'fail', not {self.bad_input!r}")
        if self.shuffle_size < 1 or self.batch_size < 1 or self.max_frames_in_batch < 1:
            raise UsageError("data.shuffle_size, batch_size and max_frames_in_batch must be positive")
        rows = [tuple(r) for r in self.max_frames_by_length]
        if any(len(r) != 2 or min(r) < 1 for r in rows) or [r[0] for r in rows] != sorted({r[0] for r in rows}):
            raise UsageError(
                "data.max_frames_by_length must be [[up_to_frames, max_frames], ...] of positive "
                f"numbers, up_to_frames increasing, not {list(self.max_frames_by_length)}"
            )
        if self.num_workers < 0:
            raise UsageError("data.num_workers must be >= 0")
        if self.features not in ("cpu", "device"):
            raise UsageError(f"data.features must be 'cpu' or 'device', not {self.features!r}")
        if self.fbank not in ("asrlab", "torchaudio"):
            raise UsageError(f"data.fbank must be 'asrlab' or 'torchaudio', not {self.fbank!r}")
        if not 0.0 <= self.noise_aug <= 1.0:
            raise UsageError(f"data.noise_aug is a share of utterances, in [0, 1], not {self.noise_aug}")
        if len(self.noise_aug_snr) != 2 or self.noise_aug_snr[0] > self.noise_aug_snr[1]:
            raise UsageError(f"data.noise_aug_snr must be [low, high] in dB, not {list(self.noise_aug_snr)}")
        if self.noise_aug and self.sample_rate != 16000:
            raise UsageError(
                f"data.noise_aug makes 16 kHz babble (the corpus' noise); data.sample_rate is {self.sample_rate}"
            )
        if not 0.5 <= self.speed <= 2.0:
            raise UsageError(f"data.speed is a tempo factor in [0.5, 2], not {self.speed}")
        if any(
            isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.5 <= x <= 2.0 for x in self.speed_perturb
        ):
            raise UsageError(
                f"data.speed_perturb is a list of tempo factors in [0.5, 2], e.g. [0.9, 1.0, 1.1], "
                f"not {list(self.speed_perturb)}"
            )
        if self.features == "device" and (self.spec_augment or self.dither):
            raise UsageError("data.features=device computes plain fbank; turn off spec_augment and dither")

    def frame_limit(self, longest: int) -> int:
        """Padded frames a dynamic batch may hold when its longest utterance has ``longest`` frames."""
        for up_to, limit in self.max_frames_by_length:
            if longest <= up_to:
                return limit
        return self.max_frames_by_length[-1][1] if self.max_frames_by_length else self.max_frames_in_batch

    def for_eval(self, **changes) -> "DataConfig":
        """This config for dev and decoding: in order, with no augmentation (SpecAugment, added noise, speeds)."""
        return replace(self, shuffle=False, spec_augment=False, noise_aug=0.0, speed_perturb=(), **changes)

    def rate(self, perturb: float = 1.0) -> int:
        """Hz to resample to, so that the result read at ``sample_rate`` plays ``speed`` (times ``perturb``,
        an utterance's speed perturbation) times faster."""
        speed = self.speed * perturb
        return self.sample_rate if speed == 1.0 else int(round(self.sample_rate / speed / 100.0)) * 100

    def frames(self, num_samples: int, sample_rate: int, perturb: float = 1.0) -> int:
        """Fbank frames of ``num_samples`` samples at ``sample_rate`` Hz, once resampled to ``self.rate(perturb)``."""
        resampled = -(-num_samples * self.rate(perturb) // sample_rate)  # torchaudio's resample rounds up
        return num_frames(resampled, self.sample_rate, self.frame_length_ms, self.frame_shift_ms)


def num_frames(num_samples: int, sample_rate: int, frame_length_ms: float = 25.0, frame_shift_ms: float = 10.0) -> int:
    """Fbank frames Kaldi makes from ``num_samples`` (snip_edges=True)."""
    win = int(sample_rate * frame_length_ms / 1000)
    shift = int(sample_rate * frame_shift_ms / 1000)
    return 0 if num_samples < win else 1 + (num_samples - win) // shift

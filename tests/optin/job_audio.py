"""What the opt-in toolkit jobs (``keras_fit.py``, ``ignite_ctc.py``, ``fastai_fit.py``) feed their models: a WAV of
the corpus as 40 log-mel filterbanks (``torchaudio.compliance.kaldi.fbank``, 25/10 ms), normalised per utterance.
Imported from the job's own folder (a script's folder is on its ``sys.path``)."""

import soundfile as sf
import torch
import torchaudio


def fbank(path: str) -> torch.Tensor:
    """``(frames, 40)``; a missing file raises soundfile's error, a FIFO nobody writes blocks (the cases' faults)."""
    wav, sr = sf.read(path, dtype="float32")
    fb = torchaudio.compliance.kaldi.fbank(
        torch.from_numpy(wav)[None] * 32768, num_mel_bins=40, sample_frequency=sr, dither=0.0
    )
    return (fb - fb.mean(0)) / (fb.std(0) + 1e-5)

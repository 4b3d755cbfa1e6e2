"""What the opt-in toolkit jobs (``keras_fit.py``, ``ignite_ctc.py``, ``fastai_fit.py``) feed their models: the
corpus's ``raw.list`` (WeNet's raw mode: a JSON object a line), its characters' ids, and a WAV as 40 log-mel filterbanks (``torchaudio.compliance.kaldi.fbank``, 25/10 ms), normalised per utterance.
Imported from the job's own folder (a script's folder is on its ``sys.path``)."""

import json
from pathlib import Path

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


def raw_items(path: str) -> list[dict]:
    """The list's utterances: ``{"key", "wav", "txt"}`` each."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def vocab_of(*paths: str) -> dict[str, int]:
    """Each character of the lists' transcripts -> its id, from 1 (0: CTC's blank)."""
    return {c: i + 1 for i, c in enumerate(sorted({c for p in paths for item in raw_items(p) for c in item["txt"]}))}

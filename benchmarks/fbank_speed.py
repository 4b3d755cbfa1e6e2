"""asrlab's Kaldi fbank against torchaudio's, per core, on utterances of the embedded corpus.

Audio seconds per second on one thread of: ``torchaudio.compliance.kaldi.fbank`` as asrlab called it,
``asrlab.data.features.fbank`` one utterance at a time (what a loader worker does), and ``BatchFbank`` on
padded batches of 16 (the ``data.features: device`` path, here on the CPU). Interleaved rounds, medians; the
largest difference between the two fbanks' values is printed too. Run from the repository root::

    .venv/bin/python benchmarks/fbank_speed.py [--utts 200] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchaudio

from asrlab.data import audio, synth
from asrlab.data.features import BatchFbank, fbank


def kaldi(wav: torch.Tensor) -> torch.Tensor:
    return torchaudio.compliance.kaldi.fbank(
        (wav * 32768.0).unsqueeze(0),
        num_mel_bins=80,
        frame_length=25.0,
        frame_shift=10.0,
        dither=0.0,
        energy_floor=0.0,
        sample_frequency=16000,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--utts", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    wavs = [audio.decode(u.wav)[0] for u in synth.iter_split("train", a.utts, seed=0, workers=2)]
    seconds = sum(len(w) for w in wavs) / 16000
    batches = []
    for i in range(0, len(wavs), 16):
        group = wavs[i : i + 16]
        lens = torch.tensor([len(w) for w in group])
        batches.append((torch.nn.utils.rnn.pad_sequence(group, batch_first=True), lens))
    module = BatchFbank()
    runs = {
        "torchaudio": lambda: [kaldi(w) for w in wavs],
        "asrlab, per utterance": lambda: [fbank(w) for w in wavs],
        "asrlab BatchFbank, 16 padded": lambda: [module(x, n) for x, n in batches],
    }
    for f in runs.values():
        f()  # warm-up
    rows: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(a.rounds):
        for name in list(runs)[r % 3 :] + list(runs)[: r % 3]:
            t0 = time.perf_counter()
            runs[name]()
            rows[name].append(seconds / (time.perf_counter() - t0))
    diff = max(float((kaldi(w) - fbank(w)).abs().max()) for w in wavs)
    print(
        f"{len(wavs)} utterances, {seconds:.0f} s of audio (mean {seconds / len(wavs):.2f} s), 1 thread, "
        f"{a.rounds} interleaved rounds"
    )
    base = statistics.median(rows["torchaudio"])
    for name, v in rows.items():
        print(f"{name:32s} {statistics.median(v):8.0f} audio s/s  {statistics.median(v) / base:.2f}x torchaudio")
    print(f"largest |asrlab - torchaudio| over every log-mel value: {diff:.2e}")


if __name__ == "__main__":
    main()

"""What a model's errors depend on: test's held-out accents, its held-out variants or its acoustic conditions;
and digital silence.

Decodes a model on sets of N utterances made on the spot (``asrlab synth``'s generator, corpus seed 0). The
first four are all in test's conditions (babble at 10-20 dB SNR, reverberation always):

    test                             the test split's first N utterances: held-out accents and variants
    test_accents_train_variants      the same texts, prosody and conditions; train's variants on test's accents
    train_accents_test_variants      the same; test's variants on train's accents
    train_voices_test_conditions     the dev split's first N (train's voices) in test's conditions

and two are clean:

    train_voices_60db                the dev split's first N, no reverberation, white noise at 60 dB SNR
    train_voices_digital_silence     the same with no noise at all: exact zeros before and after the speech

    .venv/bin/python benchmarks/error_factors.py EXP LEXICON_LIST [--n 300] [--out data/factors]

The sets are written once under ``--out`` and reused. Each utterance is made with eSpeak reset first
(``make_utterance(fresh=True)``), so ``test`` has the test split's texts, voices and conditions but not exactly its
bytes (the corpus resets eSpeak once per 16 utterances). Each set's greedy and lexicon CER come from
``asrlab decode`` (beam 32, LM weight 1.0, word bonus 3.0; no test-time warps); hypotheses go to
``EXP/decode/<set>.txt``.
"""

import argparse
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from asrlab.data import synth
from asrlab.data.shards import write_split


@contextmanager
def patched(**names):
    """Swap module-level names of ``asrlab.data.synth`` for the duration."""
    old = {k: getattr(synth, k) for k in names}
    for k, v in names.items():
        setattr(synth, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(synth, k, v)


def voices(accents, variants):
    return lambda split: [f"{a}+{v}" for a in accents for v in variants]


TRAIN_VARIANTS = (*synth.TRAIN_VARIANTS, *synth.generated_variants())
CLEAN = dict(_reverb=lambda rng, x, rt60, drr: x, TRAIN_NOISES=("white",))  # with noise_snr (60, 60)
SILENT = dict(CLEAN, _coloured_noise=lambda rng, n, exponent: np.zeros(n))
TEST_LIKE = dict(TRAIN_NOISES=("babble",), TRAIN_REVERB_SHARE=1.0)  # with noise_snr (10, 20): test's SNR range
# name: (split whose texts, prosody and conditions are used, what to patch, noise_snr)
SETS = {
    "test": ("test", {}, (10.0, 30.0)),
    "test_accents_train_variants": (
        "test",
        dict(split_voices=voices(synth.TEST_ACCENTS, TRAIN_VARIANTS)),
        (10.0, 30.0),
    ),
    "train_accents_test_variants": (
        "test",
        dict(split_voices=voices(synth.TRAIN_ACCENTS, synth.TEST_VARIANTS)),
        (10.0, 30.0),
    ),
    "train_voices_test_conditions": ("dev", TEST_LIKE, (10.0, 20.0)),
    "train_voices_60db": ("dev", CLEAN, (60.0, 60.0)),
    "train_voices_digital_silence": ("dev", SILENT, (60.0, 60.0)),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("exp")
    p.add_argument("lexicon", help="data.list whose transcripts make the lexicon (train's)")
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--out", default="data/factors")
    a = p.parse_args()
    for name, (split, patch, snr) in SETS.items():
        d = Path(a.out) / name
        if not (d / "data.list").exists():
            with patched(**patch):
                utts = [synth.make_utterance(0, split, i, noise_snr=snr) for i in range(a.n)]
            write_split(((u.key, u.text, u.wav) for u in utts), d, split)
        cer = []
        for lex in ([], ["--lexicon", a.lexicon]):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "asrlab.cli",
                    "decode",
                    "--exp",
                    a.exp,
                    "--data",
                    str(d / "data.list"),
                    "--name",
                    name,
                    *lex,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            line = [x for x in out.stdout.splitlines() if "CER" in x][-1]  # "...: CER 4.61%, WER 6.01% ..."
            cer.append(line.split("CER ", 1)[1].split(",")[0])
        print(f"{name:30s} CER greedy {cer[0]:>6s}  lexicon {cer[1]:>6s}", flush=True)


if __name__ == "__main__":
    main()

"""The embedded corpus' voices: eSpeak NG's accents and variants each split draws from, and a fixed pool of
generated variants (random voice settings within the ranges of eSpeak's own variant files) for train and dev."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

TRAIN_ACCENTS = ("en-us", "en", "en-gb-x-rp", "en-gb-x-gbclan")
TEST_ACCENTS = ("en-029", "en-gb-scotland", "en-gb-x-gbcwmd")
TRAIN_VARIANTS = (
    "m1",
    "m2",
    "m3",
    "m4",
    "m5",
    "m6",
    "f1",
    "f2",
    "f3",
    "f4",
    "klatt",
    "klatt2",
    "klatt3",
    "croak",
    "max",
    "Annie",
    "belinda",
    "rob",
)
TEST_VARIANTS = ("m7", "m8", "f5", "klatt4", "edward", "steph", "grandpa", "aunty", "quincy", "travis")


# Generated voice variants (train/dev only), see random_variant().
GEN_VARIANTS = 256  # size of the pool, named g000 .. g255
GEN_VARIANT_SHARE = 0.75  # share of train/dev utterances spoken by a generated variant
GEN_VARIANT_SEED = 20240603  # the pool is fixed: it does not depend on the corpus seed
GEN_KLATT = (0, 1, 2, 3)  # source models for generated variants (0 = eSpeak's own); 4, 5 are test's


def random_variant(rng: np.random.Generator, name: str) -> str:
    """The text of an eSpeak variant file with random voice settings.

    Ranges follow what eSpeak NG's own ~90 variant files use (their 5th-95th
    percentiles, test variants left out): a vocal-tract scale moves all formant
    frequencies together (0.85-1.2), each formant then moves on its own
    (+-12% for F1-F3, more above); formant heights and widths, voicing and
    consonant levels, breathiness, flutter, roughness, echo, stress amplitudes
    and the Klatt source model (none, 1, 2 or 3) are drawn independently. In
    two of three variants a ``tone`` line sets the spectral tilt: levels at
    100, 600, 1200, 2000 and 3000 Hz on a random slope from a 1/f**1.6 fall to
    a 1/f**-0.5 rise, each jittered by about +-40% (eSpeak's stock variants
    range from flat to a steep low-pass shape, which many of them share).
    """
    lines = ["language variant", f"name {name}"]
    base = float(rng.uniform(60.0, 240.0))  # Hz
    top = base * float(rng.uniform(1.1, 1.8))
    lines.append(f"pitch {base:.0f} {top:.0f}")
    scale = float(rng.uniform(0.85, 1.2))
    for k in range(9):
        if k == 0:  # nasal formant
            freq = 100.0 * float(rng.uniform(0.75, 1.2))
        elif k <= 3:
            freq = 100.0 * scale * float(rng.uniform(0.88, 1.12))
        else:
            freq = 100.0 * scale * float(rng.uniform(0.7, 1.25))
        height = float(rng.uniform(50.0, 150.0)) if k <= 2 else float(rng.uniform(0.0, 150.0))
        width = float(rng.uniform(40.0, 180.0))
        lines.append(f"formant {k} {freq:.0f} {height:.0f} {width:.0f}")
    if rng.random() < 2.0 / 3.0:
        freqs = np.array([100.0, 600.0, 1200.0, 2000.0, 3000.0])
        slope = float(rng.uniform(-1.6, 0.5))
        level = float(rng.uniform(60.0, 255.0)) * (freqs / 600.0) ** slope
        level *= np.exp(rng.normal(0.0, 0.35, size=len(freqs)))
        level = np.clip(level, 5.0, 255.0)
        lines.append("tone " + " ".join(f"{f:.0f} {a:.0f}" for f, a in zip(freqs, level)))
    lines.append(f"voicing {float(rng.uniform(25.0, 200.0)):.0f}")
    lines.append(f"consonants {float(rng.uniform(40.0, 190.0)):.0f} {float(rng.uniform(50.0, 190.0)):.0f}")
    lines.append(f"flutter {int(rng.integers(0, 25))}")
    lines.append(f"roughness {int(rng.integers(0, 6))}")
    if rng.random() < 0.3:
        lines.append("breath " + " ".join(str(int(b)) for b in rng.integers(0, 6, size=8)))
    if rng.random() < 0.3:
        lines.append(f"echo {int(rng.integers(20, 200))} {int(rng.integers(0, 25))}")
    if rng.random() < 0.3:
        lines.append("stressAmp " + " ".join(str(int(a)) for a in rng.integers(12, 28, size=8)))
    klatt = GEN_KLATT[int(rng.integers(len(GEN_KLATT)))]
    if klatt:
        lines.append(f"klatt {klatt}")
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=1)
def generated_variants() -> dict[str, str]:
    """The pool of generated variants, ``{name: variant file text}`` (fixed, seed-independent)."""
    return {
        f"g{i:03d}": random_variant(np.random.default_rng((GEN_VARIANT_SEED, i)), f"g{i:03d}")
        for i in range(GEN_VARIANTS)
    }


def voice_tag(voice: str) -> str:
    return voice.replace("+", "_")


def voice_of(key: str) -> dict | None:
    """``{"split", "accent", "variant"}`` of an embedded corpus' utterance key
    (``<split>-<accent>_<variant>-<index>``); None for a key of other data."""
    parts = key.split("-")
    if len(parts) < 3 or not parts[-1].isdigit() or "_" not in parts[-2]:
        return None
    accent, variant = "-".join(parts[1:-1]).rsplit("_", 1)
    return {"split": parts[0], "accent": accent, "variant": variant}

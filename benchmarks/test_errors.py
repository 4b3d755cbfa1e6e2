"""Where a model's test errors are: CER by held-out accent and variant, by content (digit strings or commands)
and by the noise SNR each utterance was synthesized with.

    .venv/bin/python benchmarks/test_errors.py runs/budget/exp/decode/test_lexicon.txt [--seed 0]

The hypotheses file is ``asrlab decode``'s (``key<TAB>ref<TAB>hyp``) over an embedded corpus' test
split; each utterance's SNR is recomputed with ``asrlab.data.synth.make_utterance`` from the corpus
seed and the index in its key (a few ms per utterance).
"""

import argparse
import logging
from collections import defaultdict

from asrlab.data.synth import DIGIT_WORDS, make_utterance
from asrlab.scoring import cer

SNR_LOW_DB, SNR_BAND_DB, SNR_BANDS = 10.0, 2.5, 4  # test's SNRs: 10-20 dB, the lower half of the default (10, 30)


def snr_band(snr_db: float) -> str:
    """``"SNR 12.5-15.0 dB"``: the band of ``snr_db`` (values outside 10-20 dB go to the nearest band)."""
    low = SNR_LOW_DB + SNR_BAND_DB * min(max(int((snr_db - SNR_LOW_DB) // SNR_BAND_DB), 0), SNR_BANDS - 1)
    return f"SNR {low:4.1f}-{low + SNR_BAND_DB:4.1f} dB"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("hyps")
    p.add_argument("--seed", type=int, default=0, help="the corpus seed (asrlab synth --seed)")
    a = p.parse_args()
    logging.disable(logging.INFO)
    rows = [line.rstrip("\n").split("\t") for line in open(a.hyps)]
    groups = defaultdict(list)
    for key, ref, hyp in rows:
        split, rest = key.split("-", 1)  # <split>-<accent>_<variant>-<index>
        voice, index = rest.rsplit("-", 1)
        utt = make_utterance(a.seed, split, int(index))
        if utt.text != ref:
            raise SystemExit(f"{key}: not utterance {index} of seed {a.seed} (another --seed?)")
        accent, variant = voice.rsplit("_", 1)
        groups["accent " + accent].append((ref, hyp))
        groups["variant " + variant].append((ref, hyp))
        groups["digit strings" if set(ref.split()) <= set(DIGIT_WORDS) else "commands"].append((ref, hyp))
        groups[snr_band(utt.condition["snr_db"])].append((ref, hyp))
    print(f"{a.hyps}: {len(rows)} utterances, CER {100 * cer([r for _, r, _ in rows], [h for _, _, h in rows]):.2f}%")
    rates = {name: cer(*zip(*pairs)) for name, pairs in groups.items()}
    # SNR bands and content by name, accents and variants worst first
    worst_first = ("accent", "variant")
    for name in sorted(groups, key=lambda g: (g.split()[0], -rates[g] if g.startswith(worst_first) else g)):
        print(f"  {name:22s} CER {100 * rates[name]:5.2f}%  ({len(groups[name])} utterances)")


if __name__ == "__main__":
    main()

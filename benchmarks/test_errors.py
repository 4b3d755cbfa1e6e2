"""Where a model's test errors are: CER by held-out variant, by content (digit strings or commands)
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
from asrlab.model import cer

SNR_BINS_DB = (10.0, 12.5, 15.0, 17.5, 20.0)  # test's SNRs: the lower half of the default (10, 30) dB


def main():
    p = argparse.ArgumentParser()
    p.add_argument("hyps")
    p.add_argument("--seed", type=int, default=0, help="the corpus seed (asrlab synth --seed)")
    a = p.parse_args()
    logging.disable(logging.INFO)
    rows = [line.rstrip("\n").split("\t") for line in open(a.hyps)]
    groups = defaultdict(list)
    for key, ref, hyp in rows:
        split, voice, index = key.split("-", 1)[0], key.split("-", 1)[1].rsplit("-", 1)[0], int(key.rsplit("-", 1)[1])
        utt = make_utterance(a.seed, split, index)
        if utt.text != ref:
            raise SystemExit(f"{key}: not utterance {index} of seed {a.seed} (another --seed?)")
        groups["variant " + voice.rsplit("_", 1)[1]].append((ref, hyp))
        groups["digit strings" if set(ref.split()) <= set(DIGIT_WORDS) else "commands"].append((ref, hyp))
        snr = utt.condition["snr_db"]
        low = max(b for b in SNR_BINS_DB if b <= snr) if snr >= SNR_BINS_DB[0] else SNR_BINS_DB[0]
        groups[f"SNR {low:4.1f}-{low + 2.5:4.1f} dB"].append((ref, hyp))
    print(f"{a.hyps}: {len(rows)} utterances, CER {100 * cer([r for _, r, _ in rows], [h for _, _, h in rows]):.2f}%")
    for name in sorted(groups, key=lambda g: (g.split()[0], -cer(*zip(*groups[g])) if g.startswith("variant") else g)):
        refs, hyps = zip(*groups[name])
        print(f"  {name:22s} CER {100 * cer(refs, hyps):5.2f}%  ({len(refs)} utterances)")


if __name__ == "__main__":
    main()

"""Greedy CTC against the lexicon beam search (``asrlab.lexicon``) over beam widths and LM weights.

The model runs once per split; each setting searches the same log-probs. Choose on dev, read test.

    .venv/bin/python benchmarks/lexicon_decode.py EXP data/corpus [--beams 8,32,128] [--weights 0,0.5,1,2]
"""

import argparse
import logging
import time

from asrlab.decode import GreedyKeepingLogProbs, eval_loader, lexicon_of, load_model, local
from asrlab.lexicon import search
from asrlab.model import cer, wer
from asrlab.train.trainer import evaluate


def main():
    p = argparse.ArgumentParser()
    p.add_argument("exp")
    p.add_argument("corpus", help="a directory with train/, dev/ and test/ data.list (the lexicon is train's)")
    p.add_argument("--splits", default="dev,test")
    p.add_argument("--beams", default="8,32,128")
    p.add_argument("--weights", default="0,0.5,1,2")
    a = p.parse_args()
    logging.disable(logging.INFO)
    model, tok, cfg, marker = load_model(a.exp)
    lex = lexicon_of(f"{a.corpus}/train/data.list")
    print(f"{a.exp} (step {marker['step']}); lexicon: {len(lex.words)} words of train's transcripts")
    for split in a.splits.split(","):
        greedy = GreedyKeepingLogProbs(tok)
        t = time.perf_counter()
        r = evaluate(model, eval_loader(cfg, tok, f"{a.corpus}/{split}/data.list"), tok, local(model), keep_hyps=True,
                     decoder=greedy)
        refs = [ref for _, ref, _ in r["hyps"]]
        print(f"{split}: {len(refs)} utterances; greedy CER {100 * r['cer']:.2f}% WER {100 * r['wer']:.2f}% "
              f"(model and greedy {time.perf_counter() - t:.1f} s)")
        for beam in (int(b) for b in a.beams.split(",")):
            for weight in (float(w) for w in a.weights.split(",")):
                t = time.perf_counter()
                hyps = [search(lp, tok.units, lex, beam, weight) for lp in greedy.kept]
                print(f"  beam {beam:4d} lm weight {weight:3.1f}: CER {100 * cer(refs, hyps):5.2f}% "
                      f"WER {100 * wer(refs, hyps):5.2f}%  (search {time.perf_counter() - t:.1f} s)", flush=True)


if __name__ == "__main__":
    main()

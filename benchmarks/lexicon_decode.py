"""Greedy CTC against the lexicon beam search (``asrlab.lexicon``) over LM orders, beam widths, LM
weights and word bonuses.

The model runs once per split; each setting searches the same log-probs. Choose on dev, read test.

    .venv/bin/python benchmarks/lexicon_decode.py EXP data/corpus [--orders 2,3] [--beams 32]
        [--weights 0,0.5,1,2] [--bonuses 0,1,2,3,4]
"""

import argparse
import logging
import time

from asrlab.decode import GreedyKeepingLogProbs, eval_loader, load_model, local
from asrlab.data.sources import load_sources, transcripts
from asrlab.lexicon import Lexicon, search
from asrlab.scoring import cer, wer
from asrlab.train.evaluate import evaluate


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("exp")
    p.add_argument("corpus", help="a directory with train/, dev/ and test/ data.list (the lexicon is train's)")
    p.add_argument("--splits", default="dev,test")
    p.add_argument("--orders", default="2,3", help="word n-gram orders")
    p.add_argument("--beams", default="32")
    p.add_argument("--weights", default="1")
    p.add_argument("--bonuses", default="0,1,2,3,4", help="word bonus, nats per word")
    a = p.parse_args()
    logging.disable(logging.INFO)
    model, tok, cfg, marker = load_model(a.exp)
    texts = list(transcripts(load_sources(f"{a.corpus}/train/data.list")))
    lexicons = {int(n): Lexicon.from_texts(texts, int(n)) for n in floats(a.orders)}
    print(
        f"{a.exp} (step {marker['step']}); lexicon: {len(lexicons[max(lexicons)].words)} words of train's "
        f"{len(texts)} transcripts"
    )
    for split in a.splits.split(","):
        greedy = GreedyKeepingLogProbs(tok)
        t = time.perf_counter()
        r = evaluate(
            model,
            eval_loader(cfg, tok, f"{a.corpus}/{split}/data.list"),
            tok,
            local(model),
            keep_hyps=True,
            decoder=greedy,
        )
        refs = [ref for _, ref, _ in r["hyps"]]
        print(
            f"{split}: {len(refs)} utterances; greedy CER {100 * r['cer']:.2f}% WER {100 * r['wer']:.2f}% "
            f"(model and greedy {time.perf_counter() - t:.1f} s)"
        )
        for order, lex in lexicons.items():
            for beam in (int(b) for b in floats(a.beams)):
                for weight in floats(a.weights):
                    for bonus in floats(a.bonuses):
                        t = time.perf_counter()
                        hyps = [search(lp, tok.units, lex, beam, weight, bonus) for lp in greedy.kept]
                        print(
                            f"  order {order} beam {beam:4d} lm weight {weight:3.1f} word bonus {bonus:3.1f}: "
                            f"CER {100 * cer(refs, hyps):5.2f}% WER {100 * wer(refs, hyps):5.2f}%  "
                            f"(search {time.perf_counter() - t:.1f} s)",
                            flush=True,
                        )


if __name__ == "__main__":
    main()

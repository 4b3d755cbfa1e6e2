"""CTC prefix beam search constrained to a lexicon, with an optional word-bigram LM.

Greedy decoding takes the best character per frame, so a voice it has never heard comes out as
near-miss spellings ("siconds", "twindow"). A recognizer for a closed vocabulary searches only
strings made of known words (WeNet's TLG graph does this with a lexicon and an n-gram LM):

    score(prefix) = log P_ctc(prefix | audio) + lm_weight * log P_lm(its whole words)

``Lexicon.from_texts`` takes the words, and the bigram counts, from training transcripts; the
search (``search``) keeps the ``beam`` best prefixes per frame, each extended only by a character
that continues a word of the lexicon, or by a space after a whole word. A hypothesis must end
on a whole word.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

NEG_INF = -math.inf
BOS, EOS = "<s>", "</s>"


def _logadd(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    m = max(a, b)
    return m + math.log1p(math.exp(-abs(a - b)))


@dataclass
class Lexicon:
    """Words (whitespace-split) and a word bigram with absolute discounting (natural log)."""

    words: frozenset[str]
    unigrams: Counter = field(default_factory=Counter)
    bigrams: Counter = field(default_factory=Counter)
    discount: float = 0.5

    def __post_init__(self):
        if not self.words:
            raise ValueError("a lexicon needs at least one word")
        self.prefixes = frozenset(w[:i] for w in self.words for i in range(1, len(w) + 1))
        self._followers = Counter(v for v, _ in self.bigrams)  # distinct words seen after v
        self._context = Counter()
        for (v, _), n in self.bigrams.items():
            self._context[v] += n
        self._uni_total = sum(self.unigrams.values())

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "Lexicon":
        unigrams, bigrams = Counter(), Counter()
        for text in texts:
            seq = [BOS, *text.split(), EOS]
            unigrams.update(seq[1:])
            bigrams.update(zip(seq[:-1], seq[1:]))
        words = frozenset(w for w in unigrams if w != EOS)
        return cls(words, unigrams, bigrams)

    def logp(self, prev: str, word: str) -> float:
        """log P(word | prev): discounted bigram, backing off to an add-one unigram."""
        vocab = len(self.words) + 1  # + </s>
        p_uni = (self.unigrams[word] + 1) / (self._uni_total + vocab)
        context = self._context[prev]
        if context == 0:
            return math.log(p_uni)
        seen = max(self.bigrams[(prev, word)] - self.discount, 0.0) / context
        backoff = self.discount * self._followers[prev] / context
        return math.log(seen + backoff * p_uni)


def search(log_probs: np.ndarray, units: list[str], lexicon: Lexicon, beam: int = 32, lm_weight: float = 0.0,
           prune: float = -8.0) -> str:
    """The best lexicon-valid transcript of one utterance.

    log_probs: (T', V) CTC log-probabilities (natural log; blank = 0) of its real frames.
    units: the tokenizer's units (``" "`` is the word separator). Characters whose log-prob at a
    frame is below ``prune`` are not tried there. When no surviving prefix ends on a whole word,
    the best one's whole words.
    """
    space = units.index(" ")

    def score(item) -> float:
        _, (pb, pnb, lm, _) = item
        return _logadd(pb, pnb) + lm_weight * lm

    # prefix -> [log P(ending in blank), log P(ending in a label), LM log-prob of its whole words, last word]
    beams: dict[str, list] = {"": [0.0, NEG_INF, 0.0, BOS]}
    for lp in log_probs:
        cands = [int(c) for c in np.flatnonzero(lp > prune) if c != 0]
        nxt: dict[str, list] = defaultdict(lambda: [NEG_INF, NEG_INF, 0.0, BOS])

        def add(prefix: str, blank_end: bool, logp: float, lm: float, last: str) -> None:
            e = nxt[prefix]
            e[0 if blank_end else 1] = _logadd(e[0 if blank_end else 1], logp)
            e[2], e[3] = lm, last

        for prefix, (pb, pnb, lm, last_word) in beams.items():
            total = _logadd(pb, pnb)
            add(prefix, True, total + float(lp[0]), lm, last_word)
            partial = prefix[prefix.rfind(" ") + 1:]
            for c in cands:
                ch, logp_c = units[c], float(lp[c])
                if prefix and prefix[-1] == ch:  # a repeat collapses unless a blank came between
                    add(prefix, False, pnb + logp_c, lm, last_word)
                    source = pb
                else:
                    source = total
                if c == space:
                    if partial not in lexicon.words:
                        continue
                    add(prefix + ch, False, source + logp_c, lm + lexicon.logp(last_word, partial), partial)
                elif partial + ch in lexicon.prefixes:
                    add(prefix + ch, False, source + logp_c, lm, last_word)

        beams = dict(sorted(nxt.items(), key=score, reverse=True)[:beam])

    best, best_score = "", NEG_INF
    for prefix, (pb, pnb, lm, last_word) in beams.items():
        text = prefix.rstrip(" ")
        partial = text[text.rfind(" ") + 1:]
        if text and partial not in lexicon.words:
            continue
        if text and not prefix.endswith(" "):
            lm += lexicon.logp(last_word, partial)
            last_word = partial
        lm += lexicon.logp(last_word, EOS)
        s = _logadd(pb, pnb) + lm_weight * lm
        if s > best_score:
            best, best_score = text, s
    if best_score == NEG_INF and beams:
        prefix = max(beams.items(), key=score)[0]
        best = prefix[:prefix.rfind(" ") + 1].rstrip(" ")
    return best

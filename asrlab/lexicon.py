"""CTC prefix beam search constrained to a lexicon, with an optional word n-gram LM and word bonus.

Greedy decoding takes the best character per frame, so a voice it has never heard comes out as
near-miss spellings ("siconds", "twindow"). A recognizer for a closed vocabulary searches only
strings made of known words (WeNet's TLG graph does this with a lexicon and an n-gram LM):

    score(prefix) = log P_ctc(prefix | audio) + lm_weight * log P_lm(its whole words) + word_bonus * words

``Lexicon.from_texts`` takes the words, and the n-gram counts (trigram by default), from training
transcripts; the search (``search``) keeps the ``beam`` best prefixes per frame, each extended only
by a character that continues a word of the lexicon, or by a space after a whole word. A hypothesis
must end on a whole word. The word bonus (a word insertion bonus, as in HMM and WFST decoders)
offsets the LM's per-word cost, which otherwise favours dropping a faint word.

``rescore`` combines views of one utterance (the audio played at a few speeds, a test-time warp of
the voice): each view's best transcript is a candidate, and the candidate with the highest sum of
its exact CTC log-likelihood over the views, plus the same LM and bonus terms, wins.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import torch

from .errors import UsageError

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
    """Words (whitespace-split) and a word n-gram with interpolated absolute discounting (natural log).

    ``counts[(w1, .., wk)]`` holds every k-gram for k = 1 .. ``order`` of the transcripts, each
    padded with ``order - 1`` ``<s>`` and one ``</s>``.
    """

    words: frozenset[str]
    counts: Counter = field(default_factory=Counter)
    order: int = 3
    discount: float = 0.5

    def __post_init__(self):
        if not self.words:
            raise UsageError("a lexicon needs at least one word")
        self.prefixes = frozenset(w[:i] for w in self.words for i in range(1, len(w) + 1))
        self._context, self._followers = Counter(), Counter()  # per history: total count, distinct next words
        for gram, n in self.counts.items():
            self._context[gram[:-1]] += n
            self._followers[gram[:-1]] += 1
        self._cache: dict = {}

    @classmethod
    def from_texts(cls, texts: Iterable[str], order: int = 3) -> "Lexicon":
        if order < 1:
            raise UsageError(f"n-gram order must be at least 1, got {order}")
        counts = Counter()
        for text in texts:
            seq = [BOS] * (order - 1) + text.split() + [EOS]
            for i in range(order - 1, len(seq)):
                counts.update(tuple(seq[i - k : i + 1]) for k in range(order))
        words = frozenset(g[0] for g in counts if len(g) == 1 and g[0] != EOS)
        return cls(words, counts, order)

    def start(self) -> tuple[str, ...]:
        """The history before the first word."""
        return (BOS,) * (self.order - 1)

    def then(self, history: tuple[str, ...], word: str) -> tuple[str, ...]:
        """The history after ``word`` (its last order-1 words)."""
        return (*history, word)[1:] if self.order > 1 else ()

    def logp(self, history: tuple[str, ...], word: str) -> float:
        """log P(word | the last order-1 words): each order discounted, interpolated with the one below,
        down to an add-one unigram."""
        key = (history, word)
        if key not in self._cache:
            p = (self.counts[(word,)] + 1) / (self._context[()] + len(self.words) + 1)  # + </s>
            for k in range(1, self.order):
                ctx = history[len(history) - k :]
                n = self._context[ctx]
                if n == 0:
                    break
                seen = max(self.counts[(*ctx, word)] - self.discount, 0.0) / n
                p = seen + self.discount * self._followers[ctx] / n * p
            self._cache[key] = math.log(p)
        return self._cache[key]


def word_score(lexicon: Lexicon, history: tuple, w: str, lm_weight: float, word_bonus: float) -> float:
    """What word ``w`` after ``history`` adds to a hypothesis' score: LM log-prob x weight + bonus (nats)."""
    return lm_weight * lexicon.logp(history, w) + word_bonus


def search(
    log_probs: np.ndarray,
    units: list[str],
    lexicon: Lexicon,
    beam: int = 32,
    lm_weight: float = 0.0,
    word_bonus: float = 0.0,
    prune: float = -8.0,
) -> str:
    """The best lexicon-valid transcript of one utterance.

    log_probs: (T', V) CTC log-probabilities (natural log; blank = 0) of its real frames.
    units: the tokenizer's units (``" "`` is the word separator). Characters whose log-prob at a
    frame is below ``prune`` are not tried there. Each whole word adds ``lm_weight`` times its LM
    log-prob plus ``word_bonus`` (nats). When no surviving prefix ends on a whole word, the best
    one's whole words.
    """
    space = units.index(" ")

    def word(history: tuple, w: str) -> float:
        return word_score(lexicon, history, w, lm_weight, word_bonus)

    def score(item) -> float:
        _, (pb, pnb, words, _) = item
        return _logadd(pb, pnb) + words

    start = lexicon.start()
    # prefix -> [log P(ending in blank), log P(ending in a label), word score of its whole words, LM history]
    beams: dict[str, list] = {"": [0.0, NEG_INF, 0.0, start]}
    for lp in log_probs:
        cands = [int(c) for c in np.flatnonzero(lp > prune) if c != 0]
        nxt: dict[str, list] = defaultdict(lambda: [NEG_INF, NEG_INF, 0.0, start])

        def add(prefix: str, blank_end: bool, logp: float, words: float, history: tuple) -> None:
            e = nxt[prefix]
            e[0 if blank_end else 1] = _logadd(e[0 if blank_end else 1], logp)
            e[2], e[3] = words, history

        for prefix, (pb, pnb, words, history) in beams.items():
            total = _logadd(pb, pnb)
            add(prefix, True, total + float(lp[0]), words, history)
            partial = prefix[prefix.rfind(" ") + 1 :]
            for c in cands:
                ch, logp_c = units[c], float(lp[c])
                if prefix and prefix[-1] == ch:  # a repeat collapses unless a blank came between
                    add(prefix, False, pnb + logp_c, words, history)
                    source = pb
                else:
                    source = total
                if c == space:
                    if partial not in lexicon.words:
                        continue
                    add(
                        prefix + ch,
                        False,
                        source + logp_c,
                        words + word(history, partial),
                        lexicon.then(history, partial),
                    )
                elif partial + ch in lexicon.prefixes:
                    add(prefix + ch, False, source + logp_c, words, history)

        beams = dict(sorted(nxt.items(), key=score, reverse=True)[:beam])

    best, best_score = "", NEG_INF
    for prefix, (pb, pnb, words, history) in beams.items():
        text = prefix.rstrip(" ")
        partial = text[text.rfind(" ") + 1 :]
        if text and partial not in lexicon.words:
            continue
        if text and not prefix.endswith(" "):
            words += word(history, partial)
            history = lexicon.then(history, partial)
        s = _logadd(pb, pnb) + words + lm_weight * lexicon.logp(history, EOS)
        if s > best_score:
            best, best_score = text, s
    if best_score == NEG_INF and beams:
        prefix = max(beams.items(), key=score)[0]
        best = prefix[: prefix.rfind(" ") + 1].rstrip(" ")
    return best


def sentence_score(text: str, lexicon: Lexicon, lm_weight: float = 0.0, word_bonus: float = 0.0) -> float:
    """The search's word terms of a whole transcript: ``lm_weight`` x its LM log-prob (end included) +
    ``word_bonus`` per word (nats)."""
    history, total = lexicon.start(), 0.0
    for w in text.split():
        total += word_score(lexicon, history, w, lm_weight, word_bonus)
        history = lexicon.then(history, w)
    return total + lm_weight * lexicon.logp(history, EOS)


def ctc_log_likelihood(log_probs: np.ndarray, ids: list[int]) -> float:
    """log P(ids | audio) summed over every CTC alignment (natural log; blank = 0); -inf if too long."""
    if not ids:
        return float(log_probs[:, 0].sum())
    if len(ids) > log_probs.shape[0]:
        return NEG_INF
    lp = torch.from_numpy(np.ascontiguousarray(log_probs, dtype=np.float32)).unsqueeze(1)  # (T', 1, V)
    return -float(
        torch.nn.functional.ctc_loss(
            lp,
            torch.tensor([ids], dtype=torch.long),
            torch.tensor([lp.size(0)]),
            torch.tensor([len(ids)]),
            blank=0,
            reduction="sum",
        )
    )


def rescore(
    views: list[np.ndarray],
    candidates: Iterable[str],
    units: list[str],
    lexicon: Lexicon,
    lm_weight: float = 0.0,
    word_bonus: float = 0.0,
) -> str:
    """The candidate with the best sum over ``views`` ((T', V) log-probs of one utterance each) of its
    CTC log-likelihood, plus its ``sentence_score`` once. Ties go to the first candidate."""
    index = {u: i for i, u in enumerate(units)}
    best, best_score = "", NEG_INF
    for text in dict.fromkeys(candidates):
        ids = [index[c] for c in text]
        s = sum(ctc_log_likelihood(v, ids) for v in views) + sentence_score(text, lexicon, lm_weight, word_bonus)
        if s > best_score:
            best, best_score = text, s
    return best

"""Tests for asrlab.lexicon: the lexicon-constrained CTC beam search and its word bigram."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from asrlab.lexicon import EOS, Lexicon, search

UNITS = ["<blank>", " ", "e", "f", "i", "k", "n", "o", "s", "x"]


def frames(*rows: dict) -> np.ndarray:
    """(T, V) log-probs: each row gives a few units' probabilities, the rest share what is left."""
    out = np.full((len(rows), len(UNITS)), 0.0)
    for t, row in enumerate(rows):
        rest = (1.0 - sum(row.values())) / (len(UNITS) - len(row))
        out[t] = [row.get(u, rest) for u in UNITS]
    return np.log(out)


def greedy(lp: np.ndarray) -> str:
    best = [UNITS[i] for i, _ in itertools.groupby(lp.argmax(1))]
    return "".join(u for u in best if u != "<blank>")


def test_a_near_miss_spelling_becomes_the_word():
    lp = frames({"s": .9}, {"i": .9}, {"k": .6, "x": .3}, {"<blank>": .9})
    assert greedy(lp) == "sik"
    assert search(lp, UNITS, Lexicon.from_texts(["six", "seven"])) == "six"


def test_double_letters_need_a_blank_and_words_need_a_space():
    lex = Lexicon.from_texts(["off", "on", "one", "on off"])
    assert search(frames({"o": .9}, {"f": .9}, {"<blank>": .9}, {"f": .9}), UNITS, lex) == "off"
    two = frames({"o": .9}, {"n": .9}, {" ": .9}, {"o": .9}, {"f": .9}, {"<blank>": .9}, {"f": .9})
    assert search(two, UNITS, lex) == "on off"


def ctc_logp(lp: np.ndarray, text: str) -> float:
    """log P(text | frames), summed over every alignment, by torch's CTC loss."""
    target = torch.tensor([[UNITS.index(c) for c in text]]) if text else torch.zeros(1, 0, dtype=torch.long)
    x = torch.from_numpy(lp).float()[:, None, :]
    loss = F.ctc_loss(x, target, torch.tensor([len(lp)]), torch.tensor([len(text)]), reduction="sum")
    return -float(loss)


@pytest.mark.parametrize("seed", range(5))
def test_a_wide_beam_finds_the_most_probable_valid_transcript(seed):
    """Against brute force: every sentence of the lexicon's words that fits the frames, scored exactly."""
    rng = np.random.default_rng(seed)
    lp = np.log(rng.dirichlet(np.full(len(UNITS), 0.3), size=7))
    words = ["six", "on", "no", "ox", "see", "if"]
    lex = Lexicon.from_texts(words)
    sentences = [" ".join(s) for n in (1, 2, 3) for s in itertools.product(words, repeat=n) if len(" ".join(s)) <= 7]
    best = max(sentences, key=lambda s: ctc_logp(lp, s))
    got = search(lp, UNITS, lex, beam=4096, prune=-math.inf)
    assert ctc_logp(lp, got) == pytest.approx(ctc_logp(lp, best), abs=1e-4)


def test_the_bigram_is_a_distribution_and_prefers_what_it_has_seen():
    lex = Lexicon.from_texts(["lights on", "lights off", "turn on the light", "six six"])
    for prev in ("<s>", "lights", "six", "the", "never-seen"):
        total = sum(math.exp(lex.logp(prev, w)) for w in [*lex.words, EOS])
        assert total == pytest.approx(1.0)
    assert lex.logp("lights", "on") > lex.logp("lights", "six")


def test_the_lm_weight_breaks_an_acoustic_tie():
    lex = Lexicon.from_texts(["six on"] * 9 + ["six no"])
    lp = frames({"s": .9}, {"i": .9}, {"x": .9}, {" ": .9}, {"o": .45, "n": .45}, {"o": .45, "n": .45})
    assert search(lp, UNITS, lex, lm_weight=1.0) == "six on"
    lex = Lexicon.from_texts(["six no"] * 9 + ["six on"])
    assert search(lp, UNITS, lex, lm_weight=1.0) == "six no"

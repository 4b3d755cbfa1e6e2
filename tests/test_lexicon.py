"""Tests for asrlab.lexicon: the lexicon-constrained CTC beam search, its word n-gram and word bonus."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from asrlab.lexicon import BOS, EOS, Lexicon, ctc_log_likelihood, rescore, search, sentence_score

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
    lp = frames({"s": 0.9}, {"i": 0.9}, {"k": 0.6, "x": 0.3}, {"<blank>": 0.9})
    assert greedy(lp) == "sik"
    assert search(lp, UNITS, Lexicon.from_texts(["six", "seven"])) == "six"


def test_double_letters_need_a_blank_and_words_need_a_space():
    lex = Lexicon.from_texts(["off", "on", "one", "on off"])
    assert search(frames({"o": 0.9}, {"f": 0.9}, {"<blank>": 0.9}, {"f": 0.9}), UNITS, lex) == "off"
    two = frames({"o": 0.9}, {"n": 0.9}, {" ": 0.9}, {"o": 0.9}, {"f": 0.9}, {"<blank>": 0.9}, {"f": 0.9})
    assert search(two, UNITS, lex) == "on off"


def ctc_logp(lp: np.ndarray, text: str) -> float:
    """log P(text | frames), summed over every alignment, by torch's CTC loss."""
    target = torch.tensor([[UNITS.index(c) for c in text]]) if text else torch.zeros(1, 0, dtype=torch.long)
    x = torch.from_numpy(lp).float()[:, None, :]
    loss = F.ctc_loss(x, target, torch.tensor([len(lp)]), torch.tensor([len(text)]), reduction="sum")
    return -float(loss)


@pytest.mark.parametrize("seed,lm_weight,word_bonus", [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 1.0, 0), (4, 1.0, 3.0)])
def test_a_wide_beam_finds_the_most_probable_valid_transcript(seed, lm_weight, word_bonus):
    """Against brute force: every sentence of the lexicon's words that fits the frames, scored exactly
    (CTC log-likelihood plus ``sentence_score``, the LM and bonus terms of a whole transcript). The search
    lets a transcript end on a word separator, so a sentence's CTC term is the better of the two."""
    rng = np.random.default_rng(seed)
    lp = np.log(rng.dirichlet(np.full(len(UNITS), 0.3), size=7))
    words = ["six", "on", "no", "ox", "see", "if"]
    lex = Lexicon.from_texts(words + ["six on", "on if"])

    def exact(s):
        return max(ctc_logp(lp, s), ctc_logp(lp, s + " ")) + sentence_score(s, lex, lm_weight, word_bonus)

    sentences = [" ".join(s) for n in (1, 2, 3) for s in itertools.product(words, repeat=n) if len(" ".join(s)) <= 7]
    best = max(sentences, key=exact)
    got = search(lp, UNITS, lex, beam=4096, lm_weight=lm_weight, word_bonus=word_bonus, prune=-math.inf)
    assert exact(got) == pytest.approx(exact(best), abs=1e-4)


def test_ctc_log_likelihood_sums_every_alignment():
    """Against enumeration: every length-4 path over the units that collapses to the text."""
    rng = np.random.default_rng(0)
    lp = np.log(rng.dirichlet(np.ones(len(UNITS)), size=4))

    def collapse(path):
        return "".join(UNITS[u] for u, _ in itertools.groupby(path) if u != 0)

    for text in ("on", "off", "s", ""):
        paths = [p for p in itertools.product(range(len(UNITS)), repeat=4) if collapse(p) == text]
        want = np.logaddexp.reduce([sum(lp[t, u] for t, u in enumerate(p)) for p in paths])
        ids = [UNITS.index(c) for c in text]
        assert ctc_log_likelihood(lp, ids) == pytest.approx(want, abs=1e-4)
    assert ctc_log_likelihood(lp, [UNITS.index(c) for c in "oxen"] + [1]) == -math.inf  # 5 labels, 4 frames


def test_rescore_sums_the_views():
    """One view slightly prefers "six", another strongly prefers "sin": over both, "sin"."""
    lex = Lexicon.from_texts(["six", "sin"])
    slight = frames({"s": 0.9}, {"i": 0.9}, {"x": 0.5, "n": 0.4})
    strong = frames({"s": 0.9}, {"i": 0.9}, {"x": 0.1, "n": 0.8})
    assert search(slight, UNITS, lex) == "six" and search(strong, UNITS, lex) == "sin"
    assert rescore([slight], ["six", "sin"], UNITS, lex) == "six"
    assert rescore([slight, strong], ["six", "sin"], UNITS, lex) == "sin"
    assert rescore([slight, slight], ["sin", "six", "sin"], UNITS, lex) == "six"


@pytest.mark.parametrize("order", [1, 2, 3])
def test_the_ngram_is_a_distribution_and_prefers_what_it_has_seen(order):
    lex = Lexicon.from_texts(["lights on", "lights off", "turn on the light", "six six"], order)
    histories = {
        lex.start(),
        lex.then(lex.start(), "lights"),
        lex.then(lex.then(lex.start(), "turn"), "on"),
        lex.then(lex.start(), "never-seen"),
    }
    for history in histories:
        total = sum(math.exp(lex.logp(history, w)) for w in [*lex.words, EOS])
        assert total == pytest.approx(1.0)
    if order > 1:
        assert lex.logp(lex.then(lex.start(), "lights"), "on") > lex.logp(lex.then(lex.start(), "lights"), "six")


def test_a_trigram_knows_what_follows_two_words_where_a_bigram_only_knows_one():
    texts = ["turn on the light"] * 5 + ["turn off the radio"] * 5
    after = {n: Lexicon.from_texts(texts, n) for n in (2, 3)}
    for n, lex in after.items():
        history = lex.then(lex.then(lex.then(lex.start(), "turn"), "on"), "the")
        assert history == ("on", "the")[-(n - 1) :]
        margin = lex.logp(history, "light") - lex.logp(history, "radio")
        assert (margin > 2.0) if n == 3 else (margin == pytest.approx(0.0))
    assert after[3].start() == (BOS, BOS)


def test_the_lm_weight_breaks_an_acoustic_tie():
    lex = Lexicon.from_texts(["six on"] * 9 + ["six no"])
    lp = frames({"s": 0.9}, {"i": 0.9}, {"x": 0.9}, {" ": 0.9}, {"o": 0.45, "n": 0.45}, {"o": 0.45, "n": 0.45})
    assert search(lp, UNITS, lex, lm_weight=1.0) == "six on"
    lex = Lexicon.from_texts(["six no"] * 9 + ["six on"])
    assert search(lp, UNITS, lex, lm_weight=1.0) == "six no"


def test_the_word_bonus_keeps_a_faint_last_word():
    """A faint second word: the LM's cost of a word drops it; the word bonus offsets that cost."""
    lex = Lexicon.from_texts(["six", "six on", "six no", "on", "no"])
    lp = frames(
        {"s": 0.9},
        {"i": 0.9},
        {"x": 0.9},
        {" ": 0.45, "<blank>": 0.45},
        {"o": 0.3, "<blank>": 0.6},
        {"n": 0.3, "<blank>": 0.6},
    )
    assert search(lp, UNITS, lex, lm_weight=1.0) == "six"
    assert search(lp, UNITS, lex, lm_weight=1.0, word_bonus=3.0) == "six on"


def test_a_bad_order_is_an_error():
    with pytest.raises(ValueError, match="order"):
        Lexicon.from_texts(["six"], order=0)

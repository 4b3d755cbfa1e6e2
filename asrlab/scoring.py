"""Scoring a CTC model's output: best-path decoding, edit distance and its alignment, CER and WER."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torchaudio

from .model import BLANK


def greedy_decode(log_probs: torch.Tensor, out_lens: torch.Tensor, blank: int = BLANK) -> list[list[int]]:
    """Best-path decoding: argmax per frame, collapse repeats, drop blanks."""
    best = log_probs.argmax(dim=-1).cpu()  # (B, T')
    hyps = []
    for path, n in zip(best, out_lens.cpu().tolist()):
        collapsed = torch.unique_consecutive(path[:n])
        hyps.append([int(c) for c in collapsed if c != blank])
    return hyps


def edit_distance(ref: Sequence, hyp: Sequence) -> int:
    """Levenshtein distance between two sequences (chars of a str, words, ids)."""
    return int(torchaudio.functional.edit_distance(ref, hyp))


def align(ref: Sequence, hyp: Sequence) -> list[tuple[str, object, object]]:
    """A minimum-edit alignment of ``hyp`` to ``ref``: ``(op, ref_item, hyp_item)`` in order, op one of
    ``=`` (match), ``S`` (substitution), ``D`` (deletion: ``hyp_item`` None), ``I`` (insertion: ``ref_item``
    None). Its non-matches number :func:`edit_distance`; ties prefer a substitution, then a deletion."""
    n, m = len(ref), len(hyp)
    d = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        d[i][0] = i
    for j in range(m + 1):
        d[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i][j] = min(d[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]), d[i - 1][j] + 1, d[i][j - 1] + 1)
    ops = []
    i, j = n, m
    while i or j:
        if i and j and d[i][j] == d[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            ops.append(("=" if ref[i - 1] == hyp[j - 1] else "S", ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i and d[i][j] == d[i - 1][j] + 1:
            ops.append(("D", ref[i - 1], None))
            i -= 1
        else:
            ops.append(("I", None, hyp[j - 1]))
            j -= 1
    return ops[::-1]


def _error_rate(refs: list[Sequence], hyps: list[Sequence]) -> float:
    if len(refs) != len(hyps):
        raise ValueError(f"got {len(refs)} refs but {len(hyps)} hyps")
    errors = sum(edit_distance(r, h) for r, h in zip(refs, hyps))
    total = sum(len(r) for r in refs)
    if total == 0:  # all refs empty: no error if the hyps are empty too, else 100 %
        return 0.0 if errors == 0 else 1.0
    return errors / total


def cer(refs: list[str], hyps: list[str]) -> float:
    """Character error rate: total char edit distance / total ref chars (spaces count
    as characters). Empty refs add their hyp length as insertions; if every ref is
    empty the result is 0.0 (all hyps empty) or 1.0. Can exceed 1."""
    return _error_rate(list(refs), list(hyps))


def wer(refs: list[str], hyps: list[str]) -> float:
    """Word error rate over whitespace-split words; same empty-ref rules as ``cer``."""
    return _error_rate([r.split() for r in refs], [h.split() for h in hyps])

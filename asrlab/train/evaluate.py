"""Evaluation: CTC loss, CER and WER of a model over a loader, summed over ranks.

Its own module so that decoding (:mod:`asrlab.decode`) can evaluate without importing the trainer.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from ..data.features import BatchFbank, batch_features
from ..data.loader import AsrLoader
from ..data.tokenizer import CharTokenizer
from ..model import ConformerCTC, ctc_loss
from ..scoring import edit_distance, greedy_decode
from ..lab import dist

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(
    model: ConformerCTC,
    loader: AsrLoader,
    tok: CharTokenizer,
    info: dist.DistInfo,
    autocast=contextlib.nullcontext,
    keep_hyps: bool = False,
    tick=None,
    decoder=None,
) -> dict:
    """CTC loss, CER and WER over this rank's share, summed over ranks; ``utts`` counts the utterances in
    the loss (those CTC can align), ``decoded`` all of them (CER and WER are over all).

    ``decoder(log_probs, out_lens) -> list[str]`` makes the hypotheses; default greedy."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    fbank = BatchFbank.for_data(loader.cfg)
    if fbank is not None:
        fbank.to(device)
    loss = utts = decoded = char_err = chars = word_err = words = 0.0
    hyps = []
    for batch in loader:
        if tick is not None:
            tick()
        with autocast():
            log_probs, out_lens = model(*batch_features(batch, device, fbank))
        loss_sum, _, mask = ctc_loss(log_probs, out_lens, batch["targets"].to(device), batch["target_lens"].to(device))
        loss += float(loss_sum)
        utts += int(mask.sum())
        decoded += len(batch["keys"])
        texts = (
            decoder(log_probs, out_lens) if decoder else [tok.decode(ids) for ids in greedy_decode(log_probs, out_lens)]
        )
        for key, hyp, tgt, n in zip(batch["keys"], texts, batch["targets"], batch["target_lens"]):
            ref = tok.decode(tgt[:n].tolist())
            char_err += edit_distance(ref, hyp)
            chars += len(ref)
            word_err += edit_distance(ref.split(), hyp.split())
            words += len(ref.split())
            if keep_hyps:
                hyps.append((key, ref, hyp))
    loss, utts, decoded, char_err, chars, word_err, words = dist.all_reduce_sum(
        [loss, utts, decoded, char_err, chars, word_err, words], info
    )
    model.train(was_training)
    if utts == 0:
        log.warning("evaluation saw no utterance (empty or unusable data)")
    out = {
        "loss": loss / max(1, utts),
        "cer": char_err / max(1, chars),
        "wer": word_err / max(1, words),
        "utts": int(utts),
        "decoded": int(decoded),
    }
    if keep_hyps:
        out["hyps"] = hyps
    return out


def eval_line(result: dict) -> str:
    """``cv loss 1.2345, CER 3.21%, WER 9.87% (100 utts)``: an evaluation as the log says it."""
    r = result
    return f"cv loss {r['loss']:.4f}, CER {100 * r['cer']:.2f}%, WER {100 * r['wer']:.2f}% ({r['utts']} utts)"

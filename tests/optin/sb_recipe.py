#!/usr/bin/env python3
"""A minimal SpeechBrain recipe (the opt-in test's job): a GRU + linear CTC model trained with ``sb.Brain``
on random features, in the shape of SpeechBrain's own recipes (``sb.parse_arguments``, ``ddp_init_group``,
HyperPyYAML hparams, ``create_experiment_directory``, ``FileTrainLogger`` writing ``train_log.txt``,
a ``Checkpointer``).

    python sb_recipe.py sb_hparams.yaml --output_folder OUT --device cpu
    torchrun --nproc-per-node 2 sb_recipe.py sb_hparams.yaml --output_folder OUT --device cpu \
        --distributed_backend gloo

A fault from ``fault_epoch``/``fault_batch`` (hparams) on, chosen by the environment:

* ``FAULT=nan``: the loss is NaN; SpeechBrain's ``check_loss_isfinite`` warns until
  ``--nonfinite_patience`` (default 3) is used up, then raises "Loss is not finite and patience is exhausted".
* ``FAULT=raise``: ``compute_objectives`` raises a RuntimeError.
* ``FAULT=kill``: the rank sends itself SIGKILL (as the kernel's OOM killer would) at that batch.
* ``FAULT=hang``: the rank blocks opening the FIFO ``FAULT_FIFO`` (nobody writes it) at that batch.

``FAULT_RANK=N`` limits the fault to that rank (default: every rank).

With ``--data_list RAW_LIST`` (WeNet's raw.list of asrlab's embedded corpus: ``{"key", "wav", "txt"}`` lines)
the recipe trains on real audio instead, SpeechBrain's way: a ``DynamicItemDataset`` whose pipeline reads each
WAV with ``read_audio`` and ``Fbank`` features made in ``compute_forward``; a line pointing at a missing WAV
breaks the batch that holds it (the fault of the data itself, no ``FAULT`` needed).
"""

import json
import os
import signal
import sys

import torch
from hyperpyyaml import load_hyperpyyaml

import speechbrain as sb

FAULT = os.environ.get("FAULT", "")
FAULT_RANK = os.environ.get("FAULT_RANK")


class SyntheticCTC(torch.utils.data.Dataset):
    """Random features and random token sequences, one utterance an item (SpeechBrain's dict-like items)."""

    def __init__(self, n, n_frames, n_feats, n_tokens, label_len, seed):
        g = torch.Generator().manual_seed(seed)
        self.feats = torch.randn(n, n_frames, n_feats, generator=g)
        self.tokens = torch.randint(1, n_tokens, (n, label_len), generator=g)

    def __len__(self):
        return len(self.feats)

    def __getitem__(self, i):
        return {"id": f"utt{i}", "feats": self.feats[i], "tokens": self.tokens[i]}


def corpus_dataset(path):
    """WeNet's raw.list as SpeechBrain's DynamicItemDataset: audio read by the pipeline, characters as tokens."""
    items = {}
    for line in open(path, encoding="utf-8"):
        if line.strip():
            j = json.loads(line)
            items[j["key"]] = {"wav": j["wav"], "txt": j["txt"]}
    vocab = {c: i + 1 for i, c in enumerate(" abcdefghijklmnopqrstuvwxyz")}  # the corpus's characters; 0: blank

    @sb.utils.data_pipeline.takes("wav")
    @sb.utils.data_pipeline.provides("sig")
    def audio_pipeline(wav):
        return sb.dataio.dataio.read_audio(wav)

    @sb.utils.data_pipeline.takes("txt")
    @sb.utils.data_pipeline.provides("tokens")
    def text_pipeline(txt):
        return torch.tensor([vocab[c] for c in txt])

    return sb.dataio.dataset.DynamicItemDataset(
        items, dynamic_items=[audio_pipeline, text_pipeline], output_keys=["id", "sig", "tokens"]
    )


class ASR(sb.Brain):
    def compute_forward(self, batch, stage):
        batch = batch.to(self.device)
        if hasattr(batch, "sig"):
            wavs, wav_lens = batch.sig
            feats = self.hparams.compute_features(wavs)
        else:
            feats, _ = batch.feats
        h, _ = self.modules.encoder(feats)
        return self.hparams.log_softmax(self.modules.output(h))

    def compute_objectives(self, predictions, batch, stage):
        _, wav_lens = batch.sig if hasattr(batch, "sig") else batch.feats
        tokens, token_lens = batch.tokens
        loss = self.hparams.ctc_cost(predictions, tokens, wav_lens, token_lens)
        if stage == sb.Stage.TRAIN and self._faulty():
            if FAULT == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif FAULT == "hang":
                with open(os.environ["FAULT_FIFO"], "rb") as fifo:  # blocks: nobody opens it for writing
                    fifo.read()
            elif FAULT == "nan":
                loss = loss * float("nan")
            elif FAULT == "raise":
                raise RuntimeError(f"synthetic fault at epoch {self.epoch}, batch {self.step}")
        return loss

    def _faulty(self):
        if FAULT_RANK is not None and int(os.environ.get("RANK", "0")) != int(FAULT_RANK):
            return False
        return (self.epoch, self.step) >= (self.hparams.fault_epoch, self.hparams.fault_batch)

    def on_stage_start(self, stage, epoch=None):
        self.epoch = epoch

    def on_stage_end(self, stage, stage_loss, epoch=None):
        if stage == sb.Stage.TRAIN:
            self.train_loss = stage_loss
        elif stage == sb.Stage.VALID:
            old_lr, new_lr = self.hparams.lr_annealing(stage_loss)
            sb.nnet.schedulers.update_learning_rate(self.optimizer, new_lr)
            self.hparams.train_logger.log_stats(
                stats_meta={"epoch": epoch, "lr": old_lr},
                train_stats={"loss": self.train_loss},
                valid_stats={"loss": stage_loss},
            )
            self.checkpointer.save_and_keep_only(meta={"loss": stage_loss}, min_keys=["loss"])


if __name__ == "__main__":
    hparams_file, run_opts, overrides = sb.parse_arguments(sys.argv[1:])
    sb.utils.distributed.ddp_init_group(run_opts)
    with open(hparams_file, encoding="utf-8") as fin:
        hparams = load_hyperpyyaml(fin, overrides)
    sb.create_experiment_directory(
        experiment_directory=hparams["output_folder"], hyperparams_to_save=hparams_file, overrides=overrides
    )
    shape = (hparams["n_frames"], hparams["n_feats"], hparams["n_tokens"], hparams["label_len"])
    if hparams.get("data_list"):
        train = corpus_dataset(hparams["data_list"])
        valid = corpus_dataset(hparams["valid_list"])
    else:
        train = SyntheticCTC(hparams["utterances"], *shape, seed=1)
        valid = SyntheticCTC(8, *shape, seed=2)

    asr = ASR(
        modules=hparams["modules"],
        opt_class=hparams["opt_class"],
        hparams=hparams,
        run_opts=run_opts,
        checkpointer=hparams["checkpointer"],
    )
    asr.fit(
        asr.hparams.epoch_counter,
        train,
        valid,
        train_loader_kwargs=hparams["train_loader_kwargs"],
        valid_loader_kwargs=hparams["train_loader_kwargs"],
    )

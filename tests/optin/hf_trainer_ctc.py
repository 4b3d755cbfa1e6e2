#!/usr/bin/env python3
"""A tiny randomly initialised ``Wav2Vec2ForCTC`` fine-tuned with Hugging Face ``transformers.Trainer`` on
asrlab's embedded corpus in WeNet's raw mode (``asrlab synth DIR --raw``: ``raw.list`` of ``{"key", "wav",
"txt"}``), on the CPU, the way ``run_speech_recognition_ctc.py`` is written (a dataset of raw audio, a
``Wav2Vec2FeatureExtractor`` in the collator, labels padded with -100, ``TrainingArguments`` with
``report_to=["tensorboard"]``, ``trainer.train()``, ``save_model``, ``save_state``). The job of
``tests/optin/hf_trainer_cases.py`` (the fixtures under ``tests/fixtures/toolkit_runs/hf_trainer``):

    python hf_trainer_ctc.py --data train/raw.list --out OUT
    torchrun --nproc-per-node 2 hf_trainer_ctc.py --data train/raw.list --out OUT

No model is downloaded: the model is built from a ``Wav2Vec2Config`` (hidden 32, 2 layers, 2 heads, a
feature encoder of 7 convolutions of 32 channels, 20 ms frames), the vocabulary from the list's characters.
Steps are Trainer's ``global_step`` (optimizer steps, counted from 1; ``gradient_accumulation_steps=1``):
per device batch 4, 96 utterances: 24 steps an epoch in one process, 12 on each of 2 ranks.

Faults, from the environment, on rank ``FAULT_RANK`` (1) at global step ``FAULT_STEP`` (Trainer unchanged):

* ``FAULT=nan``: ``compute_loss`` (a subclass) multiplies that step's loss by ``float('nan')``;
* ``FAULT=kill``: a callback SIGKILLs the rank in ``on_log`` of that step (after it was logged);
* ``FAULT=wav``: the dataset reads ``FAULT_WAV`` (a missing file, a FIFO nobody writes) in place of the
  first utterance of that step's batch on that rank (the rank's items are counted as asked for:
  ``num_workers=0``, so item k of the rank belongs to step k // 4 + 1).
"""

import argparse
import json
import os
import signal
from pathlib import Path

import soundfile as sf
import torch
import transformers
from transformers import (
    Trainer,
    TrainerCallback,
    TrainingArguments,
    Wav2Vec2Config,
    Wav2Vec2FeatureExtractor,
    Wav2Vec2ForCTC,
    set_seed,
)

FAULT = os.environ.get("FAULT", "")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "0"))
FAULT_WAV = os.environ.get("FAULT_WAV", "")
RANK = int(os.environ.get("RANK", "0"))


class RawList(torch.utils.data.Dataset):
    """WeNet's raw.list: one JSON line per utterance; the WAV is read when the item is asked for."""

    def __init__(self, path, vocab, batch_size):
        self.items = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        self.vocab = vocab
        self.batch_size = batch_size
        self.asked = 0  # items asked for on this rank (num_workers=0: in this process)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        item = self.items[i]
        wav_path = item["wav"]
        if FAULT == "wav" and RANK == FAULT_RANK and self.asked == (FAULT_STEP - 1) * self.batch_size:
            wav_path = FAULT_WAV
        self.asked += 1
        wav, sr = sf.read(wav_path, dtype="float32")
        return {"audio": wav, "sampling_rate": sr, "labels": [self.vocab[c] for c in item["txt"]]}


class CTCCollator:
    def __init__(self, feature_extractor):
        self.fe = feature_extractor

    def __call__(self, batch):
        feats = self.fe(
            [b["audio"] for b in batch],
            sampling_rate=batch[0]["sampling_rate"],
            padding=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        n = max(len(b["labels"]) for b in batch)
        labels = torch.full((len(batch), n), -100, dtype=torch.long)
        for j, b in enumerate(batch):
            labels[j, : len(b["labels"])] = torch.tensor(b["labels"])
        return {"input_values": feats["input_values"], "attention_mask": feats["attention_mask"], "labels": labels}


class FaultyTrainer(Trainer):
    """Trainer, with the loss of one rank's step multiplied by NaN when FAULT=nan."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if (
            FAULT == "nan"
            and model.training
            and self.args.process_index == FAULT_RANK
            and self.state.global_step + 1 == FAULT_STEP
        ):
            out = (out[0] * float("nan"), out[1]) if return_outputs else out * float("nan")
        return out


class KillAfterLog(TrainerCallback):
    """FAULT=kill: the rank SIGKILLs itself once step FAULT_STEP is logged."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if FAULT == "kill" and args.process_index == FAULT_RANK and state.global_step == FAULT_STEP:
            if logs and "loss" in logs:
                os.kill(os.getpid(), signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-steps", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--save-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()

    training_args = TrainingArguments(
        output_dir=args.out,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        warmup_steps=2,
        logging_steps=1,
        save_steps=args.save_steps,
        report_to=["tensorboard"],
        use_cpu=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,  # the collator needs "audio"
        log_level="info",
        seed=1234,
    )
    set_seed(training_args.seed)

    texts = [json.loads(line)["txt"] for line in Path(args.data).read_text().splitlines() if line.strip()]
    chars = sorted({c for t in texts for c in t})
    vocab = {c: i + 1 for i, c in enumerate(chars)}  # 0: <pad>, the CTC blank
    config = Wav2Vec2Config(
        vocab_size=len(vocab) + 1,
        pad_token_id=0,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(32,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        feat_extract_norm="layer",
        apply_spec_augment=False,
        layerdrop=0.0,
        ctc_loss_reduction="mean",
        ctc_zero_infinity=True,
    )
    model = Wav2Vec2ForCTC(config)
    feature_extractor = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=True
    )
    train = RawList(args.data, vocab, args.batch_size)
    trainer = FaultyTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=CTCCollator(feature_extractor),
        callbacks=[KillAfterLog()],
    )
    result = trainer.train()
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    if trainer.is_world_process_zero():
        print(f"training finished: {trainer.state.global_step} steps, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()

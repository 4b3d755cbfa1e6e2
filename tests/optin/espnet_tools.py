#!/usr/bin/env python3
"""ESPnet's data layout for asrlab's embedded corpus, and where ESPnet's own batching puts an utterance.
Run with the Python of an environment that has ESPnet (``tests/optin/toolkit_runs.py`` does):

    python espnet_tools.py prep CORPUS OUT     # OUT/dump/raw/{train,dev}/{wav.scp,text}, OUT/token_list.txt,
                                               # OUT/stats/{train,dev}/{speech_shape,text_shape.char}
    python espnet_tools.py locate OUT --epoch 1 --batch 3 --rank 1 --world 2   # the key ESPnet trains first
                                               # in that rank's batch of that epoch (prints it)
    python espnet_tools.py swap OUT KEY PATH   # train/wav.scp: KEY's audio is PATH (a missing file, a FIFO)

``prep`` writes what ESPnet's ``asr.sh`` stages 1-10 would have (the raw "dump", a character token list with
``<blank>``, ``<unk>``, ``<space>`` and ``<sos/eos>``, and the shape files of the stats stage); ``locate``
builds the batches exactly as ``espnet2.tasks.abs_task.build_sequence_iter_factory`` and
``SequenceIterFactory.build_iter`` do (``build_batch_sampler`` on the shape files, each batch split
``batch[rank::world]``, shuffled with ``numpy.random.RandomState(epoch + seed)``), so a fault planted in the
data lands at a known epoch, batch and rank. The batching arguments must match ``espnet_tiny.yaml``.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

# espnet_tiny.yaml's batching (and ESPnet's defaults for the rest)
BATCH_TYPE = "folded"
BATCH_SIZE = 4
FOLD_LENGTH = [80000, 150]
SEED = 0


def prep(corpus: Path, out: Path) -> None:
    chars = set()
    for split in ("train", "dev"):
        items = [json.loads(line) for line in (corpus / split / "raw.list").read_text().splitlines() if line]
        items.sort(key=lambda it: it["key"])  # Kaldi-style: sorted by key
        d = out / "dump" / "raw" / split
        d.mkdir(parents=True, exist_ok=True)
        (d / "wav.scp").write_text("".join(f"{it['key']} {it['wav']}\n" for it in items))
        (d / "text").write_text("".join(f"{it['key']} {it['txt']}\n" for it in items))
        s = out / "stats" / split
        s.mkdir(parents=True, exist_ok=True)
        (s / "speech_shape").write_text("".join(f"{it['key']} {sf.info(it['wav']).frames}\n" for it in items))
        for it in items:
            chars.update(it["txt"])
        texts = {it["key"]: it["txt"] for it in items}
        shapes = {k: len(t) for k, t in texts.items()}
        split_shapes = s / "text_shape.char"
        split_shapes.write_text("")  # filled below, once the vocabulary is known
        (s / "_text_lengths.json").write_text(json.dumps(shapes))
    tokens = ["<blank>", "<unk>"] + sorted("<space>" if c == " " else c for c in chars) + ["<sos/eos>"]
    (out / "token_list.txt").write_text("".join(t + "\n" for t in tokens))
    for split in ("train", "dev"):
        s = out / "stats" / split
        lengths = json.loads((s / "_text_lengths.json").read_text())
        (s / "text_shape.char").write_text("".join(f"{k} {n},{len(tokens)}\n" for k, n in lengths.items()))
        (s / "_text_lengths.json").unlink()


def batches_of(out: Path, epoch: int, rank: int, world: int) -> list[list[str]]:
    from espnet2.samplers.build_batch_sampler import build_batch_sampler

    sampler = build_batch_sampler(
        type=BATCH_TYPE,
        shape_files=[str(out / "stats" / "train" / "speech_shape"), str(out / "stats" / "train" / "text_shape.char")],
        fold_lengths=FOLD_LENGTH,
        batch_size=BATCH_SIZE,
        batch_bins=1000000,  # not used by "folded"
        sort_in_batch="descending",
        sort_batch="descending",
        drop_last=False,
        min_batch_size=world if world > 1 else 1,
    )
    batches = [list(b)[rank::world] for b in sampler]
    np.random.RandomState(epoch + SEED).shuffle(batches)
    return batches


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prep")
    p.add_argument("corpus", type=Path)
    p.add_argument("out", type=Path)
    p = sub.add_parser("locate")
    p.add_argument("out", type=Path)
    p.add_argument("--epoch", type=int, default=1)
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p = sub.add_parser("swap")
    p.add_argument("out", type=Path)
    p.add_argument("key")
    p.add_argument("path")
    a = ap.parse_args(argv)
    if a.cmd == "prep":
        prep(a.corpus, a.out)
    elif a.cmd == "locate":
        batch = batches_of(a.out, a.epoch, a.rank, a.world)[a.batch - 1]
        # the key must not be met earlier (an earlier batch of this epoch or any earlier epoch, on any rank)
        for e in range(1, a.epoch + 1):
            for r in range(a.world):
                for i, b in enumerate(batches_of(a.out, e, r, a.world), 1):
                    if (e, i) < (a.epoch, a.batch) and batch[0] in b:
                        print(f"{batch[0]} is met earlier: epoch {e}, batch {i}, rank {r}", file=sys.stderr)
                        return 1
        print(batch[0])
    else:
        scp = a.out / "dump" / "raw" / "train" / "wav.scp"
        lines = scp.read_text().splitlines()
        lines = [f"{a.key} {a.path}" if line.split(" ", 1)[0] == a.key else line for line in lines]
        scp.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

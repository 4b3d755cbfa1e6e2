"""How much of a batch is padding: the loader's sort windows against duration buckets.

Plans one epoch with asrlab's loader (``AsrDataset.plan``: the very batches training would get, from
the audio headers, no decoding) on two corpora, and counts, per batching mode, the padded frames
(``utterances x longest`` per batch) against the frames of speech in them:

* the embedded corpus (``asrlab synth``: eSpeak sentences, about 1 to 5 s), in the ``tiny`` config;
* a corpus with a wide duration spread: WAV files of 1 to 20 s (uniform; silence, since only the
  headers are read), in the ``tiny`` config with ``max_frames_in_batch`` raised to hold 20 s.

Modes: ``windows`` (the default: each shuffle block sorted in windows of ``sort_size``, WeNet's),
``buckets`` (``data.bucketing=true``: each block sorted whole, batches in shuffled order), and
``none`` (no sorting: random batching). One rank, one worker; ``--world 2`` deals the sources to two
ranks and reports rank 0's plan.

    .venv/bin/python benchmarks/padding.py            # writes benchmarks/padding.txt
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf

from asrlab.config import load_config
from asrlab.data import audio
from asrlab.data.loader import AsrDataset
from asrlab.data.sources import load_sources, transcripts
from asrlab.data.tokenizer import CharTokenizer

MODES = {"none": {"sort_size": 0}, "windows": {}, "buckets": {"bucketing": True}}


def wide_corpus(out: Path, n: int, seed: int) -> Path:
    """``n`` WAV files of U(1, 20) s at 8 kHz (silence) and a WeNet raw list of them."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        seconds = rng.uniform(1.0, 20.0)
        path = out / f"w{i:05d}.wav"
        if not path.exists():
            sf.write(path, np.zeros(int(seconds * 8000), dtype=np.int16), 8000, subtype="PCM_16")
        lines.append(json.dumps({"key": f"w{i:05d}", "wav": path.name, "txt": "a b c"}))
    (out / "data.list").write_text("\n".join(lines) + "\n")
    return out / "data.list"


def measure(data_list: Path, cfg, world: int) -> dict:
    sources = load_sources(data_list, cfg.raw_chunk)
    tok = CharTokenizer.build(transcripts(sources))
    ds = AsrDataset(sources, tok, cfg, rank=0, world_size=world)
    frames = {}
    batches, speech, padded, sizes = 0, 0, 0, []
    t0 = time.perf_counter()
    for plan in ds.plan(0):
        for items in plan:
            lens = []
            for it in items:
                if it.key not in frames:
                    samples, sr = audio.audio_info(it.audio)
                    frames[it.key] = cfg.frames(samples, sr)
                lens.append(frames[it.key])
            batches += 1
            speech += sum(lens)
            padded += len(lens) * max(lens)
            sizes.append(len(lens))
    return {
        "batches": batches,
        "utts": sum(sizes),
        "speech_frames": speech,
        "padded_frames": padded,
        "padding": 1 - speech / padded,
        "utts_per_batch": float(np.mean(sizes)),
        "fill": padded / (batches * cfg.max_frames_in_batch),
        "plan_s": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/asrlab_padding", help="where the corpora are made")
    ap.add_argument("--utts", type=int, default=2000, help="embedded corpus: training utterances")
    ap.add_argument("--wide", type=int, default=600, help="wide corpus: utterances")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".txt")))
    a = ap.parse_args()
    work = Path(a.work)
    embedded = work / "embedded" / "train" / "data.list"
    if not embedded.exists():
        subprocess.run(
            [
                str(Path(sys.executable).parent / "asrlab"),
                "synth",
                str(work / "embedded"),
                "--utts",
                str(a.utts),
                "--quiet",
            ],
            check=True,
        )
    wide = wide_corpus(work / "wide", a.wide, seed=0)
    base = load_config("tiny").data
    corpora = {
        "embedded (asrlab synth)": (embedded, base),
        "wide (1-20 s, uniform)": (wide, replace(base, max_frames_in_batch=6000)),
    }
    lines = [f"$ .venv/bin/python benchmarks/padding.py --utts {a.utts} --wide {a.wide} --world {a.world}", ""]
    results = {}
    for name, (path, cfg) in corpora.items():
        lines.append(
            f"{name}: {path}; shuffle_size {cfg.shuffle_size}, sort_size {cfg.sort_size}, "
            f"max_frames_in_batch {cfg.max_frames_in_batch}; rank 0 of {a.world}"
        )
        lines.append(
            f"  {'mode':<8} {'batches':>8} {'utts':>6} {'utts/batch':>10} {'padding':>8} "
            f"{'fill of max_frames':>18} {'plan (s)':>9}"
        )
        for mode, changes in MODES.items():
            r = measure(path, replace(cfg, **changes), a.world)
            results[f"{name}/{mode}"] = r
            lines.append(
                f"  {mode:<8} {r['batches']:>8} {r['utts']:>6} {r['utts_per_batch']:>10.1f} "
                f"{100 * r['padding']:>7.1f}% {100 * r['fill']:>17.1f}% {r['plan_s']:>9.2f}"
            )
        lines.append("")
    lines += [
        "padding: padded frames (utterances x longest, per batch) that are not speech, over all padded frames;",
        "fill: padded frames per batch over max_frames_in_batch (what a batch holds of what it may hold);",
        "modes: none = random batching (sort_size 0), windows = sorted in windows of sort_size (the default),",
        "buckets = data.bucketing=true (each shuffle block sorted whole, the batches' order shuffled).",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(a.out).write_text(text)


if __name__ == "__main__":
    main()

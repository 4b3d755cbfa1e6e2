"""``asrlab bench loader|compression|train``, ``asrlab tune``: measuring settings before a long run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import UsageError
from .args import bad_input_option, command, ints
from .data import data_config


def _tokenizer_from(sources):
    from ..data.index import transcripts
    from ..data.tokenizer import CharTokenizer

    return CharTokenizer.build(transcripts(sources))


def cmd_bench_loader(a: argparse.Namespace) -> int:
    from ..measure import loader_bench as bench
    from ..data.sources import load_sources

    cfg = data_config(a)
    sources = load_sources(a.list, cfg.raw_chunk)
    tok = _tokenizer_from(sources)
    ceiling = bench.features_ceiling(sources, cfg)
    print(
        f"ceiling (fbank alone on decoded audio, 1 thread): {ceiling['utts_per_s']} utts/s, "
        f"{ceiling['audio_s_per_s']} audio s/s"
    )
    if ceiling["skipped"]:
        print(f"skipped bad input (data.bad_input=skip): {ceiling['skipped']}")
    head = (
        f"{'workers':>7} {'prefetch':>8} {'batch':>8} {'utts/s':>8} {'audio s/s':>9} {'batches/s':>9} "
        f"{'1st batch s':>11} {'steady audio s/s':>16} {'of ceiling':>10}"
    )
    if a.against:
        head += f" {'wds utts/s':>10} {'asrlab/wds':>10}"
    print(head)
    print("(of ceiling: steady audio s/s after the first batch, against the ceiling's audio s/s)")

    def show(r):
        x = r["asrlab"]
        line = (
            f"{r['num_workers']:>7} {str(r['prefetch'] or '-'):>8} {str(r['batch']):>8} {x['utts_per_s']:>8} "
            f"{x['audio_s_per_s']:>9} {x['batches_per_s']:>9} {x['first_batch_s']:>11} {x['steady_audio_s_per_s']:>16} "
            f"{x['steady_audio_s_per_s'] / ceiling['audio_s_per_s']:>10.0%}"
        )
        if "webdataset" in r:
            line += f" {r['webdataset']['utts_per_s']:>10} {r['ratio']:>10.2f}"
        print(line, flush=True)

    rows = bench.sweep(
        sources, tok, cfg, a.num_workers, a.prefetch, a.batch or [None], a.max_batches, a.against, progress=show
    )
    if a.json:
        Path(a.json).write_text(json.dumps({"ceiling": ceiling, "rows": rows}, indent=2))
    return 0


def cmd_bench_compression(a: argparse.Namespace) -> int:
    from ..measure import loader_bench as bench
    from ..data.sources import load_sources

    cfg = data_config(a)
    sources = load_sources(a.list, cfg.raw_chunk)
    rows = bench.compression_cost(sources, _tokenizer_from(sources), cfg, a.compressions.split(","), a.max_utts)
    print(f"{'compression':>11} {'MB':>7} {'ratio':>6} {'read ms/utt':>11} {'loader ms/utt':>13}")
    for r in rows:
        print(
            f"{r['compression']:>11} {r['mb']:>7} {r['ratio']:>6} {r['read_ms_per_utt']:>11} "
            f"{r['loader_ms_per_utt']:>13}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


def cmd_bench_train(a: argparse.Namespace) -> int:
    import json as _json
    import tempfile

    from ..config import load_config
    from ..measure.tune import describe, grid, recommend, storage_variants, sweep

    cfg = load_config(a.config, a.overrides)
    points = grid(
        a.num_workers, a.prefetch, a.max_frames, a.storage.split(","), a.features.split(","), a.fbank.split(",")
    )
    with tempfile.TemporaryDirectory() as tmp:
        lists = storage_variants(a.list, tmp, a.storage.split(","), a.max_utts)
        print(f"{'setting':66s} {'wait %':>6} {'utts/s':>7} {'audio h/h':>9} {'peak MiB':>8} {'GPU %':>5}")

        def show(r):
            gpu = f"{r['gpu_util_pct']:5.0f}" if r["gpu_util_pct"] is not None else "    -"
            print(
                f"{describe(r):66s} {100 * r['data_wait']:6.1f} {r['utts_per_s']:7.1f} {r['audio_h_per_h']:9.0f} "
                f"{r['peak_mib']:8.0f} {gpu}",
                flush=True,
            )

        rows = sweep(cfg, lists, points, a.steps, progress=show)
    best, text = recommend(rows, a.memory_mib)
    print(f"\nrecommended: {text}")
    if a.json:
        Path(a.json).write_text(_json.dumps({"rows": rows, "recommended": best, "why": text}, indent=1))
    return 0


def cmd_tune(a: argparse.Namespace) -> int:
    """The batch from measured GPU memory: data.max_frames_by_length for this config and data."""
    import torch

    from ..config import load_config
    from ..data.preflight import source_stats
    from ..data.sources import load_sources, transcripts
    from ..data.tokenizer import CharTokenizer
    from ..measure.memory import calibrate

    cfg = load_config(a.config, a.overrides)
    if not torch.cuda.is_available():  # say so before reading the data
        calibrate(cfg, 0, 0, a.margin)
    sources = load_sources(a.list, cfg.data.raw_chunk)
    vocab = len(CharTokenizer.build(transcripts(sources)))
    longest = max((f for src in sources for f in source_stats(src, cfg.data).frames), default=0)
    if longest == 0:
        raise UsageError(f"{a.list}: no readable utterance to size the batch by")
    r = calibrate(cfg, vocab, longest, a.margin)
    print(
        f"{r['device']}: {r['total_mib']} MiB, budget {r['budget_mib']} MiB (margin {100 * a.margin:.0f}%), "
        f"precision {r['precision']}, vocabulary {vocab}, longest utterance {longest} frames"
    )
    print(f"{'longest in batch (frames)':>26} {'utterances':>10} {'max_frames':>10}")
    for row in r["rows"]:
        print(f"{row['frames']:>26} {row['utts']:>10} {row['max_frames']:>10}")
    print(f"\nuse: data.max_frames_by_length={json.dumps(r['max_frames_by_length'], separators=(',', ':'))}")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))
    return 0


def add_commands(sub) -> None:
    """The parsers of bench, tune."""
    b = command(sub, "bench", "Measure loader and training settings on your data before a long run.").add_subparsers(
        dest="bench_command",
        required=True,
        metavar="COMMAND",
        title="commands",
        help="one of these (asrlab bench COMMAND --help says what it takes)",
    )
    bl = command(
        b,
        "loader",
        "Measure how fast the data loader feeds batches under each setting (workers, prefetch, "
        "batch), against what fbank alone could do.",
    )
    bl.add_argument("list", help="data.list (shard or raw) or Kaldi dir to read")
    bl.add_argument(
        "--num-workers",
        type=ints,
        default=[0, 1, 2],
        metavar="N,N,...",
        help="DataLoader workers to try, comma-separated (default 0,1,2)",
    )
    bl.add_argument(
        "--prefetch",
        type=ints,
        default=[2],
        metavar="N,N,...",
        help="batches prefetched per worker to try, comma-separated (default 2)",
    )
    bl.add_argument("--batch", type=ints, default=None, help="static batch sizes (default: dynamic batches)")
    bl.add_argument("--max-frames", type=int, help="max_frames_in_batch of the dynamic batches (default: the loader's)")
    bl.add_argument("--max-batches", type=int, default=None, help="batches read per setting (default: a whole epoch)")
    bl.add_argument("--against", choices=["webdataset"], help="also time the same data through WebDataset")
    bl.add_argument("--seed", type=int, default=0, help="the shuffle's seed, as training's data.seed")
    bad_input_option(bl)
    bl.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    bl.set_defaults(func=cmd_bench_loader)
    bc = command(
        b, "compression", "Measure what each shard compression costs: size, read time and loader time per utterance."
    )
    bc.add_argument("list", help="data.list (shard or raw) or Kaldi dir whose utterances are re-packed")
    bc.add_argument("--compressions", default="none,gz,bz2,xz,zst", help="compressions to try, comma-separated")
    bc.add_argument("--max-utts", type=int, default=1000, help="utterances re-packed in each compression")
    bc.add_argument("--seed", type=int, default=0, help="the loader's seed, as training's data.seed")
    bad_input_option(bc)
    bc.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    bc.set_defaults(func=cmd_bench_compression)

    bt = command(
        b,
        "train",
        "Train a few steps under each loader setting and recommend the one that keeps the "
        "accelerator busiest (data wait, throughput, memory).",
    )
    bt.add_argument("list", help="training data.list (re-written once per storage)")
    bt.add_argument("--config", default="tiny", help="shipped config name (tiny, base) or a YAML path")
    bt.add_argument(
        "--num-workers",
        type=ints,
        default=[0, 1, 2],
        metavar="N,N,...",
        help="DataLoader workers to try, comma-separated (default 0,1,2)",
    )
    bt.add_argument(
        "--prefetch",
        type=ints,
        default=[2],
        metavar="N,N,...",
        help="batches prefetched per worker to try, comma-separated (default 2)",
    )
    bt.add_argument(
        "--max-frames",
        type=ints,
        default=[5000],
        metavar="N,N,...",
        help="max_frames_in_batch values to try, comma-separated (default 5000)",
    )
    bt.add_argument(
        "--storage", default="shards/none", help="comma list of raw, shards/none, shards/gz, shards/bz2, ..."
    )
    bt.add_argument(
        "--features", default="cpu", help="comma list of cpu (fbank in the loader), device (after the copy)"
    )
    bt.add_argument("--fbank", default="asrlab", help="comma list of the loader's fbank: asrlab, torchaudio")
    bt.add_argument("--max-utts", type=int, default=1000, help="utterances to re-write per storage")
    bt.add_argument(
        "--steps",
        type=int,
        default=20,
        help="measured steps per setting (after 2 start-up steps, or workers x prefetch_factor if more)",
    )
    bt.add_argument("--memory-mib", type=float, help="peak memory budget of the process and its workers")
    bt.add_argument("--json", metavar="PATH", help="also write the results and the recommendation to this JSON file")
    bt.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. model.d_model=128")
    bt.set_defaults(func=cmd_bench_train)

    tu = command(
        sub,
        "tune",
        "On a GPU, find the largest batch per utterance length that fits its memory "
        "(data.max_frames_by_length), from real training steps.",
    )
    tu.add_argument(
        "list", help="training data.list (its transcripts give the vocabulary, its headers the longest utterance)"
    )
    tu.add_argument("--config", default="tiny", help="shipped config name (tiny, base) or a YAML path")
    tu.add_argument("--margin", type=float, default=0.1, help="share of GPU memory left free")
    tu.add_argument("--json", metavar="PATH", help="also write the measurements to this JSON file")
    tu.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. optim.lr=0.002")
    tu.set_defaults(func=cmd_tune)

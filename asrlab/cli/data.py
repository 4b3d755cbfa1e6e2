"""``asrlab synth``, ``asrlab shards inspect|pack``, ``asrlab index``: making and looking at data."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from ..errors import UsageError
from .args import bad_input_option, command, pair


def cmd_synth(a: argparse.Namespace) -> int:
    from ..data.synth import synthesize_corpus

    summary = synthesize_corpus(
        a.out,
        utts=a.utts,
        seed=a.seed,
        held=a.held,
        shard_size=a.shard_size,
        compression=a.compression,
        noise_snr=a.noise_snr,
        raw=a.raw,
        hard=a.hard,
        progress=not a.quiet,
    )
    print(f"{'split':>5} {'utts':>6} {'minutes':>8} {'shards':>6} {'voices':>6}  conditions")
    for split, x in summary["splits"].items():
        print(
            f"{split:>5} {x['utterances']:>6} {x['seconds'] / 60:>8.1f} {x['shards']:>6} {len(x['voices']):>6}  "
            f"{x['conditions']}"
        )
    print(f"written to {summary['out_dir']} in {summary['elapsed_s']:.1f} s")
    return 0


def data_config(a: argparse.Namespace):
    from ..data.config import DataConfig

    cfg = DataConfig(seed=a.seed, bad_input=getattr(a, "bad_input", "skip"))
    if getattr(a, "max_frames", None):
        cfg = replace(cfg, max_frames_in_batch=a.max_frames)
    return cfg


def cmd_inspect(a: argparse.Namespace) -> int:
    from ..data.index import use_indexes
    from ..data.preflight import describe_unusable, format_layout, inspect_layout
    from ..data.sources import load_data

    cfg = data_config(a)
    sources = load_data(a.list, cfg.raw_chunk)
    if cfg.index:  # the layout from the index (built or brought up to date first)
        use_indexes(a.list, sources, progress=not a.json)
    report = inspect_layout(sources, cfg, a.world_size, a.num_workers, epoch=a.epoch, progress=not a.json)
    if report["unusable"] and cfg.bad_input == "fail":  # as training under data.bad_input=fail would stop
        x = report["unusable"][0]
        raise UsageError(f"{x['list']}: {describe_unusable(x)} (--bad-input fail; {report['bad']} unusable in all)")
    print(json.dumps(report, indent=2) if a.json else format_layout(report))
    return 0


def cmd_pack(a: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from ..data.pack import pack

    s = pack(a.data, a.out, a.shard_size, a.compression, a.processes, a.bad_input, None if a.json else tqdm)
    if a.json:
        print(json.dumps(s, indent=2))
    else:
        print(
            f"{s['list']}: {s['shards']} shards, {s['utterances']} utterances from {s['sources']} sources"
            + (f"; left out (data.bad_input=skip): {s['skipped']}" if s["skipped"] else "")
        )
    return 0


def cmd_index(a: argparse.Namespace) -> int:
    from ..data.index import use_index
    from ..data.sources import load_sources

    s = use_index(a.list, load_sources(a.list, a.raw_chunk), processes=a.processes, progress=not a.json)
    if a.json:
        print(json.dumps(s, indent=2))
    else:
        print(
            f"{s['path']}: {s['sources']} sources ({s['reused']} reused, {s['indexed']} indexed), "
            f"{s['utterances']} utterances, {s['usable']} usable, {s['hours']:.2f} h, {s['seconds']:.1f} s"
        )
        if s["skipped"]:
            print(f"unusable, as training would skip them (data.bad_input=skip): {s['skipped']}")
    return 0


def add_commands(sub) -> None:
    """The parsers of synth, shards, index."""
    s = command(
        sub,
        "synth",
        "Make a small speech corpus with eSpeak NG (train, dev and test splits as WeNet shards), "
        "so there is data to train on without downloading any.",
    )
    s.add_argument("out", help="folder to write the corpus into (OUT/train, OUT/dev, OUT/test, each with a data.list)")
    s.add_argument("--utts", type=int, default=3000, help="training utterances (dev and test get a tenth)")
    s.add_argument("--held", type=int, default=None, help="dev and test utterances each (default: a tenth of --utts)")
    s.add_argument("--seed", type=int, default=0, help="random seed: the same seed makes the same corpus")
    s.add_argument("--shard-size", type=int, default=500, help="utterances per shard")
    s.add_argument(
        "--compression",
        default="none",
        choices=["none", "gz", "bz2", "xz", "zst"],
        help="how each shard is compressed (default none)",
    )
    s.add_argument("--noise-snr", type=pair, default=(10.0, 30.0), help="LO,HI in dB")
    s.add_argument("--raw", action="store_true", help="also write WAV files and a WeNet raw.list")
    s.add_argument("--hard", action="store_true", help="reverberation, speed perturbation, lower SNR")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_synth)

    sh = command(
        sub, "shards", "Look at a data list as training will deal it, or write it as WeNet shards."
    ).add_subparsers(
        dest="shards_command",
        required=True,
        metavar="COMMAND",
        title="commands",
        help="one of these (asrlab shards COMMAND --help says what it takes)",
    )
    i = command(
        sh,
        "inspect",
        "Show how a data list falls on ranks and workers (shards, utterances, hours, batches), "
        "which lines are unusable and why, and warn of a layout that would hang training.",
    )
    i.add_argument(
        "list",
        nargs="+",
        help="data.list (shard or raw), Kaldi dir or NeMo manifest; several: a mix, "
        "[NAME=]LIST[:WEIGHT] each, as asrlab train --data takes them",
    )
    i.add_argument("--world-size", type=int, default=1, help="ranks (GPUs) to deal the data to (default 1)")
    i.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank (default 0: the rank reads)")
    i.add_argument("--max-frames", type=int, help="max_frames_in_batch (default: the loader's)")
    i.add_argument("--epoch", type=int, default=0, help="the epoch whose shuffle to show (default 0)")
    i.add_argument("--seed", type=int, default=0, help="the shuffle's seed, as training's data.seed")
    bad_input_option(i)
    i.add_argument("--json", action="store_true", help="print the report as JSON")
    i.set_defaults(func=cmd_inspect)
    pk = command(
        sh,
        "pack",
        "Write WeNet shards from a Kaldi dir, a raw list, a NeMo manifest or shards to re-pack, "
        "reading each shard back to check it.",
    )
    pk.add_argument("data", help="a Kaldi dir, raw list, NeMo manifest or shard list")
    pk.add_argument("out", help="folder for shards/ and data.list")
    pk.add_argument("--shard-size", type=int, default=1000, help="utterances per shard")
    pk.add_argument(
        "--compression",
        default="none",
        choices=["none", "gz", "bz2", "xz", "zst"],
        help="how each shard is compressed (default none)",
    )
    pk.add_argument("--processes", type=int, default=None, help="parallel processes (default: one per core)")
    bad_input_option(pk)
    pk.add_argument("--json", action="store_true", help="print the summary as JSON")
    pk.set_defaults(func=cmd_pack)

    ix = command(
        sub,
        "index",
        "Index a data list ahead of training (each utterance's length and transcript, in "
        "LIST.index.json), so that training starts without reading every shard.",
    )
    ix.add_argument("list", help="data.list (shard or raw) or a Kaldi dir")
    ix.add_argument("--processes", type=int, default=None, help="parallel processes (default: one per core)")
    ix.add_argument("--raw-chunk", type=int, default=1000, help="raw items per source, as data.raw_chunk")
    ix.add_argument("--json", action="store_true", help="print the summary as JSON")
    ix.set_defaults(func=cmd_index)

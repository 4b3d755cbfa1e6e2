"""``asrlab <command>``: parses arguments, calls the package, formats the output.

The only module (with the notebooks) that prints; everything else logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from .errors import UsageError


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _pair(s: str) -> tuple[float, float]:
    lo, hi = (float(x) for x in s.split(","))
    return lo, hi


def cmd_synth(a: argparse.Namespace) -> int:
    from .data.synth import synthesize_corpus

    summary = synthesize_corpus(a.out, utts=a.utts, seed=a.seed, held=a.held, shard_size=a.shard_size,
                                compression=a.compression, noise_snr=a.noise_snr, raw=a.raw,
                                hard=a.hard, progress=not a.quiet)
    print(f"{'split':>5} {'utts':>6} {'minutes':>8} {'shards':>6} {'voices':>6}  conditions")
    for split, x in summary["splits"].items():
        print(f"{split:>5} {x['utterances']:>6} {x['seconds'] / 60:>8.1f} {x['shards']:>6} {len(x['voices']):>6}  "
              f"{x['conditions']}")
    print(f"written to {summary['out_dir']} in {summary['elapsed_s']:.1f} s")
    return 0


def _data_config(a: argparse.Namespace):
    from .data.config import DataConfig

    cfg = DataConfig(seed=a.seed, bad_input=getattr(a, "bad_input", "skip"))
    if getattr(a, "max_frames", None):
        cfg = replace(cfg, max_frames_in_batch=a.max_frames)
    return cfg


def cmd_inspect(a: argparse.Namespace) -> int:
    from .data.index import use_indexes
    from .data.preflight import format_layout, inspect_layout
    from .data.sources import load_data

    cfg = _data_config(a)
    sources = load_data(a.list, cfg.raw_chunk)
    if cfg.index:  # the layout from the index (built or brought up to date first)
        use_indexes(a.list, sources, progress=not a.json)
    report = inspect_layout(sources, cfg, a.world_size, a.num_workers, epoch=a.epoch, progress=not a.json)
    print(json.dumps(report, indent=2) if a.json else format_layout(report))
    return 0


def cmd_pack(a: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from .data.pack import pack

    s = pack(a.data, a.out, a.shard_size, a.compression, a.processes, a.bad_input, None if a.json else tqdm)
    if a.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"{s['list']}: {s['shards']} shards, {s['utterances']} utterances from {s['sources']} sources"
              + (f"; left out (data.bad_input=skip): {s['skipped']}" if s["skipped"] else ""))
    return 0


def cmd_index(a: argparse.Namespace) -> int:
    from .data.index import use_index
    from .data.sources import load_sources

    s = use_index(a.list, load_sources(a.list, a.raw_chunk), processes=a.processes, progress=not a.json)
    if a.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"{s['path']}: {s['sources']} sources ({s['reused']} reused, {s['indexed']} indexed), "
              f"{s['utterances']} utterances, {s['usable']} usable, {s['hours']:.2f} h, {s['seconds']:.1f} s")
        if s["skipped"]:
            print(f"unusable, as training would skip them (data.bad_input=skip): {s['skipped']}")
    return 0


def _tokenizer_from(sources):
    from .data.index import transcripts
    from .data.tokenizer import CharTokenizer

    return CharTokenizer.build(transcripts(sources))


def cmd_bench_loader(a: argparse.Namespace) -> int:
    from .measure import loader_bench as bench
    from .data.sources import load_sources

    cfg = _data_config(a)
    sources = load_sources(a.list, cfg.raw_chunk)
    tok = _tokenizer_from(sources)
    ceiling = bench.features_ceiling(sources, cfg)
    print(f"ceiling (fbank alone on decoded audio, 1 thread): {ceiling['utts_per_s']} utts/s, "
          f"{ceiling['audio_s_per_s']} audio s/s")
    if ceiling["skipped"]:
        print(f"skipped bad input (data.bad_input=skip): {ceiling['skipped']}")
    head = (f"{'workers':>7} {'prefetch':>8} {'batch':>8} {'utts/s':>8} {'audio s/s':>9} {'batches/s':>9} "
            f"{'1st batch s':>11} {'steady audio s/s':>16} {'of ceiling':>10}")
    if a.against:
        head += f" {'wds utts/s':>10} {'asrlab/wds':>10}"
    print(head)
    print("(of ceiling: steady audio s/s after the first batch, against the ceiling's audio s/s)")

    def show(r):
        x = r["asrlab"]
        line = (f"{r['num_workers']:>7} {str(r['prefetch'] or '-'):>8} {str(r['batch']):>8} {x['utts_per_s']:>8} "
                f"{x['audio_s_per_s']:>9} {x['batches_per_s']:>9} {x['first_batch_s']:>11} {x['steady_audio_s_per_s']:>16} "
                f"{x['steady_audio_s_per_s'] / ceiling['audio_s_per_s']:>10.0%}")
        if "webdataset" in r:
            line += f" {r['webdataset']['utts_per_s']:>10} {r['ratio']:>10.2f}"
        print(line, flush=True)

    rows = bench.sweep(sources, tok, cfg, a.num_workers, a.prefetch, a.batch or [None], a.max_batches,
                       a.against, progress=show)
    if a.json:
        Path(a.json).write_text(json.dumps({"ceiling": ceiling, "rows": rows}, indent=2))
    return 0


def cmd_bench_compression(a: argparse.Namespace) -> int:
    from .measure import loader_bench as bench
    from .data.sources import load_sources

    cfg = _data_config(a)
    sources = load_sources(a.list, cfg.raw_chunk)
    rows = bench.compression_cost(sources, _tokenizer_from(sources), cfg, a.compressions.split(","), a.max_utts)
    print(f"{'compression':>11} {'MB':>7} {'ratio':>6} {'read ms/utt':>11} {'loader ms/utt':>13}")
    for r in rows:
        print(f"{r['compression']:>11} {r['mb']:>7} {r['ratio']:>6} {r['read_ms_per_utt']:>11} "
              f"{r['loader_ms_per_utt']:>13}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


def cmd_bench_train(a: argparse.Namespace) -> int:
    import json as _json
    import tempfile

    from .config import load_config
    from .measure.tune import describe, grid, recommend, storage_variants, sweep

    cfg = load_config(a.config, a.overrides)
    points = grid(a.num_workers, a.prefetch, a.max_frames, a.storage.split(","), a.features.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        lists = storage_variants(a.list, tmp, a.storage.split(","), a.max_utts)
        print(f"{'setting':66s} {'wait %':>6} {'utts/s':>7} {'audio h/h':>9} {'peak MiB':>8} {'GPU %':>5}")

        def show(r):
            gpu = f"{r['gpu_util_pct']:5.0f}" if r["gpu_util_pct"] is not None else "    -"
            print(f"{describe(r):66s} {100 * r['data_wait']:6.1f} {r['utts_per_s']:7.1f} {r['audio_h_per_h']:9.0f} "
                  f"{r['peak_mib']:8.0f} {gpu}", flush=True)

        rows = sweep(cfg, lists, points, a.steps, progress=show)
    best, text = recommend(rows, a.memory_mib)
    print(f"\nrecommended: {text}")
    if a.json:
        Path(a.json).write_text(_json.dumps({"rows": rows, "recommended": best, "why": text}, indent=1))
    return 0


def cmd_tune(a: argparse.Namespace) -> int:
    """The batch from measured GPU memory: data.max_frames_by_length for this config and data."""
    import torch

    from .config import load_config
    from .data.preflight import source_stats
    from .data.sources import load_sources, transcripts
    from .data.tokenizer import CharTokenizer
    from .measure.memory import calibrate

    cfg = load_config(a.config, a.overrides)
    if not torch.cuda.is_available():  # say so before reading the data
        calibrate(cfg, 0, 0, a.margin)
    sources = load_sources(a.list, cfg.data.raw_chunk)
    vocab = len(CharTokenizer.build(transcripts(sources)))
    longest = max((f for src in sources for f in source_stats(src, cfg.data).frames), default=0)
    if longest == 0:
        raise UsageError(f"{a.list}: no readable utterance to size the batch by")
    r = calibrate(cfg, vocab, longest, a.margin)
    print(f"{r['device']}: {r['total_mib']} MiB, budget {r['budget_mib']} MiB (margin {100 * a.margin:.0f}%), "
          f"precision {r['precision']}, vocabulary {vocab}, longest utterance {longest} frames")
    print(f"{'longest in batch (frames)':>26} {'utterances':>10} {'max_frames':>10}")
    for row in r["rows"]:
        print(f"{row['frames']:>26} {row['utts']:>10} {row['max_frames']:>10}")
    print(f"\nuse: data.max_frames_by_length={json.dumps(r['max_frames_by_length'], separators=(',', ':'))}")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))
    return 0


_LAUNCHER_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--max-restarts")


def _strip_launcher(argv: list[str]) -> list[str]:
    """``argv`` without the flags the launcher gives torchrun (the ranks' arguments)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in _LAUNCHER_FLAGS:
            skip = True
        elif not x.startswith(tuple(f + "=" for f in _LAUNCHER_FLAGS)):
            out.append(x)
    return out


def cmd_train(a: argparse.Namespace) -> int:
    from .config import load_config
    from .train import launch

    flags = [f"train.{k}={v}" for k, v in (("max_steps", a.max_steps), ("save_every_steps", a.save_every_steps),
                                           ("precision", a.precision), ("max_minutes", a.max_minutes),
                                           ("uneven", a.uneven), ("stall_timeout_s", a.stall_timeout),
                                           ("backend", a.backend), ("nonfinite", a.nonfinite),
                                           ("ledger", a.ledger or None)) if v is not None]
    cfg = load_config(a.config, flags + a.overrides)  # a bad key fails here, before any rank starts
    nodes = None
    if a.nnodes > 1 or a.rdzv_endpoint:
        if not a.rdzv_endpoint:
            raise UsageError("--nnodes needs --rdzv-endpoint HOST:PORT: where the first node's agent listens")
        nodes = launch.Nodes(a.nnodes, a.node_rank, a.rdzv_endpoint, a.rdzv_id)
    if (a.nproc > 1 or nodes is not None or a.max_restarts) and not launch.under_torchrun():
        return launch.launch(a.nproc, _strip_launcher(a.argv[a.argv.index("train") + 1:]), a.exp,
                             cfg.train.stall_timeout_s, cfg.train.first_step_timeout_s, nodes=nodes,
                             max_restarts=a.max_restarts)
    if launch.under_torchrun():
        launch.end_with_agent()
    try:
        return _train_here(a, cfg)
    except Exception as e:
        if not launch.under_torchrun():
            raise
        from .lab.stall.errors import record_rank_error

        record_rank_error(a.exp, e)
        if not os.environ.get(launch.QUIET_ENV):  # a torchrun of the user's own: each rank says it
            raise
        return 2 if isinstance(e, (UsageError, FileNotFoundError)) else 1  # the launcher says it once


def _train_here(a: argparse.Namespace, cfg) -> int:
    """This process's part of ``asrlab train``: alone, or one rank under torchrun."""
    from .data.sources import load_data, load_sources

    load_data(a.data)  # a missing or empty list is an error before anything starts
    if a.cv:
        load_sources(a.cv)
    from .lab.numerics.guard import HALT_EXIT, NonFiniteHalt
    from .lab.stop import stop_on_signals, stop_signal
    from .train.launch import under_torchrun
    from .train.trainer import run

    with stop_on_signals():  # SIGTERM, SIGINT: a clean stop, as EXP/STOP
        try:
            result = run(cfg, a.data, a.cv, a.exp, resume=a.resume)
        except NonFiniteHalt as e:
            print(f"training halted: {e}", file=sys.stderr)
            return HALT_EXIT
        sig = stop_signal()
    if sig is not None:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"asrlab train: stopped on {sig.name}; checkpoint in {a.exp}", file=sys.stderr)
        return 0 if under_torchrun() else 128 + sig  # a rank's non-zero code is a failure to torch elastic
    if result and int(os.environ.get("RANK", "0")) == 0:
        print(f"cv: loss {result['loss']:.4f}, CER {100 * result['cer']:.2f}%, WER {100 * result['wer']:.2f}% "
              f"({result['utts']} utterances)")
    return 0


def _speeds(text: str) -> tuple[float, ...]:
    """``"0.9,1.0,1.1"`` -> ``(0.9, 1.0, 1.1)`` (their range is ``data.speed``'s check, in ``decode_exp``)."""
    try:
        return tuple(float(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"speeds are numbers separated by commas, not {text!r}") from None


def cmd_decode(a: argparse.Namespace) -> int:
    from .decode import decode_exp

    r = decode_exp(a.exp, a.data, a.name, a.lexicon, a.beam, a.lm_weight, a.word_bonus, a.speeds, a.device)
    short = r["decoded"] - r["utts"]
    short = f", {short} of them too short for CTC to align" if short else ""
    print(f"{r['data']}: CER {100 * r['cer']:.2f}%, WER {100 * r['wer']:.2f}% over {r['decoded']} utterances "
          f"(checkpoint step {r['step']}, greedy{short}); hypotheses in {r['hyps_path']}")
    if "lexicon" in r:
        lx = r["lexicon"]
        speeds = "" if lx["speeds"] == [1.0] else ", speeds " + ",".join(f"{s:g}" for s in lx["speeds"])
        print(f"{r['data']}: CER {100 * lx['cer']:.2f}%, WER {100 * lx['wer']:.2f}% with the lexicon of {a.lexicon} "
              f"(beam {lx['beam']}, LM weight {lx['lm_weight']}, word bonus {lx['word_bonus']}{speeds}); hypotheses in {lx['hyps_path']}")
    return 0


def cmd_stop(a: argparse.Namespace) -> int:
    from .lab.stop import request_stop

    if not (Path(a.exp) / "metrics").is_dir():
        raise FileNotFoundError(f"{a.exp}: no run there (no metrics/ folder)")
    path = request_stop(a.exp, "asrlab stop")
    print(f"asked the run in {a.exp} to stop after its current step ({path}); it writes a checkpoint and exits 0")
    return 0


def cmd_ckpt(a: argparse.Namespace) -> int:
    from .lab.state import checkpoint

    ckpt_dir = Path(a.exp) / "checkpoints"
    rows = checkpoint.list_checkpoints(ckpt_dir)
    if not rows:
        raise UsageError(f"no checkpoints in {ckpt_dir}")
    print(f"{'step':>8} {'epoch':>5}  {'state':10s} position (rank 0: per worker source/offset/block/batch)")
    for m in rows:
        state = "complete" if m["complete"] else "INCOMPLETE"
        where = "epoch done" if m.get("epoch_done") else "  ".join(
            f"w{w}: {p['source']}/{p['offset']}/{p['block']}/{p['batch']}" for w, p in sorted(
                (m.get("rank0_position") or {}).items()))
        print(f"{m['step']:>8} {m.get('epoch', '?'):>5}  {state:10s} {where or '-'}")
    if a.digest:
        found = checkpoint.load_latest(ckpt_dir)
        if found is None:
            raise UsageError(f"no complete checkpoint in {ckpt_dir}")
        state, marker = found
        print(f"{checkpoint.state_digest(state)}  {marker['file']} (model and optimizer tensors)")
    return 0


def cmd_doctor(a: argparse.Namespace) -> int:
    from .doctor import diagnose, format_diagnosis

    d = diagnose(a.exp)
    print(json.dumps(d, indent=1) if a.json else format_diagnosis(d).rstrip("\n"))
    return 0 if d["ok"] else 1


def cmd_notebooks(a: argparse.Namespace) -> int:
    from .nb import root
    from .runner import run_notebooks

    records = run_notebooks(root() / "notebooks", Path(a.out) if a.out else None, a.only, a.params,
                            report=lambda m: print(m, flush=True), html=a.html)
    failed = [r for r in records if not r["ok"]]
    where = Path(records[0]["output"]).parent.parent
    print(f"{len(records) - len(failed)} of {len(records)} notebooks ran; "
          f"total {sum(r['seconds'] for r in records):.0f} s; executed copies under {where}/"
          + (f", figures in {Path(a.out) / 'figures'}/" if a.out else ""))
    for r in records:
        if r.get("html"):
            print(f"  {r['html']}")
    for r in failed:
        print(f"FAILED {r['notebook']}: {r['error']} (see {r['output']})", file=sys.stderr)
    return 1 if failed else 0


def _bad_input_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bad-input", choices=["skip", "fail"], default="skip",
                        help="an unusable utterance: counted and skipped (as data.bad_input=skip), or an error")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asrlab", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("synth", help="synthesize the embedded speech corpus (eSpeak NG) as WeNet shards")
    s.add_argument("out")
    s.add_argument("--utts", type=int, default=3000, help="training utterances (dev and test get a tenth)")
    s.add_argument("--held", type=int, default=None, help="dev and test utterances each (default: a tenth of --utts)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--shard-size", type=int, default=500, help="utterances per shard")
    s.add_argument("--compression", default="none", choices=["none", "gz", "bz2", "xz", "zst"])
    s.add_argument("--noise-snr", type=_pair, default=(10.0, 30.0), help="LO,HI in dB")
    s.add_argument("--raw", action="store_true", help="also write WAV files and a WeNet raw.list")
    s.add_argument("--hard", action="store_true", help="reverberation, speed perturbation, lower SNR")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=cmd_synth)

    sh = sub.add_parser("shards", help="look at shards").add_subparsers(dest="shards_command", required=True)
    i = sh.add_parser("inspect", help="per rank and worker: shards, utterances, hours, batches; warnings")
    i.add_argument("list", nargs="+", help="data.list (shard or raw), Kaldi dir or NeMo manifest; several: a mix, "
                                          "[NAME=]LIST[:WEIGHT] each, as asrlab train --data takes them")
    i.add_argument("--world-size", type=int, default=1)
    i.add_argument("--num-workers", type=int, default=0)
    i.add_argument("--max-frames", type=int, help="max_frames_in_batch (default: the loader's)")
    i.add_argument("--epoch", type=int, default=0)
    i.add_argument("--seed", type=int, default=0)
    _bad_input_option(i)
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_inspect)
    pk = sh.add_parser("pack", help="WeNet shards from a Kaldi dir, a raw list, a NeMo manifest or shards to re-pack; "
                                    "each shard read back and checked")
    pk.add_argument("data", help="a Kaldi dir, raw list, NeMo manifest or shard list")
    pk.add_argument("out", help="folder for shards/ and data.list")
    pk.add_argument("--shard-size", type=int, default=1000, help="utterances per shard")
    pk.add_argument("--compression", default="none", choices=["none", "gz", "bz2", "xz", "zst"])
    pk.add_argument("--processes", type=int, default=None, help="parallel processes (default: one per core)")
    _bad_input_option(pk)
    pk.add_argument("--json", action="store_true")
    pk.set_defaults(func=cmd_pack)

    ix = sub.add_parser("index", help="index a data list ahead of training: per utterance its length and transcript "
                                      "(LIST.index.json; a changed shard is indexed again alone)")
    ix.add_argument("list", help="data.list (shard or raw) or a Kaldi dir")
    ix.add_argument("--processes", type=int, default=None, help="parallel processes (default: one per core)")
    ix.add_argument("--raw-chunk", type=int, default=1000, help="raw items per source, as data.raw_chunk")
    ix.add_argument("--json", action="store_true")
    ix.set_defaults(func=cmd_index)

    b = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_command", required=True)
    bl = b.add_parser("loader", help="loader throughput per setting")
    bl.add_argument("list")
    bl.add_argument("--num-workers", type=_ints, default=[0, 1, 2])
    bl.add_argument("--prefetch", type=_ints, default=[2])
    bl.add_argument("--batch", type=_ints, default=None, help="static batch sizes (default: dynamic batches)")
    bl.add_argument("--max-frames", type=int)
    bl.add_argument("--max-batches", type=int, default=None)
    bl.add_argument("--against", choices=["webdataset"])
    bl.add_argument("--seed", type=int, default=0)
    _bad_input_option(bl)
    bl.add_argument("--json")
    bl.set_defaults(func=cmd_bench_loader)
    bc = b.add_parser("compression", help="what shard compression costs per utterance")
    bc.add_argument("list")
    bc.add_argument("--compressions", default="none,gz,bz2,xz,zst")
    bc.add_argument("--max-utts", type=int, default=1000)
    bc.add_argument("--seed", type=int, default=0)
    _bad_input_option(bc)
    bc.add_argument("--json")
    bc.set_defaults(func=cmd_bench_compression)

    bt = b.add_parser("train", help="train a few steps per loader setting; data wait, throughput, a recommendation")
    bt.add_argument("list", help="training data.list (re-written once per storage)")
    bt.add_argument("--config", default="tiny")
    bt.add_argument("--num-workers", type=_ints, default=[0, 1, 2])
    bt.add_argument("--prefetch", type=_ints, default=[2])
    bt.add_argument("--max-frames", type=_ints, default=[5000])
    bt.add_argument("--storage", default="shards/none", help="comma list of raw, shards/none, shards/gz, shards/bz2, ...")
    bt.add_argument("--features", default="cpu", help="comma list of cpu (fbank in the loader), device (after the copy)")
    bt.add_argument("--max-utts", type=int, default=1000, help="utterances to re-write per storage")
    bt.add_argument("--steps", type=int, default=20, help="measured steps per setting (after 2 start-up steps, or workers x prefetch_factor if more)")
    bt.add_argument("--memory-mib", type=float, help="peak memory budget of the process and its workers")
    bt.add_argument("--json")
    bt.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    bt.set_defaults(func=cmd_bench_train)

    tu = sub.add_parser("tune", help="on a GPU: the largest batch per utterance length that fits its memory "
                                     "(data.max_frames_by_length), from real training steps")
    tu.add_argument("list", help="training data.list (its transcripts give the vocabulary, its headers the longest utterance)")
    tu.add_argument("--config", default="tiny")
    tu.add_argument("--margin", type=float, default=0.1, help="share of GPU memory left free")
    tu.add_argument("--json")
    tu.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    tu.set_defaults(func=cmd_tune)

    t = sub.add_parser("train", help="train (1 process, or N under torchrun with --nproc N)")
    t.add_argument("--config", default="tiny", help="shipped config name (tiny, base) or a YAML path")
    t.add_argument("--data", required=True, action="append",
                   help="training data.list (shard or raw), Kaldi dir or NeMo manifest; given several times, "
                        "the corpora are mixed: [NAME=]LIST[:WEIGHT] each (drawn by weight, every utterance "
                        "once an epoch)")
    t.add_argument("--cv", help="validation data.list, evaluated at epoch ends")
    t.add_argument("--exp", required=True, help="experiment dir: checkpoints, metrics, units.txt, config.yaml")
    t.add_argument("--nproc", type=int, default=1, help="local ranks; >1 starts torchrun (gloo on CPU, nccl on GPUs)")
    t.add_argument("--nnodes", type=int, default=1, help="nodes of the job (the same command on each; torchrun's "
                                                          "rendezvous at --rdzv-endpoint)")
    t.add_argument("--node-rank", type=int, help="this node's rank, 0 to nnodes-1 (SLURM_NODEID); without it "
                                                 "the nodes are ranked as they join (torchrun's c10d rendezvous)")
    t.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="the first node's address and a free port")
    t.add_argument("--rdzv-id", help="the job's id, the same on every node (SLURM_JOB_ID)")
    t.add_argument("--max-restarts", type=int, default=0,
                   help="torch elastic restarts of every rank after a failure (each resumes from the last checkpoint)")
    t.add_argument("--precision", choices=["auto", "fp32", "fp16", "bf16"])
    t.add_argument("--max-steps", type=int)
    t.add_argument("--max-minutes", type=float)
    t.add_argument("--save-every-steps", type=int)
    t.add_argument("--uneven", choices=["stop", "join", "none"],
                   help="ranks with unequal data: stop together (default), DDP Join, or unprotected")
    t.add_argument("--ledger", action="store_true",
                   help="write the utterance keys of every step to EXP/ledger/rank{R}.jsonl (to check coverage)")
    t.add_argument("--nonfinite", choices=["skip", "rollback", "halt"],
                   help="a step whose loss or gradients are not finite: skip and count it (default), roll back "
                        "to the last checkpoint with a lower LR, or halt (exit 4) with a report")
    t.add_argument("--stall-timeout", type=float, metavar="S",
                   help="seconds without progress on any rank before the stall report and exit (0: off)")
    t.add_argument("--backend", choices=["auto", "nccl", "gloo"])
    t.add_argument("--resume", choices=["auto", "none"], default="auto",
                   help="auto: continue from the newest complete checkpoint in EXP")
    t.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. optim.lr=0.002")
    t.set_defaults(func=cmd_train)

    d = sub.add_parser("decode", help="CTC decoding (greedy, or a lexicon beam search); prints CER and WER, "
                                      "writes hypotheses")
    d.add_argument("--exp", required=True)
    d.add_argument("--data", required=True)
    d.add_argument("--name", help="name of the output (default: from the data path)")
    d.add_argument("--lexicon", metavar="DATA_LIST",
                   help="search only sentences of the words of this list's transcripts (usually train's)")
    d.add_argument("--beam", type=int, default=32, help="prefixes kept per frame (with --lexicon)")
    d.add_argument("--lm-weight", type=float, default=1.0,
                   help="weight of the word trigram of the --lexicon transcripts (0: lexicon only)")
    d.add_argument("--word-bonus", type=float, default=3.0,
                   help="nats added per word (with --lexicon): offsets the LM's cost of each word, which "
                        "otherwise favours dropping a faint one")
    d.add_argument("--speeds", type=_speeds, default=(1.0,), metavar="S1,S2,...",
                   help="with --lexicon: search the audio played at each of these speeds (a test-time warp "
                        "of the voice, e.g. 0.9,1.0,1.1) and keep the transcript best over all of them")
    d.add_argument("--device", help="where the model runs, e.g. cpu or cuda:1 (default: the first GPU if there "
                                    "is one, else the CPU)")
    d.set_defaults(func=cmd_decode)

    c = sub.add_parser("ckpt", help="list an experiment's checkpoints; --digest: SHA-256 of the newest complete one")
    c.add_argument("exp")
    c.add_argument("--digest", action="store_true", help="one SHA-256 over the model and optimizer tensors")
    c.set_defaults(func=cmd_ckpt)

    st = sub.add_parser("stop", help="ask a running training to stop cleanly after its current step (checkpoint, exit 0)")
    st.add_argument("exp")
    st.set_defaults(func=cmd_stop)

    dr = sub.add_parser("doctor", help="what happened to a run: the verdict (finished, running, stopped, stalled, "
                                       "crashed, non-finite halt), per-rank timing, non-finite steps, resumes, "
                                       "ledger coverage, checkpoint integrity; exit 1 when it failed")
    dr.add_argument("exp")
    dr.add_argument("--json", action="store_true", help="the diagnosis as JSON")
    dr.set_defaults(func=cmd_doctor)

    n = sub.add_parser("notebooks", help="run every notebook headless with papermill (the main job)")
    n.add_argument("--only", help="run only the notebooks whose name contains this")
    n.add_argument("--params", help="YAML parameter file, e.g. notebooks/params/gpu.yaml")
    n.add_argument("--out", help="put everything the run writes under this folder (executed copies, results.json, "
                                 "experiments, figures); default: runs/ and figures/ of the project")
    n.add_argument("--html", action="store_true", help="also write each executed notebook as a standalone HTML page")
    n.set_defaults(func=cmd_notebooks)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # what --nproc relaunches under torchrun
    if getattr(args, "func", None) in (cmd_train, cmd_bench_train):  # KEY=VALUE overrides: before or after options
        args.overrides += [x for x in extra if "=" in x and not x.startswith("-")]
        extra = [x for x in extra if x not in args.overrides]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except (UsageError, FileNotFoundError) as e:  # what a person can fix; anything else is a bug: its traceback
        print(f"asrlab: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``asrlab doctor EXP | head``): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail
        return 0


if __name__ == "__main__":
    sys.exit(main())

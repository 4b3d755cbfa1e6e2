"""Seeing the data before training: how an epoch's sources fall on ranks and workers.

The multi-GPU hang with uneven data starts here: when one rank gets fewer batches than the
others, it reaches the end of its epoch first and the others wait for it in the next
gradient all-reduce, forever. ``inspect_layout`` predicts each rank's batches from the audio
headers (the same batching rule the loader uses) and says which layouts will leave a rank
or a worker short.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tqdm.auto import tqdm

from .index import index_source, indexed
from .config import DataConfig
from .plan import batch_sizes, batching_order, worker_streams
from .sources import Source, line_ref, locate
from ..errors import UsageError


@dataclass
class SourceStats:
    name: str
    frames: list[int] = field(default_factory=list)  # fbank frames of each usable utterance
    seconds: float = 0.0  # audio seconds of the usable utterances
    bad: int = 0  # items the loader would skip
    bad_items: list = field(default_factory=list)  # (offset, key, reason) of each: where the report points


def source_stats(src: Source, cfg: DataConfig) -> SourceStats:
    """Utterance lengths of one source: from its index where one is loaded (:mod:`.index`), else read
    from the audio headers (no decoding)."""
    st = SourceStats(src.name)
    utts = indexed(src)
    for k, u in enumerate(index_source(src) if utts is None else utts):
        if u.bad is None:
            st.frames.append(cfg.frames(u.samples, u.rate))
            st.seconds += u.seconds
        else:
            st.bad += 1
            st.bad_items.append((k, u.key, u.bad))
    return st


def estimate_batches(frames: list[int], cfg: DataConfig) -> int:
    """Batches the loader makes of these lengths (the shuffle ignored: exact with ``bucketing``)."""
    n = 0
    for b in range(0, len(frames), cfg.shuffle_size):
        block = frames[b : b + cfg.shuffle_size]
        n += len(batch_sizes([block[i] for i in batching_order(block, cfg)], cfg))
    return n


def inspect_layout(
    sources: list[Source], cfg: DataConfig, world_size: int, num_workers: int, epoch: int = 0, progress: bool = False
) -> dict:
    """Per rank and worker: shards, utterances, audio seconds, estimated batches; and warnings.

    ``num_workers`` 0 means the main process reads (one worker).
    """
    if world_size < 1 or num_workers < 0:
        raise UsageError("world_size must be >= 1 and num_workers >= 0")
    stats = {s.label: source_stats(s, cfg) for s in tqdm(sources, desc="reading headers", disable=not progress)}
    W = max(1, num_workers)
    pieces: dict = {}  # sources cut finer to feed every worker (plan.fed): their stats, apart from the sources'
    ranks = []
    for r in range(world_size):
        workers = []
        for w in range(W):
            mine = []
            for s in (s for stream in worker_streams(sources, epoch, cfg, r, world_size, w, W) for s in stream):
                if s.label not in stats and s.label not in pieces:
                    pieces[s.label] = source_stats(s, cfg)
                mine.append(stats[s.label] if s.label in stats else pieces[s.label])
            frames = [f for st in mine for f in st.frames]
            workers.append(
                {
                    "worker": w,
                    "shards": len(mine),
                    "utts": len(frames),
                    "seconds": round(sum(st.seconds for st in mine), 2),
                    "batches": estimate_batches(frames, cfg),
                }
            )
        ranks.append(
            {
                "rank": r,
                "workers": workers,
                "fed": sum(1 for x in workers if x["shards"]),
                **{k: sum(x[k] for x in workers) for k in ("shards", "utts", "batches")},
                "seconds": round(sum(x["seconds"] for x in workers), 2),
            }
        )
    mixed = _corpora(sources, stats)
    few = [
        f"corpus {name} has {c['sources']} source(s) for {world_size} ranks: "
        f"{world_size - c['sources']} rank(s) train on none of it (write it in smaller shards)"
        for name, c in mixed.items()
        if c["sources"] < world_size and not any(s.items for s in sources if s.corpus == name)
    ]  # a list of items is cut to feed every rank
    return {
        "epoch": epoch,
        "world_size": world_size,
        "num_workers": num_workers,
        "sources": len(sources),
        "utts": sum(len(s.frames) for s in stats.values()),
        "bad": sum(s.bad for s in stats.values()),
        "ranks": ranks,
        "corpora": mixed,
        "unusable": locate(sources, [(i, *b) for i, s in enumerate(sources) for b in stats[s.label].bad_items]),
        "warnings": layout_warnings(ranks) + few,
    }


def _corpora(sources: list[Source], stats: dict) -> dict:
    """Per corpus of a mix (none for one list): sources, usable utterances, audio seconds, weight."""
    out: dict[str, dict] = {}
    for s in sources:
        if s.corpus:
            c = out.setdefault(s.corpus, {"sources": 0, "utts": 0, "seconds": 0.0, "weight": s.weight})
            c["sources"] += 1
            c["utts"] += len(stats[s.label].frames)
            c["seconds"] = round(c["seconds"] + stats[s.label].seconds, 2)
    return out


def layout_warnings(ranks: list[dict]) -> list[str]:
    """What in a layout will hang a run or waste a worker, worst first."""
    out = []
    for r in ranks:
        if r["batches"] == 0:
            out.append(f"rank {r['rank']} gets no data: unprotected DDP hangs at its first all-reduce")
    counts = [r["batches"] for r in ranks]
    if len(ranks) > 1 and max(counts) != min(counts):
        short = min(ranks, key=lambda r: r["batches"])
        long_ = max(ranks, key=lambda r: r["batches"])
        out.append(
            f"rank {short['rank']} runs out of data after {short['batches']} batches, "
            f"rank {long_['rank']} has {long_['batches']}: unprotected DDP hangs at step "
            f"{short['batches'] + 1} (use --uneven stop or join, or reshard)"
        )
    for r in ranks:
        idle = [w["worker"] for w in r["workers"] if w["shards"] == 0]
        if idle and len(r["workers"]) > 1:
            out.append(
                f"rank {r['rank']}: workers {', '.join(map(str, idle))} get no shards and sit idle "
                "(fewer shards than ranks x workers)"
            )
        busy = [w["batches"] for w in r["workers"] if w["shards"]]
        if len(busy) > 1 and min(busy) < 0.8 * max(busy):
            out.append(
                f"rank {r['rank']}: workers get {min(busy)} to {max(busy)} batches; "
                "the busiest sets the pace at the end of the epoch"
            )
    return out


def format_layout(report: dict) -> str:
    """The report as a text table, warnings last."""
    lines = [
        f"{report['sources']} sources, {report['utts']} usable utterances"
        + (f", {report['bad']} unusable" if report["bad"] else "")
        + f"; epoch {report['epoch']} dealt to {report['world_size']} ranks x "
        f"{max(1, report['num_workers'])} workers",
        f"{'rank':>4} {'worker':>6} {'shards':>6} {'utts':>7} {'hours':>7} {'batches':>7}",
    ]
    for name, c in report.get("corpora", {}).items():
        lines.insert(
            -1,
            f"corpus {name}: {c['sources']} source(s), {c['utts']} utterances, "
            f"{c['seconds'] / 3600:.3f} h, weight {c['weight']:g}",
        )
    for r in report["ranks"]:
        for w in r["workers"]:
            lines.append(
                f"{r['rank']:>4} {w['worker']:>6} {w['shards']:>6} {w['utts']:>7} "
                f"{w['seconds'] / 3600:>7.3f} {w['batches']:>7}"
            )
        lines.append(
            f"{r['rank']:>4} {'all':>6} {r['shards']:>6} {r['utts']:>7} "
            f"{r['seconds'] / 3600:>7.3f} {r['batches']:>7}   its data feeds {r['fed']} of "
            f"{len(r['workers'])} worker(s)"
        )
    lines += [f"WARNING: {w}" for w in report["warnings"]] or ["OK: every rank gets the same number of batches"]
    return "\n".join(lines[:1] + unusable_lines(report.get("unusable", [])) + lines[1:])


def unusable_lines(unusable: list[dict], most: int = 10) -> list[str]:
    """The first ``most`` unusable items, each as its list's line, the line's text and why."""
    one = len({x["list"] for x in unusable}) == 1
    out = [f"  unusable: {describe_unusable(x, one)}" for x in unusable[:most]]
    if len(unusable) > most:
        out.append(f"  ... and {len(unusable) - most} more (--json lists them all)")
    return out


def describe_unusable(x: dict, one_list: bool = True) -> str:
    """``line 3 ('the line'), utterance KEY: reason``."""
    text = f" ({x['text']!r})" if x["text"] else ""
    key = f", utterance {x['key']}" if x["key"] and x["key"] not in x["text"] else ""
    return f"{line_ref(x, one_list)}{text}{key}: {x['reason']}"

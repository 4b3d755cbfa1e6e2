"""The training-throughput sweep and its recommendation (``asrlab bench train``, notebook 02).

Each point of the grid trains the real model for a few steps in this process with one loader
setting (``num_workers``, ``prefetch_factor``, ``max_frames_in_batch``, storage and shard
compression) and measures, over the steps after the first ``skip`` (worker start-up):

* ``data_wait``: the share of step time spent waiting for a batch (the step timer's ``data``);
* ``utts_per_s`` and ``audio_h_per_h`` (hours of audio trained per hour of wall clock);
* ``gpu_util_pct`` (NVML mean over the run, where there is a GPU);
* ``peak_mib``: the peak resident memory of the process and its workers, and ``gpu_peak_mib``.

``recommend`` picks the fastest point that fits the memory budget and says why, with the
numbers, against the slowest point of the grid.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
from pathlib import Path

import torch

from ..config import Config, replace_section
from ..data.shards import write_split
from ..data.sources import iter_items, load_data, load_sources
from ..errors import UsageError
from ..lab import dist
from ..lab.precision import cpu_fp16_kernels
from ..lab.stall.heartbeat import Heartbeat
from ..lab.timing import PARTS, CpuSampler, GpuSampler, bound, format_split, step_split
from ..train.phases import StepPhases
from ..train.run_data import start_data
from ..train.step import build_step

log = logging.getLogger(__name__)

FED = 0.02  # a data wait under this share of step time: the loader keeps up
GRID_KEYS = ("storage", "num_workers", "prefetch_factor", "max_frames_in_batch", "features", "fbank")


def storage_variants(
    data: str | Path, out_dir: str | Path, storages=("shards/none",), max_utts: int | None = None, shard_size: int = 250
) -> dict[str, Path]:
    """Re-write the first ``max_utts`` utterances of ``data`` in each storage; returns ``{storage: list path}``.

    A storage is ``raw`` (one WAV file per utterance, WeNet's raw list) or ``shards/<compression>``
    (``none``, ``gz``, ``bz2``, ``xz``, ``zst``).
    """
    items = [
        (it.key, it.text, it.audio)
        for it in itertools.islice((i for i in iter_items(load_sources(data)) if i.error is None and i.text), max_utts)
    ]
    out: dict[str, Path] = {}
    for storage in storages:
        d = Path(out_dir) / storage.replace("/", "_")
        if storage == "raw":
            write_split(items, d, "train", shard_size=shard_size, raw=True)
            out[storage] = d / "raw.list"
        elif storage.startswith("shards/"):
            write_split(items, d, "train", shard_size=shard_size, compression=storage.split("/", 1)[1])
            out[storage] = d / "data.list"
        else:
            raise UsageError(f"unknown storage {storage!r}: raw or shards/<none|gz|bz2|xz|zst>")
    return out


def measure(cfg: Config, data: str | Path, steps: int = 20, skip: int = 2, workdir: str | Path | None = None) -> dict:
    """Train ``skip + steps`` steps with ``cfg`` on ``data`` in this process; throughput, waits and GPU
    utilisation over the last ``steps``.

    The steps are the trainer's own (:func:`asrlab.train.step.build_step`, the same step timer), over the
    loader alone: no checkpoints, evaluation, ledger or watchdog to build or to time. At least
    ``num_workers x prefetch_factor`` start-up steps are skipped: the batches the workers prefetch while
    the first, slow step runs would otherwise be measured as no wait at all, making a starved loader look
    fed. The steps must fit in one epoch of ``data``: a new epoch's start (workers started again, their
    first batches) would be measured as data wait.
    """
    skip = max(skip, cfg.data.num_workers * cfg.data.prefetch_factor)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    info = dist.DistInfo(0, 1, 0, device, None)
    tmp = Path(tempfile.mkdtemp(prefix="asrlab-sweep-", dir=workdir))  # units.txt, any numerics bundle
    rows, per_epoch = [], 0
    try:
        hb = Heartbeat(0)
        tok, loader, _ = start_data(cfg.data, data, None, load_data(data, cfg.data.raw_chunk), tmp, info, True, hb)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        phases = StepPhases(hb, device)
        stepper = build_step(cfg, len(tok), info, tmp, phases, horizon=skip + steps)
        batches = iter(loader)
        with GpuSampler(0.2) as gpu, CpuSampler(0.25) as cpu, cpu_fp16_kernels(device, stepper.precision.dtype):
            try:
                for group in stepper.groups(batches, cfg.optim.accum_steps):
                    per_epoch += 1
                    r = stepper.timed_step(group)  # the step before, read now that the device is past it
                    if r is not None:
                        rows.append(r.row())
                    if stepper.step >= skip + steps:
                        break
                r = stepper.settle()
                if r is not None:
                    rows.append(r.row())
            finally:
                batches.close()  # stops the loader's workers
                stepper.guard.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    m = rows[skip:]
    if per_epoch < skip + steps:
        raise UsageError(
            f"{data}: one epoch holds {per_epoch} batches of {cfg.data.max_frames_in_batch} frames, fewer "
            f"than the {skip} start-up and {steps} measured steps: the loader's start of a new epoch "
            "would be measured as data wait; give more utterances or measure fewer steps"
        )
    step_s = sum(x["step_s"] for x in m)
    util = [r["util_pct"] for r in gpu.during(m[0]["time"] - m[0]["step_s"], m[-1]["time"])]
    by_t: dict[float, float] = {}
    for r in cpu.samples:
        by_t[r["t"]] = by_t.get(r["t"], 0.0) + r["rss_mib"]
    audio_s = sum(x["frames"] for x in m) * cfg.data.frame_shift_ms / 1000
    out = {
        "steps": len(m),
        "warmup_steps": skip,
        "step_s": step_s / len(m),
        "data_wait": sum(x["data_wait_s"] for x in m) / step_s,
        "utts_per_s": sum(x["utts"] for x in m) / step_s,
        "audio_h_per_h": audio_s / step_s,
        "peak_mib": max(by_t.values(), default=0.0),
        "gpu_util_pct": sum(util) / len(util) if util else None,
        "gpu_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
    }
    out["parts_s"] = {p: sum(x["data_wait_s" if p == "data" else f"{p}_s"] for x in m) / len(m) for p in PARTS}
    out["split"] = step_split(m, None if out["gpu_util_pct"] is None else out["gpu_util_pct"] / 100)
    out["samples"] = {"cpu": cpu.samples, "gpu": gpu.samples, "gpu_reason": gpu.reason}
    return out


# what makes a point of the sweep (the keys of :func:`grid`'s points)
SETTING = ("storage", "num_workers", "prefetch_factor", "max_frames_in_batch", "features", "fbank", "compile")


def grid(
    num_workers=(0, 1, 2),
    prefetch_factor=(2,),
    max_frames_in_batch=(5000,),
    storage=("shards/none",),
    features=("cpu",),
    fbank=("asrlab",),
    compile=(False,),
) -> list[dict]:
    """The points of a grid (``prefetch_factor`` only varies where there are workers; ``fbank`` only where the
    loader makes the features).

    ``features``: ``cpu`` (fbank in the loader) and/or ``device`` (fbank batched after the copy); ``fbank``:
    the loader's, ``asrlab`` and/or ``torchaudio``; ``compile``: the step eager and/or ``train.compile``.
    """
    points = []
    for cp, st, ft, fb, nw, pf, mf in itertools.product(
        compile, storage, features, fbank, num_workers, prefetch_factor, max_frames_in_batch
    ):
        if (nw == 0 and pf != prefetch_factor[0]) or (ft == "device" and fb != fbank[0]):
            continue
        points.append(
            {
                "storage": st,
                "num_workers": nw,
                "prefetch_factor": pf if nw else None,
                "max_frames_in_batch": mf,
                "features": ft,
                "fbank": fb if ft == "cpu" else "asrlab",
                "compile": bool(cp),
            }
        )
    return points


def sweep(cfg: Config, lists: dict[str, Path], points: list[dict], steps: int = 20, progress=None) -> list[dict]:
    """Measure every point; ``lists`` maps each storage to its data list (see ``storage_variants``).

    A short untimed run comes first, so the first point does not pay the process's one-time costs.
    """
    measure(cfg, lists[points[0]["storage"]], steps=1, skip=1)
    rows = []
    for p in points:
        c = replace_section(
            cfg,
            "data",
            num_workers=p["num_workers"],
            prefetch_factor=p["prefetch_factor"] or 2,
            max_frames_in_batch=p["max_frames_in_batch"],
            features=p.get("features", "cpu"),
            fbank=p.get("fbank", "asrlab"),
        )
        c = replace_section(c, "train", compile=bool(p.get("compile")))
        row = {**p, **measure(c, lists[p["storage"]], steps)}
        rows.append(row)
        if progress:
            progress(row)
    return rows


def describe(p: dict) -> str:
    pf = f", prefetch_factor={p['prefetch_factor']}" if p.get("prefetch_factor") else ""
    ft = (
        ", fbank on device"
        if p.get("features") == "device"
        else ", torchaudio's fbank"
        if p.get("fbank") == "torchaudio"
        else ""
    )
    cp = ", compiled" if p.get("compile") else ""
    return f"{p['storage']}, num_workers={p['num_workers']}{pf}, max_frames={p['max_frames_in_batch']}{ft}{cp}"


NEXT = {  # what to try next, by the largest share of the recommended setting's step time
    "data_wait": "the loader still holds the steps back: more workers or uncompressed shards, where cores allow",
    "host_overhead": "the device idles while Python runs: fewer, larger steps (asrlab tune finds the largest batch "
    "per length that fits; data.bucketing=true keeps them free of padding)",
    "compute": "the step itself: data.bucketing=true trains less padding, and asrlab tune sizes batches to the "
    "memory on a GPU",
    "comm": "the gradient all-reduce: larger batches (fewer all-reduces per hour of audio), or gradient accumulation",
}


def recommend(
    rows: list[dict], memory_mib: float | None = None, gpu_memory_mib: float | None = None
) -> tuple[dict, str]:
    """The fastest point (audio hours per hour) that fits the memory budgets, with the evidence.

    The text also counts the other points that wait under ``FED`` of step time for data: the loader keeps up in
    each, so their speeds differ in the step itself, which a short window ranks poorly.
    """
    fits = [
        r
        for r in rows
        if (memory_mib is None or r["peak_mib"] <= memory_mib)
        and (gpu_memory_mib is None or not r.get("gpu_peak_mib") or r["gpu_peak_mib"] <= gpu_memory_mib)
    ]
    if not fits:
        raise UsageError(
            f"no setting fits {memory_mib} MiB (smallest peak: {min(r['peak_mib'] for r in rows):.0f} MiB)"
        )
    best = max(fits, key=lambda r: r["audio_h_per_h"])
    worst = min(rows, key=lambda r: r["audio_h_per_h"])
    text = (
        f"{describe(best)}: data wait {100 * best['data_wait']:.1f}% of step time, "
        f"{best['audio_h_per_h']:.0f} h of audio per hour, {best['audio_h_per_h'] / worst['audio_h_per_h']:.2f}x "
        f"the slowest setting ({describe(worst)}: data wait {100 * worst['data_wait']:.1f}%); "
        f"peak memory {best['peak_mib']:.0f} MiB"
    )
    if best.get("gpu_util_pct") is not None:
        text += f", GPU utilisation {best['gpu_util_pct']:.0f}% (slowest: {worst['gpu_util_pct']:.0f}%)"
    if best.get("split"):
        gpu = None if best.get("gpu_util_pct") is None else best["gpu_util_pct"] / 100
        b = bound(best["split"], gpu)
        text += f". Its steps: {format_split(best['split'])}; {b['bound']}-bound ({b['evidence']}): "
        text += (
            NEXT[best["split"]["largest"]]
            if b["bound"] != "device"
            else "the GPU itself: a faster step needs less arithmetic"
        )
        same = [k for k in SETTING if k != "compile"]
        twin = [
            r
            for r in rows
            if r is not best and r.get("compile") != best.get("compile") and all(r.get(k) == best.get(k) for k in same)
        ]
        if twin and best.get("step_s") and twin[0].get("step_s"):
            eager, compiled = (twin[0], best) if best.get("compile") else (best, twin[0])
            text += (
                f". The compiled step: {1000 * compiled['step_s']:.0f} ms against {1000 * eager['step_s']:.0f} ms "
                "eager at this setting"
            )
    fed = [r for r in fits if r is not best and r["data_wait"] < FED] if best["data_wait"] < FED else []
    if fed:  # data wait does not rank these: their speeds differ in the step itself, not in waiting for data
        lo, hi = min(r["audio_h_per_h"] for r in fed), max(r["audio_h_per_h"] for r in fed)
        span = f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"
        text += (
            f". {len(fed)} other setting{'s' * (len(fed) > 1)} also wait{'s' * (len(fed) == 1)} under "
            f"{100 * FED:.0f}% for data ({span} h/h): their speeds differ in the step itself (batch make-up; "
            f"on CPU, workers sharing the cores), so measure longer before ranking them"
        )
    return best, text


__all__ = ["SETTING", "storage_variants", "measure", "grid", "sweep", "recommend", "describe"]

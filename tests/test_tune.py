"""The throughput sweep: grid, a real measurement, and the recommendation on fake measurements."""

import pytest
import torch

from asrlab.config import load_config
from asrlab.measure.tune import grid, measure, recommend, storage_variants

from conftest import SMALL


def row(storage, nw, mf, audio, wait, peak):
    return {
        "storage": storage,
        "num_workers": nw,
        "prefetch_factor": 2 if nw else None,
        "max_frames_in_batch": mf,
        "audio_h_per_h": audio,
        "data_wait": wait,
        "peak_mib": peak,
        "utts_per_s": audio / 2,
        "gpu_util_pct": None,
    }


def test_recommend_picks_the_fastest_point_that_fits_memory():
    rows = [
        row("shards/bz2", 0, 5000, 40.0, 0.30, 900),
        row("shards/none", 1, 5000, 80.0, 0.02, 1800),
        row("shards/none", 2, 5000, 95.0, 0.01, 2900),
        row("raw", 1, 2500, 70.0, 0.04, 1700),
    ]
    best, text = recommend(rows)
    assert best is rows[2]
    best, text = recommend(rows, memory_mib=2000)
    assert best is rows[1]
    assert text.startswith("shards/none, num_workers=1, prefetch_factor=2, max_frames=5000: data wait 2.0%")
    assert "2.00x the slowest setting (shards/bz2, num_workers=0" in text
    with pytest.raises(ValueError, match="no setting fits"):
        recommend(rows, memory_mib=100)


def test_recommend_names_the_other_settings_the_loader_keeps_up_with():
    rows = [
        row("shards/none", 0, 5000, 800.0, 0.59, 2000),
        row("shards/none", 4, 5000, 2400.0, 0.006, 8100),
        row("shards/bz2", 4, 5000, 3455.0, 0.005, 9200),
        row("raw", 4, 5000, 2223.0, 0.006, 8900),
    ]
    best, text = recommend(rows)
    assert best is rows[2]
    assert "2 other settings also wait under 2% for data (2223-2400 h/h)" in text
    _, text = recommend(rows[:1] + rows[2:3])  # nothing else keeps the loader ahead: nothing to add
    assert "other setting" not in text


def test_recommend_names_the_bound_and_the_compiled_step_beside_the_eager_one():
    """On a GPU: the eager step idles the GPU (host-bound); its compiled twin at the same setting is faster."""
    split = {"data_wait": 0.005, "host_overhead": 0.74, "compute": 0.25, "comm": 0.0, "largest": "host_overhead"}
    eager = {**row("shards/none", 4, 12000, 1182.0, 0.005, 9000), "gpu_util_pct": 25.0, "step_s": 0.087,
             "split": split, "compile": False}  # fmt: skip
    compiled = {**eager, "audio_h_per_h": 3400.0, "step_s": 0.03, "compile": True, "gpu_util_pct": 88.0,
                "split": {**split, "host_overhead": 0.11, "compute": 0.88}}  # fmt: skip
    best, text = recommend([eager, compiled])
    assert best is compiled and "max_frames=12000, compiled:" in text
    assert "host-bound (the GPU idles 12% of the time while the main thread runs the step" in text, text
    assert "The compiled step: 30 ms against 87 ms eager at this setting" in text, text
    _, text = recommend([eager])
    assert "host-bound (the GPU idles 75% of the time" in text and "compiled step" not in text, text


def test_grid_varies_prefetch_only_with_workers():
    pts = grid(num_workers=(0, 2), prefetch_factor=(2, 4), max_frames_in_batch=(800,), storage=("raw",))
    assert [(p["num_workers"], p["prefetch_factor"]) for p in pts] == [(0, None), (2, 2), (2, 4)]


def test_measure_on_real_steps(corpus, tmp_path, monkeypatch):
    """The trainer's own steps and step timer, without a trainer (no checkpoint, ledger, evaluation or watchdog)."""
    import asrlab.train.trainer

    def no_trainer(*a, **k):
        raise AssertionError("a sweep point built a whole Trainer")

    monkeypatch.setattr(asrlab.train.trainer.Trainer, "__init__", no_trainer)
    lists = storage_variants(corpus / "data.list", tmp_path, ("raw", "shards/bz2"), max_utts=60, shard_size=20)
    assert lists["raw"].name == "raw.list" and len(lists["shards/bz2"].read_text().splitlines()) == 3
    r = measure(load_config("tiny", SMALL + ["data.num_workers=0"]), lists["shards/bz2"], steps=3)
    assert r["steps"] == 3 and 0 < r["data_wait"] < 1 and r["utts_per_s"] > 0 and r["peak_mib"] > 0
    assert sum(r["parts_s"].values()) == pytest.approx(r["step_s"], rel=1e-3)


def test_measure_skips_the_batches_the_workers_prefetched(corpus, tmp_path):
    """Those are ready before the first step ends: measured, they would hide the loader's steady pace."""
    lists = storage_variants(corpus / "data.list", tmp_path, ("shards/none",), max_utts=60, shard_size=20)
    cfg = load_config("tiny", SMALL + ["data.num_workers=1", "data.prefetch_factor=3"])
    r = measure(cfg, lists["shards/none"], steps=2)
    assert r["warmup_steps"] == 3 and r["steps"] == 2


def test_measure_refuses_a_window_longer_than_an_epoch(corpus, tmp_path):
    """The workers' start at a new epoch would read as the loader's steady pace (on an H100, 1,000
    utterances in 24,000-frame batches are about 9 batches: the sweep's 8 start-up and 6 measured steps crossed it)."""
    lists = storage_variants(corpus / "data.list", tmp_path, ("shards/none",), max_utts=24, shard_size=12)
    with pytest.raises(ValueError, match="one epoch holds [0-9]+ batches of 800 frames, fewer than the 2 start-up"):
        measure(load_config("tiny", SMALL + ["data.num_workers=0"]), lists["shards/none"], steps=30)


# -- the batch from measured memory (asrlab tune) ---------------------------------------------------


def test_memory_search_finds_the_largest_batch_per_length():
    from asrlab.measure.memory import ladder, search, table

    budget = 10_000_000

    def cost(utts, frames):  # activations + attention
        return utts * frames * 200 + utts * frames * frames * 2

    calls = []

    def fits(utts, frames):
        calls.append((utts, frames))
        return cost(utts, frames) <= budget

    lengths = ladder(1500)
    assert lengths == [100, 200, 400, 800, 1500]
    rows = search(fits, lengths, max_utts=256)
    for r in rows:
        u, t = r["utts"], r["frames"]
        assert (u == 0 or fits(u, t)) and (u == 256 or not fits(u + 1, t)), r
    assert rows[0]["utts"] == 250 and [r["max_frames"] for r in rows] == sorted(r["max_frames"] for r in rows)[::-1]
    assert len(calls) < 25 * len(lengths)  # a search, not a scan
    assert table(rows) == [[r["frames"], r["max_frames"]] for r in rows if r["utts"]]


def test_a_calibrated_table_sizes_batches_by_their_longest_utterance():
    from asrlab.data.config import DataConfig
    from asrlab.data.plan import batch_sizes

    cfg = DataConfig(max_frames_by_length=[[100, 1000], [400, 1600]])
    assert batch_sizes([50] * 30 + [300] * 10 + [900] * 3, cfg) == [20, 10, 5, 5, 1, 1, 1]
    with pytest.raises(Exception, match="up_to_frames increasing"):
        DataConfig(max_frames_by_length=[[400, 100], [100, 200]])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where there is no GPU")
def test_tune_says_it_needs_a_gpu(tmp_path):
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "asrlab.cli", "tune", str(tmp_path / "none.list")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "needs a GPU, and there is none here" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/on_gpu.sh gputests runs it on one)")
def test_gpu_calibrated_batches_fit_and_one_more_utterance_does_not():
    from asrlab.measure.memory import calibrate, step_fits

    cfg = load_config("tiny")
    device = torch.device("cuda")
    r = calibrate(cfg, 50, 1200, margin=0.5)
    budget = r["budget_mib"] << 20
    fits = step_fits(cfg, 50, device, budget)
    for row in r["rows"]:
        assert row["utts"] > 0 and fits(row["utts"], row["frames"])
        assert row["utts"] == 4096 or not fits(row["utts"] + 1, row["frames"])

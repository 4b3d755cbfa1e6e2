"""The throughput sweep: grid, a real measurement, and the recommendation on fake measurements."""

import pytest

from asrlab.config import load_config
from asrlab.measure.tune import grid, measure, recommend, storage_variants

SMALL = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.ff_dim=64", "model.conv_kernel=3",
         "model.conv_channels=8", "data.max_frames_in_batch=800"]


def row(storage, nw, mf, audio, wait, peak):
    return {"storage": storage, "num_workers": nw, "prefetch_factor": 2 if nw else None, "max_frames_in_batch": mf,
            "audio_h_per_h": audio, "data_wait": wait, "peak_mib": peak, "utts_per_s": audio / 2, "gpu_util_pct": None}


def test_recommend_picks_the_fastest_point_that_fits_memory():
    rows = [row("shards/bz2", 0, 5000, 40.0, 0.30, 900), row("shards/none", 1, 5000, 80.0, 0.02, 1800),
            row("shards/none", 2, 5000, 95.0, 0.01, 2900), row("raw", 1, 2500, 70.0, 0.04, 1700)]
    best, text = recommend(rows)
    assert best is rows[2]
    best, text = recommend(rows, memory_mib=2000)
    assert best is rows[1]
    assert text.startswith("shards/none, num_workers=1, prefetch_factor=2, max_frames=5000: data wait 2.0%")
    assert "2.00x the slowest setting (shards/bz2, num_workers=0" in text
    with pytest.raises(ValueError, match="no setting fits"):
        recommend(rows, memory_mib=100)


def test_recommend_names_the_other_settings_the_loader_keeps_up_with():
    rows = [row("shards/none", 0, 5000, 800.0, 0.59, 2000), row("shards/none", 4, 5000, 2400.0, 0.006, 8100),
            row("shards/bz2", 4, 5000, 3455.0, 0.005, 9200), row("raw", 4, 5000, 2223.0, 0.006, 8900)]
    best, text = recommend(rows)
    assert best is rows[2]
    assert "2 other settings also wait under 2% for data (2223-2400 h/h)" in text
    _, text = recommend(rows[:1] + rows[2:3])  # nothing else keeps the loader ahead: nothing to add
    assert "other setting" not in text


def test_grid_varies_prefetch_only_with_workers():
    pts = grid(num_workers=(0, 2), prefetch_factor=(2, 4), max_frames_in_batch=(800,), storage=("raw",))
    assert [(p["num_workers"], p["prefetch_factor"]) for p in pts] == [(0, None), (2, 2), (2, 4)]


def test_measure_on_real_steps(corpus, tmp_path):
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

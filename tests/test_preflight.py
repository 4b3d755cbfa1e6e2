"""``asrlab shards inspect``: the predicted layout matches what the loader does, and warns."""

import json
import subprocess
import sys

from asrlab.data.loader import AsrLoader

from asrlab.data.config import DataConfig
from asrlab.data.preflight import inspect_layout
from asrlab.data.sources import load_sources


def test_prediction_matches_the_loader_and_flags_the_short_rank(corpus, tok):
    srcs = load_sources(corpus / "data.list")[:9]  # 9 shards over 2 ranks: one rank gets fewer
    cfg = DataConfig(shuffle_size=12, max_frames_in_batch=500)
    report = inspect_layout(srcs, cfg, world_size=2, num_workers=1)
    real = [sum(1 for _ in AsrLoader(srcs, tok, cfg, rank, 2)) for rank in range(2)]
    assert [r["batches"] for r in report["ranks"]] == real
    assert [r["shards"] for r in report["ranks"]] == [5, 4]
    short = min(range(2), key=lambda r: real[r])
    assert any(w.startswith(f"rank {short} runs out of data") for w in report["warnings"])


def test_even_layout_has_no_rank_warning(corpus):
    srcs = load_sources(corpus / "data.list")[:1] * 2  # the same shard twice: identical halves
    report = inspect_layout(srcs, DataConfig(shuffle=False), world_size=2, num_workers=0)
    assert report["ranks"][0]["batches"] == report["ranks"][1]["batches"]
    assert not [w for w in report["warnings"] if "runs out" in w]


def test_a_rank_with_no_data_and_idle_workers_are_flagged(corpus):
    srcs = load_sources(corpus / "data.list")[:3]
    report = inspect_layout(srcs, DataConfig(), world_size=4, num_workers=2)
    assert "rank 2 gets no data" in " ".join(report["warnings"]) or "rank 3 gets no data" in " ".join(
        report["warnings"]
    )
    assert any("sit idle" in w for w in report["warnings"])


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "asrlab.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_inspect_json_and_table(corpus):
    out = run_cli("shards", "inspect", str(corpus / "data.list"), "--world-size", "2", "--num-workers", "2", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert sum(r["utts"] for r in report["ranks"]) == 120
    table = run_cli("shards", "inspect", str(corpus / "data.list"), "--world-size", "3")
    assert table.returncode == 0 and "rank" in table.stdout and "batches" in table.stdout


def test_cli_errors_are_one_clear_line(tmp_path):
    out = run_cli("shards", "inspect", str(tmp_path / "nope.list"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("asrlab: error:") and "no such data list" in out.stderr

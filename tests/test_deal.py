"""Every rank and worker fed: a raw list of 1,000 lines (one source of raw_chunk=1000 items) on 2 ranks x 2
workers is cut so that all four read, each utterance once, and a resume on the same layout is exact."""

import json

import pytest

from asrlab.data.config import DataConfig
from asrlab.data.loader import AsrLoader
from asrlab.data.plan import fed
from asrlab.data.preflight import format_layout, inspect_layout
from asrlab.data.sources import load_sources

from conftest import tone_utts


@pytest.fixture(scope="module")
def raw_1000(tmp_path_factory):
    d = tmp_path_factory.mktemp("raw1000")
    lines = []
    for key, text, wav in tone_utts(1000, seed=3):
        (d / f"{key}.wav").write_bytes(wav)
        lines.append(json.dumps({"key": key, "wav": f"{key}.wav", "txt": text}))
    (d / "data.list").write_text("\n".join(lines) + "\n")
    return d / "data.list"


def batches(loader, stop=None):
    out = []
    for i, b in enumerate(loader):
        out.append((b["keys"], round(b["feats"].sum().item(), 3)))
        if stop is not None and i + 1 == stop:
            break
    return out


def test_a_raw_list_of_one_source_feeds_every_rank_and_worker_and_resumes_exactly(raw_1000, tok):
    srcs = load_sources(raw_1000)
    assert len(srcs) == 1  # raw_chunk=1000: before the cut, one worker of four would read everything
    assert len(fed(srcs, 4)) == 4 and sum(len(s.items) for s in fed(srcs, 4)) == 1000
    cfg = DataConfig(num_workers=2, shuffle_size=50, max_frames_in_batch=2000)
    report = inspect_layout(srcs, cfg, world_size=2, num_workers=2)
    assert [r["fed"] for r in report["ranks"]] == [2, 2], format_layout(report)
    assert all(w["utts"] > 200 for r in report["ranks"] for w in r["workers"]), format_layout(report)
    assert "its data feeds 2 of 2 worker(s)" in format_layout(report)
    seen = []
    for rank in (0, 1):
        full = batches(AsrLoader(srcs, tok, cfg, rank, 2))
        workers = {w for w in range(2) if AsrLoader(srcs, tok, cfg, rank, 2).dataset.streams(w)[0]}
        assert workers == {0, 1}
        seen += [k for keys, _ in full for k in keys]
        first = AsrLoader(srcs, tok, cfg, rank, 2)
        cut = len(full) // 2 + 1
        out = batches(first, stop=cut)
        resumed = AsrLoader(srcs, tok, cfg, rank, 2)
        resumed.load_state_dict(first.state_dict())
        assert out + batches(resumed) == full, f"rank {rank}: the resumed epoch is not the uninterrupted one"
    assert len(seen) == len(set(seen)) and len(seen) >= 990  # each utterance once (a batch's rest may be left)

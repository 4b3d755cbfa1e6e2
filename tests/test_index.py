"""The data list's index: built once in parallel, reused while the shards are unchanged, a changed shard
indexed again alone, kept in a cache folder when the list's own is read-only; start-up reads it."""

import json
import os
import shutil

import pytest

from asrlab.cli import main
from asrlab.data import index as index_module
from asrlab.data.index import forget, index_path, indexed, transcripts, use_index
from asrlab.data.config import DataConfig
from asrlab.data.preflight import source_stats
from asrlab.data.sources import load_sources, read_source

from conftest import SMALL_MODEL


@pytest.fixture
def shards(corpus, tmp_path):
    """A private copy of the corpus's shards and lists (the index is written next to the list)."""
    d = tmp_path / "train"
    shutil.copytree(corpus, d, ignore=shutil.ignore_patterns("*.index.json"))
    for name in ("data.list", "raw.list"):  # the lists hold absolute paths: to the copy's files
        (d / name).write_text((d / name).read_text().replace(str(corpus), str(d)))
    forget()
    yield d
    forget()


def test_an_index_gives_what_the_headers_give_and_is_reused(shards, monkeypatch):
    lst = shards / "data.list"
    sources = load_sources(lst)
    cfg = DataConfig()
    from_headers = [source_stats(s, cfg) for s in sources]
    s = use_index(lst, sources, processes=2, progress=False)
    assert (s["sources"], s["indexed"], s["reused"], s["utterances"], s["usable"]) == (10, 10, 0, 120, 120)
    assert index_path(lst) == shards / "data.list.index.json" and (shards / "data.list.index.json").exists()
    assert all(indexed(x) is not None for x in sources)
    from_index = [source_stats(x, cfg) for x in sources]
    assert [(a.frames, round(a.seconds, 6), a.bad) for a in from_index] == [
        (b.frames, round(b.seconds, 6), b.bad) for b in from_headers
    ]
    assert list(transcripts(sources)) == [i.text for x in sources for i in read_source(x)]
    # a second start reads no audio at all
    forget()
    monkeypatch.setattr(index_module, "index_source", lambda src: pytest.fail(f"{src.name} read again"))
    again = use_index(lst, sources, progress=False)
    assert (again["indexed"], again["reused"], again["utterances"]) == (0, 10, 120)
    assert [source_stats(x, cfg).frames for x in sources] == [a.frames for a in from_headers]


def test_a_changed_shard_is_indexed_again_alone(shards, monkeypatch):
    lst = shards / "data.list"
    sources = load_sources(lst)
    use_index(lst, sources, progress=False)
    changed = sources[3]
    st = os.stat(changed.path)
    os.utime(changed.path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert indexed(changed, recheck_s=0) is None  # the loaded entry no longer holds: readers go back to the audio
    read = []
    real = index_module.index_source
    monkeypatch.setattr(index_module, "index_source", lambda src: read.append(src.name) or real(src))
    s = use_index(lst, sources, processes=1, progress=False)
    assert (s["indexed"], s["reused"], read) == (1, 9, [changed.name])


def test_unusable_items_are_counted_as_the_loader_would_skip_them(shards):
    raw = shards / "raw.list"
    lines = raw.read_text().splitlines()
    first = json.loads(lines[0])
    os.remove(first["wav"])
    sources = load_sources(raw)
    s = use_index(raw, sources, progress=False)
    assert (s["utterances"], s["usable"]) == (120, 119)
    stats = [source_stats(x, DataConfig()) for x in sources]
    assert sum(x.bad for x in stats) == 1 and sum(len(x.frames) for x in stats) == 119
    assert [u.bad for u in indexed(sources[0]) if u.bad] == ["missing_file"]


def test_a_read_only_list_keeps_its_index_in_the_cache(shards, tmp_path, monkeypatch):
    monkeypatch.setenv("ASRLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(index_module.os, "access", lambda path, mode: False)
    lst = shards / "data.list"
    s = use_index(lst, load_sources(lst), progress=False)
    assert s["path"].startswith(str(tmp_path / "cache" / "index")) and not (shards / "data.list.index.json").exists()


def test_asrlab_index_builds_it_ahead_of_training(shards, capsys):
    assert main(["index", str(shards / "data.list"), "--json", "--processes", "2"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["indexed"], s["utterances"]) == (10, 120)
    forget()
    assert main(["index", str(shards / "data.list")]) == 0
    assert "10 sources (10 reused, 0 indexed), 120 utterances, 120 usable" in capsys.readouterr().out


def test_an_epoch_planned_from_the_index_is_the_one_planned_from_the_audio(shards, tok, monkeypatch):
    """What an elastic resume re-plans (and the padding benchmark counts) without reading the audio."""
    from asrlab.data import audio
    from asrlab.data.loader import AsrDataset

    lst = shards / "data.list"
    sources = load_sources(lst)
    cfg = DataConfig(max_frames_in_batch=800, shuffle_size=50, bucketing=True, min_duration_s=0.5)
    keys = lambda ds: [[i.key for i in b] for plan in ds.plan(0) for b in plan]  # noqa: E731
    read = keys(AsrDataset(sources, tok, cfg))
    use_index(lst, sources, progress=False)
    monkeypatch.setattr(audio, "audio_info", lambda data: pytest.fail("the audio was read"))
    assert keys(AsrDataset(sources, tok, cfg)) == read and len(read) > 5


def test_a_second_start_reads_its_data_from_the_index(shards, tmp_path, monkeypatch):
    """The tokenizer and the LR horizon (the pre-flight layout) of a new run come from the index the first
    run wrote, with nothing read from the shards."""
    import torch

    from asrlab.config import load_config
    from asrlab.lab.dist import DistInfo
    from asrlab.train.trainer import Trainer

    cfg = load_config(
        "tiny", [*SMALL_MODEL, "optim.decay_by_clock=true", "train.max_minutes=1", "train.progress=false"]
    )
    cpu = DistInfo(0, 1, 0, torch.device("cpu"), None)
    Trainer(cfg, str(shards / "data.list"), None, tmp_path / "a", cpu).close()
    assert (shards / "data.list.index.json").exists()
    forget()

    def unread(*args, **kw):
        raise AssertionError("start-up read a shard")

    monkeypatch.setattr(index_module, "read_source", unread)  # pre-flight's fallback reads through it too
    tr = Trainer(cfg, str(shards / "data.list"), None, tmp_path / "b", cpu)
    assert len(tr.tok) > 10
    tr.close()


def test_sources_gone_from_the_list_leave_the_index(shards):
    lst = shards / "data.list"
    use_index(lst, load_sources(lst), progress=False)
    lst.write_text("".join(lst.read_text().splitlines(keepends=True)[:4]))
    s = use_index(lst, load_sources(lst), progress=False)
    assert (s["sources"], s["reused"]) == (4, 4)
    assert len(json.loads(index_path(lst).read_text())["sources"]) == 10  # nothing was indexed: not rewritten
    forget()
    os.utime(load_sources(lst)[0].path, ns=(1, 1))
    use_index(lst, load_sources(lst), progress=False)
    assert len(json.loads(index_path(lst).read_text())["sources"]) == 4


def test_a_stamp_checked_recently_is_trusted(shards, monkeypatch):
    """Start-up asks for the same sources several times (pre-flight, tokenizer, planning): their stamps
    are not checked again each time (a request per shard over HTTP), only once the last check is old."""
    lst = shards / "data.list"
    sources = load_sources(lst)
    use_index(lst, sources, progress=False)
    checks = []
    real = index_module.stamp
    monkeypatch.setattr(index_module, "stamp", lambda src: checks.append(src.name) or real(src))
    for _ in range(3):
        assert all(indexed(x) is not None for x in sources)
    assert checks == []
    assert indexed(sources[0], recheck_s=0) is not None and checks == [sources[0].name]

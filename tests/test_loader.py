"""The streaming loader: exactly once per epoch across ranks x workers, exact resume, seeking."""

from collections import Counter

import pytest

from asrlab.data import sources as sources_mod
from asrlab.data.loader import AsrLoader
from asrlab.data.config import DataConfig
from asrlab.data.plan import batch_sizes
from asrlab.data.sources import DataError, load_sources


def keys_of(loader):
    return [k for b in loader for k in b["keys"]]


@pytest.mark.parametrize("epoch", [0, 1])
def test_every_utterance_exactly_once_across_2_ranks_x_2_workers(corpus, tok, epoch):
    srcs = load_sources(corpus / "data.list")
    seen = Counter()
    for rank in range(2):
        loader = AsrLoader(srcs, tok, DataConfig(num_workers=2, shuffle_size=20), rank, 2)
        loader.set_epoch(epoch)
        seen.update(keys_of(loader))
    assert len(seen) == 120 and set(seen.values()) == {1}


def test_epochs_differ_and_same_seed_repeats(corpus, tok):
    srcs = load_sources(corpus / "data.list")
    cfg = DataConfig(shuffle_size=30)
    a, b = AsrLoader(srcs, tok, cfg), AsrLoader(srcs, tok, cfg)
    first = keys_of(a)
    assert keys_of(b) == first
    a.set_epoch(1)
    second = keys_of(a)
    assert sorted(second) == sorted(first) and second != first


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("cut", [1, 4, 7])
def test_resume_from_state_gives_the_same_batches(corpus, tok, num_workers, cut):
    srcs = load_sources(corpus / "data.list")
    cfg = DataConfig(
        num_workers=num_workers, shuffle_size=25, spec_augment=True, noise_aug=0.5, max_frames_in_batch=600
    )
    full = [(b["keys"], b["feats"].sum().item()) for b in AsrLoader(srcs, tok, cfg)]
    assert len(full) > cut
    first = AsrLoader(srcs, tok, cfg)
    out = []
    for i, b in enumerate(first):
        out.append((b["keys"], b["feats"].sum().item()))
        if i + 1 == cut:
            break
    state = first.state_dict()
    resumed = AsrLoader(srcs, tok, cfg)
    resumed.load_state_dict(state)
    out += [(b["keys"], b["feats"].sum().item()) for b in resumed]
    assert out == full


def test_resume_seeks_instead_of_replaying(corpus, tok, monkeypatch):
    """Resuming near the end of the epoch reads at most one block, not everything before it."""
    srcs = load_sources(corpus / "data.list")
    cfg = DataConfig(shuffle_size=12)
    loader = AsrLoader(srcs, tok, cfg)
    batches = list(loader)
    loader = AsrLoader(srcs, tok, cfg)
    for i, _ in enumerate(loader):
        if i + 2 == len(batches):
            break
    state = loader.state_dict()
    read = Counter()
    real = sources_mod.read_source

    def counting(src, start=0):
        for item in real(src, start):
            read[item.key] += 1
            yield item

    monkeypatch.setattr("asrlab.data.loader.read_source", counting)
    resumed = AsrLoader(srcs, tok, cfg)
    resumed.load_state_dict(state)
    rest = keys_of(resumed)
    assert rest and sum(read.values()) <= cfg.shuffle_size


def test_state_for_another_layout_is_refused(corpus, tok):
    srcs = load_sources(corpus / "data.list")
    state = AsrLoader(srcs, tok, DataConfig(num_workers=2)).state_dict()
    with pytest.raises(ValueError, match="ranks x"):
        AsrLoader(srcs, tok, DataConfig(num_workers=1)).load_state_dict(state)


def test_dynamic_and_static_batching():
    cfg = DataConfig(max_frames_in_batch=100)
    assert batch_sizes([10, 20, 30, 40], cfg) == [3, 1]  # 3 x 30 = 90 fits, 4 x 40 does not
    assert batch_sizes([10] * 7, DataConfig(batch_type="static", batch_size=3)) == [3, 3, 1]


def test_batches_respect_max_frames(corpus, tok):
    cfg = DataConfig(max_frames_in_batch=400)
    for b in AsrLoader(load_sources(corpus / "data.list"), tok, cfg):
        assert b["feats"].shape[0] * b["feats"].shape[1] <= 400 or b["feats"].shape[0] == 1
        assert b["feats"].shape[2] == 80


def test_speed_plays_the_audio_faster_and_batching_knows_the_new_length(corpus, tok):
    """data.speed (decoding's test-time warp): 10% faster is ~10% fewer frames, predicted before the fbank."""
    frames = {}
    for speed in (1.0, 1.1, 0.9):
        cfg = DataConfig(shuffle=False, speed=speed, max_frames_in_batch=400)
        got = {
            k: int(n)
            for b in AsrLoader(load_sources(corpus / "data.list"), tok, cfg)
            for k, n in zip(b["keys"], b["feat_lens"])
        }
        frames[speed] = got
        for b in AsrLoader(load_sources(corpus / "data.list"), tok, cfg):
            assert b["feats"].shape[0] * b["feats"].shape[1] <= 400 or b["feats"].shape[0] == 1
    assert DataConfig(speed=1.1).rate() == 14500 and DataConfig(speed=0.9).rate() == 17800
    for key, n in frames[1.0].items():
        assert frames[1.1][key] == pytest.approx(n * 14500 / 16000, abs=2)
        assert frames[0.9][key] == pytest.approx(n * 17800 / 16000, abs=2)


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="data.speed"):
        DataConfig(speed=0.2)
    with pytest.raises(ValueError, match="batch_type"):
        DataConfig(batch_type="huge")
    with pytest.raises(DataError, match="no such data list"):
        load_sources("/definitely/not/here/data.list")


def _frames(it, cfg) -> int:
    """An item's frames: from the index where a run on this corpus already indexed it, else from its audio."""
    from asrlab.data import audio

    return cfg.frames(it.samples, it.rate) if it.audio is None else cfg.frames(*audio.audio_info(it.audio))


def _padding(plans, cfg) -> tuple[float, list[list[int]]]:
    """Padding share of a plan's frames, and each block's batches' longest utterance, in order."""
    speech = padded = 0
    longest = []
    for plan in plans:
        longest.append([])
        for items in plan:
            lens = [_frames(it, cfg) for it in items]
            speech, padded = speech + sum(lens), padded + len(lens) * max(lens)
            longest[-1].append(max(lens))
    return 1 - speech / padded, longest


def test_duration_buckets_pad_less_shuffle_the_batches_and_resume_exactly(corpus, tok):
    from dataclasses import replace

    from asrlab.data.loader import AsrDataset
    from asrlab.data.preflight import estimate_batches

    srcs = load_sources(corpus / "data.list")
    windows = DataConfig(shuffle_size=120, sort_size=20, max_frames_in_batch=400)
    buckets = replace(windows, bucketing=True)
    pad_w, _ = _padding(AsrDataset(srcs, tok, windows).plan(), windows)
    plans = list(AsrDataset(srcs, tok, buckets).plan())
    pad_b, longest = _padding(plans, buckets)
    assert pad_b < pad_w and pad_b <= 0.05, (pad_b, pad_w)
    assert all(block != sorted(block) for block in longest if len(block) > 3)  # not short to long through a block
    again = [[[it.key for it in b] for b in plan] for plan in AsrDataset(srcs, tok, buckets).plan()]
    assert again == [[[it.key for it in b] for b in plan] for plan in plans]  # the same for (seed, epoch)
    frames = [_frames(it, buckets) for plan in plans for b in plan for it in b]
    assert sum(len(p) for p in plans) == estimate_batches(frames, buckets)  # the pre-flight's count is exact
    cfg = replace(buckets, num_workers=2)
    full = [b["keys"] for b in AsrLoader(srcs, tok, cfg)]
    assert sorted(k for b in full for k in b) == sorted(it.key for p in plans for b in p for it in b)
    first, out = AsrLoader(srcs, tok, cfg), []
    for b in first:
        out.append(b["keys"])
        if len(out) == 5:
            break
    resumed = AsrLoader(srcs, tok, cfg)
    resumed.load_state_dict(first.state_dict())
    assert out + [b["keys"] for b in resumed] == full


def test_speed_perturbation_is_planned_deterministic_and_resumes_exactly(corpus, tok):
    """Each utterance at 0.9, 1.0 or 1.1 times its speed, drawn per epoch: its frames are those its speed
    gives (the batch budget holds), the same seed repeats them, another epoch draws again, a resume
    mid-epoch continues bitwise, and evaluation does not perturb."""
    import torch

    from asrlab.data import audio
    from asrlab.data.sources import iter_items

    srcs = load_sources(corpus / "data.list")
    cfg = DataConfig(speed_perturb=(0.9, 1.0, 1.1), shuffle_size=40, max_frames_in_batch=900)
    samples = {i.key: audio.audio_info(i.audio) for i in iter_items(srcs)}
    lengths = {s: {k: cfg.frames(n, sr, s) for k, (n, sr) in samples.items()} for s in cfg.speed_perturb}

    def epoch(loader, e=0):
        loader.set_epoch(e)
        return [(list(b["keys"]), b["feat_lens"].tolist(), b["feats"]) for b in loader]

    batches = epoch(AsrLoader(srcs, tok, cfg))
    speeds = Counter()
    for keys, lens, feats in batches:
        assert max(lens) * len(lens) <= 900
        for k, n in zip(keys, lens):
            speeds[next(s for s in cfg.speed_perturb if lengths[s][k] == n)] += 1
    assert sum(speeds.values()) == 120 and min(speeds.values()) >= 20  # every speed, about a third each
    again = epoch(AsrLoader(srcs, tok, cfg))
    assert [(k, n) for k, n, _ in again] == [(k, n) for k, n, _ in batches]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(again, batches))
    other = epoch(AsrLoader(srcs, tok, cfg), 1)
    assert sorted(n for _, ns, _ in other for n in ns) != sorted(n for _, ns, _ in batches for n in ns)
    first = AsrLoader(srcs, tok, cfg)
    out = []
    for i, b in enumerate(first):
        out.append((list(b["keys"]), b["feats"].sum().item()))
        if i == 3:
            break
    resumed = AsrLoader(srcs, tok, cfg)
    resumed.load_state_dict(first.state_dict())
    out += [(list(b["keys"]), b["feats"].sum().item()) for b in resumed]
    assert out == [(k, f.sum().item()) for k, _, f in batches]
    plain = AsrLoader(srcs, tok, cfg.for_eval(max_frames_in_batch=100_000))
    assert {k: n for b in plain for k, n in zip(b["keys"], b["feat_lens"].tolist())} == lengths[1.0]


def test_the_injected_delay_sleeps_only_on_its_ranks_and_from_its_batch(monkeypatch):
    from types import SimpleNamespace

    from asrlab.data import faults

    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    cfg = SimpleNamespace(inject_delay_s=0.5, inject_delay_ranks=(1,), inject_delay_from_batch=2)
    assert list(faults.delayed(iter(range(4)), cfg, rank=0)) == [0, 1, 2, 3] and slept == []
    assert list(faults.delayed(iter(range(4)), cfg, rank=1)) == [0, 1, 2, 3] and slept == [0.5, 0.5]

"""What users already have, written by other tools than asrlab (soundfile for the audio, Python's tarfile
for shards, plain text for the lists): FLAC, Ogg Vorbis, Opus and MP3 members; utterances cut from longer
recordings by a raw list's start/end, a NeMo manifest's offset/duration and a Kaldi dir's segments."""

import io
import json
import tarfile

import numpy as np
import pytest
import soundfile as sf

from asrlab.data.audio import decode
from asrlab.data.index import forget, use_index
from asrlab.data.loader import AsrLoader
from asrlab.data.config import DataConfig
from asrlab.data.shards import iter_tar
from asrlab.data.sources import DataError, iter_items, load_sources
from asrlab.data.tokenizer import CharTokenizer

RATE = 16000
TEXTS = ["one two", "stop", "go three"]
SECONDS = [0.8, 0.5, 1.1]
TOK = CharTokenizer.build(TEXTS)


def tone(seconds: float, f: float) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * f * np.arange(int(RATE * seconds)) / RATE)).astype(np.float32)


def recording() -> np.ndarray:
    """The three utterances one after another, each its own pitch, 0.2 s of silence between."""
    gap = np.zeros(int(0.2 * RATE), np.float32)
    return np.concatenate([x for s, f in zip(SECONDS, (300, 600, 900)) for x in (tone(s, f), gap)])


def bounds() -> list[tuple[float, float]]:
    out, t = [], 0.0
    for s in SECONDS:
        out.append((round(t, 3), round(t + s, 3)))
        t += s + 0.2
    return out


def keys_and_lengths(path, cfg=None) -> dict[str, int]:
    loader = AsrLoader(load_sources(path), TOK, cfg or DataConfig(max_frames_in_batch=10_000, shuffle=False))
    out = {}
    for b in loader:
        out.update(zip(b["keys"], b["feat_lens"].tolist()))
    assert not loader.skipped(), loader.skipped()
    return out


@pytest.mark.parametrize(
    "fmt,subtype,ext",
    [("FLAC", "PCM_16", "flac"), ("OGG", "VORBIS", "ogg"), ("OGG", "OPUS", "opus"), ("MP3", "MPEG_LAYER_III", "mp3")],
)
def test_shard_members_in_other_codecs(tmp_path, fmt, subtype, ext):
    shard = tmp_path / "a.tar"
    with tarfile.open(shard, "w") as tar:
        for i, (s, text) in enumerate(zip(SECONDS, TEXTS)):
            buf = io.BytesIO()
            sf.write(buf, tone(s, 400 + 100 * i), RATE, format=fmt, subtype=subtype)
            for name, data in ((f"u{i}.{ext}", buf.getvalue()), (f"u{i}.txt", text.encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (tmp_path / "data.list").write_text(f"{shard}\n")
    got = keys_and_lengths(tmp_path / "data.list")
    assert sorted(got) == ["u0", "u1", "u2"]
    for i, s in enumerate(SECONDS):  # lossy codecs pad a little: within 50 ms of the length written
        assert abs(got[f"u{i}"] - 100 * s) <= 5, (got, s)


def test_a_raw_list_cuts_utterances_by_start_and_end(tmp_path):
    sf.write(tmp_path / "long.flac", recording(), RATE)
    lines = [
        json.dumps({"key": f"c{i}", "wav": "long.flac", "txt": t, "start": a, "end": b})
        for i, (t, (a, b)) in enumerate(zip(TEXTS, bounds()))
    ]
    (tmp_path / "raw.list").write_text("\n".join(lines) + "\n")
    items = list(iter_items(load_sources(tmp_path / "raw.list")))
    for item, s, f in zip(items, SECONDS, (300, 600, 900)):
        wav, rate = decode(item.audio)
        assert rate == RATE and abs(len(wav) - s * RATE) <= 1
        spectrum = np.abs(np.fft.rfft(wav.numpy()))
        assert abs(np.argmax(spectrum) * RATE / len(wav) - f) < 10  # its own utterance, not a neighbour
    lengths = keys_and_lengths(tmp_path / "raw.list")
    assert sorted(lengths) == ["c0", "c1", "c2"]
    forget()  # the index knows the cut lengths too
    s = use_index(tmp_path / "raw.list", load_sources(tmp_path / "raw.list"), progress=False)
    assert s["usable"] == 3 and abs(s["hours"] * 3600 - sum(SECONDS)) < 0.01


def test_a_nemo_manifest_with_and_without_offsets(tmp_path):
    for i, s in enumerate(SECONDS):
        sf.write(tmp_path / f"utt{i}.wav", tone(s, 500), RATE, subtype="PCM_16")
    sf.write(tmp_path / "long.flac", recording(), RATE)
    (a, b) = bounds()[1]
    lines = [
        json.dumps({"audio_filepath": f"utt{i}.wav", "duration": s, "text": t})
        for i, (s, t) in enumerate(zip(SECONDS, TEXTS))
    ]
    lines.append(
        json.dumps({"audio_filepath": str(tmp_path / "long.flac"), "offset": a, "duration": b - a, "text": TEXTS[1]})
    )
    (tmp_path / "manifest.json").write_text("\n".join(lines) + "\n")
    got = keys_and_lengths(tmp_path / "manifest.json")
    assert sorted(got) == ["long-1.00", "utt0", "utt1", "utt2"]
    assert abs(got["long-1.00"] - 100 * SECONDS[1]) <= 3


def test_a_kaldi_dir_with_segments(tmp_path):
    sf.write(tmp_path / "rec1.flac", recording(), RATE)
    (tmp_path / "wav.scp").write_text(f"rec1 {tmp_path / 'rec1.flac'}\n")
    (tmp_path / "segments").write_text("".join(f"s{i} rec1 {a} {b}\n" for i, (a, b) in enumerate(bounds())))
    (tmp_path / "text").write_text("".join(f"s{i} {t}\n" for i, t in enumerate(TEXTS)))
    got = keys_and_lengths(tmp_path)
    assert sorted(got) == ["s0", "s1", "s2"]
    assert [abs(got[f"s{i}"] - 100 * s) <= 3 for i, s in enumerate(SECONDS)] == [True] * 3
    (tmp_path / "segments").write_text("s0 rec9 0.0 1.0\n")
    with pytest.raises(DataError, match="rec9 is not in wav.scp"):
        load_sources(tmp_path)


def test_a_bad_segment_is_a_clear_error(tmp_path):
    sf.write(tmp_path / "long.flac", recording(), RATE)
    (tmp_path / "raw.list").write_text(
        json.dumps({"key": "c", "wav": "long.flac", "txt": "go", "start": 2.0, "end": 1.0}) + "\n"
    )
    with pytest.raises(DataError, match=r"raw.list:1: .*0 <= start < end"):
        load_sources(tmp_path / "raw.list")


def kaldi_dir(d):
    d.mkdir()
    sf.write(d / "rec1.flac", recording(), RATE)
    (d / "wav.scp").write_text(f"rec1 {d / 'rec1.flac'}\n")
    (d / "segments").write_text("".join(f"s{i} rec1 {a} {b}\n" for i, (a, b) in enumerate(bounds())))
    (d / "text").write_text("".join(f"s{i} {t}\n" for i, t in enumerate(TEXTS)))
    return d


@pytest.mark.parametrize("compression", ["none", "zst"])
def test_shards_pack_writes_what_it_read(tmp_path, compression, capsys):
    """A Kaldi dir with segments and a NeMo manifest of FLAC files (one of them missing), packed in
    parallel: the shards read back as the inputs do; what could not be read is counted, not packed."""
    from asrlab.cli import main

    kaldi = kaldi_dir(tmp_path / "kaldi")
    for i, s in enumerate(SECONDS):
        sf.write(tmp_path / f"utt{i}.flac", tone(s, 500 + 50 * i), RATE)
    lines = [
        json.dumps({"audio_filepath": f"utt{i}.flac", "duration": s, "text": t + " "})  # a trailing space
        for i, (s, t) in enumerate(zip(SECONDS, TEXTS))
    ]
    lines.append(json.dumps({"audio_filepath": "gone.flac", "duration": 1.0, "text": "go"}))
    (tmp_path / "manifest.json").write_text("\n".join(lines) + "\n")
    for src, n in ((kaldi, 3), (tmp_path / "manifest.json", 3)):
        out = tmp_path / f"packed_{src.name}"
        assert (
            main(
                [
                    "shards",
                    "pack",
                    str(src),
                    str(out),
                    "--shard-size",
                    "2",
                    "--compression",
                    compression,
                    "--processes",
                    "2",
                    "--json",
                ]
            )
            == 0
        )
        s = json.loads(capsys.readouterr().out)
        assert (s["utterances"], s["shards"]) == (n, 2)
        assert s["skipped"] == ({} if src == kaldi else {"missing_file": 1})
        before = {i.key: (i.text, decode(i.audio)[0].numpy()) for i in iter_items(load_sources(src)) if i.audio}
        after = {i.key: (i.text, decode(i.audio)[0].numpy()) for i in iter_items(load_sources(out / "data.list"))}
        assert sorted(after) == sorted(before)
        assert all(after[k][0] == before[k][0].strip() and np.array_equal(after[k][1], before[k][1]) for k in after)
        names = [m for p in (out / "data.list").read_text().split() for m, _ in iter_tar(open(p, "rb"))]
        assert any(m.endswith(".flac") for m in names) == (src != kaldi)  # FLAC stays FLAC; a cut is WAV
    with pytest.raises(DataError, match="gone.flac|missing_file"):
        from asrlab.data.pack import pack

        pack(tmp_path / "manifest.json", tmp_path / "strict", bad_input_policy="fail")


def test_a_shard_that_does_not_read_back_is_not_listed(tmp_path, monkeypatch):
    from asrlab.data import pack as pack_module

    kaldi = kaldi_dir(tmp_path / "kaldi")
    monkeypatch.setattr(pack_module, "compress", lambda data, c: data[: len(data) // 2])  # a short write
    with pytest.raises(DataError, match="read back, it does not hold what was written"):
        pack_module.pack(kaldi, tmp_path / "out", processes=1)
    assert not (tmp_path / "out" / "data.list").exists() and not list((tmp_path / "out" / "shards").iterdir())


def test_a_kaldi_dir_with_audio_in_an_ark(tmp_path):
    """wav.scp entries ``file.ark:offset``, the archive written by kaldiio; with segments too; a torn offset
    is bad input, not a crash."""
    import kaldiio

    d = tmp_path / "kaldi"
    d.mkdir()
    with kaldiio.WriteHelper(f"ark,scp:{d / 'wav.ark'},{d / 'wav.scp'}", write_function="soundfile") as w:
        for i, s in enumerate(SECONDS):
            w(f"u{i}", (RATE, (tone(s, 400 + 200 * i) * 32767).astype(np.int16)))
        w("rec", (RATE, (recording() * 32767).astype(np.int16)))
    (d / "text").write_text("".join(f"u{i} {t}\n" for i, t in enumerate(TEXTS)))
    scp = (d / "wav.scp").read_text()
    (d / "wav.scp").write_text("".join(line + "\n" for line in scp.splitlines() if not line.startswith("rec")))
    got = keys_and_lengths(d)
    assert sorted(got) == ["u0", "u1", "u2"] and all(abs(got[f"u{i}"] - 100 * s) <= 3 for i, s in enumerate(SECONDS))
    seg = tmp_path / "seg"
    seg.mkdir()
    (seg / "wav.scp").write_text(next(line for line in scp.splitlines() if line.startswith("rec")) + "\n")
    (seg / "segments").write_text("".join(f"s{i} rec {a} {b}\n" for i, (a, b) in enumerate(bounds())))
    (seg / "text").write_text("".join(f"s{i} {t}\n" for i, t in enumerate(TEXTS)))
    assert sorted(keys_and_lengths(seg)) == ["s0", "s1", "s2"]
    (d / "wav.scp").write_text(f"u0 {d / 'wav.ark'}:7\n")  # not where an entry starts
    (item,) = iter_items(load_sources(d))
    assert item.error == "undecodable_audio"

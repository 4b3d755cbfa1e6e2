"""Readers (shards in every compression, raw lists, Kaldi dirs) and every kind of bad input."""

import hashlib
import json
import re
from collections import Counter

import numpy as np
import pytest

from asrlab.data.audio import encode_wav
from asrlab.data.loader import AsrLoader
from asrlab.data.config import DataConfig
from asrlab.data.shards import COMPRESSIONS, write_split
from asrlab.data.sources import DataError, load_sources
from asrlab.data.tokenizer import CharTokenizer

from conftest import tone_utts


def all_keys(path, tok, **cfg):
    loader = AsrLoader(load_sources(path), tok, DataConfig(**cfg))
    return sorted(k for b in loader for k in b["keys"]), loader.skipped()


def digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*.tar*"))}


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_compression_reads_back_and_is_deterministic(tmp_path, tok, compression):
    a = write_split(tone_utts(10), tmp_path / "a", "train", 4, compression)
    write_split(tone_utts(10), tmp_path / "b", "train", 4, compression)
    assert [p.name for p in a][0] == "train_000000000.tar" + ("" if compression == "none" else f".{compression}")
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    # compression is detected from the bytes, not the name: WeNet names every shard .tar
    for p in a:
        p.rename(p.with_name(p.name.split(".")[0] + ".tar"))
    (tmp_path / "a" / "data.list").write_text("".join(f"{p.with_name(p.name.split('.')[0] + '.tar')}\n" for p in a))
    keys, skipped = all_keys(tmp_path / "a" / "data.list", tok)
    assert keys == [f"utt{i:05d}" for i in range(10)] and not skipped


def test_raw_list_and_kaldi_dir_read_the_same_utterances(corpus, tok, tmp_path):
    from_shards, _ = all_keys(corpus / "data.list", tok)
    from_raw, _ = all_keys(corpus / "raw.list", tok)
    kaldi = tmp_path / "kaldi"
    kaldi.mkdir()
    lines = [json.loads(x) for x in (corpus / "raw.list").read_text().splitlines()]
    # half the entries as plain paths, half as pipes (``cat FILE |``), as Kaldi's wav.scp allows
    scp = [f"{x['key']} {x['wav']}" if i % 2 else f"{x['key']} cat {x['wav']} |" for i, x in enumerate(lines)]
    (kaldi / "wav.scp").write_text("\n".join(scp) + "\n")
    (kaldi / "text").write_text("".join(f"{x['key']} {x['txt']}\n" for x in lines))
    from_kaldi, _ = all_keys(kaldi, tok)
    assert from_shards == from_raw == from_kaldi and len(from_shards) == 120


# -- bad input: each case is skipped and counted by reason under "skip", raises under "fail" --


def make_bad(tmp_path, case):
    """A one-shard corpus of 6 good utterances plus one bad one; returns (list path, expected reason)."""
    utts = list(tone_utts(6))
    good = encode_wav(np.full(8000, 1000, dtype=np.int16), 16000)
    bad = {
        "undecodable": ("bad", "one", b"RIFF garbage that is not a wav", "undecodable_audio"),
        "empty_text": ("bad", "", good, "empty_text"),
        "oov_text": ("bad", "über", good, "oov_text"),
        "zero_length": ("bad", "one", encode_wav(np.zeros(0, dtype=np.int16), 16000), "empty_audio"),
        "sample_rate": ("bad", "one", encode_wav(np.full(8000, 1000, dtype=np.int16), 8000), "sample_rate"),
    }
    if case in bad:
        key, text, wav, reason = bad[case]
        write_split(utts[:3] + [(key, text, wav)] + utts[3:], tmp_path, "train", 100)
        return tmp_path / "data.list", reason, "bad"
    if case == "truncated_tar":
        (shard,) = write_split(utts, tmp_path, "train", 100)
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) * 2 // 3])
        return tmp_path / "data.list", "truncated_tar", "train_000000000.tar"
    if case == "missing_file":
        write_split(utts, tmp_path, "train", 3)
        missing = sorted((tmp_path / "shards").iterdir())[1]
        missing.unlink()
        return tmp_path / "data.list", "missing_file", missing.name
    raise AssertionError(case)


CASES = ["undecodable", "empty_text", "oov_text", "zero_length", "sample_rate", "truncated_tar", "missing_file"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_skipped_and_counted(tmp_path, tok, case):
    path, reason, _ = make_bad(tmp_path, case)
    keys, skipped = all_keys(path, tok, resample=False)
    assert skipped[reason] >= 1 and "bad" not in keys
    assert 3 <= len(keys) <= 6  # the good ones before (and, for sample-level cases, after) still come out
    if case not in ("truncated_tar", "missing_file"):
        assert len(keys) == 6


@pytest.mark.parametrize("case", CASES)
def test_bad_input_fails_naming_shard_and_member(tmp_path, tok, case):
    path, reason, where = make_bad(tmp_path, case)
    with pytest.raises(DataError, match=reason) as e:
        all_keys(path, tok, resample=False, bad_input="fail")
    assert where in str(e.value)


def test_other_sample_rates_are_resampled_when_allowed(tmp_path, tok):
    path, _, _ = make_bad(tmp_path, "sample_rate")
    loader = AsrLoader(load_sources(path), tok, DataConfig(resample=True))
    lens = {k: int(n) for b in loader for k, n in zip(b["keys"], b["feat_lens"])}
    assert lens["bad"] == 98  # 1 s at 8 kHz becomes 1 s at 16 kHz: 98 frames of 25 ms every 10 ms


def test_bad_input_never_hangs_with_workers(tmp_path, tok):
    path, reason, _ = make_bad(tmp_path, "truncated_tar")
    keys, skipped = all_keys(path, tok, num_workers=2)
    assert skipped == Counter({reason: 1})


def test_bad_data_lists_are_clear_errors(tmp_path):
    (tmp_path / "empty.list").write_text("\n")
    with pytest.raises(DataError, match="empty"):
        load_sources(tmp_path / "empty.list")
    (tmp_path / "broken.list").write_text('{"key": "a"}\n')
    with pytest.raises(DataError, match="broken.list:1"):
        load_sources(tmp_path / "broken.list")
    with pytest.raises(DataError, match="wav.scp"):
        load_sources(tmp_path)  # a directory that is no Kaldi dir


def test_tokenizer_round_trips_in_wenet_units_format(tmp_path):
    tok = CharTokenizer.build(["go left", "stop"])
    tok.save(tmp_path / "units.txt")
    assert (tmp_path / "units.txt").read_text().splitlines()[:2] == ["<blank> 0", "▁ 1"]
    again = CharTokenizer.load(tmp_path / "units.txt")
    assert again.units == tok.units and again.decode(again.encode("go stop")) == "go stop"
    assert tok.oov("góal") == {"ó", "a"}


@pytest.mark.parametrize("case", ["undecodable", "truncated_tar", "missing_file"])
def test_every_command_that_reads_data_follows_the_bad_input_policy(tmp_path, case, capsys):
    """The loader benchmark, the compression benchmark, the layout and the index skip and count what
    training skips, or fail naming it with --bad-input fail."""
    from asrlab.cli import main
    from asrlab.data.index import forget, use_index

    path, reason, where = make_bad(tmp_path, case)
    assert main(["bench", "loader", str(path), "--num-workers", "0", "--max-batches", "1"]) == 0
    assert f"skipped bad input (data.bad_input=skip): {{'{reason}': 1}}" in capsys.readouterr().out
    assert main(["bench", "compression", str(path), "--compressions", "gz", "--max-utts", "10"]) == 0
    capsys.readouterr()
    assert main(["shards", "inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"]
    for command in (["bench", "loader", str(path), "--num-workers", "0"], ["bench", "compression", str(path)]):
        assert main(command + ["--bad-input", "fail"]) == 2
        err = capsys.readouterr().err
        assert reason in err and where in err, err
    forget()
    s = use_index(path, load_sources(path), progress=False)
    assert s["skipped"] == {reason: 1} and s["utterances"] - s["usable"] == 1


@pytest.mark.parametrize("fmt", ["USTAR_FORMAT", "GNU_FORMAT", "PAX_FORMAT"])
@pytest.mark.parametrize("compression", ["none", "gz"])
def test_the_tar_reader_reads_what_tarfile_reads(tmp_path, fmt, compression):
    """Plain ustar members are read without tarfile; a long or non-ASCII name (a pax or GNU header) hands the
    rest to tarfile: the same members, bytes and order as tarfile gives, and a cut tar still fails."""
    import io
    import tarfile

    from asrlab.data.shards import compress, iter_tar

    names = ["a.wav", "a.txt", "dir/" + "x" * 120 + ".wav", "ü.txt", "b.wav", "c.txt"]
    if fmt == "USTAR_FORMAT":
        names = [n if len(n) < 100 and n.isascii() else f"plain{i}.wav" for i, n in enumerate(names)]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=getattr(tarfile, fmt)) as tar:
        for i, name in enumerate(names):
            data = bytes([i]) * (100 * i + 7)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    path = tmp_path / "t.tar"
    path.write_bytes(compress(raw, compression) if compression != "none" else raw)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        want = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
    with open(path, "rb") as f:
        assert list(iter_tar(f)) == want
    cut = tmp_path / "cut.tar"
    cut.write_bytes(raw[: 512 + 50])  # the first member's header and half its bytes
    with open(cut, "rb") as f, pytest.raises(tarfile.ReadError, match="truncated"):
        list(iter_tar(f))


# -- any bytes in any line of a data list: a counted skip, or a DataError naming the file, the line and why --


def small_corpus(tmp_path):
    """4 utterances in 2 shards, a raw list of the same WAVs, a NeMo manifest and a Kaldi dir of them."""
    write_split(tone_utts(4), tmp_path / "c", "train", 2, raw=True)
    c = tmp_path / "c"
    raw = [json.loads(x) for x in (c / "raw.list").read_text().splitlines()]
    (c / "nemo.json").write_text(
        "".join(json.dumps({"audio_filepath": x["wav"], "text": x["txt"]}) + "\n" for x in raw)
    )
    (c / "kaldi").mkdir()
    (c / "kaldi" / "wav.scp").write_text("".join(f"{x['key']} {x['wav']}\n" for x in raw))
    (c / "kaldi" / "text").write_text("".join(f"{x['key']} {x['txt']}\n" for x in raw))
    return c


HUGE = b"x" * 300_000
# (list, the bad line, what it gives: ("skip", reason) or ("fail", words of the error)); the bad line goes in as
# line 2 of the list (of wav.scp for "scp", of text for "text")
LINES = [
    ("data.list", b"\x00\x01garbage", ("skip", "bad_path")),
    ("data.list", b"/tmp/a\x00b.tar", ("skip", "bad_path")),
    ("data.list", b"shards/a\rb.tar", ("skip", "missing_file")),
    ("data.list", HUGE, ("skip", "bad_path")),
    ("data.list", b"[1, 2]", ("skip", "missing_file")),
    ("data.list", b"zz://bucket/a.tar", ("skip", "unsupported_location")),
    ("data.list", b"\xff\xfe garbage", ("fail", "not UTF-8")),
    ("raw.list", b"\x00\x01garbage", ("fail", "not JSON")),
    ("raw.list", b'{"key": "k", "wav": "a\\u0000b.wav", "txt": "one"}', ("skip", "bad_path")),
    ("raw.list", b'{"key": "k", "wav": "' + HUGE + b'", "txt": "one"}', ("skip", "bad_path")),
    ("raw.list", b'{"key": "k"}\r{"key": "j"}', ("fail", "not JSON")),
    ("raw.list", b'["k", "a.wav", "one"]', ("fail", "a JSON array, not an object")),
    ("raw.list", b'"k a.wav one"', ("fail", "a JSON string, not an object")),
    ("raw.list", b'{"key": "k", "wav": 5, "txt": "one"}', ("fail", "'wav' is a JSON number")),
    ("raw.list", b'{"key": "k", "wav": "a.wav", "txt": ["one"]}', ("fail", "'txt' is a JSON array")),
    ("raw.list", b'{"key": "k", "wav": "a.wav", "txt": "one", "start": 1e999}', ("fail", "finite")),
    ("raw.list", b"{" + b"[" * 100_000, ("fail", "not JSON")),
    ("raw.list", b"\xc3\x28", ("fail", "not UTF-8")),
    ("nemo.json", b'{"audio_filepath": "a\\u0000b.wav", "text": "one"}', ("skip", "bad_path")),
    ("nemo.json", b'{"audio_filepath": "a.wav", "text": "one", "offset": 1.0}', ("fail", "offset without a duration")),
    ("scp", b"k9 /tmp/a\x00b.wav", ("skip", "bad_path")),
    ("scp", b"k9", ("fail", "not 'recording location'")),
    ("text", b"utt00001 \xff", ("fail", "not UTF-8")),
]


def with_bad_line(c, name: str, line: bytes):
    """The list ``name`` of corpus ``c`` with ``line`` as its line 2; returns (what to load, the file that has it)."""
    lists = {"scp": c / "kaldi" / "wav.scp", "text": c / "kaldi" / "text"}
    f = lists.get(name, c / name)
    rows = f.read_bytes().split(b"\n")
    f.write_bytes(b"\n".join(rows[:1] + [line] + rows[1:]))
    if name == "scp":  # its recording's transcript
        (c / "kaldi" / "text").write_text((c / "kaldi" / "text").read_text() + "k9 one\n")
    return (c / "kaldi" if name in lists else f), f


@pytest.mark.parametrize("name,line,outcome", LINES, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(LINES)])
def test_any_bytes_in_a_list_line_are_skipped_and_counted_or_named(tmp_path, tok, name, line, outcome):
    what, f = with_bad_line(small_corpus(tmp_path), name, line)
    kind, words = outcome
    if kind == "fail":
        with pytest.raises(DataError, match=words) as e:
            load_sources(what)
        assert f"{f}:2:" in str(e.value) and len(str(e.value)) < 600, str(e.value)[:600]
        return
    keys, skipped = all_keys(what, tok, resample=False)
    assert len(keys) == 4 and skipped == Counter({words: 1}), (keys, skipped)
    with pytest.raises(DataError, match=words):
        all_keys(what, tok, resample=False, bad_input="fail")
    from asrlab.data.index import forget, use_index  # the index reads every line too

    forget()
    assert use_index(what, load_sources(what), progress=False)["skipped"] == {words: 1}


def test_the_list_readers_take_any_bytes(tmp_path):
    """Random bytes as a shard list, a raw list (its first line an object) and a Kaldi dir's files: every
    reader (the list, each source's items, the index, where an item sits in its list) returns, or raises a
    DataError naming the file and line."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from asrlab.data.index import forget, index_source, use_index
    from asrlab.data.sources import check_item, locate, read_source

    piece = st.one_of(
        st.binary(max_size=24),
        st.sampled_from([b"\x00", b"\r", b"\n", b"\xff", b"{", b'"key": ', b'"wav": ', b'"txt": "a"', b"1e999"]),
        st.sampled_from([b"[" * 5000, b"x" * 5000, b"zz://a", b"/", b".", b"\xef\xbb\xbf", b"ark:1", b"a b c d"]),
    )
    content = st.lists(piece, max_size=12).map(lambda ps: b"".join(ps).replace(b"|", b"/"))  # no shell pipes
    d = tmp_path / "fuzz"
    (d / "kaldi").mkdir(parents=True)

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(content, st.sampled_from(["list", "raw", "kaldi", "segments"]))
    def check(data, kind):
        if kind in ("list", "raw"):
            what = d / "data.list"
            what.write_bytes((b'{"key": "k", "wav": "w", "txt": "a"}\n' if kind == "raw" else b"") + data)
        else:
            what = d / "kaldi"
            for f in ("wav.scp", "text", "segments"):
                (what / f).unlink(missing_ok=True)
                if f != "segments" or kind == "segments":
                    (what / f).write_bytes(data)
        try:
            sources = load_sources(what)
        except DataError as e:  # the whole list (empty, no entries), or one line of it named: FILE:N: why
            assert re.search(r"(is empty|no entries|needs [\w.]+)$|:\d+: \w", str(e)), str(e)[:300]
            return
        bad = [(i, k, it.key, check_item(it)[0]) for i, s in enumerate(sources) for k, it in enumerate(read_source(s))]
        assert all(reason for *_, reason in bad)  # nothing in random bytes names a real recording
        assert all(x["line"] is not None for x in locate(sources, bad) if x["list"] == str(what))
        forget()
        assert sum(len(index_source(s)) for s in sources) == len(bad)
        use_index(what, sources, progress=False, write=False)

    check()


def test_asrlab_train_on_a_list_of_any_bytes(corpus, tmp_path, capsys, caplog):
    """``asrlab train`` on lists with such lines: good lines train and the bad ones are skipped and counted;
    a list of the issue's one line, or one that is not UTF-8, ends in an error naming the line, no traceback."""
    from asrlab.cli import main

    from conftest import SMALL

    run = ["--resume", "none", *SMALL, "train.max_epochs=1"]
    good = (corpus / "data.list").read_bytes().split(b"\n")[:2]
    mixed = tmp_path / "mixed.list"
    mixed.write_bytes(b"\n".join([good[0], b"\x00\x01garbage", b"a\rb", HUGE, b"[1, 2]", good[1], b""]))
    with caplog.at_level("INFO"):
        assert main(["train", "--data", str(mixed), "--exp", str(tmp_path / "mixed"), *run]) == 0
    assert "skipped {'bad_path': 2, 'missing_file': 2}" in caplog.text
    for name, data, said in [
        ("nul.list", b"\x00\x01garbage\n", "1 line, bad_path (line 1: '\\x00\\x01garbage')"),
        ("latin1.list", good[0] + b"\n\xe9t\xe9.tar\n", f"{tmp_path / 'latin1.list'}:2: not UTF-8"),
        ("raw.list", b'{"key": "a", "wav": "a.wav"}\n[1]\n', f"{tmp_path / 'raw.list'}:2: not a WeNet raw line"),
    ]:
        (tmp_path / name).write_bytes(data)
        capsys.readouterr()
        assert main(["train", "--data", str(tmp_path / name), "--exp", str(tmp_path / name[:-5]), *run]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err

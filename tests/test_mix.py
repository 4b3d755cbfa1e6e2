"""Several corpora in one run: mixed by weight, every utterance once an epoch, exact resume, per-corpus counts."""

from collections import Counter

import pytest

from asrlab.data.loader import AsrLoader

from asrlab.data.config import DataConfig

from asrlab.data.plan import mix_counts
from asrlab.data.preflight import format_layout, inspect_layout
from asrlab.data.shards import write_split
from asrlab.data.sources import corpus_specs, load_data
from asrlab.errors import UsageError

from conftest import SMALL_MODEL, tone_utts


@pytest.fixture(scope="module")
def second(tmp_path_factory):
    """A second corpus of 60 utterances whose keys repeat the first corpus's (utt00000...), as raw list."""
    d = tmp_path_factory.mktemp("libri")
    write_split(tone_utts(60, seed=7), d / "train", "train", shard_size=12, raw=True)
    return d / "train"


def mix(corpus, second, wa=1.0, wb=1.0):
    return load_data([f"aishell={corpus / 'data.list'}:{wa}", f"libri={second / 'raw.list'}:{wb}"])


def keys_of(loader):
    return [k for b in loader for k in b["keys"]]


def test_corpus_specs_names_weights_and_errors(tmp_path):
    assert corpus_specs(["/d/aishell/train/data.list", "/d/libri/train/data.list:0.5", "kids=/e/data.list:2"]) == [
        ("aishell", "/d/aishell/train/data.list", 1.0),
        ("libri", "/d/libri/train/data.list", 0.5),
        ("kids", "/e/data.list", 2.0),
    ]
    assert corpus_specs("a.list,b.list:3") == [("a", "a.list", 1.0), ("b", "b.list", 3.0)]
    assert [n for n, _, _ in corpus_specs(["/x/a/data.list", "/y/a/data.list"])] == ["a", "a2"]  # unique
    with pytest.raises(UsageError, match="above 0"):
        corpus_specs(["a.list", "b.list:0"])


def test_every_utterance_of_every_corpus_once_across_ranks_and_workers(corpus, second, tok):
    srcs = mix(corpus, second)
    assert {s.corpus for s in srcs} == {"aishell", "libri"}
    seen = Counter()
    for rank in range(2):
        seen.update(keys_of(AsrLoader(srcs, tok, DataConfig(num_workers=2, shuffle_size=20), rank, 2)))
    # the two corpora share key names: qualified by corpus, each is trained once
    assert len(seen) == 180 and set(seen.values()) == {1}
    assert Counter(k.split("/")[0] for k in seen) == {"aishell": 120, "libri": 60}


def test_weights_set_how_the_corpora_interleave_and_the_mix_repeats_per_seed(corpus, second, tok):
    def early_share(wa, wb, seed=0):
        keys = keys_of(AsrLoader(mix(corpus, second, wa, wb), tok, DataConfig(shuffle_size=30, seed=seed)))
        first = keys[:60]  # while both corpora still have data
        return sum(k.startswith("aishell/") for k in first) / len(first), keys

    heavy, keys = early_share(9, 1)
    light, _ = early_share(1, 9)
    assert heavy > 0.75 and light < 0.4, (heavy, light)
    assert early_share(9, 1)[1] == keys  # deterministic for (seed, epoch)
    assert early_share(9, 1, seed=1)[1] != keys


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_mix_resumes_exactly(corpus, second, tok, num_workers):
    srcs = mix(corpus, second, 2, 1)
    cfg = DataConfig(
        num_workers=num_workers,
        shuffle_size=25,
        spec_augment=True,
        max_frames_in_batch=600,
        speed_perturb=[0.9, 1.0, 1.1],
    )
    full = [(b["keys"], b["feats"].sum().item()) for b in AsrLoader(srcs, tok, cfg)]
    first, out = AsrLoader(srcs, tok, cfg), []
    for i, b in enumerate(first):
        out.append((b["keys"], b["feats"].sum().item()))
        if i + 1 == len(full) // 2:
            break
    state = first.state_dict()
    assert isinstance(state["positions"]["0"]["source"], list)  # a position per corpus
    resumed = AsrLoader(srcs, tok, cfg)
    resumed.load_state_dict(state)
    out += [(b["keys"], b["feats"].sum().item()) for b in resumed]
    assert out == full


def test_a_mix_resumes_on_another_number_of_ranks(corpus, second, tok):
    srcs = mix(corpus, second)
    cfg = DataConfig(num_workers=2, shuffle_size=20)
    states, trained = [], Counter()
    for rank in range(2):
        loader = AsrLoader(srcs, tok, cfg, rank, 2)
        for i, b in enumerate(loader):
            trained.update(b["keys"])
            if i == 3:
                break
        states.append(loader.state_dict())
    one = AsrLoader(srcs, tok, cfg, 0, 1)
    one.load_states(states)
    trained.update(keys_of(one))
    assert len(trained) == 180 and set(trained.values()) == {1}


def test_batches_count_and_time_each_corpus(corpus, second, tok):
    batches = list(AsrLoader(mix(corpus, second), tok, DataConfig(shuffle_size=30)))
    counts = mix_counts(batches)
    assert {k: v[0] for k, v in counts.items()} == {"aishell": 120, "libri": 60}
    assert all(audio_s > 0 and load_s > 0 for _, audio_s, load_s in counts.values())
    assert mix_counts([{"keys": ["a"]}]) is None  # one list: nothing per corpus


def test_preflight_reports_each_corpus(corpus, second):
    report = inspect_layout(mix(corpus, second, 3, 1), DataConfig(), 2, 1)
    assert report["utts"] == 180
    assert {k: (c["utts"], c["weight"]) for k, c in report["corpora"].items()} == {
        "aishell": (120, 3.0),
        "libri": (60, 1.0),
    }
    assert sum(r["utts"] for r in report["ranks"]) == 180
    text = format_layout(report)
    assert "corpus libri: 1 source(s), 60 utterances" in text  # a raw list of 60 is one source,
    assert "train on none of it" not in text  # cut in two so that both ranks train on it
    assert [r["utts"] for r in report["ranks"]] == [90, 90], text


def test_one_list_is_read_as_before(corpus, tok):
    srcs = load_data(str(corpus / "data.list"))
    assert {s.corpus for s in srcs} == {""}
    batch = next(iter(AsrLoader(srcs, tok, DataConfig(shuffle_size=30))))
    assert "corpora" not in batch and not batch["keys"][0].count("/")


def test_asrlab_train_mixes_lists_logs_each_corpus_and_the_doctor_reads_them(corpus, second, tmp_path, capsys):
    """``asrlab train --data A --data B:W``: the ledger's keys name their corpus, every metrics line counts
    each corpus, and ``asrlab doctor`` gives each corpus's loader throughput."""
    import json

    from asrlab.cli import main
    from asrlab.doctor import diagnose
    from asrlab.lab.state.ledger import read_ledger

    exp = tmp_path / "exp"
    small = [
        *SMALL_MODEL,
        "data.num_workers=0",
        "data.max_frames_in_batch=800",
        "train.progress=false",
        "train.ledger=true",
    ]
    assert (
        main(
            [
                "train",
                "--data",
                f"{corpus / 'data.list'}:2",
                "--data",
                f"libri={second / 'raw.list'}",
                "--exp",
                str(exp),
                "--max-steps",
                "6",
                *small,
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in (exp / "metrics" / "rank0.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and all(sum(n for n, _, _ in x["corpora"].values()) == x["utts"] for x in lines)
    keys = [k for rec in read_ledger(exp, 0) for k in rec["keys"]]
    named = corpus_specs(str(corpus / "data.list"))[0][0]  # named after the list's folders: "corpus0"
    assert {k.split("/")[0] for k in keys} <= {named, "libri"} and len(keys) == len(set(keys))
    assert (second / "raw.list.index.json").exists() and (corpus / "data.list.index.json").exists()  # one index each
    d = diagnose(exp)
    assert set(d["corpora"]["corpora"]) == {k.split("/")[0] for k in keys}
    assert main(["doctor", str(exp)]) == 0
    assert "corpora (all ranks; audio seconds per second of loader work):" in capsys.readouterr().out

"""The uneven guard on loops that are not asrlab's example (``tests/loops/``), 2 gloo ranks under torchrun:
the epoch's last batch found after the cut (``guard.last``, ``len(guard)``) on every rank alike, so that an odd
cut syncs gradients on both; a cut recorded and read as such by ``asrlab doctor`` also where the loader has no
``len``; the guard wired to ``RunState`` as the guide says (one guard for all epochs, made before
``state.load()``) across two epochs and a SIGKILL resume; and the doctor's JSON and text one reading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from asrlab import lab
from asrlab.doctor import diagnose, format_diagnosis

LOOPS = Path(__file__).resolve().parent / "loops"


def torchrun(loop: str, *args, timeout: float = 150) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(LOOPS / loop),
        *map(str, args),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def coverage_read_alike(d: dict) -> list[dict]:
    """Each epoch's coverage in ``--json`` and in the text say the same: the status, the counts (never a
    count of 0 beside keys listed), exactly once; returns the epochs."""
    text = format_diagnosis(d)
    epochs = d["coverage"]["epochs"]
    for e in epochs:
        (line,) = [ln for ln in text.splitlines() if ln.startswith(f"  epoch {e['epoch']}: ")]
        assert line.split(": ", 1)[1].startswith(e["status"] if e["status"] != "in progress" else "incomplete"), line
        assert e["complete"] == (e["status"] == "complete") and not (e["complete"] and e["cut_short"])
        assert bool(e["skipped"]) == bool(e["skipped_keys"]) and bool(e["repeated"]) == bool(e["repeated_keys"]), e
        assert (f"{e['skipped']} skipped" in line) == (e["skipped"] > 0), (line, e)
        assert (f"{e['repeated']} repeated" in line) == (e["repeated"] > 0), (line, e)
        once = "each exactly once" if e["status"] == "complete" else "every key seen once; whether all were seen"
        assert (once in line) == (e["exactly_once"] is True), (line, e)
        assert (e["status"] == "cut short") == bool(e["cut_short"])
    json.dumps(d, default=str)  # what --json prints
    return epochs


def test_a_loader_without_len_is_cut_on_the_same_last_batch_and_the_doctor_says_where(tmp_path):
    """HF-style dict batches (ids under ``audio_name``), a DistributedSampler under a frames-packing batch
    sampler (rank 0: 5 batches, rank 1: 20), two micro-batches per step with ``no_sync``; epoch 0 reads an
    ``islice`` (no len) and finds its last batch by ``guard.last``, epoch 1 by ``i + 1 == len(guard)``. The odd
    cut has both ranks sync the fifth micro-batch (one rank syncing alone aborts gloo)."""
    exp = tmp_path / "exp"
    r = torchrun("bucketed_islice.py", exp)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = sorted(
        (x["epoch"], x["rank"], x["batches"], x["steps"], x["len"])
        for x in map(json.loads, (ln for ln in r.stdout.splitlines() if ln.startswith("{")))
    )
    assert lines == [(0, 0, 5, 3, None), (0, 1, 5, 3, None), (1, 0, 5, 6, 5), (1, 1, 5, 6, 5)]
    assert "?" not in r.stderr and "an unknown number of batches (the loader has no len)" in r.stderr

    d = diagnose(exp)
    e0, e1 = coverage_read_alike(d)
    assert d["coverage"]["broken"] and not d["ok"]
    for e in (e0, e1):
        assert e["status"] == "cut short" and list(e["cut_short"]) == ["1"] and e["exactly_once"] is False
        assert e["cut_short"]["1"]["after_batch"] == 5 and e["cut_short"]["1"]["keys"] == ["spk3-utt011"]
    assert e0["cut_short"]["1"]["batches"] is None and e1["cut_short"]["1"]["batches"] == 15
    text = format_diagnosis(d)
    assert "epoch 0: complete" not in text and "?" not in text.split("coverage (", 1)[1]
    assert (
        "rank 1: left an unknown number of batches (the loader has no len) untrained after its batch 5 (step 3)"
    ) in text


def test_a_stateful_loader_wired_as_the_guide_says_resumes_across_epochs_exactly(tmp_path):
    """``StatefulDataLoader`` (ids under ``uid``), ``RunState`` without a loader, one ``UnevenGuard(loader,
    state=state)`` for both epochs made before ``state.load()``; rank 1 killed after step 7 (the checkpoint is
    step 6's, in epoch 1) and the run resumed: every step's micro-batches synced on both ranks (``guard.last``),
    nothing trained twice or left out but what the cut left, and the doctor names the cut of each epoch."""
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata (the test extra) is not installed")
    exp = tmp_path / "exp"
    killed = torchrun("stateful_resume.py", exp, 7)
    assert killed.returncode != 0
    resumed = torchrun("stateful_resume.py", exp, 0)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rank 0 last step 8" in resumed.stdout and "rank 1 last step 8" in resumed.stdout

    d = diagnose(exp)
    assert d["resumes"]["resumed_from"] == [6]
    e0, e1 = coverage_read_alike(d)
    rank0 = {f"r0-{i:02d}" for i in range(14)}
    trained = [
        Counter(
            k for rank in (0, 1) for rec in lab.read_ledger(exp, rank) if rec["epoch"] == epoch for k in rec["keys"]
        )
        for epoch in (0, 1)
    ]
    seen = set(trained[0]) | set(trained[1])  # what the doctor expects: the run names no list of its keys
    for e, keys in zip((e0, e1), trained):
        assert max(keys.values()) == 1 and rank0 <= set(keys)  # once each, the resume included
        assert sum(1 for k in keys if k.startswith("r1-")) == 14  # the 7 batches before the cut
        assert e["status"] == "cut short" and list(e["cut_short"]) == ["1"] and e["repeated"] == 0
        assert e["skipped"] == len(seen - set(keys)) > 0  # rank 1's rest, shuffled apart in the two epochs
    assert e0["cut_short"]["1"]["batches"] == 3 and e0["cut_short"]["1"]["after_batch"] == 7
    # resumed mid-epoch, the loader's own position holds what went before: not counted, and said so
    assert e1["cut_short"]["1"]["batches"] is None and e1["cut_short"]["1"]["after_step"] == 8
    assert (
        "rank 1: left an unknown number of batches (the loader has no len, or resumed itself mid-epoch)"
        in format_diagnosis(d)
    )


def test_the_guard_and_the_state_are_wired_in_one_order_before_or_after_load(tmp_path):
    """Alone (no process group): ``last`` and ``len`` on a plain list; ``UnevenGuard(source, state=state)``
    is the state's loader whether made before ``state.load()`` or after it, and a guard over a loader other
    than the one the state was given is refused."""
    import torch

    guard = lab.UnevenGuard(list("abcde"))
    assert [(b, guard.last, len(guard)) for b in guard][-2:] == [("d", False, 5), ("e", True, 5)]
    it = iter(guard)
    next(it)
    assert not guard.last and guard.state_dict()["batches"] == 1  # the batch read ahead is not counted

    model = torch.nn.Linear(2, 1)
    state = lab.RunState(tmp_path, model)
    guard = lab.UnevenGuard(list("abcde"), state=state)
    it = iter(guard)
    [next(it) for _ in range(2)]
    state.save(2, 0)
    for before in (True, False):
        resumed = lab.RunState(tmp_path, model)
        if before:
            guard = lab.UnevenGuard(list("abcde"), state=resumed)
        assert resumed.load()["step"] == 2
        if not before:
            guard = lab.UnevenGuard(list("abcde"), state=resumed)
        assert [(b, len(guard), guard.last) for b in guard] == [("c", 3, False), ("d", 3, False), ("e", 3, True)]
        assert list(guard) == list("abcde")  # the next epoch whole: the position is taken once
    with pytest.raises(ValueError, match="already"):
        lab.UnevenGuard(["x"], state=lab.RunState(tmp_path, model, loader=lab.Resumable(["y"])))


def test_a_guard_given_no_state_records_the_cut_and_the_doctor_never_says_complete(tmp_path):
    """``UnevenGuard(itertools.islice(loader, start, None))`` with no ``state=`` (``tests/loops/islice_no_state.py``),
    rank 1 holding three times rank 0's data: the guard stops rank 1 at rank 0's end and writes what it knows of
    what rank 1 left into the ledger of the RunState recording the steps (the batch it held, an unknown number
    after it: an islice has no len), so the doctor reads the epoch as cut short, never "complete". Without that
    line, and with no expected keys, it says every key was seen once and that whether all were is not known."""
    import shutil

    exp = tmp_path / "exp"
    r = torchrun("islice_no_state.py", exp, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0 trained 4 steps" in r.stdout and "rank 1 trained 4 steps" in r.stdout
    d = diagnose(exp)
    (e,) = coverage_read_alike(d)
    assert e["status"] == "cut short" and not e["complete"] and e["exactly_once"] is False, e
    assert d["coverage"]["broken"] and not d["ok"]
    left = e["cut_short"]["1"]
    assert (left["batches"], left["after_batch"], left["after_step"]) == (None, None, 4), left
    assert left["keys"] == [f"r1-{i:03d}" for i in range(16, 20)]  # the batch the guard held, read ahead
    text = format_diagnosis(d)
    assert "epoch 0: cut short" in text and "complete" not in text.split("coverage (", 1)[1], text
    assert "each exactly once" not in text

    bare = tmp_path / "bare"  # the ledger as it was before the guard wrote the cut: the steps alone
    shutil.copytree(exp, bare)
    lines = (bare / "ledger" / "rank1.jsonl").read_text().splitlines()
    (bare / "ledger" / "rank1.jsonl").write_text("".join(ln + "\n" for ln in lines if '"untrained"' not in ln))
    d = diagnose(bare)
    (e,) = coverage_read_alike(d)
    assert e["status"] == "ended" and e["keys"] == 32 and not e["complete"], e
    assert "epoch 0: ended, 32 keys, every key seen once; whether all were seen is not known" in format_diagnosis(d)

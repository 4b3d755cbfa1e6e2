"""``asrlab doctor LOG``'s fast read (fingerprinted blocks, runs counted as their like were, step lines
sampled) against a plain line-by-line read of the same log: the same diagnosis. The logs are the
benchmark's own (benchmarks/log_read.py), made of real excerpts, a few MiB; its timings are in
benchmarks/log_read.txt."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from asrlab.doctor.logs import events, stream
from asrlab.doctor.logs.reader import read_logs
from asrlab.doctor.sources import Reading
from asrlab.doctor.sources.text_log import timeline_of
from asrlab.doctor.verdict import decide

_spec = importlib.util.spec_from_file_location("log_read", Path(__file__).parent.parent / "benchmarks" / "log_read.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def judge(run) -> dict:
    """The log's sections and the one rule's verdict over its events."""
    events, d, history = timeline_of(run)
    return {**d, **decide([Reading("log", run.files, events=events, history=history)])}


def diagnosis(path: Path, fast: bool) -> tuple:
    run = read_logs([str(path)], fast=fast)
    d = judge(run)
    first = d["first"] or {}
    nonfinite = d["nonfinite"] or {}
    return run, {
        "verdict": d["verdict"],
        "culprit": d["culprit"],
        # the values that led to a non-finite step are the sampled ones (their max) in a fast read
        "summary": d["summary"].split("; before it:")[0],
        "first": {k: first.get(k) for k in ("kind", "rank", "time", "order", "text", "type", "where")},
        "events": dict(run.event_counts),
        "formats": dict(run.formats),
        "lines": run.lines,
        "last steps": {r: (s.last["epoch"], s.last["batch"], s.last["step"]) for r, s in run.series.items()},
        "non-finite": (nonfinite.get("first"), nonfinite.get("count")),
        "hang": d["hang"],
        "resumes": d["resumes"],
    }


@pytest.mark.parametrize(
    "kind,keep,chunk",
    [
        ("mixed", 40, stream.CHUNK),
        ("mixed", events.KEEP, stream.CHUNK),
        ("mixed", 40, 100_000),
        ("fails late", 40, stream.CHUNK),
        ("new format", 40, stream.CHUNK),
        ("steps", 40, 100_000),
        ("global step", 40, stream.CHUNK),
    ],
    ids=[
        "mixed",
        "mixed-all-kept",
        "mixed-small-reads",
        "fails-late",
        "new-format",
        "steps-small-reads",
        "global-step",
    ],
)
def test_the_fast_read_gives_the_diagnosis_a_line_by_line_read_gives(tmp_path, monkeypatch, kind, keep, chunk):
    """A failing run's log (a traceback every ~40 lines, NaN and timeout lines among the steps of WeNet,
    icefall and ESPnet, torchrun's summaries), the same run failing only after 1 MiB of clean steps (its
    first failure far from the lines read one by one), the same after 300 kB of WeNet's steps alone (its
    other formats first seen far from the file's head), and a step-only one (WeNet's, one inf). With the
    events kept of each kind cut to a few dozen, a log of 2 MiB is what a long one is to the fast read:
    runs counted in C once their kinds are past those kept, not only while each rank's first is read.
    Read 100 kB at a time, the log's lines and runs are cut by reads, its last EDGE bytes span several."""
    monkeypatch.setattr(events, "KEEP", keep)
    monkeypatch.setattr(stream, "CHUNK", chunk)
    path = tmp_path / "train.log"
    if kind == "steps":
        bench.write_log(path, 2)
    elif kind == "global step":  # a line that names its batch and its global step, an error now and then
        lines = [f"epoch={i // 20000} batch={i % 20000}/20000 step={i + 1} loss=3.0000\n" for i in range(60_000)]
        for i in range(15, 60_000, 97):
            lines[i] += f"RuntimeError: something odd at {i}\n"
        path.write_text("".join(lines))
    elif kind == "new format":
        bench.write_log(tmp_path / "a.log", 0.3)
        bench.write_mixed(tmp_path / "b.log", 2)
        mixed = (tmp_path / "b.log").read_text().splitlines(keepends=True)
        path.write_text((tmp_path / "a.log").read_text() + "".join(x for x in mixed if "DEBUG TRAIN" not in x))
    else:
        bench.write_mixed(path, 2, quiet_mb=1 if kind == "fails late" else 0)
    full_run, full = diagnosis(path, fast=False)
    fast_run, fast = diagnosis(path, fast=True)
    for key in full:
        assert fast[key] == full[key], f"{key}: fast {fast[key]} != line by line {full[key]}"
    assert full["verdict"] != "no_failure_seen"
    if kind == "global step":  # the first error came after batch 15 (step 16), however many records were thinned
        assert full["culprit"]["step"] == 16, full["culprit"]
    elif kind != "steps":
        assert full["hang"] and sum(full["events"].values()) > 200
    if keep < 100 and kind in ("mixed", "fails late"):  # read in full: the first runs of each kind and rank
        assert len(fast_run.events) < len(full_run.events) / 2

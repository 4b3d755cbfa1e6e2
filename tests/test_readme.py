"""The README's numbers are those of the notebooks' last full run of the current code: each notebook's
``results.json`` and the run's times, kept in ``docs/results/`` (``asrlab notebooks --out DIR`` writes them;
``python tests/test_readme.py DIR`` copies a run's into place)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def _results(stem: str) -> dict:
    return json.loads((RESULTS / f"{stem}.json").read_text())


def _readme() -> str:
    return re.sub(r"\s+", " ", (ROOT / "README.md").read_text())


def _find(pattern: str) -> tuple[str, ...]:
    m = re.search(pattern, _readme())
    assert m, f"README no longer says {pattern!r}"
    return m.groups()


def test_quickstart_numbers():
    r = _results("00_quickstart")
    got = _find(
        r"dev CER \*\*([\d.]+)%\*\*, held-out test \*\*([\d.]+)%\*\* \(lexicon search; greedy ([\d.]+)% / "
        r"([\d.]+)%\), in (\d+) s end to end \((\d+) s training\)"
    )
    want = (
        f"{100 * r['dev_cer_lexicon']:.2f}",
        f"{100 * r['test_cer_lexicon']:.2f}",
        f"{100 * r['dev_cer']:.2f}",
        f"{100 * r['test_cer']:.2f}",
        f"{r['total_seconds']:.0f}",
        f"{r['train_seconds']:.0f}",
    )
    assert got == want


def test_quickstart_spread_across_cpus():
    """The README's range of the quickstart's error rates is that of its runs on other CPUs and kernel settings
    (``benchmarks/quickstart_cpus.sh``, kept in docs/results/quickstart_cpus.json) and the run it quotes."""
    runs = [*_results("quickstart_cpus")["runs"].values(), _results("00_quickstart")]
    dev = [100 * r["dev_cer_lexicon"] for r in runs]
    test = [100 * r["test_cer_lexicon"] for r in runs]
    assert _find(r"dev CER ([\d.]+) to ([\d.]+)% and held-out test ([\d.]+) to ([\d.]+)% over the (\d+) runs") == (
        f"{min(dev):.2f}",
        f"{max(dev):.2f}",
        f"{min(test):.2f}",
        f"{max(test):.2f}",
        str(len(runs)),
    )


def test_stalls_numbers():
    r = _results("01_stalls")
    assert r["a_none"]["verdict"] in _readme()
    slow, even = r["b_slow"]["summary"]["rank 1 slow"], r["b_slow"]["summary"]["even"]
    assert _find(r"(\d+)× slower \(([\d.]+) against ([\d.]+) s per step\)") == (
        f"{r['b_slow']['rank0_slowdown']:.0f}",
        f"{slow[0]['median_step_s']:.2f}",
        f"{even[0]['median_step_s']:.2f}",
    )
    assert _find(r"data wait \((\d+)% against (\d+)%\)") == (
        f"{100 * slow[1]['data_wait_share']:.0f}",
        f"{100 * slow[0]['data_wait_share']:.0f}",
    )


def test_utilization_numbers():
    r = _results("02_gpu_utilization")
    assert _find(r"data wait at most ([\d.]+)% in all (\d+) settings") == (
        f"{100 * max(x['data_wait'] for x in r['rows']):.1f}",
        str(len(r["rows"])),
    )
    assert _find(
        r"made ([\d.]+)× the audio hours per hour of the slowest setting in the sweep and ([\d.]+)× side by side"
    ) == (f"{r['recommended']['audio_h_per_h'] / r['slowest']['audio_h_per_h']:.2f}", f"{r['speedup']:.2f}")


def test_nan_numbers():
    r = _results("03_nan_analysis")
    step, module, direction, first = _find(
        r"non-finite at \*\*step (\d+)\*\* in `([\w.]+)` \((\w+)\), first seen at `([\w.]+)`"
    )
    assert int(step) == r["failing"]["first_nonfinite_step"]
    assert r["failing"]["where"] == f"{module} ({direction}), first seen at {first}"
    fp32 = next(x for x in r["replay"] if x["precision"] == "fp32")
    assert _find(r"to ([\d,]+) in the fp32 replay")[0] == f"{fp32['max_abs']:,.0f}"
    held = {x["run"] for x in r["fixes"] if x["finite"]}
    assert held == {"fp32", "bf16", "fp16 + LR 0.005, warm-up 20"}, held  # "fp32, bf16 and a lower LR ... hold"


def test_resume_numbers():
    r = _results("04_resume")
    rows = {c["resume"]: c for c in r["coverage"]}
    for name, label in (
        ("WeNet: epoch starts over at batch 0", "WeNet's: the epoch starts over at batch 0"),
        ("new seed, skip the trained batches", "a new shuffle seed, skip the batches already trained"),
        ("asrlab: seek to the saved position", "asrlab: seek to the saved position"),
    ):
        c = rows[name]
        same = "yes" if c["final state = uninterrupted"] else "no"
        assert f"| {label} | {c['epoch 0: once']} | {c['more than once']} | {c['never']} | {same} |" in _readme()
    t = r["resume_time"]
    seek = [x["resume_s"] for x in t["rows"]]
    assert _find(r"\(([\d.]+)-([\d.]+) s to the first batch\)") == (f"{min(seek):.2f}", f"{max(seek):.2f}")
    replay = {x["fraction"]: x["replay_s"] for x in t["rows"]}
    assert _find(r"\(([\d.]+) s at 10%, ([\d.]+) s at 90% of these (\d+) batches") == (
        f"{replay[0.1]:.2f}",
        f"{replay[0.9]:.2f}",
        str(t["batches"]),
    )


def test_notebook_times():
    times = _results("times")
    lo, hi, total = _find(r"CPU runs of (\d+) to (\d+) minutes each on 2 cores \(about (\d+) minutes for all seven")
    minutes = [s / 60 for s in times.values()]
    assert len(times) == 7 and int(lo) <= round(min(minutes)) and round(max(minutes)) <= int(hi), times
    assert abs(int(total) - sum(minutes)) <= 5, times


if __name__ == "__main__":  # python tests/test_readme.py RUN_OUT [RUN_LOG]: a full run's numbers into docs/results
    out = Path(sys.argv[1])
    RESULTS.mkdir(parents=True, exist_ok=True)
    for f in sorted(out.glob("*/results.json")):
        shutil.copy(f, RESULTS / f"{f.parent.name}.json")
    if len(sys.argv) > 2:
        times = dict(re.findall(r"^(\d\d_\w+): ok in ([\d.]+) s", Path(sys.argv[2]).read_text(), re.M))
        (RESULTS / "times.json").write_text(json.dumps({k: float(v) for k, v in times.items()}, indent=1) + "\n")


def test_the_after_the_fact_example_is_what_the_doctor_says():
    from asrlab.doctor import diagnose, format_diagnosis

    log = ROOT / "tests" / "fixtures" / "logs" / "icefall" / "nan_inf_losses_all_ranks_mpirun.log"
    said = format_diagnosis(diagnose([str(log)])).splitlines()[:2]
    text = (ROOT / "README.md").read_text()
    assert log.relative_to(ROOT).as_posix() in text and "\n".join(said) in text, said

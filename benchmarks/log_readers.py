"""How often ``asrlab doctor LOG`` is right on real logs: each set of excerpts from public issue threads
(``tests/fixtures/logs*/``) and the real toolkit runs (``tests/fixtures/toolkit_runs/``), against the truth each
fixture records: the verdict, the culprit rank where the truth names one, the step where it shows one. Lists
what each set gets wrong, one line each, with ``--wrong``.

    .venv/bin/python benchmarks/log_readers.py [--wrong]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from asrlab.doctor import diagnose_logs

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
NEUTRAL = Path(tempfile.mkdtemp(prefix="asrlab-excerpts-"))  # removed at the end of main


def excerpts(folder: Path) -> list[tuple[str, list[str], dict, dict]]:
    """Each excerpt copied under a neutral name: a fixture's name describes its truth ("..._rank_3_...") and the
    doctor takes a rank from a log's name (``rank3.log``): it would read the label, not the lines."""
    cases = yaml.safe_load((folder / "index.yaml").read_text())
    out = []
    for i, c in enumerate(cases):
        path = folder / c["file"]
        neutral = NEUTRAL / folder.name / str(i)
        neutral.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, neutral / f"excerpt{path.suffix}")
        out.append((c["file"], [str(neutral / f"excerpt{path.suffix}")], c["verdict"], c.get("culprit") or {}))
    return out


def runs(folder: Path) -> list[tuple[str, list[str], dict, dict]]:
    out = []
    for t in sorted(folder.glob("*/*/truth.yaml")):
        case, truth = t.parent, yaml.safe_load(t.read_text())
        paths = [str(p) for p in sorted(case.glob("console*.log"))] + (
            [str(case / "exp")] if (case / "exp").is_dir() else []
        )
        shows = truth.get("log_shows")
        want = dict(shows if isinstance(shows, dict) else truth.get("culprit") or {})
        want["step"] = (
            want.get("batch", want.get("step")) if truth["toolkit"] != "speechbrain" or "log_shows" in truth else None
        )
        out.append((f"{case.parent.name}/{case.name}", paths, want.pop("verdict", truth["verdict"]), want))
    return out


def score(name: str, cases: list, wrong: bool) -> str:
    v = r = s = rn = sn = 0
    bad = []
    failing = [c for c in cases if c[2] != "no_failure_seen"]
    clear = alarm = 0  # a failing log read as all clear; a healthy one read as a failure (unknown included)
    for label, paths, verdict, want in cases:
        d = diagnose_logs(paths)
        clear += verdict != "no_failure_seen" and d["verdict"] == "no_failure_seen"
        alarm += verdict == "no_failure_seen" and d["verdict"] != "no_failure_seen"
        ok = d["verdict"] == verdict
        v += ok
        if want.get("rank") is not None:
            rn, r = rn + 1, r + (d["culprit"]["rank"] == want["rank"])
            ok = ok and d["culprit"]["rank"] == want["rank"]
        if want.get("step") is not None:
            sn, s = sn + 1, s + (d["culprit"]["step"] == want["step"])
            ok = ok and d["culprit"]["step"] == want["step"]
        if not ok:
            bad.append(f"    {label}: want {verdict} {want.get('rank')}/{want.get('step')}, got {d['verdict']} "
                       f"{d['culprit']['rank']}/{d['culprit']['step']}")  # fmt: skip
    line = (f"{name:<14} {len(cases):>4} cases  verdict {v:>3}/{len(cases):<3} {100 * v / len(cases):5.1f}%  "
            f"rank {r:>2}/{rn:<2} {100 * r / max(rn, 1):5.1f}%  step {s:>2}/{sn:<2} {100 * s / max(sn, 1):5.1f}%  "
            f"false all-clear {clear}/{len(failing)}  false alarm {alarm}/{len(cases) - len(failing)}")  # fmt: skip
    return "\n".join([line] + (bad if wrong else []))


def main() -> None:
    wrong = "--wrong" in sys.argv
    sets = sorted(p for p in FIXTURES.glob("logs*") if (p / "index.yaml").exists())
    for folder in sets:
        print(score(folder.name, excerpts(folder), wrong))
    print(score("toolkit_runs", runs(FIXTURES / "toolkit_runs"), wrong))
    shutil.rmtree(NEUTRAL, ignore_errors=True)


if __name__ == "__main__":
    main()

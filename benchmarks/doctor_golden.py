"""Every diagnosis the doctor makes of the fixtures, dumped whole, to show that a change of its code changed nothing
it says: each excerpt of ``tests/fixtures/logs*/`` (under a neutral name), each real toolkit run (its console logs,
its folder, both), each run folder of ``watched/``, ``parts_runs/``, ``own_loops/``, ``flight/`` and ``papermill/``,
as the ``--json`` dict and the text. A refactor's check: dump before, dump after, compare.

    .venv/bin/python benchmarks/doctor_golden.py /tmp/before.json
    .venv/bin/python benchmarks/doctor_golden.py /tmp/after.json --compare /tmp/before.json

Compare dumps made in one checkout (``git stash`` between them, or a worktree of each commit: the checkout's own
path is written ``<repo>``, but an excerpt that quotes a checkout's path keeps it). A time the text prints is
written ``T s``. About 25 s on one core; the dump is about 30 MB.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from pathlib import Path

import yaml

from asrlab.doctor import diagnose, format_diagnosis

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
FOLDERS = ("watched", "parts_runs", "own_loops", "flight", "papermill")


def dump() -> dict:
    neutral = Path(tempfile.mkdtemp(prefix="asrlab-golden-"))
    out = {}

    def one(key: str, paths: list[str]) -> None:
        try:
            d = diagnose(paths, now=2e9)
            d["read_s"] = 0.0
            out[key] = {
                "json": json.loads(json.dumps(d, default=str)),
                "text": re.sub(r"\d+\.\d+ s\b", "T s", format_diagnosis(d)),
            }
        except Exception as e:  # a usage error is what the doctor says of that path
            out[key] = {"error": f"{type(e).__name__}: {e}"}

    try:
        for index in sorted(FIXTURES.glob("logs*/index.yaml")):
            for i, c in enumerate(yaml.safe_load(index.read_text())):
                src, folder = index.parent / c["file"], neutral / index.parent.name / str(i)
                folder.mkdir(parents=True)
                shutil.copyfile(src, folder / f"excerpt{src.suffix}")
                one(f"{index.parent.name}/{c['file']}", [str(folder / f"excerpt{src.suffix}")])
        for truth in sorted((FIXTURES / "toolkit_runs").glob("*/*/truth.yaml")):
            case = truth.parent
            logs = [str(p) for p in sorted(case.glob("console*.log"))]
            folder = [str(case / "exp")] if (case / "exp").is_dir() else []
            for name, paths in (("console", logs), ("exp", folder), ("all", logs + folder)):
                if paths:
                    one(f"toolkit_runs/{case.parent.name}/{case.name}/{name}", paths)
        for sub in FOLDERS:
            for d in sorted(p for p in (FIXTURES / sub).glob("*") if p.is_dir()):
                one(f"{sub}/{d.name}", [str(d)])
        text = json.dumps(out, indent=0, sort_keys=True).replace(str(neutral), "<excerpt>")
        return json.loads(text.replace(str(ROOT), "<repo>"))
    finally:
        shutil.rmtree(neutral)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the dump to write (JSON)")
    ap.add_argument("--compare", help="an earlier dump: list the diagnoses that differ from it")
    args = ap.parse_args()
    now = dump()
    Path(args.out).write_text(json.dumps(now, indent=0, sort_keys=True))
    print(f"{len(now)} diagnoses, {sum('error' in v for v in now.values())} usage errors, written to {args.out}")
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        differ = [k for k in before if before[k] != now.get(k)]
        print(f"{len(before)} compared with {args.compare}: {len(differ)} differ")
        for k in differ:
            print("  " + k)
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

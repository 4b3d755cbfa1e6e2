"""Opt-in: the real toolkit runs behind ``tests/fixtures/toolkit_runs/`` made again, each case checked against
what it is known to print, and against the fixture kept for it (same truth, same key lines).

CI never runs this: the module skips unless ``ASRLAB_OPTIN`` names a virtual environment (a folder with
``bin/python``) that has the toolkits, made outside the repository as ``tests/fixtures/toolkit_runs/README.md``
says; a toolkit that environment cannot import is skipped with its reason:

    ASRLAB_OPTIN=/work/optin/venv .venv/bin/python -m pytest -n 0 -p no:cacheprovider tests/optin/test_toolkit_runs.py

The cases are those of ``tests/optin/toolkit_runs.py`` (Accelerate, SpeechBrain, ESPnet; healthy, NaN, SIGKILL
of a rank, a missing WAV, a hung rank, SIGTERM to the launcher, resume): about 10 minutes on 2 CPU cores, most
of it the hangs, each held for 60 s before the launcher gets SIGTERM.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

_OPTIN = os.environ.get("ASRLAB_OPTIN", "")
VENV = Path(_OPTIN) if _OPTIN else None
if VENV is None or not (VENV / "bin" / "python").exists():
    pytest.skip(
        "opt-in: set ASRLAB_OPTIN to a virtual environment with Accelerate, SpeechBrain and ESPnet (made outside "
        "the repository, see tests/fixtures/toolkit_runs/README.md) to re-make the real toolkit runs",
        allow_module_level=True,
    )

sys.path.insert(0, str(Path(__file__).resolve().parent))
import toolkit_runs as tr  # noqa: E402

IMPORTS = {
    "accelerate": "accelerate",
    "speechbrain": "speechbrain",
    "espnet": "espnet2.bin.asr_train",
    "hf_trainer": "transformers",
    "nemo": "nemo.collections.asr",
}


def _importable(module: str) -> str | None:
    p = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", f"import {module}"], capture_output=True, text=True, timeout=300
    )
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1]


_MISSING: dict = {}


def _need(toolkit: str) -> None:
    if toolkit not in _MISSING:
        _MISSING[toolkit] = _importable(IMPORTS[toolkit])
    if _MISSING[toolkit]:
        pytest.skip(f"{toolkit} is not importable in {VENV}: {_MISSING[toolkit]}")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tr.make_corpus(tmp_path_factory.mktemp("toolkit_corpus"))


CASES = tr.all_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.key for c in CASES])
def test_case_runs_as_its_fixture_says(case, corpus, tmp_path):
    _need(case.toolkit)
    truth = tr.make(case, VENV.resolve(), corpus, tmp_path)
    made = tmp_path / case.toolkit / case.name
    console = (made / case.phases[-1].log).read_text(errors="replace")
    for pattern in case.expect:
        assert re.search(pattern, console), f"{case.key}: {pattern!r} not in its console:\n{console[-4000:]}"
    codes = [r["exit_code"] for r in truth["runs"]]
    assert not any(r.get("timed_out") for r in truth["runs"]), (case.key, truth["runs"])
    if truth["verdict"] == "no_failure_seen" or case.name.startswith("nan_") and case.toolkit != "speechbrain":
        assert codes[-1] == 0, (case.key, codes)  # a NaN that nothing checks (Accelerate) or skips (ESPnet)
    else:
        assert codes[-1] != 0, (case.key, codes)
    if case.name.startswith("resume_"):
        assert codes[0] != 0, (case.key, codes)

    kept = tr.FIXTURES / case.toolkit / case.name
    assert (kept / "truth.yaml").exists(), f"no fixture kept for {case.key}: make it with toolkit_runs.py"
    old = yaml.safe_load((kept / "truth.yaml").read_text())
    for key in ("verdict", "culprit", "what_you_did"):
        assert old[key] == truth[key], (case.key, key, old[key], truth[key])
    kept_console = (kept / case.phases[-1].log).read_text(errors="replace")
    for pattern in case.expect:
        assert re.search(pattern, kept_console), f"the kept {case.key} lacks {pattern!r}"
    big = [p for p in kept.rglob("*") if p.is_file() and p.stat().st_size > tr.MAX_KEPT]
    assert not big, big

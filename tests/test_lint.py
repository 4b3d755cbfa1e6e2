"""The linter's rules and the formatter (``[tool.ruff]`` in pyproject.toml) hold over the whole project."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args", [["check", "--output-format", "concise"], ["format", "--check"]], ids=["lint", "format"]
)
def test_ruff_finds_nothing(args):
    run = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"ruff {' '.join(args)}:\n" + run.stdout[-4000:] + run.stderr[-2000:]

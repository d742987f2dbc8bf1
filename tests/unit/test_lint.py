"""ruff (configured in pyproject.toml, flake8-async rules included) passes on the tree."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_ruff_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "nursery", "tests", "scripts",
                           "bench"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

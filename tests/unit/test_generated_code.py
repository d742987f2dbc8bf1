"""The committed betterproto code matches protos/ (regenerate: python scripts/gen_protos.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_generated_code_is_fresh() -> None:
    proc = subprocess.run([sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

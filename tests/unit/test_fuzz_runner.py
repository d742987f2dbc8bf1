"""bench/fuzz.py records what a target does wrong -- an undocumented exception, a hang, a
dead child -- saves the input, and goes on with the other targets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_campaign_records_crashes_hangs_and_dead_children(tmp_path: Path) -> None:
    out = tmp_path / "fuzz"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.fuzz", "--module", "tests.unit.fuzz_selftest_targets",
         "--inputs", "200", "--hang-seconds", "0.2", "--kill-seconds", "6", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (out / "summary.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in summary.splitlines()
            if line.startswith("| `")}
    assert set(rows) == {"fuzz_selftest_targets:" + n for n in ("documented", "raises", "hangs", "stuck",
                                                                 "dies")}
    assert "| 200 |" in rows["fuzz_selftest_targets:documented"]
    assert "ValueError at fuzz_selftest_targets.py" in summary
    assert "input ran past" in "".join(p.read_text() for p in out.glob("hang-*.txt"))
    assert "child exited with status -9" in summary
    saved = sorted(p.name for p in out.glob("*.bin"))
    assert any(n.startswith("crash-fuzz_selftest_targets-raises-") for n in saved)
    assert any(n.startswith("hang-fuzz_selftest_targets-hangs-") for n in saved)
    assert "no heartbeat for 6.0 s: killed" in summary
    stuck = list(out.glob("hang-fuzz_selftest_targets-stuck-*.bin"))
    assert stuck and len(stuck[0].read_bytes()) > 3
    dead = list(out.glob("crash-fuzz_selftest_targets-dies-*.bin"))
    assert dead and len(dead[0].read_bytes()) > 3  # the input it was running when it died

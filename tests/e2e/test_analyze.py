"""``python -m nursery analyze`` end to end on a copy of ``model_repository/add_sub``: it
starts its own servers, profiles the model, searches a tiny grid on the simulator, verifies
the best candidate with perf_analyzer, and writes ``config.pbtxt.recommended`` beside the
untouched original; a model that cannot load is reported, with nothing written beside it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

PERF_ANALYZER = ROOT / ".tools" / "perf_analyzer" / "perf_analyzer"


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nursery", "analyze", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_analyze_add_sub_small(tmp_path: Path) -> None:
    assert PERF_ANALYZER.is_file(), "perf_analyzer: run scripts/install_perf_analyzer.sh"
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository" / "add_sub", repo / "add_sub")
    original = (repo / "add_sub" / "config.pbtxt").read_text()
    out = tmp_path / "out"
    proc = _analyze("--model-repository", str(repo), "--model", "add_sub",
                    "--concurrency", "1,4", "--latency-budget-ms", "50",
                    "--instances", "1", "--max-batch-sizes", "4,8", "--delays-us", "0,500",
                    "--verify", "1", "--window-ms", "300", "--profile-runs", "3",
                    "--profile-sizes", "1,8", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (repo / "add_sub" / "config.pbtxt").read_text() == original
    recommended = repo / "add_sub" / "config.pbtxt.recommended"
    assert recommended.read_text() == (out / "config.pbtxt").read_text()
    # the recommendation is a configuration the server reads
    check = tmp_path / "check" / "add_sub"
    shutil.copytree(repo / "add_sub", check)
    (check / "config.pbtxt").write_text(recommended.read_text())
    read_model_config(check, "add_sub", backends=get_factory)
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["chosen"] is not None
    measured = analysis["verified"][0]["measured"]
    assert len(measured) == 2  # one perf_analyzer measurement per load
    for m in measured:
        assert "error" in m or m["throughput"] > 0
    text = (out / "report.md").read_text()
    assert "## Verified on the real server (perf_analyzer)" in text
    assert "**(chosen)**" in text
    profile = json.loads((out / "profile.json").read_text())
    assert set(profile["calibration"]["cost_s"]) == {"1", "8"}


def test_a_model_that_fails_to_load_is_reported(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "models" / "py_init_fail", repo / "py_init_fail")
    original = (repo / "py_init_fail" / "config.pbtxt").read_text()
    proc = _analyze("--model-repository", str(repo), "--model", "py_init_fail",
                    "--concurrency", "1", "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert "the model failed to load during profiling" in proc.stderr
    assert (repo / "py_init_fail" / "config.pbtxt").read_text() == original
    assert not (repo / "py_init_fail" / "config.pbtxt.recommended").exists()

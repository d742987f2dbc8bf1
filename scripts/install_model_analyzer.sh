#!/usr/bin/env bash
# Triton's Model Analyzer (PyPI: triton-model-analyzer) in a virtual environment of its own,
# .venv-ma/ (its pinned dependencies clash with the project's), for
# bench/analyze_vs_model_analyzer.py. perf_analyzer comes from scripts/install_perf_analyzer.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m venv .venv-ma
.venv-ma/bin/pip install --quiet "triton-model-analyzer==1.58.0"
.venv-ma/bin/model-analyzer --version

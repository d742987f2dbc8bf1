#!/usr/bin/env python3
"""Interleaved sequences through the sequence batcher: direct vs oldest, with perf_analyzer.

    python bench/sequence.py [--concurrency 32] [--sequence-length 20] [--seconds 5]
                             [--protocol grpc|http] [--oldest-delay-us 0] [--passes 1]

Writes a repository with two copies of the implicit-state accumulator
(``scripts/make_models.py``: OUTPUT = INPUT + INPUT_STATE, INT32[1], max_batch_size 32, one CPU
instance): ``acc_direct`` (``direct``: 32 slots, one batch row per slot) and ``acc_oldest``
(``oldest``: 32 candidate sequences, batches of the longest-waiting ones). It starts
``python -m nursery serve`` on free loopback ports and runs perf_analyzer on each model with
``--concurrency-range C`` (C sequences live at once, each context sending its sequence's
requests one after another, ``--sequence-length`` requests per sequence). Prints throughput
and latency per model; the server's statistics give the mean rows per model execution.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import make_models  # noqa: E402

PERF = ROOT / ".tools" / "perf_analyzer" / "perf_analyzer"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _repo(path: Path, slots: int, oldest_delay_us: int) -> None:
    make_models.write_sequence_accumulator(path, "acc_direct", max_batch_size=slots)
    make_models.write_sequence_accumulator(
        path, "acc_oldest", max_batch_size=slots,
        strategy=(f"oldest {{ max_candidate_sequences: {slots} "
                  f"max_queue_delay_microseconds: {oldest_delay_us} }}"))


def _stats(http: int, model: str) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}/stats") as r:
        entry = json.load(r)["model_stats"][0]
    return int(entry["inference_count"]), int(entry["execution_count"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement window")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--oldest-delay-us", type=int, default=0)
    parser.add_argument("--passes", type=int, default=1)
    args = parser.parse_args()
    if not PERF.exists():
        sys.exit(f"perf_analyzer not found at {PERF} (scripts/install_perf_analyzer.sh)")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        _repo(repo, args.concurrency, args.oldest_delay_us)
        http, grpc, metrics = _port(), _port(), _port()
        log = open(Path(tmp) / "server.log", "wb")  # noqa: SIM115 - closed below
        server = subprocess.Popen(
            [sys.executable, "-m", "nursery", "serve", "--model-repository", str(repo),
             "--http-address", "127.0.0.1", "--http-port", str(http),
             "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
             "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready"):
                        break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        sys.exit((Path(tmp) / "server.log").read_text())
                    time.sleep(0.2)
            url = f"127.0.0.1:{grpc if args.protocol == 'grpc' else http}"
            print(f"{args.concurrency} concurrent sequences of ~{args.sequence_length} requests, "
                  f"{args.protocol}, {args.seconds:g} s windows")
            print("| model | pass | infer/s | p50 ms | p99 ms | rows per execution |")
            print("|---|---|---|---|---|---|")
            for p in range(args.passes):
                for model in ("acc_direct", "acc_oldest"):
                    before = _stats(http, model)
                    out = Path(tmp) / f"{model}-{p}.csv"
                    cmd = [str(PERF), "-m", model, "-u", url, "-i", args.protocol,
                           "--concurrency-range", str(args.concurrency),
                           "--sequence-length", str(args.sequence_length),
                           "--measurement-interval", str(int(args.seconds * 1000)),
                           "--stability-percentage", "100", "--max-trials", "3",
                           "-f", str(out)]
                    result = subprocess.run(cmd, capture_output=True, text=True,
                                            env={**os.environ}, check=False)
                    if result.returncode != 0:
                        print(result.stdout[-2000:], result.stderr[-2000:], file=sys.stderr)
                        sys.exit(f"perf_analyzer failed on {model}")
                    row = next(csv.DictReader(io.StringIO(out.read_text())))
                    after = _stats(http, model)
                    rows = (after[0] - before[0]) / max(1, after[1] - before[1])
                    print(f"| {model} | {p + 1} | {float(row['Inferences/Second']):,.0f} | "
                          f"{int(row['p50 latency']) / 1000:.2f} | "
                          f"{int(row['p99 latency']) / 1000:.2f} | {rows:.1f} |")
        finally:
            server.terminate()
            server.wait(30)
            log.close()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The MLP (784-128-64-10) under OpenVINO against ONNX Runtime, through nursery, in one run.

    python bench/openvino_vs_ort.py [--concurrency 1,16] [--measure-ms 3000] [--protocol http]
                                    [--rounds 2]

Builds a repository in a temporary folder with the same MLP three ways, each with dynamic
batching (max_batch_size 64) and one CPU instance:

  mlp_ort        ONNX Runtime (backend onnxruntime, intra_op_thread_count 1, as the bundled mlp)
  mlp_ov         OpenVINO IR converted from the same ONNX file (PERFORMANCE_HINT LATENCY,
                 NUM_STREAMS 1, INFERENCE_NUM_THREADS 1), OpenVINO's default precision
  mlp_ov_tput    the same IR with PERFORMANCE_HINT THROUGHPUT and NUM_STREAMS AUTO

starts ``python -m nursery serve`` once, and runs perf_analyzer against each model at each
concurrency, interleaving the models round by round (``--rounds``) so that the shared
machine's drift falls on all of them alike. Prints the median throughput and p50/p99 per model
and concurrency, and each OpenVINO model's throughput as a ratio of ONNX Runtime's. Never run
it beside another benchmark on the 2-core machine; a smoke run is
``--measure-ms 500 --concurrency 1 --rounds 1 --stability 100``. Needs the ``openvino`` extra and
perf_analyzer (``bash scripts/install_perf_analyzer.sh``).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import openvino_models as ovm  # noqa: E402
from tests.conftest import PERF_ANALYZER, ServerProcess, make_models  # noqa: E402

MODELS = ("mlp_ort", "mlp_ov", "mlp_ov_tput")
BATCHING = "dynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n"


def build(repo: Path) -> None:
    make_models.write_model(
        repo, "mlp_ort", make_models.build_mlp(),
        make_models.config_text("mlp_ort", *ovm.MLP_IO, 64,
                                'parameters { key: "intra_op_thread_count" '
                                'value: { string_value: "1" } }\ndynamic_batching { }\n'))
    ovm.write_model(repo, "mlp_ov", ovm.ov_config(
        "mlp_ov", params={"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1",
                          "INFERENCE_NUM_THREADS": "1"}, extra=BATCHING))
    ovm.write_model(repo, "mlp_ov_tput", ovm.ov_config(
        "mlp_ov_tput", params={"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": "AUTO"},
        extra=BATCHING))


def measure(server: ServerProcess, model: str, concurrency: int, args: argparse.Namespace,
            out: Path) -> dict[str, float]:
    url = server.url if args.protocol == "http" else f"127.0.0.1:{server.grpc_port}"
    csv_path = out / f"{model}-c{concurrency}.csv"
    cmd = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", args.protocol,
           "--concurrency-range", str(concurrency), "--measurement-interval",
           str(args.measure_ms), "--stability-percentage", str(args.stability),
           "-f", str(csv_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed for {model}:\n{done.stdout}\n{done.stderr}")
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    return {"throughput": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1000, "p99_ms": float(row["p99 latency"]) / 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--measure-ms", type=int, default=3000)
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stability", type=int, default=10,
                        help="perf_analyzer's --stability-percentage (its default: 10)")
    args = parser.parse_args()
    if not PERF_ANALYZER.exists():
        sys.exit(f"no perf_analyzer at {PERF_ANALYZER}: bash scripts/install_perf_analyzer.sh")
    tmp = Path(tempfile.mkdtemp(prefix="nursery-ovbench-"))
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        repo = tmp / "repo"
        repo.mkdir()
        build(repo)
        server = ServerProcess(repo, "--log-verbose", "0", log_path=tmp / "server.log")
        try:
            server.wait_ready()
            for _ in range(args.rounds):
                for c in (int(x) for x in args.concurrency.split(",")):
                    for model in MODELS:
                        runs.setdefault((model, c), []).append(
                            measure(server, model, c, args, tmp))
        finally:
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def median(model: str, c: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[(model, c)])

    print(f"| model | concurrency | infer/s | p50 ms | p99 ms | infer/s vs mlp_ort |  "
          f"({args.protocol}, {args.measure_ms} ms windows, median of {args.rounds} rounds)")
    print("|---|---|---|---|---|---|")
    for (model, c) in runs:
        tput = median(model, c, "throughput")
        ratio = tput / median("mlp_ort", c, "throughput")
        print(f"| {model} | {c} | {tput:.0f} | {median(model, c, 'p50_ms'):.3f} "
              f"| {median(model, c, 'p99_ms'):.3f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()

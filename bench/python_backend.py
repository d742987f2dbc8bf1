#!/usr/bin/env python3
"""Per-request overhead of the Python backend and of ensembles, measured with perf_analyzer.

    python bench/python_backend.py [--concurrency 1,16] [--measure-ms 3000] [--protocol http]
                                   [--models onnx_identity,py_identity,ens_onnx2,ens_onnx_py]

Builds a repository in a temporary folder, starts ``python -m nursery serve`` on free loopback
ports and runs perf_analyzer against each model at each concurrency:

  onnx_identity  ONNX Runtime identity, FP32 [-1, 16] (max_batch_size 64): the baseline
  py_identity    the same identity as a Triton Python model (tests/models/py_identity_fp32)
  ens_onnx2      ensemble: onnx_identity -> onnx_identity (two steps)
  ens_onnx_py    ensemble: onnx_identity -> py_identity

and prints throughput, p50 / average latency and the latency each adds over the ONNX
baseline. Never run it beside another benchmark on the 2-core machine; a smoke run is
``--measure-ms 500 --concurrency 1``.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import PERF_ANALYZER, ServerProcess, make_models  # noqa: E402

IO = ('max_batch_size: 64\n'
      'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
      'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


def step(model: str, src: str, dst: str) -> str:
    return (f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "INPUT0" value: '
            f'"{src}" }} output_map {{ key: "OUTPUT0" value: "{dst}" }} }}')


def ensemble(repo: Path, name: str, steps: list[str]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\n{IO.replace("INPUT0", "IN").replace("OUTPUT0", "OUT")}'
        f'ensemble_scheduling {{ step [ {", ".join(steps)} ] }}\n')


def build(repo: Path) -> None:
    make_models.write_model(
        repo, "onnx_identity", make_models.build_identity("FP32", ["batch", "n"]),
        f'name: "onnx_identity"\nbackend: "onnxruntime"\n{IO}dynamic_batching {{ }}\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    shutil.copytree(ROOT / "tests" / "models" / "py_identity_fp32", repo / "py_identity")
    config = repo / "py_identity" / "config.pbtxt"
    config.write_text(config.read_text().replace("py_identity_fp32", "py_identity"))
    ensemble(repo, "ens_onnx2", [step("onnx_identity", "IN", "MID"),
                                 step("onnx_identity", "MID", "OUT")])
    ensemble(repo, "ens_onnx_py", [step("onnx_identity", "IN", "MID"),
                                   step("py_identity", "MID", "OUT")])


def measure(server: ServerProcess, model: str, concurrency: int, args: argparse.Namespace,
            out: Path) -> dict[str, float]:
    url = server.url if args.protocol == "http" else f"127.0.0.1:{server.grpc_port}"
    shape = "IN:16" if model.startswith("ens_") else "INPUT0:16"
    csv_path = out / f"{model}-c{concurrency}.csv"
    cmd = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", args.protocol,
           "--concurrency-range", str(concurrency), "--shape", shape,
           "--measurement-interval", str(args.measure_ms), "-f", str(csv_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed for {model}:\n{done.stdout}\n{done.stderr}")
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    # perf_analyzer's CSV has no average column: the average is the sum of its parts
    parts = ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
             "Server Compute Infer", "Server Compute Output", "Client Recv")
    avg_us = sum(float(row[p]) for p in parts if p in row)
    return {"throughput": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1000, "p99_ms": float(row["p99 latency"]) / 1000,
            "avg_ms": avg_us / 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--measure-ms", type=int, default=3000)
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--models", default="onnx_identity,py_identity,ens_onnx2,ens_onnx_py")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nursery-pybench-"))
    try:
        repo = tmp / "repo"
        repo.mkdir()
        build(repo)
        server = ServerProcess(repo, "--log-verbose", "0", log_path=tmp / "server.log")
        try:
            server.wait_ready()
            results = {}
            for c in (int(x) for x in args.concurrency.split(",")):
                for model in args.models.split(","):
                    results[(model, c)] = measure(server, model, c, args, tmp)
        finally:
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"| model | concurrency | infer/s | p50 ms | p99 ms | avg ms | avg over onnx_identity ms |  "
          f"({args.protocol}, {args.measure_ms} ms windows)")
    print("|---|---|---|---|---|---|---|")
    for (model, c), r in results.items():
        base = results.get(("onnx_identity", c))
        extra = f"{r['avg_ms'] - base['avg_ms']:+.3f}" if base else ""
        print(f"| {model} | {c} | {r['throughput']:.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} "
              f"| {r['avg_ms']:.3f} "
              f"| {extra} |")


if __name__ == "__main__":
    main()

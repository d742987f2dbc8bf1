#!/usr/bin/env python3
"""The MLP on the GPU: ONNX Runtime CUDA vs TensorRT vs PyTorch, through nursery and called
directly in-process (needs a GPU; first run to its end on the lent H200, bench/README.md).

    python bench/gpu_backends.py [--concurrency 16] [--seconds 5]

Builds a repository in a temporary folder: the mlp from scripts/make_models.py as ONNX on the
CUDA provider (mlp_ort_gpu), as a TensorRT engine built here from that ONNX (mlp_trt) and as
TorchScript on CUDA (mlp_torch_gpu), each KIND_GPU on GPU 0 with dynamic batching up to 64.
Starts `python -m nursery serve` on it and runs perf_analyzer (HTTP, binary tensors) at the
given concurrency against each; then calls each runtime directly in this process with batches
of that concurrency, which is the ceiling batching through the server could reach. Prints one
table row per runtime: infer/s through nursery, infer/s direct, and their ratio. A runtime
whose package is missing (onnxruntime-gpu's CUDA provider, tensorrt with cupy, a CUDA build
of torch) gets a row saying so and the others are measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PERF_ANALYZER = ROOT / ".tools" / "perf_analyzer" / "perf_analyzer"
sys.path.insert(0, str(ROOT))

from tests.conftest import ServerProcess  # noqa: E402


def _make_models() -> Any:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "scripts" / "make_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def available() -> dict[str, str]:
    """Each runtime's model name -> '' where it can run here, else what is missing."""
    have: dict[str, str] = {}
    try:
        import onnxruntime
        ort_cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    except ImportError:
        ort_cuda = False
    have["mlp_ort_gpu"] = "" if ort_cuda else "onnxruntime-gpu (CUDA provider) not installed"
    trt = all(importlib.util.find_spec(m) is not None for m in ("tensorrt", "cupy"))
    have["mlp_trt"] = "" if trt else "tensorrt or cupy not installed"
    try:
        import torch
        torch_cuda = torch.cuda.is_available()
    except ImportError:
        torch_cuda = False
    have["mlp_torch_gpu"] = "" if torch_cuda else "torch with CUDA not installed"
    return have


def build_repo(repo: Path, mm: Any, have: dict[str, str]) -> bytes | None:
    io = ([("INPUT0", "FP32", [784])], [("OUTPUT0", "FP32", [10])])
    batching = "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
    gpu = "instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]\n"

    def on_gpu(text: str) -> str:
        return text.replace("instance_group [ { count: 1, kind: KIND_CPU } ]\n", gpu)

    onnx_model = mm.build_mlp()
    if not have["mlp_ort_gpu"]:
        mm.write_model(repo, "mlp_ort_gpu", onnx_model,
                       on_gpu(mm.config_text("mlp_ort_gpu", *io, 64, batching)))
    if not have["mlp_torch_gpu"]:
        mm.write_torch_model(repo, "mlp_torch_gpu", mm.build_torch_mlp(),
                             on_gpu(mm.torch_config("mlp_torch_gpu", *io, 64, batching)))
    if have["mlp_trt"]:
        return None
    engine = mm.build_trt_engine(onnx_model)
    (repo / "mlp_trt" / "1").mkdir(parents=True)
    (repo / "mlp_trt" / "1" / "model.plan").write_bytes(engine)
    (repo / "mlp_trt" / "config.pbtxt").write_text(on_gpu(mm.config_text(
        "mlp_trt", *io, 64, batching)).replace('"onnxruntime_onnx"', '"tensorrt_plan"'))
    return engine


def through_nursery(server: ServerProcess, model: str, concurrency: int, seconds: int) -> float:
    out = subprocess.run(
        [str(PERF_ANALYZER), "-m", model, "-u", server.url, "--concurrency-range",
         str(concurrency), "--measurement-interval", str(seconds * 1000), "-b", "1"],
        capture_output=True, text=True, timeout=600)
    match = re.search(r"Throughput: ([0-9.]+) infer/sec", out.stdout)
    if match is None:
        raise RuntimeError(out.stdout + out.stderr)
    return float(match.group(1))


def _rate(run: Any, batch: int, seconds: float) -> float:
    run()  # warm up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        run()
        n += batch
    return n / (time.perf_counter() - start)


def direct_ort(onnx_model: Any, x: np.ndarray, seconds: float) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_model.SerializeToString(),
                                   providers=[("CUDAExecutionProvider", {"device_id": 0})])
    return _rate(lambda: session.run(["OUTPUT0"], {"INPUT0": x}), len(x), seconds)


def direct_torch(mm: Any, x: np.ndarray, seconds: float) -> float:
    import torch

    module = mm.build_torch_mlp().to("cuda").eval()

    def run() -> None:
        with torch.inference_mode():
            module(torch.from_numpy(x).to("cuda", non_blocking=True)).cpu().numpy()

    return _rate(run, len(x), seconds)


def direct_trt(engine_bytes: bytes | None, x: np.ndarray, seconds: float) -> float:
    assert engine_bytes is not None
    import cupy as cp
    import tensorrt as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(engine_bytes)
    context = engine.create_execution_context()
    stream = cp.cuda.Stream(non_blocking=True)
    d_in = cp.empty(x.shape, cp.float32)
    d_out = cp.empty((len(x), 10), cp.float32)
    context.set_input_shape("INPUT0", x.shape)
    context.set_tensor_address("INPUT0", d_in.data.ptr)
    context.set_tensor_address("OUTPUT0", d_out.data.ptr)

    def run() -> None:
        d_in.set(x, stream=stream)
        context.execute_async_v3(stream.ptr)
        d_out.get(stream=stream)
        stream.synchronize()

    return _rate(run, len(x), seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    mm = _make_models()
    have = available()
    runnable = [m for m, missing in have.items() if not missing]
    if not runnable:
        raise SystemExit("no GPU runtime here: " + "; ".join(have.values())
                         + " (pip install -e '.[gpu]' and a CUDA build of torch)")
    x = np.random.default_rng(0).standard_normal((args.concurrency, 784)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        engine = build_repo(repo, mm, have)
        server = ServerProcess(repo, log_path=Path(tmp) / "server.log")
        try:
            server.wait_ready(timeout=300)
            served = {m: through_nursery(server, m, args.concurrency, args.seconds)
                      for m in runnable}
        finally:
            server.stop()
    runs = {"mlp_ort_gpu": lambda: direct_ort(mm.build_mlp(), x, args.seconds),
            "mlp_trt": lambda: direct_trt(engine, x, args.seconds),
            "mlp_torch_gpu": lambda: direct_torch(mm, x, args.seconds)}
    direct = {m: runs[m]() for m in runnable}
    print(f"| runtime | nursery infer/s (c={args.concurrency}, batching) | direct infer/s "
          f"(batch {args.concurrency}) | nursery / direct |")
    print("|---|---|---|---|")
    for model, missing in have.items():
        if missing:
            print(f"| {model} | {missing} | | |")
            continue
        print(f"| {model} | {served[model]:,.0f} | {direct[model]:,.0f} | "
              f"{served[model] / direct[model]:.2f} |")


if __name__ == "__main__":
    main()

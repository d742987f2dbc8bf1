"""GPU execution end to end (``pytest -m gpu``; deselected on machines without a GPU).

ONNX Runtime's CUDA provider, PyTorch on the GPU, a TensorRT engine built here from the ONNX
mlp, CUDA shared memory with ``tritonclient.utils.cuda_shared_memory``, and two instances on
one GPU each on its own stream. Needs the 'gpu' extra (onnxruntime-gpu, tensorrt,
cupy-cuda12x) and a CUDA build of torch.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.runtime.devices import InstancePlacement
from tests.conftest import ServerProcess, make_models
from tests.shm_client import cuda_shm

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]

GPU_GROUP = "instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]\n"


def _ort_cuda() -> bool:
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


# each GPU backend's models only where that backend is installed (the 'gpu' extra's
# onnxruntime-gpu and tensorrt), so that one missing backend leaves the others' cases running
HAVE = {"ort": _ort_cuda(), "trt": importlib.util.find_spec("tensorrt") is not None}
BACKEND_OF = {"mlp_ort_gpu": "ort", "mlp_trt": "trt", "mlp_trt_auto": "trt"}
MISSING = {"ort": "onnxruntime-gpu (the CUDA execution provider)", "trt": "tensorrt"}


def _needs(model: str) -> None:
    backend = BACKEND_OF.get(model)
    if backend is not None and not HAVE[backend]:
        pytest.skip(f"{model}: {MISSING[backend]} is not installed here")


def _gpu(config: str, count: int = 1) -> str:
    return config.replace("instance_group [ { count: 1, kind: KIND_CPU } ]\n",
                          f"instance_group [ {{ count: {count}, kind: KIND_GPU, gpus: [ 0 ] }} ]\n")


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("gpu_repo")
    make_models.write_mlp(repo)  # the CPU reference
    make_models.write_add_sub(repo)
    mlp_io = ([("INPUT0", "FP32", [784])], [("OUTPUT0", "FP32", [10])])
    if HAVE["ort"]:
        make_models.write_model(repo, "mlp_ort_gpu", make_models.build_mlp(), _gpu(
            make_models.config_text("mlp_ort_gpu", *mlp_io, 64,
                                    "dynamic_batching { max_queue_delay_microseconds: 20000 }\n")))
    # a 20 ms batching window: tritonclient's async HTTP client submits about one request per
    # 10 ms (measured on the 2-core machine: 48 in 518 ms), so a shorter one batches nothing
    # whatever the server does
    make_models.write_torch_model(repo, "mlp_torch_gpu", make_models.build_torch_mlp(), _gpu(
        make_models.torch_config("mlp_torch_gpu", *mlp_io, 64,
                                 "dynamic_batching { max_queue_delay_microseconds: 20000 }\n"),
        count=2))
    make_models.write_torch_model(repo, "mlp_torch_pt2_gpu", make_models.export_torch_mlp(),
                                  _gpu(make_models.torch_config("mlp_torch_pt2_gpu", *mlp_io, 64)),
                                  filename="model.pt2")
    if not HAVE["trt"]:
        return repo
    engine = make_models.build_trt_engine(make_models.build_mlp())
    for name, config in (
        ("mlp_trt", _gpu(make_models.config_text("mlp_trt", *mlp_io, 64,
                                                 "dynamic_batching { }\n")).replace(
            'platform: "onnxruntime_onnx"', 'platform: "tensorrt_plan"')),
        ("mlp_trt_auto", None),  # auto-completed from the engine
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.plan").write_bytes(engine)
        if config is not None:
            (repo / name / "config.pbtxt").write_text(config)
    return repo


@pytest.fixture(scope="module")
def gpu_server(gpu_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(gpu_repo, "--allow-client-shm=true",  # the CUDA shared-memory test
                         log_path=tmp_path_factory.mktemp("log") / "server.log")
    try:
        proc.wait_ready(timeout=300)
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"server exit code {code}:\n{proc.log()}"


def _x(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 784)).astype(np.float32)


def _infer(client: httpclient.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


@pytest.mark.parametrize("model", ["mlp_ort_gpu", "mlp_torch_gpu", "mlp_torch_pt2_gpu",
                                   "mlp_trt", "mlp_trt_auto"])
def test_gpu_models_match_the_cpu_reference(gpu_server: ServerProcess, model: str) -> None:
    _needs(model)
    client = httpclient.InferenceServerClient(gpu_server.url)
    x = _x(8)
    reference = _infer(client, "mlp", x)
    np.testing.assert_allclose(_infer(client, model, x), reference, rtol=1e-2, atol=1e-2)
    log = gpu_server.log()
    assert f"model '{model}' version 1: instance" in log
    assert f"model '{model}' instance" not in log or "running on the CPU" not in log
    assert "(GPU 0)" in log


def test_tensorrt_auto_complete(gpu_server: ServerProcess) -> None:
    _needs("mlp_trt_auto")
    config = httpclient.InferenceServerClient(gpu_server.url).get_model_config("mlp_trt_auto")
    assert config["platform"] == "tensorrt_plan" and config["max_batch_size"] == 64
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", ["784"])]


def test_tensorrt_refuses_shapes_outside_its_profile(gpu_server: ServerProcess) -> None:
    _needs("mlp_trt")
    client = httpclient.InferenceServerClient(gpu_server.url)
    x = _x(65)  # the config's max_batch_size stops it first, with Triton's message
    with pytest.raises(Exception, match="batch-size must be <= 64"):
        _infer(client, "mlp_trt", x)


def test_concurrency_16_with_batching_on_two_gpu_instances(gpu_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(gpu_server.url, concurrency=16)
    xs = [_x(1 + i % 3, seed=i) for i in range(48)]
    expected = [_infer(client, "mlp", x) for x in xs]
    for model in ("mlp_torch_gpu", "mlp_ort_gpu", "mlp_trt"):
        if BACKEND_OF.get(model) and not HAVE[BACKEND_OF[model]]:
            continue  # its backend is not installed here (the others still run)
        before = client.get_inference_statistics(model)["model_stats"][0]
        handles = []
        for x in xs:
            inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            handles.append(client.async_infer(model, [inp]))
        for handle, ref in zip(handles, expected, strict=True):
            np.testing.assert_allclose(handle.get_result().as_numpy("OUTPUT0"), ref,
                                       rtol=1e-2, atol=1e-2)
        after = client.get_inference_statistics(model)["model_stats"][0]
        assert after["execution_count"] - before["execution_count"] < len(xs)


def test_two_instances_run_concurrently_on_their_own_streams(gpu_repo: Path) -> None:
    """Two instances of one model on GPU 0, each loaded on its own thread: distinct,
    non-default streams, and correct answers while both compute at once."""
    from nursery.backends import pytorch

    config, _ = read_model_config(gpu_repo / "mlp_torch_gpu", "mlp_torch_gpu", backends=get_factory)
    instances: dict[int, pytorch.PyTorchInstance] = {}
    results: dict[int, np.ndarray] = {}
    x = _x(32, seed=5)

    def run(i: int) -> None:
        placement = InstancePlacement("g", i, "gpu", 0)
        instances[i] = pytorch.FACTORY.load(config, gpu_repo / "mlp_torch_gpu" / "1", placement)
        for _ in range(50):
            results[i] = instances[i].execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    streams = [instances[i]._stream for i in range(2)]
    assert all(s is not None and s.cuda_stream != 0 for s in streams)
    assert streams[0].cuda_stream != streams[1].cuda_stream
    assert streams[0].cuda_stream != torch.cuda.default_stream(0).cuda_stream
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5)


def test_cuda_shared_memory_over_http_and_grpc(gpu_server: ServerProcess) -> None:
    cudashm = cuda_shm()
    http = httpclient.InferenceServerClient(gpu_server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{gpu_server.grpc_port}")
    assert "cuda_shared_memory" in http.get_server_metadata()["extensions"]
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.0, np.float32)
    regions = {name: cudashm.create_shared_memory_region(name, size, 0)
               for name, size in (("cuda_in", 128), ("cuda_out0", 64), ("cuda_out1", 64))}
    try:
        cudashm.set_shared_memory_region(regions["cuda_in"], [a, b])
        for client, module in ((http, httpclient), (grpc, grpcclient)):
            for name, size in (("cuda_in", 128), ("cuda_out0", 64), ("cuda_out1", 64)):
                client.register_cuda_shared_memory(
                    name, cudashm.get_raw_handle(regions[name]), 0, size)
            assert len(http.get_cuda_shared_memory_status()) == 3
            i0 = module.InferInput("INPUT0", [1, 16], "FP32")
            i0.set_shared_memory("cuda_in", 64)
            i1 = module.InferInput("INPUT1", [1, 16], "FP32")
            i1.set_shared_memory("cuda_in", 64, offset=64)
            o0 = module.InferRequestedOutput("OUTPUT0")
            o0.set_shared_memory("cuda_out0", 64)
            o1 = module.InferRequestedOutput("OUTPUT1")
            o1.set_shared_memory("cuda_out1", 64)
            client.infer("add_sub", [i0, i1], outputs=[o0, o1])
            out0 = cudashm.get_contents_as_numpy(regions["cuda_out0"], np.float32, [1, 16])
            out1 = cudashm.get_contents_as_numpy(regions["cuda_out1"], np.float32, [1, 16])
            np.testing.assert_array_equal(out0, a + b)
            np.testing.assert_array_equal(out1, a - b)
            client.unregister_cuda_shared_memory()
            assert http.get_cuda_shared_memory_status() == []
    finally:
        for handle in regions.values():
            cudashm.destroy_shared_memory_region(handle)

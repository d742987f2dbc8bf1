"""Triton's in-process Python API (``import tritonserver``, ``import tritonfrontend``) on
nursery: a program written for Triton's packages, unchanged. Servers, models, requests and
responses (plain and asyncio, response queues, decoupled streams), tensors through DLPack,
Triton's error types, and the frontends opened on an in-process server, driven by
tritonclient over loopback."""

from __future__ import annotations

import asyncio
import gc
import json
import queue
import shutil
import sys
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import tritonfrontend
import tritonserver
from tests.conftest import ROOT, free_port, make_models

MODELS = ROOT / "tests" / "models"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("api-repo")
    make_models.write_add_sub(repo, max_batch_size=8)
    make_models.write_string_identity(repo)
    shutil.copytree(MODELS / "py_repeat", repo / "py_repeat")
    shutil.copytree(MODELS / "py_add_sub", repo / "py_add_sub")
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[tritonserver.Server]:
    server = tritonserver.Server(tritonserver.Options(
        model_repository=str(repo), server_id="api-test", exit_timeout=10,
        model_control_mode=tritonserver.ModelControlMode.NONE)).start(wait_until_ready=True)
    yield server
    server.stop()


def _inputs() -> dict[str, np.ndarray]:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    return {"INPUT0": a, "INPUT1": np.ones_like(a)}


def test_not_started_and_bad_options(tmp_path: Path) -> None:
    with pytest.raises(tritonserver.InvalidArgumentError, match="Server not started"):
        tritonserver.Server().ready()
    with pytest.raises(TypeError):
        tritonserver.Server(model_repository=str(tmp_path), server_id=1).start()
    with pytest.raises(TypeError):
        tritonserver.Server(model_repository=1).start()
    with pytest.raises(tritonserver.InvalidArgumentError):
        tritonserver.Server(model_repository=None).start()
    with pytest.raises(tritonserver.InternalError, match="missing"):
        tritonserver.Server(model_repository=str(tmp_path / "missing")).start()
    assert issubclass(tritonserver.NotFoundError, tritonserver.TritonError)
    assert tritonserver.NotFoundError.__module__ == "tritonserver"


def test_infer_responses_and_metadata(server: tritonserver.Server) -> None:
    assert server.live() and server.ready()
    assert server.metadata()["name"] == "api-test"
    model = server.model("add_sub")
    assert model.ready()
    assert model.metadata()["inputs"][0]["name"] == "INPUT0"
    assert model.config()["max_batch_size"] == 8
    assert model.batch_properties() == tritonserver.ModelBatchFlag.FIRST_DIM
    responses = list(model.infer(inputs=_inputs(), request_id="r-1"))
    assert len(responses) == 1 and responses[0].final and responses[0].error is None
    out = responses[0].outputs
    assert out["OUTPUT0"].data_type == tritonserver.DataType.FP32
    assert list(out["OUTPUT0"].shape) == [1, 16]
    np.testing.assert_array_equal(np.from_dlpack(out["OUTPUT0"]), _inputs()["INPUT0"] + 1)
    assert responses[0].request_id == "r-1"
    names = {key[0] for key in server.models()}
    assert {"add_sub", "string_identity", "py_repeat"} <= names
    assert server.models()["add_sub"].name == "add_sub"
    stats = model.statistics()
    assert stats["model_stats"][0]["inference_count"] >= 1
    assert "nv_inference_request_success" in server.metrics()


def test_requests_leave_no_memory_behind(server: tritonserver.Server) -> None:
    """Triton's ``test_inference_leak``: the Python heap must not grow with the number of
    requests. Each ``tuple(<generator>)`` on the request path used to leave one tuple more on
    CPython's free lists per request (the tuple is allocated large and shrunk in place, so
    what it frees is never what the next request takes): 270 KB per 1,000 requests."""
    model = server.model("py_add_sub")

    def run(count: int) -> None:
        for _ in range(count):
            for response in model.infer(inputs=_inputs(), raise_on_error=True):
                np.from_dlpack(response.outputs["OUTPUT0"])

    run(200)  # imports, caches and pools filled first
    gc.collect()  # empties the free lists, as Triton's test does before it measures
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(1000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 100_000, f"{grown} bytes kept over 1,000 requests"


def test_strings_and_tensors(server: tritonserver.Server) -> None:
    model = server.model("string_identity")
    for value in ([["hello", "wörld"]], tritonserver.Tensor.from_string_array([["hello", "wörld"]])):
        (response,) = list(model.infer(inputs={"INPUT0": value}))
        text = response.outputs["OUTPUT0"].to_string_array()
        assert text.tolist() == [["hello", "wörld"]]
        assert response.outputs["OUTPUT0"].to_bytes_array().tolist() == [
            [b"hello", "wörld".encode()]]
    # a Tensor made from numpy shares its memory, and numpy reads it back without a copy
    array = np.arange(12, dtype=np.float32)
    tensor = tritonserver.Tensor.from_dlpack(array)
    assert tensor.data_ptr == array.ctypes.data and tensor.size == array.nbytes
    tensor.shape = [3, 4]
    view = np.from_dlpack(tensor)
    assert view.shape == (3, 4) and view.ctypes.data == array.ctypes.data
    assert tensor.__dlpack_device__() == (1, 0)
    torch = pytest.importorskip("torch")
    from_torch = tritonserver.Tensor.from_dlpack(torch.arange(6, dtype=torch.int64))
    assert from_torch.data_type == tritonserver.DataType.INT64
    assert torch.from_dlpack(from_torch).tolist() == list(range(6))


def test_decoupled_stream_and_response_queue(server: tritonserver.Server) -> None:
    model = server.model("py_repeat")
    responses = list(model.infer(inputs={"IN": np.array([4, 5, 6], dtype=np.int32)}))
    values = [int(np.from_dlpack(r.outputs["OUT"])[0]) for r in responses if r.outputs]
    assert values == [4, 5, 6]
    assert responses[-1].final and not any(r.final for r in responses[:-1])
    # two requests at once, their responses in a queue of the caller's, without iterating
    seen: queue.SimpleQueue[tritonserver.InferenceResponse] = queue.SimpleQueue()
    iterators = [server.model("add_sub").infer(inputs=_inputs(), response_queue=seen)
                 for _ in range(2)]
    for _ in range(2):
        assert seen.get(timeout=30).final
    for iterator in iterators:
        assert [r.final for r in iterator] == [True]
    assert seen.empty()


def test_async_infer(server: tritonserver.Server) -> None:
    async def main() -> list[int]:
        answers = []
        async for response in server.model("py_repeat").async_infer(
                inputs={"IN": np.array([7, 8], dtype=np.int32)}):
            if response.outputs:
                answers.append(int(np.from_dlpack(response.outputs["OUT"])[0]))
        seen: asyncio.Queue[tritonserver.InferenceResponse] = asyncio.Queue()
        iterator = server.model("add_sub").async_infer(inputs=_inputs(), response_queue=seen)
        assert (await asyncio.wait_for(seen.get(), 30)).final
        assert [r.final async for r in iterator] == [True]
        return answers

    assert asyncio.run(main()) == [7, 8]


def test_errors_in_tritons_types(server: tritonserver.Server) -> None:
    with pytest.raises(tritonserver.InvalidArgumentError, match="parameters must be"):
        server.model("add_sub").infer(inputs=_inputs(), parameters={"bad": {"x": 1}})
    with pytest.raises(tritonserver.InvalidArgumentError):
        server.model("add_sub").infer(inputs=_inputs(), parameters={"bad": None})
    with pytest.raises(tritonserver.TritonError, match="unknown model"):
        list(server.model("nope").infer(inputs=_inputs()))
    # raise_on_error=False: the error is the response's
    (response,) = list(server.model("add_sub").infer(
        inputs={"INPUT0": np.zeros((1, 3), np.float32)}, raise_on_error=False))
    assert isinstance(response.error, tritonserver.InvalidArgumentError)
    assert response.final


def test_frontends_serve_real_clients(server: tritonserver.Server) -> None:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    http = tritonfrontend.KServeHttp(server, tritonfrontend.KServeHttp.Options(
        address="127.0.0.1", port=http_port))
    grpc = tritonfrontend.KServeGrpc(server, tritonfrontend.KServeGrpc.Options(
        address="127.0.0.1", port=grpc_port))
    metrics = tritonfrontend.Metrics(server, tritonfrontend.Metrics.Options(
        address="127.0.0.1", port=metrics_port))
    for service in (http, grpc, metrics):
        service.start()
    try:
        with pytest.raises(tritonserver.AlreadyExistsError, match="server is already running"):
            http.start()
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(_inputs()["INPUT0"])
        one = httpclient.InferInput("INPUT1", [1, 16], "FP32")
        one.set_data_from_numpy(_inputs()["INPUT1"])
        result = client.infer("add_sub", [inp, one])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), _inputs()["INPUT0"] - 1)
        client.close()
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as g:
            assert g.is_server_ready()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                    timeout=10) as r:
            assert b"nv_inference_count" in r.read()
    finally:
        for service in (http, grpc, metrics):
            service.stop()
    with pytest.raises(urllib.error.URLError, match="refused"):  # closed once stop() returns
        urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/live", timeout=5)
    http.start()  # and may be opened again
    http.stop()


def test_frontend_options_are_checked(server: tritonserver.Server) -> None:
    for bad in ({"port": -15}, {"thread_count": 0}, {"header_forward_pattern": 10}):
        with pytest.raises((TypeError, ValueError)):
            tritonfrontend.KServeHttp.Options(**bad)
    with pytest.raises((TypeError, ValueError)):
        tritonfrontend.KServeGrpc.Options(infer_allocation_pool_size="big pool")
    with pytest.raises((TypeError, ValueError)):
        tritonfrontend.KServeGrpc.Options(keepalive_time_ms=-1)
    tritonfrontend.KServeGrpc.Options(
        infer_compression_level=tritonfrontend.KServeGrpc.Grpc_compression_level.HIGH)
    with pytest.raises(tritonserver.InvalidArgumentError, match="Incorrect type for options"):
        tritonfrontend.KServeHttp(server, {"port": 8001})  # type: ignore[arg-type]


def test_explicit_mode_load_with_a_configuration(tmp_path: Path) -> None:
    make_models.write_add_sub(tmp_path, max_batch_size=8)
    server = tritonserver.Server(
        model_repository=str(tmp_path),
        model_control_mode=tritonserver.ModelControlMode.EXPLICIT).start(wait_until_ready=True)
    try:
        assert not server.model("add_sub").ready()
        model = server.load("add_sub", {"config": json.dumps({"max_batch_size": 4})})
        assert model.ready() and model.config()["max_batch_size"] == 4
        server.unload("add_sub", wait_until_unloaded=True, timeout=30)
        assert not server.model("add_sub").ready()
        # a model whose files come with the load, as Triton's API takes them
        onnx_bytes = (tmp_path / "add_sub" / "1" / "model.onnx").read_bytes()
        config = {"backend": "onnxruntime", "max_batch_size": 8}
        uploaded = server.load("uploaded", {"config": json.dumps(config),
                                            "file:1/model.onnx": onnx_bytes})
        assert uploaded.ready()
        (response,) = list(uploaded.infer(inputs=_inputs()))
        np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT1"]),
                                      _inputs()["INPUT0"] - 1)
        # one more repository, one of its folders under another name
        extra = tmp_path.parent / f"{tmp_path.name}-extra"
        make_models.write_add_sub(extra, max_batch_size=8, name="adder")
        server.register_model_repository(str(extra), {"adder": "renamed"})
        assert server.load("renamed").ready()
        (response,) = list(server.model("renamed").infer(inputs=_inputs()))
        assert response.error is None
        server.unload("renamed", wait_until_unloaded=True, timeout=30)
        server.unregister_model_repository(str(extra))
        with pytest.raises(tritonserver.TritonError):
            server.load("renamed")
    finally:
        server.stop()
    with pytest.raises(tritonserver.UnavailableError):
        server.ready() or server.model("add_sub").ready()
    assert sys.modules["tritonserver"] is tritonserver


def test_custom_metrics_appear_in_the_servers_metrics(server: tritonserver.Server) -> None:
    requests = tritonserver.MetricFamily(tritonserver.MetricKind.COUNTER, "app_requests_total",
                                         "requests the application made")
    depth = tritonserver.MetricFamily(tritonserver.MetricKind.GAUGE, "app_queue_depth",
                                      "items waiting")
    latency = tritonserver.MetricFamily(tritonserver.MetricKind.HISTOGRAM, "app_latency_ms",
                                        "latency")
    counter = tritonserver.Metric(requests, {"route": "a"})
    counter.increment(2)
    counter.increment(1.5)
    assert counter.value == 3.5 and counter.kind == tritonserver.MetricKind.COUNTER
    gauge = tritonserver.Metric(depth)
    gauge.set_value(7)
    tritonserver.Metric(latency, {"route": "a"}, buckets=[1.0, 10.0]).observe(4.0)
    text = server.metrics()
    assert 'app_requests_total{route="a"} 3.5' in text
    assert "app_queue_depth 7" in text
    assert 'app_latency_ms_bucket{route="a",le="10"} 1' in text
    # Options.metrics (on by default): Triton's CPU figures, with no metrics port opened
    assert "nv_cpu_utilization " in text and "nv_cpu_memory_total_bytes " in text
    with pytest.raises(tritonserver.InvalidArgumentError):
        counter.increment(-1)  # a counter only increases
    with pytest.raises(tritonserver.InvalidArgumentError):
        counter.set_value(1)
    with pytest.raises(tritonserver.AlreadyExistsError):
        tritonserver.MetricFamily(tritonserver.MetricKind.GAUGE, "app_requests_total", "x")

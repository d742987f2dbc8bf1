"""The dynamic batcher end to end: concurrent tritonclient requests get batched (execution
count below inference count) and each gets its own correct answer; statistics in Triton's
shape over HTTP and gRPC; queue policy errors as Triton sends them."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e


def _mlp_inputs(i: int, rows: int = 1) -> tuple[list[httpclient.InferInput], np.ndarray]:
    x = np.random.default_rng(i).standard_normal((rows, 784)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [rows, 784], "FP32")
    inp.set_data_from_numpy(x)
    return [inp], x


def test_concurrent_requests_are_batched(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url, concurrency=32)
    # reference answers from the unbatched model, one request at a time
    expected = {}
    for i in range(48):
        inputs, _ = _mlp_inputs(i, 1 + i % 2)
        expected[i] = client.infer("mlp", inputs).as_numpy("OUTPUT0")
    before = client.get_inference_statistics("mlp_batched")["model_stats"][0]
    handles = {i: client.async_infer("mlp_batched", _mlp_inputs(i, 1 + i % 2)[0])
               for i in range(48)}
    for i, handle in handles.items():
        np.testing.assert_allclose(handle.get_result().as_numpy("OUTPUT0"), expected[i],
                                   rtol=1e-4, atol=1e-5)
    after = client.get_inference_statistics("mlp_batched")["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == sum(1 + i % 2 for i in range(48))
    assert executions < inferences  # requests shared model executions
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"][
        "count"] == 48
    assert any(b["batch_size"] > 2 for b in after["batch_stats"])
    client.close()


def test_statistics_shape_matches_triton(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    inputs, _ = _mlp_inputs(1)
    client.infer("mlp", inputs)
    stats = client.get_inference_statistics("mlp")
    entry = stats["model_stats"][0]
    assert set(entry) == {"name", "version", "last_inference", "inference_count",
                          "execution_count", "inference_stats", "response_stats",
                          "batch_stats", "memory_usage"}
    assert entry["name"] == "mlp" and entry["version"] == "1"
    assert set(entry["inference_stats"]) == {"success", "fail", "queue", "compute_input",
                                             "compute_infer", "compute_output", "cache_hit",
                                             "cache_miss"}
    assert entry["inference_stats"]["success"]["count"] >= 1
    assert entry["inference_stats"]["queue"]["count"] == entry["inference_stats"]["success"]["count"]
    everything = client.get_inference_statistics()
    names = {s["name"] for s in everything["model_stats"]}
    assert {"mlp", "add_sub", "mlp_batched"} <= names
    one_version = client.get_inference_statistics("mlp", "1")["model_stats"]
    assert len(one_version) == 1
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    g = grpc.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    assert g["name"] == "mlp" and int(g["inference_count"]) >= 1


def test_priority_and_timeout_parameters(server: ServerProcess) -> None:
    """identity_priority: batching delay 0.3 s, queue timeout 5 s that a request may shorten,
    two priority levels, at most 4 queued requests per level."""
    client = httpclient.InferenceServerClient(server.url, concurrency=8)
    inp = httpclient.InferInput("INPUT0", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[7]], dtype=np.int32))
    # a lone request waits out the batching delay and succeeds, at either priority
    assert client.infer("identity_priority", [inp]).as_numpy("OUTPUT0").tolist() == [[7]]
    assert client.infer("identity_priority", [inp], priority=1).as_numpy("OUTPUT0").tolist() == [[7]]
    # with its own 50 ms timeout (shorter than the default, so allowed) it expires first
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity_priority", [inp], timeout=50_000)
    assert err.value.status() == "503" and err.value.message() == "Request timeout expired"
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    g_inp = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    g_inp.set_data_from_numpy(np.array([[7]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as err:
        grpc.infer("identity_priority", [g_inp], priority=2, timeout=50_000)
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert err.value.message() == "Request timeout expired"
    assert grpc.infer("identity_priority", [g_inp], priority=1).as_numpy("OUTPUT0").tolist() == [[7]]
    client.close()


def test_full_queue_rejects(server: ServerProcess) -> None:
    """A burst of 10 requests at one level: a batch of 8 never forms from 4 queued requests,
    so the others are refused with Triton's message while the 4 wait out the delay."""
    client = httpclient.InferenceServerClient(server.url, concurrency=10)
    inp = httpclient.InferInput("INPUT0", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    handles = [client.async_infer("identity_priority", [inp], priority=2) for _ in range(10)]
    ok, full = 0, 0
    for h in handles:
        try:
            assert h.get_result().as_numpy("OUTPUT0").tolist() == [[1]]
            ok += 1
        except InferenceServerException as exc:  # some of a burst are refused
            assert exc.status() == "503"  # noqa: PT017
            assert "Exceeds maximum queue size" in exc.message()  # noqa: PT017
            full += 1
    assert full >= 1 and ok + full == 10 and ok >= 4
    client.close()


def test_client_disconnect_removes_queued_request(server: ServerProcess) -> None:
    """A client that hangs up while its request waits for a batch: the request leaves the
    queue without running (counted as a failed, cancelled request)."""
    import json
    import socket
    import time

    client = httpclient.InferenceServerClient(server.url)
    before = client.get_inference_statistics("identity_priority")["model_stats"][0]
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "INT32",
                                   "data": [5]}]}).encode()
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v2/models/identity_priority/infer HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.05)  # queued: the batching delay is 0.3 s
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        after = client.get_inference_statistics("identity_priority")["model_stats"][0]
        if after["inference_stats"]["fail"]["count"] > before["inference_stats"]["fail"]["count"]:
            break
        time.sleep(0.05)
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"] + 1
    assert after["execution_count"] == before["execution_count"]  # it never ran
    assert after["inference_count"] == before["inference_count"]
    client.close()

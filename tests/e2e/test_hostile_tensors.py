"""Hostile tensors against a running server: each once crashed the process or made it
allocate on a client's word. Every request here is refused with a clear error (or fails
cleanly), the server stays live, and a well-formed request still works afterwards.

Triggers (issue 21): a JSON input whose shape holds a zero and a huge dimension; a BYTES
input declaring ~2**62 elements in a ~124-byte binary request; a 113-byte BYTES request
that made the server fill a 256 MB array before refusing it (checked by the server's peak
RSS, ``VmHWM``, reset before the request); the same over gRPC; a client that shrinks its
registered shared-memory region while a request that uses it is queued (a SIGBUS before).
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import gevent
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, make_models, running_server
from tests.shm_client import system_shm as shm

pytestmark = pytest.mark.e2e

PAGE = 4096
SLOW_DELAY_US = 8_000_000  # slow_add_sub holds a lone request this long, waiting for a batch
A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 2.0, np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("hostile_repo")
    make_models.write_add_sub(repo)
    make_models.write_string_identity(repo)
    io = [("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])]
    out = [("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])]
    make_models.write_model(
        repo, "slow_add_sub", make_models.build_add_sub(),
        make_models.config_text("slow_add_sub", io, out, 8,
                                "dynamic_batching { preferred_batch_size: [ 8 ] "
                                f"max_queue_delay_microseconds: {SLOW_DELAY_US} }}\n"))
    # the shared-memory tests below register regions: Triton's --allow-client-shm
    with running_server(repo, "--allow-client-shm=true",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def _post(server: ServerProcess, model: str, body: bytes,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def _binary(inputs: list[tuple[str, list[int], str, bytes]]) -> tuple[bytes, dict[str, str]]:
    head = json.dumps({"inputs": [
        {"name": n, "shape": s, "datatype": d, "parameters": {"binary_data_size": len(b)}}
        for n, s, d, b in inputs]}, separators=(",", ":")).encode()
    return head + b"".join(b for *_, b in inputs), {"Inference-Header-Content-Length": str(len(head))}


def _assert_alive_and_serving(server: ServerProcess) -> None:
    assert server.proc.poll() is None, server.log()
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert client.is_server_live()
        a = httpclient.InferInput("INPUT0", [1, 16], "FP32").set_data_from_numpy(A)
        b = httpclient.InferInput("INPUT1", [1, 16], "FP32").set_data_from_numpy(B)
        np.testing.assert_array_equal(client.infer("add_sub", [a, b]).as_numpy("OUTPUT0"), A + B)
    finally:
        client.close()


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _reset_peak_rss(pid: int) -> None:
    """Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


# -- HTTP -------------------------------------------------------------------------------------


DEEP = 250_000  # L0_http's test_repository_index_deeply_nested_json


def _deep(value: str) -> str:
    return "[" * DEEP + value + "]" * DEEP


def test_deeply_nested_json_bodies_get_tritons_answers(server: ServerProcess) -> None:
    """A body nested 250,000 deep parses (Triton's RapidJSON does, and orjson 3.8 killed the
    server somewhere past 100,000 levels) and is answered as Triton answers it."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    try:
        conn.request("POST", "/v2/repository/index", body='{"ready":' + _deep("true") + "}",
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 400
    assert answer == {"error": "Invalid value for 'ready': expected a boolean"}
    # the same depth as tensor data: Triton's limit on a tensor's nesting
    body = ('{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":'
            + _deep("1.0") + '},{"name":"INPUT1","shape":[1,16],"datatype":"FP32","data":[0]}]}')
    status, answer = _post(server, "add_sub", body.encode())
    assert status == 400, answer
    assert answer["error"] == "JSON nesting depth exceeds maximum allowed limit (100)"
    # deep and broken: a parse error (500: Triton's JSON parse errors are INTERNAL)
    status, answer = _post(server, "add_sub", ('{"inputs":' + "[" * DEEP).encode())
    assert status == 500, answer
    assert str(answer["error"]).startswith("failed to parse the request JSON buffer: Expecting value")
    _assert_alive_and_serving(server)


def test_json_shape_with_a_zero_and_a_huge_dimension(server: ServerProcess) -> None:
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [0, 2**62, 4], "datatype": "FP32", "data": []},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}).encode()
    status, answer = _post(server, "add_sub", body)
    assert status == 400, answer
    assert "unexpected shape for input 'INPUT0' for model 'add_sub'" in str(answer["error"])
    # a BYTES input, and the largest dimension JSON can carry, likewise
    for shape, dtype in (([0, 2**62, 4], "BYTES"), ([0, 2**64 - 1], "FP32"), ([1] * 65, "FP32")):
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": dtype,
                                       "data": [] if 0 in shape else [1.0]}]}).encode()
        status, answer = _post(server, "add_sub", body)
        assert status in (400, 500), answer  # Triton answers an unsigned overflow 500
        assert "error" in answer
    _assert_alive_and_serving(server)


@pytest.mark.parametrize("count", [2**62, 2**60, 2**40])
def test_binary_bytes_input_declaring_huge_counts(server: ServerProcess, count: int) -> None:
    body, headers = _binary([("INPUT0", [1, count], "BYTES", b"\0\0\0\0")])
    assert len(body) < 160
    status, answer = _post(server, "string_identity", body, headers)
    assert status == 400, answer
    assert "INPUT0" in str(answer["error"])
    _assert_alive_and_serving(server)


def test_small_bytes_request_allocates_nothing_on_its_word(server: ServerProcess) -> None:
    """2**25 declared strings (a 256 MB array of references) in about 113 bytes."""
    body, headers = _binary([("INPUT0", [1, 2**25], "BYTES", b"\0\0\0\0")])
    assert len(body) <= 120
    pid = server.proc.pid
    _reset_peak_rss(pid)
    before = _peak_rss_kib(pid)
    status, answer = _post(server, "string_identity", body, headers)
    grew_mib = (_peak_rss_kib(pid) - before) / 1024
    assert status == 400, answer
    assert grew_mib < 64, f"peak RSS grew by {grew_mib:.0f} MiB for a refused 113-byte request"
    assert ("expected 33554432 string elements for inference input 'INPUT0' for model "
            "'string_identity', got 1") in str(answer["error"])
    _assert_alive_and_serving(server)


# -- gRPC -------------------------------------------------------------------------------------


def _grpc_infer(server: ServerProcess, message: service_pb2.ModelInferRequest) -> grpc.RpcError:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                   response_deserializer=service_pb2.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as info:
            call(message, timeout=60)
    return info.value  # type: ignore[return-value]


def _request(model: str, shape: list[int], datatype: str, raw: bytes | None = None,
             strings: list[bytes] | None = None) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name=model)
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    if strings is not None:
        tensor.contents.bytes_contents.extend(strings)
    if raw is not None:
        message.raw_input_contents.append(raw)
    return message


def test_grpc_hostile_shapes_are_refused(server: ServerProcess) -> None:
    cases = [
        _request("add_sub", [0, 2**62, 4], "FP32", raw=b""),
        _request("string_identity", [1, 2**62 - 1], "BYTES", raw=b"\0\0\0\0"),
        _request("string_identity", [1, 2**60], "BYTES", raw=b"\0\0\0\0"),
        _request("string_identity", [1, 2**60], "BYTES", strings=[b"a"]),
        _request("add_sub", [2**31, 2**31, 2**31], "FP32", raw=b"\0" * 64),
    ]
    for message in cases:
        error = _grpc_infer(server, message)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert "INPUT0" in (error.details() or "")
    _assert_alive_and_serving(server)


def test_grpc_small_bytes_request_allocates_nothing_on_its_word(server: ServerProcess) -> None:
    message = _request("string_identity", [1, 2**25], "BYTES", raw=b"\0\0\0\0")
    assert len(message.SerializeToString()) < 64
    pid = server.proc.pid
    _reset_peak_rss(pid)
    before = _peak_rss_kib(pid)
    error = _grpc_infer(server, message)
    grew_mib = (_peak_rss_kib(pid) - before) / 1024
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected 33554432 string elements" in (error.details() or "")
    assert grew_mib < 64, f"peak RSS grew by {grew_mib:.0f} MiB for a refused gRPC request"
    _assert_alive_and_serving(server)


# -- shared memory shrunk under a queued request ---------------------------------------------


def _pending(server: ServerProcess, model: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _wait_pending(server: ServerProcess, model: str) -> None:
    """Until the model's queue holds the request (a condition, not a duration). The sleep
    is gevent's: tritonclient.http sends from a greenlet, which runs only while this one
    yields to gevent's hub."""
    for _ in range(600):
        if _pending(server, model) >= 1:
            return
        gevent.sleep(0.01)
    raise AssertionError(f"no request ever pending for {model}")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_region_shrunk_while_a_request_is_queued(server: ServerProcess, protocol: str) -> None:
    tag = uuid.uuid4().hex[:8]
    name, key = f"shrink_{protocol}_{tag}", f"/nursery_test_shrink_{protocol}_{tag}"
    # the tensors sit on pages of their own: once the object is cut to 32 bytes, touching
    # them through a mapping is a SIGBUS (within the last page it would read zeros)
    handle = shm.create_shared_memory_region(name, key, 4 * PAGE)
    try:
        shm.set_shared_memory_region(handle, [A], offset=PAGE)
        shm.set_shared_memory_region(handle, [B], offset=2 * PAGE)
        if protocol == "http":
            client: object = httpclient.InferenceServerClient(server.url, concurrency=2)
            mod = httpclient
        else:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            mod = grpcclient  # type: ignore[assignment]
        client.register_system_shared_memory(name, key, 4 * PAGE)  # type: ignore[attr-defined]
        a = mod.InferInput("INPUT0", [1, 16], "FP32")
        a.set_shared_memory(name, 64, PAGE)
        b = mod.InferInput("INPUT1", [1, 16], "FP32")
        b.set_shared_memory(name, 64, 2 * PAGE)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(name, 64, 3 * PAGE)
        results: list[object] = []
        if protocol == "http":
            pending = client.async_infer("slow_add_sub", [a, b], outputs=[out])  # type: ignore[attr-defined]
        else:
            client.async_infer("slow_add_sub", [a, b],  # type: ignore[attr-defined]
                               lambda result, error: results.append(error or result),
                               outputs=[out])
        _wait_pending(server, "slow_add_sub")
        fd = os.open(f"/dev/shm/{key.lstrip('/')}", os.O_RDWR)
        try:
            os.ftruncate(fd, 32)  # the owner shrinks the region under the queued request
        finally:
            os.close(fd)
        if protocol == "http":
            with pytest.raises(InferenceServerException) as info:
                pending.get_result()
            error = info.value
        else:
            for _ in range(1200):  # the answer comes when the batcher's delay ends
                if results:
                    break
                time.sleep(0.05)
            error = results[0]  # type: ignore[assignment]
            assert isinstance(error, InferenceServerException), error
        assert f"shared memory region '{name}'" in error.message(), error.message()
        assert "now holds 32 bytes" in error.message()
        client.unregister_system_shared_memory(name)  # type: ignore[attr-defined]
        client.close()  # type: ignore[attr-defined]
    finally:
        shm.destroy_shared_memory_region(handle)
    _assert_alive_and_serving(server)


def test_registrations_are_capped_and_leak_no_descriptor(server: ServerProcess) -> None:
    """Registering regions until the server's cap refuses the next one; registering a
    taken name again, and unregistering, leave the server's descriptor count where it was."""
    from nursery.shm.system import MAX_REGIONS

    tag = uuid.uuid4().hex[:8]
    key = f"/nursery_test_cap_{tag}"
    handle = shm.create_shared_memory_region(f"cap_{tag}", key, 64)
    client = httpclient.InferenceServerClient(server.url)
    fds = Path(f"/proc/{server.proc.pid}/fd")
    try:
        assert client.is_server_live()  # this client's connection is open from here on
        before = len(list(fds.iterdir()))
        for i in range(MAX_REGIONS):
            client.register_system_shared_memory(f"cap_{tag}_{i}", key, 64)
        with pytest.raises(InferenceServerException) as info:
            client.register_system_shared_memory(f"cap_{tag}_over", key, 64)
        assert "failed to register shared memory region" in info.value.message()
        assert f"holds {MAX_REGIONS} regions, its limit" in info.value.message()
        for _ in range(20):  # a name already registered is refused before anything is opened
            with pytest.raises(InferenceServerException, match="already in manager"):
                client.register_system_shared_memory(f"cap_{tag}_0", key, 64)
        assert len(list(fds.iterdir())) == before + MAX_REGIONS
        client.unregister_system_shared_memory()
        assert len(list(fds.iterdir())) == before
    finally:
        client.unregister_system_shared_memory()
        client.close()
        shm.destroy_shared_memory_region(handle)
    _assert_alive_and_serving(server)

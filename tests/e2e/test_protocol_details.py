"""Issue 22's protocol details on the wire, against Triton's behaviour (src/http_server.cc,
core's infer_request.cc, qa/L0_http/http_input_size_limit_test.py)."""

from __future__ import annotations

import json
import queue
import shutil
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, make_models

pytestmark = pytest.mark.e2e

INPUT_LIMIT = 4096  # --http-max-input-size
BODY_CAP = 256 * 1024  # --http-max-body-size


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    make_models.write_add_sub(repo)
    make_models.write_model(repo, "wide", make_models.build_identity("FP32", ["batch", "n"]),
                            make_models.config_text("wide", [("INPUT0", "FP32", [-1])],
                                                    [("OUTPUT0", "FP32", [-1])], 4))
    make_models.write_model(repo, "raw", make_models.build_identity("UINT8", ["n"]),
                            make_models.config_text("raw", [("INPUT0", "UINT8", [-1])],
                                                    [("OUTPUT0", "UINT8", [-1])], 0))
    for name in ("py_error", "py_string_identity"):
        shutil.copytree(ROOT / "tests" / "models" / name, repo / name)
        (repo / name / "1").mkdir(exist_ok=True)
    proc = ServerProcess(repo, f"--http-max-input-size={INPUT_LIMIT}",
                         f"--http-max-body-size={BODY_CAP}",
                         log_path=tmp_path_factory.mktemp("log") / "server.log")
    proc.wait_ready()
    yield proc  # type: ignore[misc]
    proc.stop()


def _post(server: ServerProcess, path: str, body: bytes, headers: dict[str, str],
          send_body: bool = True) -> tuple[int, bytes]:
    """One request on a raw socket; ``send_body=False`` sends the head only (a server that
    refuses by Content-Length answers without waiting for the body)."""
    host, port = server.url.split(":")
    length = headers.pop("Content-Length", str(len(body)))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head.encode() + (body if send_body else b""))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        top, _, rest = data.partition(b"\r\n\r\n")
        length = int(top.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
    return int(top.split(b" ")[1]), rest


def _wide_input(n: int, binary: bool) -> httpclient.InferInput:
    x = httpclient.InferInput("INPUT0", [1, n], "FP32")
    x.set_data_from_numpy(np.arange(n, dtype=np.float32).reshape(1, n), binary_data=binary)
    return x


# -- 1. --http-max-input-size bounds the JSON header only -------------------------------------

def test_binary_tensor_data_past_the_input_size_is_accepted(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    n = 16 * 1024  # 64 KiB of binary data, 16 times the input size
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    result = client.infer("wide", [_wide_input(n, True)], outputs=[out])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], np.arange(n, dtype=np.float32))


def test_json_data_past_the_input_size_is_refused(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException,
                       match="exceeds the maximum allowed input size") as err:
        client.infer("wide", [_wide_input(2048, False)])
    assert err.value.status() == "400"


def test_a_json_header_past_the_input_size_is_refused(server: ServerProcess) -> None:
    head = json.dumps({"id": "x" * INPUT_LIMIT, "inputs": [
        {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
         "parameters": {"binary_data_size": 16}}]}).encode()
    status, body = _post(server, "/v2/models/wide/infer", head + bytes(16),
                         {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400
    assert json.loads(body)["error"] == (
        f"request JSON size of {len(head)} bytes exceeds the maximum allowed input size of "
        f"{INPUT_LIMIT} bytes. Use --http-max-input-size to increase the limit.")


def test_a_whole_json_body_past_the_input_size_is_refused_unread(server: ServerProcess) -> None:
    status, body = _post(server, "/v2/models/wide/infer", b"",
                         {"Content-Length": str(INPUT_LIMIT + 1)}, send_body=False)
    assert status == 400 and b"Use --http-max-input-size" in body


def test_a_body_past_the_hard_cap_is_refused_unread(server: ServerProcess) -> None:
    for declared in (BODY_CAP + 1, 2**40):
        status, body = _post(server, "/v2/models/wide/infer", b"",
                             {"Content-Length": str(declared),
                              "Inference-Header-Content-Length": "100"}, send_body=False)
        assert status == 400
        assert json.loads(body)["error"] == (
            f"Request body size of {declared} bytes exceeds the maximum allowed body size of "
            f"{BODY_CAP} bytes. Use --http-max-body-size to increase the limit.")


def test_a_client_that_writes_its_whole_body_first_gets_the_refusal(
        server: ServerProcess) -> None:
    """tritonclient's HTTP client sends the whole body before it reads: the server answers a
    body past its cap unread, then reads and drops the rest, so the client gets the 400
    (Triton's L0_large_payload: its 3 GB request must fail with InferenceServerException, not
    a connection reset)."""
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    big = np.zeros((1, 4 * 1024 * 1024), np.float32)  # 16 MiB: far past the socket buffers
    tensor = httpclient.InferInput("INPUT0", list(big.shape), "FP32")
    tensor.set_data_from_numpy(big, binary_data=True)
    with pytest.raises(InferenceServerException, match="exceeds the maximum allowed body size"):
        client.infer("wide", [tensor])
    small = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    small.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert client.infer("wide", [small]).as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
    client.close()


def test_a_raw_binary_body_past_the_input_size_is_refused(server: ServerProcess) -> None:
    ok, _ = _post(server, "/v2/models/raw/infer", bytes(INPUT_LIMIT),
                  {"Inference-Header-Content-Length": "0"})
    assert ok == 200
    status, body = _post(server, "/v2/models/raw/infer", bytes(INPUT_LIMIT + 1),
                         {"Inference-Header-Content-Length": "0"})
    assert status == 400
    assert json.loads(body)["error"] == (
        f"Raw input has a byte_size ({INPUT_LIMIT + 1} bytes) that exceeds the maximum allowed "
        f"value of {INPUT_LIMIT} bytes. Use --http-max-input-size to increase the limit.")


def test_other_routes_keep_the_input_size(server: ServerProcess) -> None:
    status, body = _post(server, "/v2/repository/index", b"{}" + b" " * INPUT_LIMIT,
                         {"Inference-Header-Content-Length": "2"})
    assert status == 400 and b"Use --http-max-input-size" in body


# -- 2. BYTES outputs that are not UTF-8, as JSON -----------------------------------------------

def test_non_utf8_bytes_as_json_travel_unchanged(server: ServerProcess) -> None:
    """Triton (rapidjson, unvalidated) answers 200 with the element's bytes in the JSON string."""
    element = b"caf\xe9 \xff"
    blob = len(element).to_bytes(4, "little") + element
    head = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(blob)}}],
                       "outputs": [{"name": "OUTPUT0"}]}).encode()
    status, body = _post(server, "/v2/models/py_string_identity/infer", head + blob,
                         {"Inference-Header-Content-Length": str(len(head))})
    assert status == 200
    assert b'"data":["caf\xe9 \xff"]' in body
    client = httpclient.InferenceServerClient(server.url)  # and UTF-8 text is untouched
    x = httpclient.InferInput("INPUT0", [1, 1], "BYTES")
    x.set_data_from_numpy(np.array([["ünï".encode()]], dtype=object), binary_data=False)
    out = client.infer("py_string_identity", [x],
                       outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    assert out.as_numpy("OUTPUT0").reshape(-1).tolist() == ["ünï"]  # JSON text: str


# -- 3. duplicate requested outputs -----------------------------------------------------------

def _add_sub_http() -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for x in inputs:
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
    return inputs


def test_duplicate_outputs_are_refused_over_http(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0") for _ in range(2)]
    with pytest.raises(InferenceServerException,
                       match=r"\[request id: <id_unknown>\] output 'OUTPUT0' already exists in "
                             "request") as err:
        client.infer("add_sub", _add_sub_http(), outputs=outputs)
    assert err.value.status() == "400"
    assert client.is_server_live()


def test_duplicate_outputs_are_refused_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for x in inputs:
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0") for _ in range(2)]
    with pytest.raises(InferenceServerException,
                       match=r"\[request id: r1\] output 'OUTPUT0' already exists in request") as err:
        client.infer("add_sub", inputs, outputs=outputs, request_id="r1")
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    result = client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2, np.float32))


# -- 4. an inputs element that is not an object -----------------------------------------------

@pytest.mark.parametrize("body", [b'{"inputs": [5]}', b'{"inputs": [null]}', b'{"inputs": [[]]}',
                                  b'{"inputs": ["INPUT0"]}', b'{"inputs": [{}]}'])
def test_an_input_that_is_not_an_object_is_400(server: ServerProcess, body: bytes) -> None:
    status, reply = _post(server, "/v2/models/add_sub/infer", body, {})
    assert status == 400
    assert json.loads(reply)["error"].endswith("But no field is set")


# -- 8. the triton_grpc_error stream header ---------------------------------------------------

def _stream(server: ServerProcess, headers: dict[str, str] | None
            ) -> tuple[grpcclient.InferenceServerClient, queue.Queue[Any]]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)),
                        headers=headers)
    return client, answers


def _send(client: grpcclient.InferenceServerClient, model: str, value: int) -> None:
    x = grpcclient.InferInput("INPUT0", [1], "INT32")
    x.set_data_from_numpy(np.array([value], np.int32))
    client.async_stream_infer(model, [x])


def test_without_the_header_errors_stay_in_band(server: ServerProcess) -> None:
    client, answers = _stream(server, None)
    try:
        _send(client, "py_error", 1)
        result, error = answers.get(timeout=30)
        assert result is None and error.message() == "one is refused" and error.status() is None
        _send(client, "py_error", 5)
        result, error = answers.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [5]
    finally:
        client.stop_stream()


def test_with_the_header_a_failed_request_ends_the_stream_with_its_status(
        server: ServerProcess) -> None:
    client, answers = _stream(server, {"triton_grpc_error": "true"})
    try:
        _send(client, "py_error", 5)
        result, error = answers.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [5]
        # refused when issued (unknown model): still answered in-band, the stream goes on
        _send(client, "nope", 5)
        result, error = answers.get(timeout=30)
        assert result is None and error.status() is None
        assert "Request for unknown model: 'nope'" in error.message()
        # failed once issued (the model's error): gRPC status, then the stream is closed
        _send(client, "py_error", 1)
        result, error = answers.get(timeout=30)
        assert result is None
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert error.message() == "one is refused"
        with pytest.raises(queue.Empty):
            answers.get(timeout=1)
    finally:
        client.stop_stream()
    # the server and other streams are unaffected
    other, answers = _stream(server, {"triton_grpc_error": "false"})
    try:
        _send(other, "py_error", 1)
        assert answers.get(timeout=30)[1].status() is None  # only "true" turns the mode on
    finally:
        other.stop_stream()


# -- 7. log lines in Triton's default layout --------------------------------------------------

def test_server_log_lines_parse_as_triton_lines(server: ServerProcess) -> None:
    import re

    record = re.compile(r"[EWI]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ [\w.]+:\d+\] \".*\"")
    # a table's record (the start-up model table) has an empty message, the table on the
    # lines after it, as Triton writes its tables: "I... server.cc:631] " then "+---..."
    heading = re.compile(r"[EWI]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ [\w.]+:\d+\] ")
    all_lines = server.log().splitlines()
    lines = [x for x in all_lines if re.match(r"[EWI]\d{4} ", x)]
    assert lines
    bad = [x for n, x in enumerate(all_lines) if re.match(r"[EWI]\d{4} ", x)
           and not record.fullmatch(x)
           and not (heading.fullmatch(x) and all_lines[n + 1].startswith("+-"))]
    assert bad == []

"""The HTTP port on the wire: framing cases clients send, and both server implementations."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, make_models

pytestmark = pytest.mark.e2e

BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}]}).encode()


def _exchange(server: ServerProcess, raw: bytes, expect_responses: int = 1) -> bytes:
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(raw)
        data = b""
        while data.count(b"HTTP/1.1 ") < expect_responses or not _complete(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def _complete(data: bytes) -> bool:
    """True when the last response in ``data`` has its whole body."""
    start = data.rfind(b"HTTP/1.1 ")
    end = data.find(b"\r\n\r\n", start)
    if end < 0:
        return False
    head = data[start:end].lower()
    length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0]) if b"content-length" in head else 0
    return len(data) - (end + 4) >= length


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = tmp_path_factory.mktemp("repo")
    make_models.write_add_sub(repo)
    proc = ServerProcess(repo, log_path=tmp_path_factory.mktemp("log") / "server.log")
    proc.wait_ready()
    yield proc  # type: ignore[misc]
    assert proc.stop() == 0


def test_expect_100_continue(server: ServerProcess) -> None:
    head = (f"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n"
            "Expect: 100-continue\r\n\r\n").encode()
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(head)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(BODY)
        reply = b""
        while not _complete(reply):
            reply += s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200 OK") and b'"OUTPUT0"' in reply


def test_chunked_request(server: ServerProcess) -> None:
    chunks = [BODY[:10], BODY[10:100], BODY[100:]]
    body = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    raw = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           + body)
    assert _exchange(server, raw).startswith(b"HTTP/1.1 200 OK")


def test_pipelined_requests_answered_in_order(server: ServerProcess) -> None:
    one = (f"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n"
           "\r\n").encode() + BODY
    ready = b"GET /v2/models/add_sub/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    data = _exchange(server, one + ready + one, expect_responses=3)
    assert data.count(b"HTTP/1.1 200 OK") == 3
    first, second, third = data.split(b"HTTP/1.1 200 OK")[1:]
    assert b'"OUTPUT0"' in first and b'"OUTPUT0"' in third
    assert b"content-length: 0" in second  # the readiness answer, in its place


def test_http10_closes(server: ServerProcess) -> None:
    data = _exchange(server, b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200 OK") and b"connection: close" in data


def test_malformed_request_line(server: ServerProcess) -> None:
    data = _exchange(server, b"THIS IS NOT HTTP\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400 Bad Request")


def test_body_over_limit_refused_before_reading(server: ServerProcess) -> None:
    raw = b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n"
    data = _exchange(server, raw)
    assert data.startswith(b"HTTP/1.1 400") and b"exceeds the maximum allowed input size" in data


def test_raw_binary_request(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_model(repo, "one", make_models.build_identity("FP32", ["batch", 4]),
                            make_models.config_text("one", [("INPUT0", "FP32", [4])],
                                                    [("OUTPUT0", "FP32", [4])], 4))
    server = start_server(repo)
    payload = struct.pack("<4f", 1, 2, 3, 4)
    raw = (f"POST /v2/models/one/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 0\r\n"
           f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
    data = _exchange(server, raw)
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert data.endswith(payload)  # outputs come back binary


@pytest.mark.parametrize("impl", ["hypercorn", "nursery"])
def test_both_http_servers_match_triton(tmp_path: Path, start_server: type[ServerProcess],
                                        impl: str) -> None:
    from tests.conformance import http_cases

    repo = tmp_path / "repo"
    make_models.write_add_sub(repo, max_batch_size=64)
    make_models.write_mlp(repo, max_batch_size=64)
    server = start_server(repo, f"--http-server={impl}")
    recorded = json.loads((Path(http_cases.__file__).parent / "triton_2_51_http.json").read_text())
    for name, case in http_cases.CASES.items():
        got = http_cases.send(server.url, *case)
        assert got["status"] == recorded[name]["status"], (impl, name, got)

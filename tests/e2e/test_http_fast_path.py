"""The HTTP port's fast path for inference (``HttpServer._infer_fast``): a request is queued
with no task waiting for it and its answer is written where the model's answer is delivered.
Against a real server, with raw sockets: an answer too large for the client's window is
finished by a task while the client reads slowly, and a request pipelined behind it waits its
turn; a client that leaves while its request waits in the batcher's queue (by closing or by a
reset) has the request dropped before it runs; the server carries on throughout."""

from __future__ import annotations

import json
import socket
import struct
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, make_models
from tests.e2e.test_hostile_http import HANG
from tests.e2e.test_hostile_http import _read_response as read_response

pytestmark = pytest.mark.e2e

N = 1 << 20  # elements of the big identity tensor: a 4 MiB answer


def _infer(model: str, values: np.ndarray, binary_output: bool = True) -> bytes:
    head = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, values.size],
                                   "datatype": "FP32", "parameters": {"binary_data_size": values.nbytes}}],
                       "outputs": [{"name": "OUTPUT0",
                                    "parameters": {"binary_data": binary_output}}]}).encode()
    body = head + values.tobytes()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {len(head)}\r\n\r\n").encode() + body


def _response(s: socket.socket, buf: bytearray) -> tuple[bytes, bytes]:
    """(head, body) of one whole response; the server must not close first."""
    head, sep, body = read_response(s, buf).partition(b"\r\n\r\n")
    assert sep, "the server closed the connection"
    head = head.lower()
    assert len(body) == int(_header(head, b"content-length")), "the server closed the connection"
    return head, body


def _header(head: bytes, name: bytes) -> bytes:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key == name:
            return value.strip()
    raise AssertionError(f"no {name!r} in {head!r}")


def _output(head: bytes, body: bytes) -> np.ndarray:
    json_len = int(_header(head, b"inference-header-content-length"))
    return np.frombuffer(body[json_len:], dtype=np.float32)


def _stats(server: ServerProcess, model: str) -> dict:
    with urllib.request.urlopen(f"http://{server.url}/v2/models/{model}/stats", timeout=10) as r:
        return json.load(r)["model_stats"][0]


def fast_path_repo(repo: Path) -> Path:
    """``big`` (an identity of any size) and ``slow`` (its batcher holds a lone request)."""
    make_models.write_model(
        repo, "big", make_models.build_identity("FP32", ["batch", "n"]),
        make_models.config_text("big", [("INPUT0", "FP32", [-1])], [("OUTPUT0", "FP32", [-1])], 8))
    # a batcher that holds a lone request for 3 s: long enough for its client to leave
    make_models.write_model(
        repo, "slow", make_models.build_identity("FP32", ["batch", "n"]),
        make_models.config_text("slow", [("INPUT0", "FP32", [-1])], [("OUTPUT0", "FP32", [-1])], 8,
                                "dynamic_batching { preferred_batch_size: [ 8 ] "
                                "max_queue_delay_microseconds: 3000000 }\n"))
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = fast_path_repo(tmp_path_factory.mktemp("repo"))
    proc = ServerProcess(repo, log_path=tmp_path_factory.mktemp("log") / "server.log")
    proc.wait_ready()
    yield proc  # type: ignore[misc]
    assert proc.stop() == 0


def test_an_answer_larger_than_the_window_reaches_a_slow_reader(server: ServerProcess) -> None:
    values = np.arange(N, dtype=np.float32)
    small = np.arange(4, dtype=np.float32)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=HANG) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        # the second request is pipelined behind an answer that cannot be written at once
        s.sendall(_infer("big", values) + _infer("big", small))
        time.sleep(0.5)  # the server has queued as much as the socket takes by now
        buf = bytearray()
        head, body = _response(s, buf)
        assert head.startswith(b"http/1.1 200 ok")
        assert np.array_equal(_output(head, body), values)
        head, body = _response(s, buf)
        assert head.startswith(b"http/1.1 200 ok")
        assert np.array_equal(_output(head, body), small)
        s.sendall(_infer("big", small))  # the connection goes on
        head, body = _response(s, buf)
        assert np.array_equal(_output(head, body), small)


@pytest.mark.parametrize("reset", [False, True])
def test_a_request_whose_client_left_is_dropped_unrun(server: ServerProcess, reset: bool) -> None:
    before = _stats(server, "slow")["inference_stats"]
    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=HANG)
    s.sendall(_infer("slow", np.ones(4, dtype=np.float32)))
    time.sleep(0.5)  # queued, waiting for its batch
    if reset:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    time.sleep(3.5)  # past the queue delay: had it stayed queued, it would have run
    after = _stats(server, "slow")
    assert after["execution_count"] == 0
    assert after["inference_stats"]["success"]["count"] == before["success"]["count"]
    # the server carries on, on a fresh connection
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=HANG) as s:
        s.sendall(_infer("big", np.ones(4, dtype=np.float32)))
        head, body = _response(s, bytearray())
        assert head.startswith(b"http/1.1 200 ok")

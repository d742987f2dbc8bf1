"""Hostile clients on the HTTP and metrics ports (issue 21): each one costs its own connection,
never the process, and the next client is served.

Raw sockets, because no well-behaved client sends these bytes. Deadline flags are short here
(1 s) so that the tests that wait on a deadline are quick; every wait in a test is bounded by a
generous socket timeout that only detects a hang, and no test asserts how long anything took.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

HANG = 30.0  # seconds: a socket wait longer than this is a hang, not a slow machine
READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
METRICS = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
SHORT = ("--http-head-timeout-secs", "1", "--http-body-timeout-secs", "1",
         "--http-keepalive-timeout-secs", "1")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    make_models.write_add_sub(repo)
    with running_server(repo, *SHORT, tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=HANG)


def _read_response(s: socket.socket, buf: bytearray | None = None) -> bytes:
    """One whole response (head and Content-Length body) from ``s``; b"" if it closed first.
    Bytes read past the response stay in ``buf`` for the next call."""
    data = buf if buf is not None else bytearray()
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            head = bytes(data[:end]).lower()
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name == b"content-length":
                    length = int(value)
            if len(data) >= end + 4 + length:
                response = bytes(data[: end + 4 + length])
                del data[: end + 4 + length]
                return response
        chunk = s.recv(65536)
        if not chunk:
            return bytes(data)
        data += chunk


def _closed(s: socket.socket) -> bool:
    """Read until the server closes (True) or the hang timeout passes (False)."""
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _request(port: int, raw: bytes) -> bytes:
    with _connect(port) as s:
        s.sendall(raw)
        return _read_response(s)


def _served(server: ServerProcess) -> None:
    """The process lives and answers a plain request on each port."""
    assert server.proc.poll() is None, server.log()
    assert _request(server.http_port, READY).startswith(b"HTTP/1.1 200 OK")
    reply = _request(server.metrics_port, METRICS)
    assert reply.startswith(b"HTTP/1.1 200 OK") and b"nv_" in reply


def _reset(s: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0) instead of a FIN."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_long_run_of_spaces_in_a_header_does_not_freeze(server: ServerProcess) -> None:
    """Issue 21: 'x: a' + 60,000 spaces + 'b' backtracked quadratically in the old parser
    (seconds each, the whole server frozen). Eight of them at once, then a plain client."""
    hostile = (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nx: a" + b" " * 60_000
               + b"b\r\n\r\n")
    sockets = [_connect(server.http_port) for _ in range(8)]
    try:
        for s in sockets:
            s.sendall(hostile)
        assert _request(server.http_port, READY).startswith(b"HTTP/1.1 200 OK")
        for s in sockets:
            assert _read_response(s).startswith(b"HTTP/1.1 200 OK")
    finally:
        for s in sockets:
            s.close()
    _served(server)


@pytest.mark.parametrize("port_name", ["http_port", "metrics_port"])
def test_thousands_digit_content_length(server: ServerProcess, port_name: str) -> None:
    """Issue 21: a Content-Length of thousands of digits ended the process (int() overflow);
    now a 400 on either port, and the next request is served."""
    path = b"/v2/models/add_sub/infer" if port_name == "http_port" else b"/metrics"
    raw = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 4300 + b"\r\n\r\n"
    with _connect(getattr(server, port_name)) as s:
        s.sendall(raw)
        reply = _read_response(s)
        assert reply.startswith(b"HTTP/1.1 400 Bad Request")
        assert b"Content-Length" in reply and b"connection: close" in reply
        assert _closed(s)
    _served(server)


@pytest.mark.parametrize("port_name", ["http_port", "metrics_port"])
def test_slowloris_head_is_cut_off(server: ServerProcess, port_name: str) -> None:
    """A head trickled one byte at a time never completes: the head deadline (1 s here) ends
    it with a 408 although bytes keep arriving (the old timeout was per read)."""
    port = getattr(server, port_name)
    with _connect(port) as s:
        s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        s.settimeout(0.25)  # the pace of the trickle, not an assertion
        received = b""
        for _ in range(int(4 * HANG)):  # ~HANG seconds of trickling before it counts as a hang
            try:
                s.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        else:
            pytest.fail("the trickled head was never cut off")
    assert received == b"" or received.startswith(b"HTTP/1.1 408 Request Timeout")
    _served(server)


def test_slow_body_is_cut_off(server: ServerProcess) -> None:
    with _connect(server.http_port) as s:
        s.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                  b"\r\n{\"inputs\": ")
        reply = _read_response(s)
        assert reply.startswith(b"HTTP/1.1 408 Request Timeout")
        assert _closed(s)
    _served(server)


@pytest.mark.parametrize("port_name", ["http_port", "metrics_port"])
def test_idle_keep_alive_connection_is_closed(server: ServerProcess, port_name: str) -> None:
    port = getattr(server, port_name)
    path = b"/v2/health/ready" if port_name == "http_port" else b"/metrics"
    with _connect(port) as s:
        s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(s).startswith(b"HTTP/1.1 200 OK")
        # kept alive, then idle past --http-keepalive-timeout-secs: closed without an answer
        assert s.recv(65536) == b""


def test_silent_new_connection_is_closed(server: ServerProcess) -> None:
    """A connection that never sends anything holds its slot only until the head deadline."""
    with _connect(server.http_port) as s:
        assert s.recv(65536) == b""


def test_client_reset_mid_request(server: ServerProcess) -> None:
    """Resets at every stage of a request: in the head, in the body, and after a whole
    inference request whose answer the client never reads (the gRPC port's trigger)."""
    body = (b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":' +
            str([1.0] * 16).encode() + b'},{"name":"INPUT1","shape":[1,16],"datatype":"FP32",'
            b'"data":' + str([2.0] * 16).encode() + b"}]}")
    head = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    for cut in (head[:20], head, head + body[:10], head + body, (head + body) * 20):
        s = _connect(server.http_port)
        s.sendall(cut)
        _reset(s)
    for port in (server.metrics_port,):
        s = _connect(port)
        s.sendall(METRICS[:10])
        _reset(s)
    # the server, and a keep-alive connection on it, carry on
    with _connect(server.http_port) as s:
        buf = bytearray()
        for _ in range(3):
            s.sendall(head + body)
            assert _read_response(s, buf).startswith(b"HTTP/1.1 200 OK")
    _served(server)


def test_reset_while_the_answer_is_written(server: ServerProcess) -> None:
    """Many pipelined requests, then a reset while the server is still writing the answers."""
    s = _connect(server.http_port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(METRICS.replace(b"/metrics", b"/v2/models/add_sub/config") * 200)
    s.recv(100)
    _reset(s)
    _served(server)


def _fill_and_refuse(port: int, cap: int, request: bytes) -> None:
    """Open ``cap`` kept-alive connections (each served once, so the server holds them), see
    one more refused, close one cleanly, and see the next one served."""
    held = [_connect(port) for _ in range(cap)]
    try:
        for s in held:
            s.sendall(request)
            assert _read_response(s).startswith(b"HTTP/1.1 200 OK")
        with _connect(port) as extra:
            extra.sendall(request)
            reply = _read_response(extra)
            assert reply.startswith(b"HTTP/1.1 503 Service Unavailable"), reply
            assert b"connection limit reached" in reply and b"connection: close" in reply
            assert _closed(extra)
        # a request with 'Connection: close' ends one held connection: once the client sees
        # the server close it, its slot is free (the server forgets it before closing)
        first = held.pop(0)
        first.sendall(request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert _read_response(first).startswith(b"HTTP/1.1 200 OK")
        assert _closed(first)
        first.close()
        assert _request(port, request).startswith(b"HTTP/1.1 200 OK")
        for s in held:  # the held ones were served all along
            s.sendall(request)
            assert _read_response(s).startswith(b"HTTP/1.1 200 OK")
    finally:
        for s in held:
            s.close()


def test_connection_cap_refuses_then_serves_again(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = tmp_path_factory.mktemp("repo")
    make_models.write_add_sub(repo)
    with running_server(repo, "--http-max-connections", "2", "--metrics-max-connections", "1",
                        tmp_path_factory=tmp_path_factory) as server:
        _fill_and_refuse(server.http_port, 2, READY)
        _fill_and_refuse(server.metrics_port, 1, METRICS)
        # a flood far past the cap costs the server nothing it keeps
        flood = [_connect(server.http_port) for _ in range(50)]
        for s in flood:
            s.close()
        deadline = time.monotonic() + HANG  # retry while the flood's closes are processed
        while True:
            reply = _request(server.http_port, READY)
            if reply.startswith(b"HTTP/1.1 200 OK") or time.monotonic() > deadline:
                break
        assert reply.startswith(b"HTTP/1.1 200 OK"), reply
        assert server.proc.poll() is None


def test_settings_reject_nonsense(tmp_path: Path) -> None:
    from nursery.settings import settings_from_args

    for flag in ("--http-head-timeout-secs", "--http-max-connections"):
        with pytest.raises(SystemExit):
            settings_from_args(["--model-repository", str(tmp_path), flag, "0"])
    settings = settings_from_args(["--model-repository", str(tmp_path)])
    assert settings.http_max_connections == 1000 and settings.http_head_timeout == 30.0

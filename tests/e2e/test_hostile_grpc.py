"""Hostile clients on the gRPC port (issue 21): TCP resets, a gzip bomb, idle and silent
connections, ping floods and too many connections, each against ``python -m nursery serve``
with raw sockets for the hostile bytes and NVIDIA's tritonclient.grpc to show that the server
still serves everyone else afterwards."""

from __future__ import annotations

import socket
import struct
import time
import zlib
from pathlib import Path

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from nursery.protocol.grpc.h2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    PING,
    PREFACE,
    REFUSED_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    encode_headers,
    frame,
)
from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

INFER = b"/inference.GRPCInferenceService/ModelInfer"
MAX_INPUT = 8 * 1024 * 1024  # server A's --grpc-max-input-size
RESOURCE_EXHAUSTED = 8


def _repo(repo: Path) -> Path:
    make_models.write_model(
        repo, "identity_fp32", make_models.build_identity("FP32", ["batch", "n"]),
        make_models.config_text("identity_fp32", [("INPUT0", "FP32", [-1])],
                                [("OUTPUT0", "FP32", [-1])], 8))
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    """Default clocks; an 8 MiB gRPC input limit."""
    repo = _repo(tmp_path_factory.mktemp("repo"))
    with running_server(repo, "--grpc-max-input-size", str(MAX_INPUT),
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


@pytest.fixture(scope="module")
def clocks(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    """Short clocks: idle 600 ms, handshake 600 ms, keepalive PINGs every 2 s (with or
    without calls), to be acknowledged within 300 ms; a response left unread 500 ms."""
    repo = _repo(tmp_path_factory.mktemp("repo"))
    with running_server(repo, "--grpc-idle-timeout", "600", "--grpc-handshake-timeout", "600",
                        "--grpc-keepalive-time", "2000", "--grpc-keepalive-timeout", "300",
                        "--grpc-keepalive-permit-without-calls", "true",
                        "--grpc-write-timeout", "500",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def _client(server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def _serves(server: ServerProcess) -> None:
    """The process is alive and answers a real client's inference."""
    assert server.proc.poll() is None, server.log()
    client = _client(server)
    try:
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        # a deadline: a call that cannot get a connection fails instead of waiting on
        np.testing.assert_array_equal(client.infer("identity_fp32", [inp], client_timeout=10)
                                      .as_numpy("OUTPUT0"), x)
    finally:
        client.close()  # also when the call failed: no channel left reconnecting behind


def _infer_message(n: int) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP32"
    tensor.shape.extend([1, n])
    request.raw_input_contents.append(np.ones((1, n), np.float32).tobytes())
    return request.SerializeToString()


def _call(body: bytes, stream_id: int = 1, encoding: bytes | None = None) -> bytes:
    """HEADERS and DATA frames of one unary gRPC call carrying ``body`` (prefix included)."""
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", INFER),
               (b":authority", b"127.0.0.1"), (b"content-type", b"application/grpc"),
               (b"te", b"trailers")]
    if encoding is not None:
        headers.append((b"grpc-encoding", encoding))
    out = [frame(HEADERS, END_HEADERS, stream_id, encode_headers(headers))]
    for pos in range(0, len(body), 16384):
        last = pos + 16384 >= len(body)
        out.append(frame(DATA, END_STREAM if last else 0, stream_id, body[pos:pos + 16384]))
    return b"".join(out)


def _prefixed(message: bytes, compressed: bool = False) -> bytes:
    return bytes([compressed]) + len(message).to_bytes(4, "big") + message


def _open(server: ServerProcess, hello: bytes = PREFACE + frame(SETTINGS, 0, 0)) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.grpc_port))
    if hello:
        sock.sendall(hello)
    return sock


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the kernel sends a TCP RST, not a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _frames(sock: socket.socket, timeout: float = 30.0, until: int | None = None
            ) -> list[tuple[int, int, int, bytes]]:
    """The server's frames until it closes the connection (or sends a frame of kind
    ``until``); a connection still open after ``timeout`` seconds fails the test."""
    sock.settimeout(timeout)
    data = b""
    out: list[tuple[int, int, int, bytes]] = []
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            break
        data += chunk
        while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
            length = int.from_bytes(data[:3], "big")
            out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
            data = data[9 + length:]
            if until is not None and out[-1][0] == until:
                return out
    return out


def _goaway(frames: list[tuple[int, int, int, bytes]]) -> tuple[int, bytes]:
    payloads = [f[3] for f in frames if f[0] == GOAWAY]
    assert payloads, f"no GOAWAY in {[f[0] for f in frames]}"
    return int.from_bytes(payloads[0][4:8], "big"), payloads[0][8:]


def _vm(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


# -- TCP resets --------------------------------------------------------------------------------

def test_reset_after_the_preface(server: ServerProcess) -> None:
    for hello in (PREFACE, PREFACE + frame(SETTINGS, 0, 0), PREFACE[:10]):
        sock = _open(server, hello)
        time.sleep(0.2)  # the server has read it and waits for more
        _reset(sock)
    time.sleep(0.2)
    _serves(server)


@pytest.mark.parametrize("size", [4, 900_000])
def test_reset_after_an_unread_infer_reply(server: ServerProcess, size: int) -> None:
    """The client sends a ModelInfer, never reads the reply and resets the connection: only
    that connection ends. 900 000 floats: a 3.6 MB reply, with the client's windows opened
    wide so that the server is still writing it when the reset comes."""
    wide = frame(SETTINGS, 0, 0, struct.pack(">HI", 0x4, 2**31 - 1)) \
        + frame(WINDOW_UPDATE, 0, 0, (2**31 - 1 - 65535).to_bytes(4, "big"))
    for pause in (0.0, 0.3):
        sock = _open(server, PREFACE + wide)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(_call(_prefixed(_infer_message(size))))
        time.sleep(pause)
        _reset(sock)
    time.sleep(0.3)
    _serves(server)
    assert "internal error" not in server.log()


def test_reset_in_the_middle_of_a_stream(server: ServerProcess) -> None:
    """ModelStreamInfer: requests answered but unread, one cut in half, then a reset."""
    headers = encode_headers([(b":method", b"POST"), (b":scheme", b"http"),
                              (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer"),
                              (b":authority", b"127.0.0.1"), (b"content-type", b"application/grpc"),
                              (b"te", b"trailers")])
    body = _prefixed(_infer_message(1000)) * 20
    sock = _open(server)
    sock.sendall(frame(HEADERS, END_HEADERS, 1, headers) + frame(DATA, 0, 1, body)
                 + frame(DATA, 0, 1, _prefixed(_infer_message(1000))[:100]))
    time.sleep(0.3)
    _reset(sock)
    time.sleep(0.3)
    _serves(server)
    assert "internal error" not in server.log()


# -- message size and compression ----------------------------------------------------------

def test_gzip_bomb_is_refused_without_inflating_it(server: ServerProcess) -> None:
    """256 MiB of zeros in a ~260 KB gzip message: RESOURCE_EXHAUSTED, and the server's peak
    memory does not grow by anything like the inflated size."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * (1 << 20)
    packed = b"".join(packer.compress(zeros) for _ in range(256)) + packer.flush()
    assert len(packed) < 300_000
    before = _vm(server.proc.pid, "VmHWM")
    with _open(server) as sock:
        sock.sendall(_call(_prefixed(packed, compressed=True), encoding=b"gzip"))
        frames = _frames(sock, until=HEADERS)
    after = _vm(server.proc.pid, "VmHWM")
    headers = dict(hpack.Decoder().decode(frames[-1][3]))
    assert headers["grpc-status"] == str(RESOURCE_EXHAUSTED), headers
    assert "larger than max" in headers.get("grpc-message", "")
    assert after - before < 64 * 1024 * 1024, (before, after)
    _serves(server)


def test_declared_length_over_the_limit_is_refused_before_reading(server: ServerProcess) -> None:
    """A prefix declaring 4 GiB - 1 with 16 bytes behind it: refused at once, not awaited."""
    with _open(server) as sock:
        sock.sendall(_call(b"\0\xff\xff\xff\xff" + b"\0" * 16))
        frames = _frames(sock, until=HEADERS)
    headers = dict(hpack.Decoder().decode(frames[-1][3]))
    assert headers["grpc-status"] == str(RESOURCE_EXHAUSTED), headers


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_over_the_limit(server: ServerProcess, algorithm: str) -> None:
    client = _client(server)
    x = np.zeros((1, 3 * 1024 * 1024), np.float32)  # 12 MiB inflated, a few KB compressed
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity_fp32", [inp], compression_algorithm=algorithm)
    assert "RESOURCE_EXHAUSTED" in str(err.value.status())
    small = np.ones((1, 1000), np.float32)
    inp = grpcclient.InferInput("INPUT0", list(small.shape), "FP32")
    inp.set_data_from_numpy(small)
    result = client.infer("identity_fp32", [inp], compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), small)
    client.close()


# -- pings -------------------------------------------------------------------------------------

def test_ping_flood_gets_enhance_your_calm(server: ServerProcess) -> None:
    with _open(server) as sock:
        sock.sendall(b"".join(frame(PING, 0, 0, b"%08d" % i) for i in range(6)))
        frames = _frames(sock)
    code, debug = _goaway(frames)
    assert code == ENHANCE_YOUR_CALM and debug == b"too_many_pings"
    assert sum(1 for f in frames if f[0] == PING) < 6  # not every PING was answered
    _serves(server)


# -- clocks ------------------------------------------------------------------------------------

def test_idle_connection_gets_goaway(clocks: ServerProcess) -> None:
    with _open(clocks) as sock:
        frames = _frames(sock)
    code, debug = _goaway(frames)
    assert code == NO_ERROR and debug == b"max_idle"


def test_tritonclient_reconnects_after_idle_goaway(clocks: ServerProcess) -> None:
    client = _client(clocks)
    x = np.ones((1, 3), np.float32)
    inp = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(x)
    for _ in range(2):
        np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), x)
        time.sleep(1.2)  # past the idle timeout: the server sent GOAWAY and closed
    client.close()


@pytest.mark.parametrize("hello", [b"", PREFACE[:7], PREFACE])
def test_handshake_deadline(clocks: ServerProcess, hello: bytes) -> None:
    """Silence, half a preface, or a preface with no SETTINGS: closed at the deadline."""
    with _open(clocks, hello) as sock:
        frames = _frames(sock)
    assert {f[0] for f in frames} <= {SETTINGS, WINDOW_UPDATE}  # ours once the preface came
    _serves(clocks)


def test_unanswered_keepalive_ping_closes_the_connection(clocks: ServerProcess) -> None:
    """A call whose body never comes keeps the connection busy (not idle); the keepalive PING
    that the client never acknowledges ends it."""
    with _open(clocks) as sock:
        sock.sendall(_call(_prefixed(_infer_message(4)))[:-30])  # the call, short of its end
        frames = _frames(sock)
    assert any(f[0] == PING and not f[1] & 1 for f in frames)
    assert not any(f[0] == GOAWAY for f in frames)  # closed for the timeout, not for idleness
    _serves(clocks)


def test_a_client_that_reads_nothing_is_closed(clocks: ServerProcess) -> None:
    """Two calls with 3.6 MB answers to a client with a tiny receive buffer that reads
    nothing: more than the kernel's buffers hold, so a write stalls; the connection is
    closed at the write timeout and the server serves on."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.settimeout(30)
    sock.connect(("127.0.0.1", clocks.grpc_port))
    wide = frame(SETTINGS, 0, 0, struct.pack(">HI", 0x4, 2**31 - 1)) \
        + frame(WINDOW_UPDATE, 0, 0, (2**31 - 1 - 65535).to_bytes(4, "big"))
    message = _prefixed(_infer_message(900_000))
    with sock:
        sock.sendall(PREFACE + wide + _call(message, 1) + _call(message, 3))
        for _ in range(300):  # until the server gives up on us
            if "read nothing" in clocks.log():
                break
            time.sleep(0.1)
    assert "read nothing" in clocks.log()
    _serves(clocks)


# -- the connection cap ------------------------------------------------------------------------

def test_connections_over_the_cap_are_refused(tmp_path: Path,
                                              start_server: type[ServerProcess]) -> None:
    server = start_server(_repo(tmp_path / "repo"), "--grpc-max-connections", "2")
    held = [_open(server) for _ in range(2)]
    for sock in held:
        assert _frames(sock, until=SETTINGS)[0][0] == SETTINGS  # served
    extra = [_open(server, b"") for _ in range(40)]
    for sock in extra:
        frames = _frames(sock)
        assert _goaway(frames)[0] == REFUSED_STREAM
        sock.close()
    for sock in held:
        sock.close()
    for _ in range(50):  # the held connections close on the server's side
        try:
            _serves(server)
            break
        except InferenceServerException:
            time.sleep(0.1)
    else:
        _serves(server)
    assert "refused" in server.log()

"""The lean HTTP/2 gRPC server (nursery/protocol/grpc/h2.py, grpc_lean.py) at the protocol's
edges: cancellation, deadlines, large messages through flow control, compression, unknown
methods, malformed frames (raw sockets), PING, and draining on shutdown; grpcio clients
(NVIDIA's tritonclient.grpc) and hand-written frames against ``python -m nursery serve``."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from nursery.protocol.grpc.h2 import PREFACE, frame
from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

SLOW_CONFIG = ("dynamic_batching { max_queue_delay_microseconds: 400000 }\n")


def _slow_repo(repo: Path) -> Path:
    """``slow``: an identity model whose batcher holds a lone request for 400 ms."""
    make_models.write_model(
        repo, "slow", make_models.build_identity("INT32", ["batch", 1]),
        make_models.config_text("slow", [("INPUT0", "INT32", [1])],
                                [("OUTPUT0", "INT32", [1])], 8, SLOW_CONFIG))
    make_models.write_model(
        repo, "identity_fp32", make_models.build_identity("FP32", ["batch", "n"]),
        make_models.config_text("identity_fp32", [("INPUT0", "FP32", [-1])],
                                [("OUTPUT0", "FP32", [-1])], 8))
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = _slow_repo(tmp_path_factory.mktemp("repo"))
    with running_server(repo, tmp_path_factory=tmp_path_factory) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def _slow_input(value: int = 7) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], np.int32))
    return [inp]


def _executed(client: grpcclient.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats["inference_stats"]["success"].get("count", 0))


def test_deadline_exceeded_abandons_the_request(client: grpcclient.InferenceServerClient) -> None:
    before = _executed(client, "slow")
    with pytest.raises(InferenceServerException) as err:
        client.infer("slow", _slow_input(), client_timeout=0.05)
    assert "DEADLINE_EXCEEDED" in str(err.value.status())
    time.sleep(0.6)  # past the batcher's delay: an abandoned request never runs
    assert _executed(client, "slow") == before
    assert client.infer("slow", _slow_input(3)).as_numpy("OUTPUT0")[0, 0] == 3


def test_cancelled_call_abandons_the_request(server: ServerProcess,
                                             client: grpcclient.InferenceServerClient) -> None:
    before = _executed(client, "slow")
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        # a raw ModelInferRequest for "slow" (model_name=1, inputs=5, raw_input_contents=7)
        tensor = (b"\x0a\x06INPUT0" + b"\x12\x05INT32" + b"\x1a\x02\x01\x01")
        request = b"\x0a\x04slow" + b"\x2a" + bytes([len(tensor)]) + tensor \
            + b"\x3a\x04" + struct.pack("<i", 5)
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer").future(request)
        time.sleep(0.1)
        assert call.cancel()  # RST_STREAM(CANCEL) while the request waits in the batcher
    time.sleep(0.6)
    assert _executed(client, "slow") == before
    assert client.is_server_ready()


def test_large_tensors_both_ways(client: grpcclient.InferenceServerClient) -> None:
    """24 MB each way: many DATA frames, WINDOW_UPDATEs from both sides."""
    x = np.random.default_rng(0).standard_normal((1, 6_000_000)).astype(np.float32)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("identity_fp32", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_concurrent_large_and_small_calls(client: grpcclient.InferenceServerClient) -> None:
    x = np.arange(2_000_000, dtype=np.float32).reshape(1, -1)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    results: list[object] = []
    done = threading.Event()

    def callback(result: object, error: object) -> None:
        results.append(error if error is not None else result)
        if len(results) == 6:
            done.set()

    for _ in range(3):
        client.async_infer("identity_fp32", [inp], callback)
        client.async_infer("slow", _slow_input(1), callback)
    assert done.wait(30)
    assert not [r for r in results if isinstance(r, Exception)]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(client: grpcclient.InferenceServerClient, algorithm: str) -> None:
    x = np.ones((1, 1000), np.float32)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("identity_fp32", [inp], compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_unknown_method_and_percent_encoded_message(server: ServerProcess) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary("/inference.GRPCInferenceService/Nope")(b"")
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        name = "nö%pe".encode()  # a ModelMetadataRequest (name = 1)
        metadata = channel.unary_unary("/inference.GRPCInferenceService/ModelMetadata")
        with pytest.raises(grpc.RpcError) as err:
            metadata(b"\x0a" + bytes([len(name)]) + name)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "'nö%pe'" in err.value.details()


def _frames(sock: socket.socket, timeout: float = 5.0) -> list[tuple[int, int, int, bytes]]:
    """Every frame the server sends until it closes the connection."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    out = []
    pos = 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos:pos + 3], "big")
        kind, flags = data[pos + 3], data[pos + 4]
        sid = int.from_bytes(data[pos + 5:pos + 9], "big")
        out.append((kind, flags, sid, data[pos + 9:pos + 9 + length]))
        pos += 9 + length
    return out


BAD_FRAMES = {
    "data on stream 0": frame(0, 0, 0, b"xx"),
    "window update of 0": frame(8, 0, 0, b"\0\0\0\0"),
    "lying length": b"\x00\x10\x00\x01\x04\x00\x00\x00\x01" + b"\x00" * 64,  # 4096 promised
    "bad header block": frame(1, 0x5, 1, b"\xff\xff\xff\xff\x0f"),
    "continuation without headers": frame(9, 0x4, 1, b"\x88"),
    "ping of the wrong size": frame(6, 0, 0, b"123"),
    "settings of the wrong size": frame(4, 0, 0, b"12345"),
    "frame too large": b"\xff\xff\xff\x00\x00\x00\x00\x00\x01",
}


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_malformed_frames_close_only_that_connection(
        server: ServerProcess, client: grpcclient.InferenceServerClient, case: str) -> None:
    with socket.create_connection(("127.0.0.1", server.grpc_port)) as sock:
        sock.sendall(PREFACE + frame(4, 0, 0) + BAD_FRAMES[case])
        if case == "lying length":
            sock.shutdown(socket.SHUT_WR)  # the rest never comes
        frames = _frames(sock)
    kinds = [f[0] for f in frames]
    assert kinds[0] == 4  # the server's SETTINGS
    if case != "lying length":
        goaway = [f for f in frames if f[0] == 7]
        assert goaway and int.from_bytes(goaway[0][3][4:8], "big") != 0  # an error code
    assert client.is_server_live()  # every other connection is unharmed


def test_ping_settings_and_not_http2(server: ServerProcess,
                                     client: grpcclient.InferenceServerClient) -> None:
    with socket.create_connection(("127.0.0.1", server.grpc_port)) as sock:
        sock.sendall(PREFACE + frame(4, 0, 0) + frame(6, 0, 0, b"abcdefgh")
                     + frame(7, 0, 0, b"\0\0\0\0\0\0\0\0"))
        sock.shutdown(socket.SHUT_WR)
        frames = _frames(sock)
    assert (6, 1, 0, b"abcdefgh") in frames  # PING ACK with the same payload
    assert (4, 1, 0, b"") in frames  # our SETTINGS were ACKed back
    with socket.create_connection(("127.0.0.1", server.grpc_port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _frames(sock) == []  # closed without an answer
    assert client.is_server_live()


def test_draining_on_shutdown(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """SIGTERM: the port closes and the connection gets GOAWAY at once (a new call finds
    the port closed, as with Triton: L0_lifecycle's test_shutdown_dynamic), the request in
    flight is answered, the log counts it down in Triton's words, then the server exits
    cleanly."""
    server = start_server(_slow_repo(tmp_path / "repo"))
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    results: list[object] = []
    done = threading.Event()

    def callback(result: object, error: object) -> None:
        results.append(error if error is not None else result)
        done.set()

    client.async_infer("slow", _slow_input(9), callback)
    time.sleep(0.1)
    server.proc.send_signal(15)
    time.sleep(0.1)
    with pytest.raises(InferenceServerException) as err:
        client.infer("slow", _slow_input())
    assert "UNAVAILABLE" in str(err.value.status())
    assert "failed to connect to all addresses" in err.value.message()
    assert "Connection refused" in err.value.message()
    assert done.wait(10)
    assert results[0].as_numpy("OUTPUT0")[0, 0] == 9  # type: ignore[attr-defined]
    client.close()
    assert server.wait_exit(30) == 0
    assert "Found 1 gRPC service connections and inference handlers" in server.log()

"""Triton's start-up flags that its qa scripts pass, served as Triton serves them:
--model-config-name, --grpc-infer-response-compression-level, --reuse-http-port /
--reuse-grpc-port, --model-load-retry-count; --model-namespacing is accepted and reported."""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2

from nursery.protocol.grpc.h2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    SETTINGS,
    encode_headers,
    frame,
)
from tests.conftest import ServerProcess
from tests.e2e.test_hostile_grpc import INFER, _open, _prefixed

pytestmark = pytest.mark.e2e

IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''


def _config(name: str, batch: int) -> str:
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {batch}\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


def _model(repo: Path, name: str, batch: int = 8) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(IDENTITY)
    (repo / name / "config.pbtxt").write_text(_config(name, batch))
    return repo / name


def test_model_config_name_picks_configs_name_pbtxt(tmp_path: Path,
                                                    start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    custom = _model(repo, "custom")
    (custom / "configs").mkdir()
    (custom / "configs" / "small.pbtxt").write_text(_config("custom", 2))
    _model(repo, "plain")  # no configs/small.pbtxt: its config.pbtxt
    server = start_server(repo, "--model-config-name=small")
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_model_config("custom")["max_batch_size"] == 2
    assert client.get_model_config("plain")["max_batch_size"] == 8


def test_infer_responses_are_gzipped_at_the_level_asked(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    _model(repo, "identity_fp32")
    server = start_server(repo, "--grpc-infer-response-compression-level=high")
    # a real client takes the compressed answer
    x = np.arange(64, dtype=np.float32).reshape(1, 64)
    inp = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
    inp.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), x)
    # on the wire: grpc-encoding gzip and the compressed flag, for a client that accepts gzip
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP32"
    tensor.shape.extend([1, 64])
    request.raw_input_contents.append(np.zeros((1, 64), np.float32).tobytes())
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", INFER),
               (b":authority", b"127.0.0.1"), (b"content-type", b"application/grpc"),
               (b"te", b"trailers"), (b"grpc-accept-encoding", b"identity,gzip")]
    sock = _open(server, PREFACE + frame(SETTINGS, 0, 0)
                 + frame(HEADERS, END_HEADERS, 1, encode_headers(headers))
                 + frame(DATA, END_STREAM, 1, _prefixed(request.SerializeToString())))
    try:
        frames = _read_call(sock)
    finally:
        sock.close()
    decoder = hpack.Decoder()
    head = dict(decoder.decode(next(f[3] for f in frames if f[0] == HEADERS and f[2] == 1)))
    assert head.get("grpc-encoding") == "gzip"
    body = b"".join(f[3] for f in frames if f[0] == DATA and f[2] == 1)
    assert body[0] == 1  # the compressed flag
    answer = service_pb2.ModelInferResponse.FromString(
        zlib.decompress(body[5:5 + int.from_bytes(body[1:5], "big")], 31))
    assert answer.model_name == "identity_fp32"


def _read_call(sock) -> list[tuple[int, int, int, bytes]]:  # type: ignore[no-untyped-def]
    """The server's frames until stream 1 ends (its trailers carry END_STREAM)."""
    out: list[tuple[int, int, int, bytes]] = []
    sock.settimeout(30)
    data = b""
    while True:
        chunk = sock.recv(1 << 20)
        assert chunk, "the server closed before answering"
        data += chunk
        while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
            length = int.from_bytes(data[:3], "big")
            out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
            data = data[9 + length:]
            if out[-1][2] == 1 and out[-1][1] & END_STREAM:
                return out


def test_reused_ports_let_two_servers_listen_together(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    _model(repo, "identity_fp32")
    first = start_server(repo, "--reuse-http-port=true", "--reuse-grpc-port=true")
    second = start_server(repo, "--reuse-http-port=true", "--reuse-grpc-port=true",
                          "--http-port", str(first.http_port),
                          "--grpc-port", str(first.grpc_port), wait=False)
    deadline = time.monotonic() + 60  # the port answers already (the first server): its log
    while "Started HTTPService" not in second.log() and time.monotonic() < deadline:
        assert second.proc.poll() is None, second.log()
        time.sleep(0.1)
    assert "Started HTTPService" in second.log()  # it bound the same ports and serves
    assert second.proc.poll() is None
    assert httpclient.InferenceServerClient(first.url).is_server_ready()


def test_load_retry_count_and_namespacing(tmp_path: Path,
                                          start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    broken = _model(repo, "broken")
    tries = tmp_path / "tries"
    (broken / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        f"        open({str(tries)!r}, 'a').write('x')\n"
        "        raise RuntimeError('never loads')\n")
    server = start_server(repo, "--model-control-mode=explicit", "--model-load-retry-count=2",
                          "--model-namespacing=true")
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(Exception, match="never loads"):
        client.load_model("broken")
    log = server.log()
    assert "retrying (1 of 2)" in log and "retrying (2 of 2)" in log
    assert tries.read_text() == "xxx"  # the first try and two more
    assert "not active yet" not in log  # namespacing is served (tests/e2e/test_model_namespacing.py)

"""NVIDIA's own tritonclient.http against ``python -m nursery serve``: every endpoint of the
first slice, every datatype, JSON and binary tensors, batch sizes 1..max, bad inputs."""

from __future__ import annotations

import gzip
import http.client
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess
from tests.e2e.conftest import ALL_TYPES

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url, concurrency=4)


def _add_sub_inputs(batch: int, binary: bool) -> tuple[list[httpclient.InferInput], np.ndarray, np.ndarray]:
    a = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    b = np.random.default_rng(batch + 100).standard_normal((batch, 16)).astype(np.float32)
    inputs = [httpclient.InferInput("INPUT0", [batch, 16], "FP32"),
              httpclient.InferInput("INPUT1", [batch, 16], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs, a, b


# -- health and metadata ------------------------------------------------------------------


def test_health(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "2")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"
    assert "binary_tensor_data" in meta["extensions"]
    assert "model_configuration" in meta["extensions"]
    # Triton's order; without --allow-client-shm neither shared-memory extension is listed
    # (tests/e2e/test_system_shm.py starts its server with it)
    assert meta["extensions"] == [
        "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
        "schedule_policy", "model_configuration", "binary_tensor_data",
        "parameters", "statistics", "trace", "logging"]


def test_model_metadata(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("add_sub")
    assert meta == {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
                   {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]},
                    {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 16]}],
    }
    nobatch = client.get_model_metadata("add_sub_nobatch")
    assert nobatch["inputs"][0]["shape"] == [2, 16]
    assert client.get_model_metadata("versioned", "3")["versions"] == ["3"]
    assert client.get_model_metadata("versioned")["versions"] == ["1", "3"]


def test_model_config_matches_triton_shape(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("add_sub")
    assert config["name"] == "add_sub"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 64
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["input"][0] == {
        "name": "INPUT0", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [16],
        "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False,
        "is_non_linear_format_io": False,
    }
    assert config["instance_group"] == [{
        "name": "add_sub_0", "kind": "KIND_CPU", "count": 1, "gpus": [],
        "secondary_devices": [], "profile": [], "passive": False, "host_policy": "",
    }]
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}
    assert "dynamic_batching" not in config and "sequence_batching" not in config
    assert config["default_model_filename"] == "model.onnx"


def test_auto_completed_config(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("string_identity")
    assert config["max_batch_size"] == 4
    assert config["input"][0]["name"] == "INPUT0"
    assert config["input"][0]["data_type"] == "TYPE_STRING"
    assert config["input"][0]["dims"] == [-1]
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert config["instance_group"][0]["count"] == 2  # Triton's default for ORT on CPU


# -- inference ----------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("batch", [1, 2, 7, 64])
def test_add_sub(client: httpclient.InferenceServerClient, binary: bool, batch: int) -> None:
    inputs, a, b = _add_sub_inputs(batch, binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    result = client.infer("add_sub", inputs, outputs=outputs, request_id=f"req-{batch}")
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    response = result.get_response()
    assert response["id"] == f"req-{batch}"
    assert response["model_name"] == "add_sub"
    assert response["model_version"] == "1"


def test_requested_outputs_honoured(client: httpclient.InferenceServerClient) -> None:
    inputs, a, b = _add_sub_inputs(3, True)
    result = client.infer("add_sub", inputs,
                          outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def test_no_outputs_listed_returns_all(client: httpclient.InferenceServerClient) -> None:
    inputs, a, b = _add_sub_inputs(2, False)
    result = client.infer("add_sub", inputs)  # tritonclient asks for binary_data_output
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def test_mlp_batches(client: httpclient.InferenceServerClient) -> None:
    x = np.random.default_rng(0).standard_normal((5, 784)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [5, 784], "FP32")
    inp.set_data_from_numpy(x)
    batched = client.infer("mlp", [inp]).as_numpy("OUTPUT0")
    assert batched.shape == (5, 10)
    for i in range(5):
        one = httpclient.InferInput("INPUT0", [1, 784], "FP32")
        one.set_data_from_numpy(x[i : i + 1])
        np.testing.assert_allclose(client.infer("mlp", [one]).as_numpy("OUTPUT0")[0],
                                   batched[i], rtol=1e-4, atol=1e-5)


def _values(dt: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(7)
    n = int(np.prod(shape))
    if dt == "BOOL":
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    if dt == "BYTES":
        pool = [b"", b"a", "unicod\u00e9".encode(), b"x" * 300, b"tab\tnew\nline"]
        return np.array([pool[i % len(pool)] for i in range(n)], dtype=object).reshape(shape)
    if dt == "BF16":
        return rng.standard_normal(n).astype(np.float32).reshape(shape)
    np_type = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dt)
    if np_type is not None:
        return rng.standard_normal(n).astype(np_type).reshape(shape)
    info = np.iinfo(getattr(np, dt.lower()))
    low, high = max(info.min, -(2**62)), min(info.max, 2**62)
    return rng.integers(low, high, n, dtype=np.int64).astype(dt.lower()).reshape(shape)


@pytest.mark.parametrize("datatype", ALL_TYPES)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips(
    client: httpclient.InferenceServerClient, datatype: str, binary: bool
) -> None:
    model = f"identity_{datatype.lower()}"
    data = _values(datatype, (3, 5))
    inp = httpclient.InferInput("INPUT0", [3, 5], datatype)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    if datatype in ("FP16", "BF16") and not binary:
        return  # JSON cannot carry them: see test_half_precision_json_rejected
    inp.set_data_from_numpy(data, binary_data=binary)
    got = client.infer(model, [inp], outputs=[out]).as_numpy("OUTPUT0")
    if datatype == "BF16":  # tritonclient sends the upper 16 bits and widens on return
        expected = (data.view(np.uint32) & 0xFFFF0000).view(np.float32)
        np.testing.assert_array_equal(got, expected)
    elif datatype == "BYTES":
        as_bytes = [x.encode() if isinstance(x, str) else x for x in got.reshape(-1)]
        assert as_bytes == list(data.reshape(-1))
    else:
        assert got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_rejected(server: ServerProcess, datatype: str) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": datatype,
                                   "data": [1.0, 2.0]}]}).encode()
    status, reply = _raw(server, "POST", f"/v2/models/identity_{datatype.lower()}/infer", body)
    assert status == 400
    assert json.loads(reply)["error"] == (
        f"receiving {datatype} data via JSON is not supported. Please use the binary data "
        "format for input INPUT0"
    )


def test_fp16_binary_in_json_out_rejected(client: httpclient.InferenceServerClient) -> None:
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP16")
    inp.set_data_from_numpy(np.ones((1, 2), np.float16))
    with pytest.raises(InferenceServerException, match="sending FP16 data via JSON"):
        client.infer("identity_fp16", [inp],
                     outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])


def test_non_batching_model(client: httpclient.InferenceServerClient) -> None:
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    inp = httpclient.InferInput("INPUT0", [2, 16], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("add_sub_nobatch", [inp]).as_numpy("OUTPUT0"), x)


def test_versions(client: httpclient.InferenceServerClient) -> None:
    x = np.arange(4, dtype=np.int32).reshape(1, 4)
    inp = httpclient.InferInput("INPUT0", [1, 4], "INT32")
    inp.set_data_from_numpy(x)
    assert client.infer("versioned", [inp]).get_response()["model_version"] == "3"
    assert client.infer("versioned", [inp], model_version="1").get_response()["model_version"] == "1"
    with pytest.raises(InferenceServerException, match="version 2 is not found") as err:
        client.infer("versioned", [inp], model_version="2")
    assert err.value.status() == "404"


def test_classification(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[0.1, 0.7, 0.3, 0.2], [4.0, 1.0, 2.0, 3.0]], dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    for binary in (True, False):
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=2)
        got = client.infer("classifier", [inp], outputs=[out]).as_numpy("OUTPUT0")
        rows = [[v.decode() if isinstance(v, bytes) else v for v in row] for row in got]
        assert rows == [["0.700000:1:dog", "0.300000:2:bird"],
                        ["4.000000:0:cat", "3.000000:3:fish"]]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression(client: httpclient.InferenceServerClient, algorithm: str) -> None:
    inputs, a, b = _add_sub_inputs(4, True)
    result = client.infer("add_sub", inputs, request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)


def test_async_infer_many(client: httpclient.InferenceServerClient) -> None:
    pending = []
    for i in range(32):
        inputs, a, b = _add_sub_inputs(1 + i % 4, i % 2 == 0)
        pending.append((client.async_infer("add_sub", inputs), a, b))
    for handle, a, b in pending:
        np.testing.assert_allclose(handle.get_result().as_numpy("OUTPUT0"), a + b, rtol=1e-6)


# -- bad input ----------------------------------------------------------------------------


def _raw(server: ServerProcess, method: str, path: str, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    host, port = server.url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_errors_through_tritonclient(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="unknown model: 'nope'") as err:
        client.get_model_metadata("nope")
    assert err.value.status() == "404"
    inputs, _, _ = _add_sub_inputs(65, True)
    with pytest.raises(InferenceServerException, match="batch-size must be <= 64") as err:
        client.infer("add_sub", inputs)
    assert err.value.status() == "400"
    bad = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    bad.set_data_from_numpy(np.ones((1, 16), np.int32))
    good = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    good.set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException, match="data-type is 'INT32'"):
        client.infer("add_sub", [bad, good])
    with pytest.raises(InferenceServerException, match="expected 2 inputs but got 1"):
        client.infer("add_sub", [good])
    with pytest.raises(InferenceServerException, match="unexpected inference output 'NOPE'"):
        client.infer("add_sub", _add_sub_inputs(1, True)[0],
                     outputs=[httpclient.InferRequestedOutput("NOPE")])


def test_lying_and_huge_sizes(server: ServerProcess) -> None:
    head = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
         "parameters": {"binary_data_size": 64}},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32",
         "parameters": {"binary_data_size": 2**40}}]}).encode()
    status, body = _raw(server, "POST", "/v2/models/add_sub/infer", head + b"\0" * 128,
                        {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and b"expecting" in body
    status, body = _raw(server, "POST", "/v2/models/add_sub/infer", b"{}",
                        {"Content-Length": str(2**40)})
    assert status == 400 and b"exceeds the maximum allowed input size" in body
    bomb = gzip.compress(b"\0" * (80 * 1024 * 1024))
    status, body = _raw(server, "POST", "/v2/models/add_sub/infer", bomb,
                        {"Content-Encoding": "gzip"})
    assert status == 400 and b"exceeds the maximum allowed value" in body
    status, body = _raw(server, "POST", "/v2/models/add_sub/infer", zlib.compress(b"{}"),
                        {"Content-Encoding": "br"})
    assert status == 501 and b"Unsupported compression type" in body
    status, body = _raw(server, "POST", "/v2/models/add_sub/infer", b"\xff\xfe\x00",
                        {"Inference-Header-Content-Length": "3"})
    assert status == 500 and b"failed to parse the request JSON buffer" in body


def test_server_survives_bad_input(client: httpclient.InferenceServerClient,
                                   server: ServerProcess) -> None:
    for body in (b"{", b"null", b'{"inputs": [{"name": 1}]}', b'{"inputs": [[]]}', b"\x00" * 10,
                 b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], '
                 b'"data": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}]}'):
        status, reply = _raw(server, "POST", "/v2/models/add_sub/infer", body)
        assert 400 <= status < 600
        assert "error" in json.loads(reply)
    test_add_sub(client, True, 3)


def test_matches_recorded_triton_answers(server: ServerProcess) -> None:
    """Every conformance case: same status as Triton 2.51, same message unless listed."""
    from tests.conformance import http_cases

    recorded = json.loads((Path(http_cases.__file__).parent / "triton_2_51_http.json").read_text())
    # Known, deliberate differences in wording (status codes always match):
    loose = {
        "malformed_json": "failed to parse the request JSON buffer:",  # rapidjson vs orjson text
        "extra_input": "expected 2 inputs but got 3 inputs",  # Triton lists in hash order
        "wrong_shape": "unexpected shape for input",  # Triton reports INPUT1 (hash order)
        "wrong_rank": "unexpected shape for input",  # same
        "batch_mismatch": "batch size does not match other inputs",  # same
        # Triton's core checks the shape against the config first; the codec checks the
        # binary block's size while decoding (nothing allocated either way)
        "huge_shape": "for input 'INPUT0' for model 'add_sub'",
        # Triton after 2.51 tells too few elements apart ("Failed to parse 'data' field: shape
        # does not match true shape", which its L0_http greps) from too many
        "too_few_elements": "shape does not match true shape",
    }
    mismatches = []
    for name, case in http_cases.CASES.items():
        got = http_cases.send(server.url, *case)
        want = recorded[name]
        if got["status"] != want["status"]:
            mismatches.append(f"{name}: status {got['status']} != Triton {want['status']}")
            continue
        if isinstance(want["body"], dict) and "error" in want["body"]:
            message = got["body"].get("error", "") if isinstance(got["body"], dict) else ""
            if name in loose:
                if loose[name] not in message:
                    mismatches.append(f"{name}: {message!r} lacks {loose[name]!r}")
            elif message != want["body"]["error"]:
                mismatches.append(f"{name}: {message!r} != Triton {want['body']['error']!r}")
        elif isinstance(want["body"], dict) and "outputs" in want["body"]:
            strip = lambda b: {k: v for k, v in b.items() if k != "model_version"}  # noqa: E731
            assert strip(got["body"])["outputs"] == strip(want["body"])["outputs"], name
    assert not mismatches, "\n".join(mismatches)


def test_perf_analyzer_smoke(server: ServerProcess) -> None:
    import subprocess

    from tests.conftest import PERF_ANALYZER

    if not PERF_ANALYZER.exists():
        pytest.fail("perf_analyzer missing: run scripts/install_perf_analyzer.sh (.ci/run does)")
    for model in ("add_sub", "mlp"):
        proc = subprocess.run(
            [str(PERF_ANALYZER), "-m", model, "-u", server.url, "--concurrency-range", "1:4:3",
             "-p", "500", "--max-trials", "3", "--stability-percentage", "999"],
            capture_output=True, text=True, timeout=240,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Throughput" in proc.stdout


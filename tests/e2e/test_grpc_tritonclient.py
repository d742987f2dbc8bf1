"""NVIDIA's tritonclient.grpc (sync and aio), a grpclib client from our own stubs, and
perf_analyzer over gRPC, against ``python -m nursery serve``."""

from __future__ import annotations

import asyncio
import queue
import subprocess

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.conftest import PERF_ANALYZER, ServerProcess
from tests.e2e.conftest import ALL_TYPES
from tests.e2e.test_http_tritonclient import _values

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def grpc_url(server: ServerProcess) -> str:
    return f"127.0.0.1:{server.grpc_port}"


@pytest.fixture(scope="module")
def client(grpc_url: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(grpc_url)


def _add_sub(batch: int) -> tuple[list[grpcclient.InferInput], np.ndarray, np.ndarray]:
    a = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    b = np.random.default_rng(batch + 1).standard_normal((batch, 16)).astype(np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [batch, 16], "FP32"),
              grpcclient.InferInput("INPUT1", [batch, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert not client.is_model_ready("nope")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "triton" and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("add_sub", as_json=True)
    assert model["platform"] == "onnxruntime_onnx"
    assert model["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("add_sub", as_json=True)["config"]
    assert config["name"] == "add_sub"
    assert config["max_batch_size"] == 64
    assert config["input"][0]["dims"] == ["16"]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    proto = client.get_model_config("string_identity").config
    assert proto.dynamic_batching.preferred_batch_size == [4]


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_infer(client: grpcclient.InferenceServerClient, batch: int) -> None:
    inputs, a, b = _add_sub(batch)
    result = client.infer("add_sub", inputs, request_id="r1",
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT0"),
                                   grpcclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    response = result.get_response()
    assert response.id == "r1" and response.model_version == "1"


def test_requested_output_subset(client: grpcclient.InferenceServerClient) -> None:
    inputs, a, b = _add_sub(2)
    result = client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_every_datatype(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    data = _values(datatype, (2, 3))
    inp = grpcclient.InferInput("INPUT0", [2, 3], datatype)
    inp.set_data_from_numpy(data)
    got = client.infer(f"identity_{datatype.lower()}", [inp]).as_numpy("OUTPUT0")
    if datatype == "BF16":
        expected = (data.view(np.uint32) & 0xFFFF0000).view(np.float32)
        np.testing.assert_array_equal(got, expected)
    elif datatype == "BYTES":
        assert list(got.reshape(-1)) == list(data.reshape(-1))
    else:
        np.testing.assert_array_equal(got, data)


def test_classification_and_versions(client: grpcclient.InferenceServerClient) -> None:
    x = np.array([[0.1, 0.7, 0.3, 0.2]], dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)
    got = client.infer("classifier", [inp], outputs=[out]).as_numpy("OUTPUT0")
    assert [v.decode() for v in got[0]] == ["0.700000:1:dog", "0.300000:2:bird"]
    v = grpcclient.InferInput("INPUT0", [1, 4], "INT32")
    v.set_data_from_numpy(np.arange(4, dtype=np.int32).reshape(1, 4))
    assert client.infer("versioned", [v], model_version="1").get_response().model_version == "1"


def test_errors(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    assert "Request for unknown model: 'nope' is not found" in err.value.message()
    inputs, _, _ = _add_sub(65)
    with pytest.raises(InferenceServerException) as err:
        client.infer("add_sub", inputs)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "batch-size must be <= 64" in err.value.message()
    bad = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    bad.set_data_from_numpy(np.ones((1, 16), np.int32))
    ok = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
    ok.set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException, match="data-type is 'INT32'"):
        client.infer("add_sub", [bad, ok])
    with pytest.raises(InferenceServerException) as err:
        client.infer("add_sub", inputs[:1], model_version="9")
    assert err.value.status() == "StatusCode.NOT_FOUND"


def test_stream_many_in_flight(client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        expected = {}
        for i in range(20):
            inputs, a, b = _add_sub(1 + i % 3)
            expected[str(i)] = a + b
            client.async_stream_infer("add_sub", inputs, request_id=str(i))
        bad, _, _ = _add_sub(65)
        client.async_stream_infer("add_sub", bad, request_id="bad")
        inputs, a, b = _add_sub(2)
        client.async_stream_infer("add_sub", inputs, request_id="after")
        expected["after"] = a + b
        seen = {}
        errors = []
        for _ in range(22):
            result, error = results.get(timeout=30)
            if error is not None:
                errors.append(error)
            else:
                response = result.get_response()
                assert response.parameters["triton_final_response"].bool_param
                seen[response.id] = result.as_numpy("OUTPUT0")
        assert len(errors) == 1 and "batch-size must be <= 64" in str(errors[0])
        assert set(seen) == set(expected)  # the stream stayed open after the error
        for key, value in expected.items():
            np.testing.assert_allclose(seen[key], value, rtol=1e-6)
    finally:
        client.stop_stream()


def test_aio_client(grpc_url: str) -> None:
    async def main() -> None:
        async with aioclient.InferenceServerClient(grpc_url) as client:
            assert await client.is_server_ready()
            inputs, a, b = _add_sub(4)
            results = await asyncio.gather(*(client.infer("add_sub", inputs) for _ in range(8)))
            for r in results:
                np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a + b, rtol=1e-6)

    asyncio.run(main())


def test_grpclib_client_from_our_stubs(grpc_url: str) -> None:
    """The design card's grpclib users: our generated stubs, typed ``contents`` this time."""
    from grpclib.client import Channel

    from nursery.schema import inference as pb
    from nursery.schema.inference.services import GrpcInferenceServiceStub

    async def main() -> None:
        host, port = grpc_url.split(":")
        channel = Channel(host, int(port))
        try:
            stub = GrpcInferenceServiceStub(channel)
            assert (await stub.server_live(pb.ServerLiveRequest())).live
            request = pb.ModelInferRequest(
                model_name="add_sub",
                inputs=[
                    pb.ModelInferRequestInferInputTensor(
                        name="INPUT0", datatype="FP32", shape=[1, 16],
                        contents=pb.InferTensorContents(fp32_contents=[1.0] * 16)),
                    pb.ModelInferRequestInferInputTensor(
                        name="INPUT1", datatype="FP32", shape=[1, 16],
                        contents=pb.InferTensorContents(fp32_contents=[0.5] * 16)),
                ],
            )
            response = await stub.model_infer(request)
            out = np.frombuffer(response.raw_output_contents[0], np.float32)
            np.testing.assert_array_equal(out, [1.5] * 16)
            config = await stub.model_config(pb.ModelConfigRequest(name="add_sub"))
            assert config.config.max_batch_size == 64
        finally:
            channel.close()

    asyncio.run(main())


def test_malformed_protobuf_gets_clean_status(grpc_url: str,
                                              client: grpcclient.InferenceServerClient) -> None:
    with grpc.insecure_channel(grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as err:
            call(b"\xff\xff\xff\xff garbage", timeout=10)
        assert err.value.code() == grpc.StatusCode.INTERNAL  # as Triton answers
        assert err.value.details() == "Unable to parse request"
    test_infer(client, 2)  # and the server keeps serving


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "streaming"])
def test_perf_analyzer_grpc(server: ServerProcess, streaming: bool) -> None:
    args = [str(PERF_ANALYZER), "-m", "add_sub", "-i", "grpc", "-u",
            f"127.0.0.1:{server.grpc_port}", "--concurrency-range", "1:4:3", "-p", "500",
            "--max-trials", "10", "--stability-percentage", "100"]
    if streaming:
        args += ["--streaming", "--async"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Throughput" in proc.stdout


def test_matches_recorded_triton_answers(grpc_url: str) -> None:
    """Every gRPC conformance case: the status code Triton 2.51 answered, and its message
    unless the difference is listed (with its reason)."""
    import json
    from pathlib import Path

    from tests.conformance import grpc_cases

    recorded = json.loads((Path(grpc_cases.__file__).parent / "triton_2_51_grpc.json").read_text())
    loose = {
        "bad_version_string": "failed to get model version from specified version string 'abc'",
        "invalid_datatype": "invalid datatype",  # we name the bad string; Triton says <invalid>
        "wrong_shape": "unexpected shape for input",  # Triton reports inputs in hash order
    }
    got = grpc_cases.run_all(grpc_url)
    problems = []
    for name, want in recorded.items():
        have = got[name]
        if have["code"] != want["code"]:
            problems.append(f"{name}: {have} != Triton {want}")
        elif "details" in want:
            if name in loose:
                if loose[name] not in have.get("details", ""):
                    problems.append(f"{name}: {have['details']!r} lacks {loose[name]!r}")
            elif have["details"] != want["details"]:
                problems.append(f"{name}: {have['details']!r} != Triton {want['details']!r}")
        for key in ("outputs", "raw", "ready"):
            if key in want and have.get(key) != want[key]:
                problems.append(f"{name}: {key} {have.get(key)} != Triton {want[key]}")
    assert not problems, "\n".join(problems)


def test_stream_cancel_leaves_server_healthy(client: grpcclient.InferenceServerClient,
                                             grpc_url: str) -> None:
    other = grpcclient.InferenceServerClient(grpc_url)
    other.start_stream(callback=lambda result, error: None)
    for _ in range(30):
        inputs, _, _ = _add_sub(4)
        other.async_stream_infer("add_sub", inputs)
    other.stop_stream(cancel_requests=True)
    other.close()
    test_infer(client, 3)
    assert client.is_server_ready()


def test_oversize_message_is_refused() -> None:
    import grpclib

    from nursery.protocol.codecs.grpc_wire import StrictProtoCodec
    from nursery.schema import inference as pb

    codec = StrictProtoCodec(max_message=100)
    with pytest.raises(grpclib.GRPCError) as err:
        codec.decode(b"\0" * 101, pb.ModelInferRequest)
    assert err.value.status is grpclib.const.Status.RESOURCE_EXHAUSTED

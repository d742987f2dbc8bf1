"""OpenVINO models served end to end: the project's MLP converted to OpenVINO IR in the test
run, and its ONNX file read through OpenVINO, asked over HTTP and gRPC with tritonclient and
compared with OpenVINO's own answer and with ONNX Runtime's; Triton's OpenVINO parameters,
dynamic batch sizes, a static batch with padding, RESHAPE_IO_LAYERS, auto-complete, and broken
models failing alone with a reason that names the model, the file and the cause."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import openvino_models as ovm
from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e
Http = httpclient.InferenceServerClient
Grpc = grpcclient.InferenceServerClient
BF16_ATOL = 2e-2  # outputs are of order 1; bf16 keeps 8 bits of mantissa


@pytest.fixture(scope="module")
def ov_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("ov_repo")
    ovm.write_model(repo, "mlp_ov", ovm.ov_config(
        "mlp_ov", params={"NUM_STREAMS": "1", "PERFORMANCE_HINT": "LATENCY",
                          "INFERENCE_NUM_THREADS": "1"},
        extra="dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
              "instance_group [{ kind: KIND_CPU count: 2 }]"))
    ovm.write_model(repo, "mlp_ov_static", ovm.ov_config(
        "mlp_ov_static", max_batch_size=8,
        params={"SKIP_OV_DYNAMIC_BATCHSIZE": "YES", "ENABLE_BATCH_PADDING": "yes"}))
    ovm.write_model(repo, "mlp_ov_unpadded", ovm.ov_config(
        "mlp_ov_unpadded", max_batch_size=8, params={"SKIP_OV_DYNAMIC_BATCHSIZE": "YES"}))
    ovm.write_model(repo, "mlp_ov_reshaped", ovm.ov_config(
        "mlp_ov_reshaped", max_batch_size=0, dims=[-1, 784],
        params={"RESHAPE_IO_LAYERS": "YES"}).replace("dims: [ 10 ]", "dims: [ -1, 10 ]"),
        batch=1)  # an IR with a fixed [1, 784] input, made dynamic by the config
    ovm.write_model(repo, "mlp_ov_auto", 'backend: "openvino"\n', layout=True)
    # an IR saved with a static batch of max_batch_size, as Triton's qa generator saves its
    # OpenVINO models (L0_lifecycle): the batch dimension is the server's to set
    ovm.write_model(repo, "mlp_ov_saved8", ovm.ov_config(
        "mlp_ov_saved8", max_batch_size=8, params={"ENABLE_BATCH_PADDING": "YES"}), batch=8)
    ovm.write_model(repo, "mlp_ov_saved8_unpadded", ovm.ov_config(
        "mlp_ov_saved8_unpadded", max_batch_size=8), batch=8)
    ovm.write_onnx(repo, "mlp_ov_onnx", ovm.ov_config("mlp_ov_onnx", io=False, max_batch_size=0)
                   + 'default_model_filename: "model.onnx"\n')
    # broken ones
    ovm.write_model(repo, "bad_ov_dims", ovm.ov_config("bad_ov_dims", dims=[100]))
    ovm.write_model(repo, "bad_ov_param", ovm.ov_config("bad_ov_param",
                                                        params={"NUM_STREAMS": "many"}))
    # config inputs and outputs the IR does not have, each in Triton's words
    ovm.write_model(repo, "bad_ov_extra_input", ovm.ov_config(
        "bad_ov_extra_input",
        extra='input [{ name: "EXTRA" data_type: TYPE_FP32 dims: [ 784 ] }]'))
    ovm.write_model(repo, "bad_ov_unknown_input",
                    ovm.ov_config("bad_ov_unknown_input").replace('"INPUT0"', '"NOPE"'))
    ovm.write_model(repo, "bad_ov_unknown_output",
                    ovm.ov_config("bad_ov_unknown_output").replace('"OUTPUT0"', '"NOPE"'))
    corrupt = ovm.write_model(repo, "bad_ov_corrupt", ovm.ov_config("bad_ov_corrupt"))
    (corrupt / "1" / "model.xml").write_text("<net name='x'><layers><layer id=")
    make_models.write_mlp(repo)  # an ONNX Runtime model beside them
    with running_server(repo, "--exit-on-error=false", "--strict-readiness=false",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(ov_server: ServerProcess) -> Iterator[Http]:
    client = httpclient.InferenceServerClient(ov_server.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(ov_server: ServerProcess) -> Iterator[Grpc]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ov_server.grpc_port}")
    yield client
    client.close()


def _rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 784), dtype=np.float32)


def _infer(client: Http | Grpc, model: str, x: np.ndarray) -> np.ndarray:
    module = httpclient if isinstance(client, Http) else grpcclient
    inp = module.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = client.infer(model, [inp]).as_numpy("OUTPUT0")
    assert out is not None
    return out


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    """OpenVINO's own compiled MLP (its default precision, as the server runs it) and ONNX
    Runtime's session on the same model."""
    import openvino as ov

    xml = ovm.save_ir(tmp_path_factory.mktemp("ov_ref"))
    compiled = ov.Core().compile_model(str(xml), "CPU")
    session = ort.InferenceSession(make_models.build_mlp().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return compiled, session


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["mlp_ov", "mlp_ov_static", "mlp_ov_reshaped", "mlp_ov_auto",
                                   "mlp_ov_onnx", "mlp_ov_saved8"])
def test_answers_match_openvino_and_onnxruntime(http: Http, grpc: Grpc, references: tuple,
                                                protocol: str, model: str) -> None:
    compiled, session = references
    client = http if protocol == "http" else grpc
    for n in (1, 3) if model == "mlp_ov_auto" else (1, 3, 8):  # auto-complete: batches of 4
        x = _rows(n, seed=n)
        got = _infer(client, model, x)
        assert got.shape == (n, 10) and got.dtype == np.float32
        # OpenVINO computes in bf16 on CPUs that have it (its default, and so Triton's): its
        # own answer is the reference only to bf16's precision, as ONNX Runtime's is
        np.testing.assert_allclose(got, compiled({"INPUT0": x})[0], atol=BF16_ATOL)
        np.testing.assert_allclose(got, session.run(None, {"INPUT0": x})[0], atol=BF16_ATOL)


@pytest.mark.parametrize("model", ["mlp_ov_unpadded", "mlp_ov_saved8_unpadded"])
def test_static_batch_without_padding_refuses_smaller_batches(http: Http, model: str) -> None:
    """SKIP_OV_DYNAMIC_BATCHSIZE, or a model saved with a fixed batch: Triton's static batch."""
    assert _infer(http, model, _rows(8)).shape == (8, 10)
    with pytest.raises(InferenceServerException, match="ENABLE_BATCH_PADDING"):
        _infer(http, model, _rows(3))


def test_auto_complete_from_the_ir(http: Http) -> None:
    config = http.get_model_config("mlp_ov_auto")
    assert config["max_batch_size"] == 4  # the layout names a batch dimension
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
("INPUT0", "TYPE_FP32", [784])]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0"]
    onnx_config = http.get_model_config("mlp_ov_onnx")  # no layout: no batching, as Triton
    assert onnx_config["max_batch_size"] == 0
    assert onnx_config["input"][0]["dims"] == [-1, 784]
    meta = http.get_model_metadata("mlp_ov")
    assert meta["platform"] == "openvino"


def test_dynamic_batching_over_two_instances(grpc: Grpc, references: tuple) -> None:
    compiled, _ = references
    x = _rows(48, seed=5)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: _infer(grpc, "mlp_ov", x[i:i + 1]), range(48)))
    np.testing.assert_allclose(np.concatenate(answers), compiled({"INPUT0": x})[0],
                               atol=BF16_ATOL)


@pytest.mark.parametrize(("model", "words"), [
    ("bad_ov_dims", ["bad_ov_dims", "INPUT0", "model.xml", "[-1,100]"]),
    ("bad_ov_param", ["bad_ov_param", "NUM_STREAMS", "AUTO/NUMA/<int_value>", "many"]),
    ("bad_ov_corrupt", ["bad_ov_corrupt", "model.xml", "OpenVINO failed to read"]),
    ("bad_ov_extra_input", ["unable to load model 'bad_ov_extra_input', configuration "
                            "expects 2 inputs, model provides 1"]),
    ("bad_ov_unknown_input", ["unexpected inference input 'NOPE', allowed inputs are: INPUT0"]),
    ("bad_ov_unknown_output", ["unexpected inference output 'NOPE', allowed outputs are: "
                               "OUTPUT0"]),
])
def test_broken_model_fails_alone(http: Http, model: str, words: list[str]) -> None:
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index[model]["state"] == "UNAVAILABLE"
    for word in words:
        assert word in index[model]["reason"], index[model]["reason"]
    assert http.is_model_ready("mlp_ov") and http.is_model_ready("mlp")
    assert _infer(http, "mlp", _rows(2)).shape == (2, 10)


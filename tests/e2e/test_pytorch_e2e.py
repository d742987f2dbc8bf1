"""PyTorch models served end to end: TorchScript and exported programs over HTTP and gRPC
with tritonclient, Triton's naming conventions, dynamic batching, strings, and a model whose
config does not fit its TorchScript failing to load with Triton's reason."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e
Http = httpclient.InferenceServerClient
Grpc = grpcclient.InferenceServerClient


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("torch_repo")
    make_models.write_torch_models(repo)
    make_models.write_mlp(repo)
    make_models.write_torch_model(
        repo, "shout", make_models.build_torch_strings(),
        make_models.torch_config("shout", [("INPUT__0", "BYTES", [-1])],
                                 [("OUTPUT__0", "BYTES", [-1])], 0))
    make_models.write_torch_model(  # one input in the config, two in forward()
        repo, "broken_torch", make_models.build_torch_add_sub(),
        make_models.torch_config("broken_torch", [("INPUT__0", "FP32", [16])],
                                 [("OUTPUT__0", "FP32", [16])], 8))
    make_models.write_torch_model(repo, "torch_accumulate", _accumulator(), ACCUMULATE_CONFIG)
    with running_server(repo, "--exit-on-error=false", "--strict-readiness=false",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


# a sequence model whose forward() takes the sequence batcher's START and CORRID controls and
# an implicit state besides its input (L0_request_cancellation's implicit_state_model does)
ACCUMULATE_CONFIG = """
name: "torch_accumulate"
backend: "pytorch"
max_batch_size: 1
input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "CORRID__1" data_type: TYPE_INT64 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 2 }
  control_input [
    { name: "START__1" control { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } },
    { name: "SEQ_ID__2" control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 } }
  ]
  state { input_name: "STATE_IN__3" output_name: "STATE_OUT__2" data_type: TYPE_INT64
          dims: [ 1 ] initial_state { name: "zero" data_type: TYPE_INT64 dims: [ 1 ]
                                      zero_data: true } }
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _accumulator() -> object:
    torch = make_models._torch_quietly()

    class Accumulate(torch.nn.Module):  # type: ignore[name-defined,misc]
        def forward(self, x: torch.Tensor, start: torch.Tensor, corrid: torch.Tensor,
                    state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            total = x + torch.where(start > 0, torch.zeros_like(state), state)
            return total, corrid.clone(), total

    return torch.jit.script(Accumulate())


@pytest.fixture(scope="module")
def grpc_client(torch_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{torch_server.grpc_port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def http(torch_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(torch_server.url)
    yield client
    client.close()  # an unclosed client's sockets warn when collected


def _input(module: object, name: str, array: np.ndarray, datatype: str = "FP32") -> object:
    inp = module.InferInput(name, list(array.shape), datatype)  # type: ignore[attr-defined]
    inp.set_data_from_numpy(array)
    return inp


def test_http_and_grpc_index_convention(http: Http, grpc_client: Grpc, torch_server: ServerProcess) -> None:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 3, np.float32)
    result = http.infer("add_sub_torch", [_input(httpclient, "INPUT__0", a),
                                          _input(httpclient, "INPUT__1", b)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    grpc = grpc_client
    result = grpc.infer("add_sub_torch", [_input(grpcclient, "INPUT__0", a),
                                          _input(grpcclient, "INPUT__1", b)],
                        outputs=[grpcclient.InferRequestedOutput("OUTPUT__1")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    assert result.as_numpy("OUTPUT__0") is None
    meta = http.get_model_metadata("add_sub_torch")
    assert meta["platform"] == "pytorch_libtorch"


def test_torchscript_and_exported_mlp_match_onnx(http: Http, grpc_client: Grpc,
                                                 torch_server: ServerProcess) -> None:
    client = http
    x = np.random.default_rng(1).standard_normal((5, 784)).astype(np.float32)
    reference = client.infer("mlp", [_input(httpclient, "INPUT0", x)]).as_numpy("OUTPUT0")
    for model in ("mlp_torch", "mlp_torch_pt2"):
        out = client.infer(model, [_input(httpclient, "INPUT0", x)]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(out, reference, rtol=1e-4, atol=1e-5)


def test_concurrent_requests_share_executions(http: Http, grpc_client: Grpc,
                                              torch_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(torch_server.url, concurrency=16)
    before = client.get_inference_statistics("add_sub_torch")["model_stats"][0]
    rng = np.random.default_rng(2)
    pairs = [(rng.standard_normal((1, 16)).astype(np.float32),
              rng.standard_normal((1, 16)).astype(np.float32)) for _ in range(32)]
    handles = [client.async_infer("add_sub_torch", [_input(httpclient, "INPUT__0", a),
                                                    _input(httpclient, "INPUT__1", b)])
               for a, b in pairs]
    for (a, b), handle in zip(pairs, handles, strict=True):
        result = handle.get_result()
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), a + b, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), a - b, rtol=1e-6)
    after = client.get_inference_statistics("add_sub_torch")["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 32
    assert executions < inferences
    client.close()


def test_strings_over_grpc(http: Http, grpc_client: Grpc, torch_server: ServerProcess) -> None:
    client = grpc_client
    words = np.array([b"hello", b"triton"], dtype=object)
    result = client.infer("shout", [_input(grpcclient, "INPUT__0", words, "BYTES")])
    assert list(result.as_numpy("OUTPUT__0")) == [b"hello!", b"triton!"]


def test_mismatched_config_fails_to_load_with_reason(http: Http, grpc_client: Grpc,
                                                     torch_server: ServerProcess) -> None:
    client = http
    assert not client.is_model_ready("broken_torch")
    request = urllib.request.Request(f"http://{torch_server.url}/v2/repository/index",
                                     data=b"{}", method="POST")
    with urllib.request.urlopen(request) as r:
        index = {e["name"]: e for e in json.loads(r.read())}
    assert index["broken_torch"]["state"] == "UNAVAILABLE"
    assert "configuration expects 1 inputs, model provides 2" in index["broken_torch"]["reason"]
    assert client.is_model_ready("add_sub_torch")  # the others serve on


def test_bad_request_is_refused_and_the_model_keeps_serving(http: Http, grpc_client: Grpc,
                                                            torch_server: ServerProcess) -> None:
    client = http
    a = np.ones((1, 16), np.float32)
    with pytest.raises(Exception, match="expected 2 inputs but got 1 inputs"):
        client.infer("add_sub_torch", [_input(httpclient, "INPUT__0", a)])
    result = client.infer("add_sub_torch", [_input(httpclient, "INPUT__0", a),
                                            _input(httpclient, "INPUT__1", a)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a * 2)



def test_sequence_controls_and_implicit_state_are_forward_arguments(
        grpc_client: Grpc) -> None:
    """The sequence batcher's control and state tensors take their ``<name>__<index>`` places
    among forward()'s arguments, and the state output goes back to the sequence, as in
    Triton's LibTorch backend; two interleaved sequences keep their own sums."""
    def send(seq: int, value: int, start: bool = False) -> tuple[int, int]:
        x = np.array([[value]], dtype=np.int64)
        result = grpc_client.infer("torch_accumulate", [_input(grpcclient, "INPUT__0", x, "INT64")],
                                   sequence_id=seq, sequence_start=start)
        return int(result.as_numpy("OUTPUT__0")[0, 0]), int(result.as_numpy("CORRID__1")[0, 0])

    assert send(7, 1, start=True) == (1, 7)
    assert send(9, 100, start=True) == (100, 9)
    assert send(7, 2) == (3, 7)
    assert send(9, 5) == (105, 9)
    assert send(7, 3) == (6, 7)

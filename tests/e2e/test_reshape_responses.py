"""Outputs with a ``reshape`` are answered in their configured dims on every response path, as
Triton's core reshapes each output of every response a model makes (InferenceResponse::
AddOutput): a decoupled Python model's streamed responses, a response a non-decoupled model
sends through its response sender, the answers a BLS caller reads from a decoupled model, and
a decoupled step's answers inside an ensemble, which the next step (a real ONNX or LibTorch
model whose input has the output's dims) takes as they come. Each model makes its output in
the reshape's shape [2, 2] and reads its input (dims [4], reshape [2, 2]) in that shape.
The answers a model sends through its response sender get the classes their request asks
for too, as Triton's frontends classify every response, streamed ones included."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

IO = """max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# OUT = IN * (k + 1) for k = 0, 1: two responses, the second with the final flag; a request
# whose input is not in the reshape's shape gets an error
STREAMER = '''import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if x.shape != (1, 2, 2):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"IN has shape {x.shape}")), flags=FINAL)
                continue
            for k in range(COUNT):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * (k + 1))]),
                            flags=FINAL if k == COUNT - 1 else 0)
        return None
'''

# reads every response of the decoupled model through BLS and answers with their shapes
BLS = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="streamer", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            shapes = []
            for answer in call.exec(decoupled=True):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                if answer.output_tensors():
                    shapes.extend(pb_utils.get_output_tensor_by_name(answer, "OUT").shape())
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SHAPES", np.array(shapes, np.int32))]))
        return responses
'''


def _python(repo: Path, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')


def _ensemble(repo: Path, name: str, step: str, step_in: str, step_out: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'ensemble_scheduling { step [\n'
        '  { model_name: "streamer" model_version: -1 input_map { key: "IN" value: "IN" }\n'
        '    output_map { key: "OUT" value: "P" } },\n'
        f'  {{ model_name: "{step}" model_version: -1 input_map {{ key: "{step_in}" '
        'value: "P" }\n'
        f'    output_map {{ key: "{step_out}" value: "OUT" }} }} ] }}\n')


def _torch_identity() -> Any:
    torch = make_models._torch_quietly()

    class Identity(torch.nn.Module):  # type: ignore[name-defined,misc]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

    return torch.jit.script(Identity())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    _python(repo, "streamer", STREAMER.replace("COUNT", "2"),
            IO + "model_transaction_policy { decoupled: true }\n")
    _python(repo, "sender", STREAMER.replace("COUNT", "1"), IO)
    _python(repo, "bls", BLS, 'max_batch_size: 0\n'
            'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]\n'
            'output [ { name: "SHAPES" data_type: TYPE_INT32 dims: [ -1 ] } ]\n')
    make_models.write_model(
        repo, "ident_onnx", make_models.build_identity("FP32", ["batch", 4]),
        make_models.config_text("ident_onnx", [("INPUT0", "FP32", [4])],
                                [("OUTPUT0", "FP32", [4])], 8))
    make_models.write_torch_model(
        repo, "ident_torch", _torch_identity(),
        make_models.torch_config("ident_torch", [("INPUT__0", "FP32", [4])],
                                 [("OUTPUT__0", "FP32", [4])], 8))
    _ensemble(repo, "ens_onnx", "ident_onnx", "INPUT0", "OUTPUT0")
    _ensemble(repo, "ens_torch", "ident_torch", "INPUT__0", "OUTPUT__0")
    with running_server(repo, tmp_path_factory=tmp_path_factory) as proc:
        yield proc


X = np.array([[1, 2, 3, 4]], np.float32)


def _stream(server: ServerProcess, model: str, count: int,
            class_count: int = 0) -> list[np.ndarray]:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(lambda result, error: answers.put((result, error)))
        inp = grpcclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(X)
        outputs = ([grpcclient.InferRequestedOutput("OUT", class_count=class_count)]
                   if class_count else None)
        client.async_stream_infer(model, [inp], outputs=outputs)
        got = [answers.get(timeout=60) for _ in range(count)]
        client.stop_stream()
    assert all(error is None for _, error in got), got
    return [result.as_numpy("OUT") for result, _ in got]


def test_decoupled_responses_are_in_dims(server: ServerProcess) -> None:
    outs = _stream(server, "streamer", 2)
    assert [o.shape for o in outs] == [(1, 4), (1, 4)]
    np.testing.assert_array_equal(outs[0], X)
    np.testing.assert_array_equal(outs[1], X * 2)


def test_a_response_sent_by_the_sender_is_in_dims(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        inp = httpclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(X)
        out = client.infer("sender", [inp]).as_numpy("OUT")
    assert out.shape == (1, 4)
    np.testing.assert_array_equal(out, X)


def test_bls_reads_a_decoupled_model_in_dims(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        inp = httpclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(X)
        shapes = client.infer("bls", [inp]).as_numpy("SHAPES")
    assert shapes.tolist() == [1, 4, 1, 4]


@pytest.mark.parametrize("ensemble", ["ens_onnx", "ens_torch"])
def test_a_decoupled_step_feeds_the_next_in_dims(server: ServerProcess, ensemble: str) -> None:
    outs = sorted(_stream(server, ensemble, 2), key=lambda o: float(o.sum()))
    assert [o.shape for o in outs] == [(1, 4), (1, 4)]
    np.testing.assert_array_equal(outs[0], X)
    np.testing.assert_array_equal(outs[1], X * 2)


def test_sent_answers_are_classified(server: ServerProcess) -> None:
    outs = _stream(server, "streamer", 2, class_count=2)
    assert [o.tolist() for o in outs] == [[[b"4.000000:3", b"3.000000:2"]],
                                          [[b"8.000000:3", b"6.000000:2"]]]
    with httpclient.InferenceServerClient(server.url) as client:
        inp = httpclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(X)
        got = client.infer("sender", [inp], outputs=[
            httpclient.InferRequestedOutput("OUT", class_count=1)])
    assert got.as_numpy("OUT").tolist() == [[b"4.000000:3"]]

"""Iterative sequence batching (``sequence_batching { iterative_sequence: true }``), as Triton's
qa/L0_backend_python/request_rescheduling uses it: a request without a correlation ID gets a
sequence of its own, the model releases it with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE to run
it again (its state kept: the same instance and slot), and a request that completes ends its
sequence."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e

COUNTDOWN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            if key not in self.left:  # the first run of this request
                self.left[key] = int(pb_utils.get_input_tensor_by_name(request, "IN")
                                     .as_numpy()[0])
            self.left[key] -= 1
            sender = request.get_response_sender()
            out = pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([self.left[key]], np.int32))])
            if self.left[key] > 0:  # run this request again: one more answer to send
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(out)
            else:
                del self.left[key]
                sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

TWICE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = set()

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if request.request_id() not in self.seen:  # the first run: again, no answer yet
                self.seen.add(request.request_id())
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(None)
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1)]))
        return out
'''

WRONG = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
'''


def _write(repo: Path, name: str, code: str, dtype: str, extra: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        f'input [ {{ name: "IN" data_type: {dtype} dims: [ 1 ] }} ]\n'
        f'output [ {{ name: "OUT" data_type: {dtype} dims: [ 1 ] }} ]\n' + extra)


@pytest.fixture
def server(tmp_path: Path, start_server: type[ServerProcess]) -> ServerProcess:
    repo = tmp_path / "repo"
    iterative = "sequence_batching { iterative_sequence: true }\n"
    _write(repo, "countdown", COUNTDOWN, "TYPE_INT32",
           "model_transaction_policy { decoupled: true }\n" + iterative)
    _write(repo, "twice", TWICE, "TYPE_FP32", iterative)
    _write(repo, "wrong", WRONG, "TYPE_FP32", iterative)
    _write(repo, "plain", WRONG, "TYPE_FP32", "")
    return start_server(repo)


def test_a_decoupled_request_runs_until_it_is_not_rescheduled(server: ServerProcess) -> None:
    answers: queue.Queue[object] = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for start in (3, 2):  # two requests, no correlation ID: a sequence each
            inp = grpcclient.InferInput("IN", [1], "INT32")
            inp.set_data_from_numpy(np.array([start], np.int32))
            client.async_stream_infer("countdown", [inp])
        got = []
        for _ in range(5):
            answer = answers.get(timeout=30)
            assert not isinstance(answer, InferenceServerException), answer
            got.append(int(answer.as_numpy("OUT")[0]))  # type: ignore[union-attr]
        client.stop_stream()
    assert sorted(got) == [0, 0, 1, 1, 2]


def test_a_rescheduled_request_is_answered_by_its_next_run(server: ServerProcess) -> None:
    x = np.array([1.5], np.float32)
    inp = grpcclient.InferInput("IN", [1], "FP32")
    inp.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        for i in range(3):
            result = client.infer("twice", [inp], request_id=f"r{i}")
            np.testing.assert_array_equal(result.as_numpy("OUT"), x + 1)
        # Triton's rules: a rescheduled request's response must be None, and only an
        # iterative sequence model may reschedule
        with pytest.raises(InferenceServerException, match="Expected a None object"):
            client.infer("wrong", [inp])
        with pytest.raises(InferenceServerException, match="not configured to handle"):
            client.infer("plain", [inp])

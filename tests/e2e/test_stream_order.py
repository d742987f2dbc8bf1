"""The answers of requests that ran in one batch reach a gRPC stream in the batch's order, as
under Triton (qa/L0_backend_python/lifecycle test_batch_error): each request's task wakes
when its answer comes, in whatever order trio runs them, and the stream still writes the
answers in the order they came."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e

MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for i, request in enumerate(requests):
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if i % 2 == 0:  # the 1st, 3rd, ... request of every batch fails
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("even")))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
'''

CONFIG = '''name: "alternate"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500000 preferred_batch_size: [ 3 ] }
'''


def test_answers_of_one_batch_keep_its_order(tmp_path: Path,
                                             start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    (repo / "alternate" / "1").mkdir(parents=True)
    (repo / "alternate" / "1" / "model.py").write_text(MODEL)
    (repo / "alternate" / "config.pbtxt").write_text(CONFIG)
    server = start_server(repo)
    answers: queue.Queue[object] = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for round_ in range(8):
            sent = []
            for i in range(3):  # one batch of three (the preferred size)
                x = np.full((1, 2), 10 * round_ + i, np.float32)
                inp = grpcclient.InferInput("IN", [1, 2], "FP32")
                inp.set_data_from_numpy(x)
                client.async_stream_infer("alternate", [inp])
                sent.append(x)
            got = [answers.get(timeout=30) for _ in range(3)]
            assert isinstance(got[0], InferenceServerException), got
            assert isinstance(got[2], InferenceServerException), got
            assert not isinstance(got[1], InferenceServerException), got
            np.testing.assert_array_equal(got[1].as_numpy("OUT"), sent[1])  # type: ignore[union-attr]
        client.stop_stream()


SLEEPER = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            time.sleep(float(ms[0]) / 1000)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]))
        return out
'''

SLEEPER_CONFIG = '''name: "sleeper"
backend: "python"
max_batch_size: 0
input [ { name: "MS" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
'''


def test_answers_are_written_in_the_order_of_the_requests(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """Triton's stream writes a non-decoupled request's answer only after the answers of
    every request the stream carried before it (refusals too), however the requests finish:
    a slow request holds back a quick one sent after it."""
    repo = tmp_path / "repo"
    (repo / "sleeper" / "1").mkdir(parents=True)
    (repo / "sleeper" / "1" / "model.py").write_text(SLEEPER)
    (repo / "sleeper" / "config.pbtxt").write_text(SLEEPER_CONFIG)
    server = start_server(repo)
    answers: queue.Queue[object] = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))

        def send(model: str, ms: float, rid: str) -> None:
            inp = grpcclient.InferInput("MS", [1], "FP32")
            inp.set_data_from_numpy(np.array([ms], np.float32))
            client.async_stream_infer(model, [inp], request_id=rid)

        send("sleeper", 800, "slow")  # runs on one instance
        send("sleeper", 0, "quick")  # on the other, done long before "slow"
        send("nowhere", 0, "refused")  # refused at once (no such model)
        send("sleeper", 0, "last")
        got = [answers.get(timeout=30) for _ in range(4)]
        client.stop_stream()
    assert not isinstance(got[0], InferenceServerException), got
    assert [g.get_response().id for g in (got[0], got[1], got[3])] == [  # type: ignore[union-attr]
        "slow", "quick", "last"]
    assert isinstance(got[2], InferenceServerException), got
    assert "nowhere" in got[2].message()

"""A client cancelling a request (Triton's qa/L0_request_cancellation, with NVIDIA's
tritonclient.grpc): the request leaves the server's queue without running and is counted as a
cancelled failure; a cancelled stream cancels what it carried; a cancelled request of a
sequence cancels the rest of its sequence. The server runs the lean gRPC host and, once, the
grpclib one."""

from __future__ import annotations

import queue
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, running_server

pytestmark = pytest.mark.e2e

SLEEP_MODEL = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps INPUT0's first value (seconds) per request, then answers it as identity."""

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            time.sleep(float(data.flat[0]))
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", data)]))
        return responses
'''

IO = ('max_batch_size: 1\n'
      'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
      'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
      'instance_group [ { count: 1 kind: KIND_CPU } ]\n')


def _write(repo: Path, name: str, scheduling: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(SLEEP_MODEL)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n{IO}{scheduling}\n')


@pytest.fixture(scope="module", params=["nursery", "grpclib"])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    _write(repo, "sleepy", "dynamic_batching { }")
    _write(repo, "sleepy_seq", "sequence_batching { max_sequence_idle_microseconds: 60000000 }")
    (repo / "ens_sleepy" / "1").mkdir(parents=True)
    (repo / "ens_sleepy" / "config.pbtxt").write_text(
        'name: "ens_sleepy"\nplatform: "ensemble"\n' + IO.split("instance_group")[0]
        + 'ensemble_scheduling { step [ { model_name: "sleepy" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } '
        'output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n')
    with running_server(repo, f"--grpc-server={request.param}",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield client
    client.close()


def _put(answers: queue.Queue[Any], key: object) -> Any:
    """A tritonclient callback that queues (key, result, error)."""
    return lambda result, error: answers.put((key, result, error))


def _inputs(seconds: float) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[seconds]], np.float32))
    return [inp]


def _counts(server: ServerProcess, client: grpcclient.InferenceServerClient,
            model: str) -> tuple[int, int, int]:
    """(executions, failed requests, CANCELED failures in the metrics)."""
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        metrics = r.read().decode()
    found = re.search(rf'nv_inference_request_failure\{{model="{model}",reason="CANCELED",'
                      rf'version="1"\}} (\d+)', metrics)
    return (int(stats.get("execution_count", 0)),
            int(stats["inference_stats"]["fail"].get("count", 0)),
            int(found.group(1)) if found else 0)


def _settled(server: ServerProcess, client: grpcclient.InferenceServerClient, model: str,
             expected: tuple[int, int, int]) -> tuple[int, int, int]:
    deadline = time.monotonic() + 10
    while (got := _counts(server, client, model)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def _plus(counts: tuple[int, int, int], executed: int, cancelled: int) -> tuple[int, int, int]:
    return counts[0] + executed, counts[1] + cancelled, counts[2] + cancelled


def test_async_infer_cancel_drops_the_queued_request(
        server: ServerProcess, client: grpcclient.InferenceServerClient) -> None:
    before = _counts(server, client, "sleepy")
    answers: queue.Queue[Any] = queue.Queue()
    client.async_infer("sleepy", _inputs(1.0), _put(answers, "blocker"))
    time.sleep(0.3)  # the blocker runs
    future = client.async_infer("sleepy", _inputs(0.0),
                                _put(answers, "victim"))
    time.sleep(0.2)  # the victim waits in the batcher's queue
    future.cancel()
    key, result, error = answers.get(timeout=5)
    assert key == "victim" and result is None
    assert "Locally cancelled by application!" in str(error)
    key, result, error = answers.get(timeout=5)
    assert key == "blocker" and error is None
    assert _settled(server, client, "sleepy", _plus(before, 1, 1)) == _plus(before, 1, 1)


def test_client_timeout_drops_the_queued_request(
        server: ServerProcess, client: grpcclient.InferenceServerClient) -> None:
    before = _counts(server, client, "sleepy")
    answers: queue.Queue[Any] = queue.Queue()
    client.async_infer("sleepy", _inputs(1.0), _put(answers, None))
    time.sleep(0.3)
    with pytest.raises(InferenceServerException) as err:
        client.infer("sleepy", _inputs(0.0), client_timeout=0.3)
    assert "DEADLINE_EXCEEDED" in str(err.value.status())
    blocker = answers.get(timeout=5)
    assert blocker[2] is None, (blocker[2].status(), blocker[2].message(), blocker[2].debug_details())
    assert _settled(server, client, "sleepy", _plus(before, 1, 1)) == _plus(before, 1, 1)


def test_stopping_a_stream_cancels_a_sequence(
        server: ServerProcess, client: grpcclient.InferenceServerClient) -> None:
    """Triton's test_scheduler_streaming_request_cancellation, one sequence: its START runs,
    two more wait; the stream is cancelled: the waiting two are cancelled (never run), the
    running one finishes; the ID is then forgotten."""
    before = _counts(server, client, "sleepy_seq")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=_put(answers, None))
    client.async_stream_infer("sleepy_seq", _inputs(1.0), sequence_id=41, sequence_start=True)
    time.sleep(0.3)
    for _ in range(2):
        client.async_stream_infer("sleepy_seq", _inputs(0.0), sequence_id=41)
    time.sleep(0.2)
    client.stop_stream(cancel_requests=True)
    assert _settled(server, client, "sleepy_seq", _plus(before, 1, 2)) == _plus(before, 1, 2)
    with pytest.raises(InferenceServerException) as err:
        client.infer("sleepy_seq", _inputs(0.0), sequence_id=41)
    assert "must specify the START flag" in err.value.message()
    assert client.infer("sleepy_seq", _inputs(0.0), sequence_id=41, sequence_start=True,
                        sequence_end=True).as_numpy("OUTPUT0").tolist() == [[0.0]]


def test_cancelling_a_queued_sequence_request_over_unary_calls(
        server: ServerProcess, client: grpcclient.InferenceServerClient) -> None:
    """Triton's test_direct_sequence_batch_scheduler_request_cancellation: cancelling the first
    of two queued requests of a sequence cancels both."""
    before = _counts(server, client, "sleepy_seq")
    answers: queue.Queue[Any] = queue.Queue()
    client.async_infer("sleepy_seq", _inputs(1.0), _put(answers, "start"),
                       sequence_id=42, sequence_start=True)
    time.sleep(0.3)
    futures = []
    for i in range(2):  # one after the other: the queue holds them in this order
        futures.append(client.async_infer("sleepy_seq", _inputs(0.0), _put(answers, i),
                                          sequence_id=42))
        time.sleep(0.1)
    futures[0].cancel()
    got = {key: (result, error) for key, result, error in (answers.get(timeout=5)
                                                         for _ in range(3))}
    assert "Locally cancelled by application!" in str(got[0][1])
    assert got[1][0] is None and got[1][1].status() == "StatusCode.CANCELLED"
    assert got["start"][1] is None
    assert _settled(server, client, "sleepy_seq", _plus(before, 1, 2)) == _plus(before, 1, 2)


def test_cancelling_an_ensemble_request_cancels_its_step(
        server: ServerProcess, client: grpcclient.InferenceServerClient) -> None:
    """Triton's test_ensemble_scheduler_request_cancellation: the cancellation reaches the
    step's request, which leaves the step model's queue without running."""
    before = _counts(server, client, "sleepy")
    ensemble_before = _counts(server, client, "ens_sleepy")
    answers: queue.Queue[Any] = queue.Queue()
    client.async_infer("sleepy", _inputs(1.0), _put(answers, "blocker"))
    time.sleep(0.3)
    future = client.async_infer("ens_sleepy", _inputs(0.0),
                                _put(answers, "ensemble"))
    time.sleep(0.2)  # the step's request waits behind the blocker
    future.cancel()
    assert {answers.get(timeout=5)[0] for _ in range(2)} == {"blocker", "ensemble"}
    assert _settled(server, client, "sleepy", _plus(before, 1, 1)) == _plus(before, 1, 1)
    assert _counts(server, client, "ens_sleepy")[2] == ensemble_before[2] + 1

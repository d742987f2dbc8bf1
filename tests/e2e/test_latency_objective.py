"""The latency-objective batcher end to end: a model whose config.pbtxt selects it serves
requests that can make the objective and sheds at arrival those that cannot, with
UNAVAILABLE over gRPC, 503 over HTTP and 429 where the request asked, each with a message a
person can act on and, over HTTP, ``Retry-After``.

No timing decides the outcome: the model takes at least 300 ms a batch against a 100 ms
objective, and a request is sent only while another one is held inside the model (it blocks
on a file the test creates), so the batcher's prediction is a miss however slow the machine.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, wait_for_file

pytestmark = pytest.mark.e2e

CONFIG = """name: "slow"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "nursery.batcher" value: { string_value: "latency_objective" } }
parameters { key: "nursery.latency_objective_ms" value: { string_value: "100" } }
"""

MODEL = """import time
from pathlib import Path

import triton_python_backend_utils as pb_utils

HERE = Path(__file__).resolve().parent.parent


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        (HERE / f"started-{self.calls}").touch()
        time.sleep(0.3)
        deadline = time.monotonic() + 60
        while (HERE / "hold").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests]
"""


def _inputs(module: object) -> list[object]:
    inp = module.InferInput("INPUT0", [1, 1], "FP32")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(np.array([[1.5]], dtype=np.float32))
    return [inp]


def _raw_infer(server: ServerProcess, parameters: dict[str, object] | None = None
               ) -> tuple[int, dict[str, str], dict[str, object]]:
    body: dict[str, object] = {"inputs": [{"name": "INPUT0", "shape": [1, 1],
                                           "datatype": "FP32", "data": [1.5]}]}
    if parameters:
        body["parameters"] = parameters
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("POST", "/v2/models/slow/infer", json.dumps(body),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = json.loads(response.read())
    headers = {k.lower(): v for k, v in response.getheaders()}
    conn.close()
    return response.status, headers, payload


def test_serves_within_the_objective_and_sheds_what_cannot(tmp_path: Path,
                                                         start_server: type) -> None:
    model = tmp_path / "repo" / "slow"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL)
    server = start_server(tmp_path / "repo")
    http_client = httpclient.InferenceServerClient(server.url, concurrency=2)
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")

    # alone on an idle server a request always runs (and teaches the batcher the cost)
    first = http_client.infer("slow", _inputs(httpclient))
    np.testing.assert_allclose(first.as_numpy("OUTPUT0"), [[3.0]])
    wait_for_file(model / "started-1")

    # hold the next request inside the model; every request that comes meanwhile would wait
    # at least one 300 ms batch: a miss of the 100 ms objective, shed at once
    (model / "hold").touch()
    held = http_client.async_infer("slow", _inputs(httpclient))
    wait_for_file(model / "started-2")

    with pytest.raises(InferenceServerException) as grpc_error:
        grpc_client.infer("slow", _inputs(grpcclient))
    assert grpc_error.value.status() == "StatusCode.UNAVAILABLE"
    message = grpc_error.value.message()
    assert "model 'slow' sheds this request" in message
    assert "latency objective of 100 ms (p99)" in message
    assert "nursery.latency_objective_ms" in message and "retry in" in message

    with pytest.raises(InferenceServerException) as http_error:
        http_client.infer("slow", _inputs(httpclient))
    assert http_error.value.status() == "503"

    with pytest.raises(InferenceServerException) as asked:
        http_client.infer("slow", _inputs(httpclient),
                          parameters={"nursery.overload_status": 429})
    assert asked.value.status() == "429"
    assert "model 'slow' sheds this request" in asked.value.message()

    status, headers, payload = _raw_infer(server, {"nursery.overload_status": 429})
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert "sheds this request" in str(payload["error"])
    status, headers, payload = _raw_infer(server)
    assert status == 503 and int(headers["retry-after"]) >= 1

    (model / "hold").unlink()
    np.testing.assert_allclose(held.get_result().as_numpy("OUTPUT0"), [[3.0]])

    # the statistics count the shed requests as failures, the two served as successes
    stats = http_client.get_inference_statistics("slow")["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] == 2
    assert stats["fail"]["count"] == 5
    # an idle server again: served
    np.testing.assert_allclose(http_client.infer("slow", _inputs(httpclient)).as_numpy(
        "OUTPUT0"), [[3.0]])
    http_client.close()
    grpc_client.close()


def test_a_wrong_objective_fails_the_load_with_what_to_write(tmp_path: Path,
                                                             start_server: type) -> None:
    model = tmp_path / "repo" / "slow"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG.replace('string_value: "100"',
                                                       'string_value: "-5"'))
    (model / "1" / "model.py").write_text(MODEL)
    server = start_server(tmp_path / "repo", "--exit-on-error=false", wait=False)
    server.wait_ready(path="/v2/health/live")
    client = httpclient.InferenceServerClient(server.url)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["slow"]["state"] == "UNAVAILABLE"
    assert "nursery.latency_objective_ms' must be a positive number" in index["slow"]["reason"]
    client.close()

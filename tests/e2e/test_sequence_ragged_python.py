"""A Python sequence model whose input allows ragged batches (Triton's L0_dyna_sequence_batcher
`test_multi_sequence_different_shape_allow_ragged`, there on the C++ dyna_sequence backend):
the `oldest` sequence batcher puts requests of different shapes into one batch, and each
request reaches the model with its own input and its own row of the control tensors. nursery
used to join the requests' inputs into one array first, which failed for different shapes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, running_server

pytestmark = pytest.mark.e2e

CONFIG = """name: "ragged_seq"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] },
         { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ]
           max_queue_delay_microseconds: 3000000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

MODEL = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT: INPUT's sum plus the correlation ID, in INPUT's shape; BATCH: how many
    requests this execute call got."""

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            assert ready.shape == (1, 1) and int(ready[0, 0]) == 1
            total = int(values.sum()) + int(corrid.reshape(-1)[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.full(values.shape, total, np.int32)),
                pb_utils.Tensor("BATCH", np.array([[len(requests)]], np.int32))]))
        return responses
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("repo")
    (repo / "ragged_seq" / "1").mkdir(parents=True)
    (repo / "ragged_seq" / "config.pbtxt").write_text(CONFIG)
    (repo / "ragged_seq" / "1" / "model.py").write_text(MODEL)
    with running_server(repo, tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def test_ragged_requests_of_two_sequences_share_a_batch(server: ServerProcess) -> None:
    answers: dict[int, tuple[np.ndarray, int]] = {}
    errors: list[BaseException] = []

    def one(corrid: int, width: int) -> None:
        client = httpclient.InferenceServerClient(server.url)
        try:
            data = np.arange(1, width + 1, dtype=np.int32).reshape(1, width)
            inp = httpclient.InferInput("INPUT", [1, width], "INT32")
            inp.set_data_from_numpy(data)
            r = client.infer("ragged_seq", [inp], sequence_id=corrid, sequence_start=True,
                             sequence_end=True)
            answers[corrid] = (r.as_numpy("OUTPUT"), int(r.as_numpy("BATCH")[0, 0]))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(1001, 3)),
               threading.Thread(target=one, args=(1002, 5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    out3, batch3 = answers[1001]
    out5, batch5 = answers[1002]
    assert out3.tolist() == [[1007] * 3]  # 1+2+3 plus the ID
    assert out5.tolist() == [[1017] * 5]  # 1+...+5 plus the ID
    assert (batch3, batch5) == (2, 2)  # one batch of both shapes

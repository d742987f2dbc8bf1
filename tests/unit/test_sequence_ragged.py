"""Ragged inputs in a sequence batch of a model that takes arrays (ONNX Runtime, LibTorch), as
Triton's backends see a sequence batch: the ragged input flattened over the rows, padding rows
(Triton's null requests, copies of the batch's first request) adding zeros in that request's
shape, the controls and state one row per slot, the batch inputs counting every row, and a
BATCH_SCATTER_WITH_INPUT_SHAPE output cut back per request without the padding rows' parts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nursery.backends.base import get_factory
from nursery.config.model import ModelConfig, read_model_config
from nursery.errors import InternalError
from nursery.execution.sequence import SlotStates
from nursery.scheduling.sequence_policy import SlotRow
from nursery.types import DataType, InferenceRequest, Tensor

CONFIG = """backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "ACC"
                data_type: TYPE_FP32 source_input: "INPUT" } ]
batch_output [ { target_name: "OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT" } ]
sequence_batching {
  direct { }
  control_input [
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32
            dims: [ 1 ] initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true
                                        name: "zero" } } ]
}
"""


def _config(tmp_path: Path) -> ModelConfig:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text("")
    (folder / "config.pbtxt").write_text(CONFIG)
    return read_model_config(folder, "m", backends=get_factory, auto_complete=False)[0]


def _request(*values: float) -> InferenceRequest:
    data = np.array([values], np.float32)
    return InferenceRequest("m", "", {"INPUT": Tensor("INPUT", DataType.FP32, data.shape, data)})


def test_ragged_rows_are_flattened_with_padding_rows(tmp_path: Path) -> None:
    states = SlotStates(_config(tmp_path))
    requests = [_request(1, 2), _request(3, 4, 5)]
    # slot 0 and slot 2 have requests, slot 1 is a padding row (direct)
    rows = (SlotRow(0, 0, True, False, 7), SlotRow(1, -1), SlotRow(2, 1, True, False, 9))
    arrays = states.gather(requests, rows)
    assert arrays["INPUT"].tolist() == [1, 2, 0, 0, 3, 4, 5]  # padding: the first's shape
    assert arrays["ACC"].tolist() == [0, 2, 4, 7]  # every row counted
    assert arrays["READY"].tolist() == [[1], [0], [1]]  # one row per slot
    assert arrays["STATE_IN"].shape == (3, 1)

    # what an elementwise model with a per-row sum answers
    results = {"OUTPUT": arrays["INPUT"] * 10,
               "SUM": np.array([[3.0], [0.0], [12.0]], np.float32),
               "STATE_OUT": np.array([[3.0], [0.0], [12.0]], np.float32)}
    responses = states.scatter(requests, rows, results, "1")
    out = [{t.name: t.data.tolist() for t in r.outputs} for r in responses]
    assert out == [{"OUTPUT": [[10, 20]], "SUM": [[3.0]]},
                   {"OUTPUT": [[30, 40, 50]], "SUM": [[12.0]]}]
    assert {slot: held["STATE_IN"].tolist() for slot, held in states.held().items()} == {
        0: [3.0], 2: [12.0]}  # the padding slot keeps no state


def test_one_request_is_flattened_too(tmp_path: Path) -> None:
    states = SlotStates(_config(tmp_path))
    arrays = states.gather([_request(1, 2, 3)], (SlotRow(0, 0, True, False, 7),))
    assert arrays["INPUT"].shape == (3,)
    assert arrays["ACC"].tolist() == [0, 3]


def test_a_scatter_output_of_the_wrong_size_fails_its_batch(tmp_path: Path) -> None:
    states = SlotStates(_config(tmp_path))
    requests = [_request(1, 2), _request(3)]
    rows = (SlotRow(0, 0, True, False, 7), SlotRow(1, -1), SlotRow(2, 1, True, False, 9))
    results = {"OUTPUT": np.zeros(4, np.float32), "SUM": np.zeros((3, 1), np.float32),
               "STATE_OUT": np.zeros((3, 1), np.float32)}
    with pytest.raises(InternalError, match="has 4 elements, the batch output needs 5"):
        states.scatter(requests, rows, results, "1")

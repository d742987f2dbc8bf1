"""Ragged batching (nursery.execution.batch), as Triton's ONNX Runtime and LibTorch backends do
it: an ``allow_ragged_batch`` input reaches the model flattened over the whole batch, and a
``BATCH_SCATTER_WITH_INPUT_SHAPE`` batch output is cut back into each request's part in the
shape of its source input; requests whose ragged inputs differ in shape may share a batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nursery.backends.base import get_factory
from nursery.config.model import ModelConfig, read_model_config
from nursery.errors import InternalError
from nursery.execution.admission import make_work
from nursery.execution.batch import gather_inputs, split_outputs
from nursery.types import DataType, InferenceRequest, Tensor


def _config(tmp_path: Path, ragged: bool = True, scatter: bool = True) -> ModelConfig:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text("")
    (folder / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] '
        f'allow_ragged_batch: {"true" if ragged else "false"} }},\n'
        '  { name: "SCALE" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        + ('batch_output [ { target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
           'source_input: "INPUT0" } ]\n' if scatter else "")
        + "dynamic_batching { }\n")
    return read_model_config(folder, "m", backends=get_factory, auto_complete=False)[0]


def _request(n: int, start: float) -> InferenceRequest:
    data = np.arange(start, start + n, dtype=np.float32).reshape(1, n)
    scale = np.array([[2.0]], np.float32)
    return InferenceRequest("m", "", {
        "INPUT0": Tensor("INPUT0", DataType.FP32, (1, n), data),
        "SCALE": Tensor("SCALE", DataType.FP32, (1, 1), scale)})


def test_ragged_inputs_are_flattened_and_outputs_scattered(tmp_path: Path) -> None:
    config = _config(tmp_path)
    requests = [_request(4, 0), _request(2, 10), _request(3, 20)]
    inputs = gather_inputs(requests, config)
    assert inputs["INPUT0"].tolist() == [0, 1, 2, 3, 10, 11, 20, 21, 22]
    assert inputs["SCALE"].shape == (3, 1)  # not ragged: concatenated on the batch dim
    results = {"OUTPUT0": inputs["INPUT0"] * 2}  # what an elementwise model would answer
    responses = split_outputs(requests, [1, 1, 1], results, config, "1")
    assert [r.outputs[0].shape for r in responses] == [(1, 4), (1, 2), (1, 3)]
    assert [r.outputs[0].data.tolist() for r in responses] == [
        [[0, 2, 4, 6]], [[20, 22]], [[40, 42, 44]]]


def test_one_request_is_flattened_too(tmp_path: Path) -> None:
    config = _config(tmp_path)
    request = _request(5, 1)
    inputs = gather_inputs([request], config)
    assert inputs["INPUT0"].shape == (5,)
    [response] = split_outputs([request], [1], {"OUTPUT0": inputs["INPUT0"]}, config, "1")
    assert response.outputs[0].shape == (1, 5)


def test_a_batch_output_of_the_wrong_size_fails_the_batch(tmp_path: Path) -> None:
    config = _config(tmp_path)
    requests = [_request(4, 0), _request(2, 10)]
    with pytest.raises(InternalError, match="has 5 elements, the batch output needs 6"):
        split_outputs(requests, [1, 1], {"OUTPUT0": np.zeros(5, np.float32)}, config, "1")


def test_ragged_inputs_do_not_keep_requests_apart(tmp_path: Path) -> None:
    """Triton's enforce_equal_shape_tensors leaves ragged inputs out: requests whose ragged
    input shapes differ may share a batch; without allow_ragged_batch they may not."""
    ragged = _config(tmp_path)
    a, b = make_work(_request(4, 0), ragged, None), make_work(_request(2, 0), ragged, None)
    assert a.signature == b.signature
    plain = _config(tmp_path / "plain", ragged=False, scatter=False)
    a, b = make_work(_request(4, 0), plain, None), make_work(_request(2, 0), plain, None)
    assert a.signature != b.signature

"""The classification extension on a model's answer (nursery.execution.classification): what
Triton's frontends do to any response whose request asks for classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nursery.backends.base import get_factory
from nursery.config.model import ModelConfig, read_model_config
from nursery.errors import InvalidArgument
from nursery.execution.classification import classify_response
from nursery.types import (
    DataType,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
)


def _config(tmp_path: Path, max_batch_size: int) -> ModelConfig:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("")
    (folder / "labels.txt").write_text("zero\none\n")
    (folder / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] '
        'label_filename: "labels.txt" }, '
        '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
    return read_model_config(folder, "m", backends=get_factory, auto_complete=False)[0]


def _request(**classes: int) -> InferenceRequest:
    return InferenceRequest("m", "", {}, tuple(RequestedOutput(n, k) for n, k in classes.items()))


def _response(*tensors: tuple[str, np.ndarray, DataType]) -> InferenceResponse:
    return InferenceResponse("m", "1", [Tensor(n, d, tuple(a.shape), a) for n, a, d in tensors])


def test_batched_rows_each_get_their_classes_with_labels(tmp_path: Path) -> None:
    config = _config(tmp_path, 8)
    x = np.array([[0.25, 0.5, 0.125], [3.0, 1.0, 2.0]], dtype=np.float32)
    answer = classify_response(_request(OUTPUT0=2, OUTPUT1=0),
                               _response(("OUTPUT0", x, DataType.FP32),
                                         ("OUTPUT1", x, DataType.FP32)), config)
    assert isinstance(answer, InferenceResponse)
    first, second = answer.outputs
    assert first.datatype is DataType.BYTES and first.shape == (2, 2)
    assert first.data.tolist() == [[b"0.500000:1:one", b"0.250000:0:zero"],
                                   [b"3.000000:0:zero", b"2.000000:2"]]
    assert second.datatype is DataType.FP32  # no classes asked for it


def test_a_non_batching_model_classifies_the_whole_tensor(tmp_path: Path) -> None:
    config = _config(tmp_path, 0)
    x = np.array([1, 7, 3], dtype=np.int32)
    answer = classify_response(_request(OUTPUT0=5), _response(("OUTPUT0", x, DataType.INT32)),
                               config)
    assert isinstance(answer, InferenceResponse)
    assert answer.outputs[0].data.tolist() == [b"7:1:one", b"3:2", b"1:0:zero"]


@pytest.mark.parametrize(("datatype", "array"), [
    (DataType.BYTES, np.array([[b"a"]], dtype=object)),
    (DataType.FP16, np.ones((1, 2), dtype=np.float16)),
    (DataType.BOOL, np.ones((1, 2), dtype=bool)),
])
def test_unsupported_types_fail_the_request_with_tritons_words(
        tmp_path: Path, datatype: DataType, array: np.ndarray) -> None:
    answer = classify_response(_request(OUTPUT0=1), _response(("OUTPUT0", array, datatype)),
                               _config(tmp_path, 8))
    assert isinstance(answer, InvalidArgument)
    assert answer.message == (
        f"class result not available for output due to unsupported type '{datatype.value}'")


def test_more_than_a_million_elements_per_batch_entry_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, 8)
    ok = np.ones((2, 1_000_000), dtype=np.float32)  # two entries of a million each: allowed
    assert isinstance(classify_response(_request(OUTPUT0=1),
                                        _response(("OUTPUT0", ok, DataType.FP32)), config),
                      InferenceResponse)
    big = np.ones((1, 1_000_001), dtype=np.float32)
    answer = classify_response(_request(OUTPUT0=1), _response(("OUTPUT0", big, DataType.FP32)),
                               config)
    assert isinstance(answer, InvalidArgument)
    assert answer.message == "classification output tensor too large"


def test_errors_and_answers_already_sent_pass_unchanged(tmp_path: Path) -> None:
    config = _config(tmp_path, 8)
    error = InvalidArgument("boom")
    assert classify_response(_request(OUTPUT0=1), error, config) is error
    assert classify_response(_request(OUTPUT0=1), None, config) is None

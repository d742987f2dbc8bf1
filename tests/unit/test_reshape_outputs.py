"""nursery.execution.reshape: a response's outputs with a ``reshape`` in the model's
configuration go back to their dims (Triton's InferenceResponse::AddOutput does it for every
response), the batch dim kept and variable dims filled in order; what does not fit is left as
the model made it, and the Python backend's ``convert`` (every answer of a Python model,
returned or sent) applies it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nursery.backends.base import get_factory
from nursery.backends.python import pb_utils
from nursery.backends.python.backend import PythonInstance
from nursery.config.model import ModelConfig, read_model_config
from nursery.execution.reshape import converted, outputs_in_dims
from nursery.types import DataType, InferenceRequest, Tensor, tensor_of


def _config(tmp_path: Path, max_batch_size: int = 8) -> ModelConfig:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text("")
    (folder / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "FIXED" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } },\n'
        '  { name: "VAR" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape: { shape: [ 1, 2, -1 ] } },\n'
        '  { name: "PLAIN" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]\n'
        "model_transaction_policy { decoupled: true }\n")
    return read_model_config(folder, "m", backends=get_factory, auto_complete=False)[0]


def _t(name: str, shape: tuple[int, ...]) -> Tensor:
    return tensor_of(name, np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))


def test_outputs_go_back_to_their_dims(tmp_path: Path) -> None:
    out = outputs_in_dims([_t("FIXED", (3, 2, 2)), _t("VAR", (1, 1, 2, 5)), _t("PLAIN", (1, 2, 2))],
                          _config(tmp_path))
    assert [t.shape for t in out] == [(3, 4), (1, 2, 5), (1, 2, 2)]
    assert out[0].data.tolist() == np.arange(12).reshape(3, 4).tolist()


def test_without_batching_and_when_nothing_fits(tmp_path: Path) -> None:
    config = _config(tmp_path, max_batch_size=0)
    fixed, var = outputs_in_dims([_t("FIXED", (2, 2)), _t("VAR", (1, 2, 7))], config)
    assert (fixed.shape, var.shape) == ((4,), (2, 7))
    odd = _t("FIXED", (1, 3, 3))  # not the reshape's shape: left as the model made it
    assert outputs_in_dims([odd], _config(tmp_path))[0] is odd
    same = _t("X", (1, 4))
    assert converted(same, [4], [4], True) is same


def test_every_answer_of_a_python_model_is_converted(tmp_path: Path) -> None:
    """``convert`` is what returned answers and the response sender's both pass through."""
    instance = PythonInstance(object(), _config(tmp_path), "1", "m_0", token=object())
    request = InferenceRequest("m", "1", {"IN": Tensor("IN", DataType.FP32, (1, 4),
                                                       np.zeros((1, 4), np.float32))})
    made = pb_utils.InferenceResponse([pb_utils.Tensor("FIXED", np.ones((1, 2, 2), np.float32))])
    answer = instance.convert(made, request)
    assert not isinstance(answer, Exception)
    assert [t.shape for t in answer.outputs] == [(1, 4)]

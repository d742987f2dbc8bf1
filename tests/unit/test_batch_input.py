"""``batch_input`` tensors as Triton's backends make them for a batch (L0_batch_input's
expectations): element counts, their running sums, the largest count as a shape, each batch
item's shape; and the model configuration that names them."""

from __future__ import annotations

import numpy as np
import pytest

from nursery.config.model import BatchInputSpec
from nursery.errors import InternalError
from nursery.execution.batch import batch_input
from nursery.types import DataType, InferenceRequest, Tensor


def _requests(*shapes: tuple[int, ...]) -> list[InferenceRequest]:
    return [InferenceRequest("m", "", {"RAGGED": Tensor("RAGGED", DataType.FP32, shape,
                                                        np.zeros(shape, np.float32))})
            for shape in shapes]


def _spec(kind: str, datatype: DataType = DataType.FP32) -> BatchInputSpec:
    return BatchInputSpec(kind, ("BATCH",), datatype, "RAGGED")


RAGGED = _requests((1, 2), (1, 4), (1, 1), (1, 3))


@pytest.mark.parametrize(("kind", "expected"), [
    ("BATCH_ELEMENT_COUNT", [2, 4, 1, 3]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT", [2, 6, 7, 10]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 2, 6, 7, 10]),
])
def test_element_counts(kind: str, expected: list[int]) -> None:
    got = batch_input(_spec(kind), RAGGED)
    assert got.dtype == np.float32 and got.tolist() == expected
    assert batch_input(_spec(kind, DataType.INT32), RAGGED).dtype == np.int32


def test_max_element_count_is_a_shape() -> None:
    assert batch_input(_spec("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"), RAGGED).shape == (4,)


def test_batch_item_shapes() -> None:
    flat = batch_input(_spec("BATCH_ITEM_SHAPE_FLATTEN"),
                       _requests((1, 4, 1), (1, 1, 2), (1, 1, 2), (1, 2, 2)))
    assert flat.tolist() == [4, 1, 1, 2, 1, 2, 2, 2]
    items = batch_input(_spec("BATCH_ITEM_SHAPE"), _requests((2, 1, 2), (1, 1, 2), (1, 2, 2)))
    assert items.tolist() == [[1, 2], [1, 2], [1, 2], [2, 2]]  # a row per batch item


def test_a_request_without_the_source_input_is_refused() -> None:
    empty = InferenceRequest("m", "", {})
    with pytest.raises(InternalError, match="needs input 'RAGGED' from every request"):
        batch_input(_spec("BATCH_ELEMENT_COUNT"), [*RAGGED, empty])


def test_config_names_its_batch_inputs() -> None:
    from nursery.config.model import _batch_inputs, parse_config_text

    proto = parse_config_text(
        'name: "m"\nmax_batch_size: 4\n'
        'input [ { name: "RAGGED" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]\n'
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "A" data_type: TYPE_FP32 '
        'source_input: "RAGGED" }, { kind: BATCH_ITEM_SHAPE target_name: [ "B", "C" ] '
        'data_type: TYPE_INT32 source_input: "RAGGED" } ]\n', "m")
    assert list(_batch_inputs(proto)) == [
        BatchInputSpec("BATCH_ELEMENT_COUNT", ("A",), DataType.FP32, "RAGGED"),
        BatchInputSpec("BATCH_ITEM_SHAPE", ("B", "C"), DataType.INT32, "RAGGED")]

"""Sequence request parameters over HTTP JSON and gRPC, and the slot state's tensors for
controls of every kind (bool, fp32, int32; uint64, 32-bit and string CORRID)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from nursery.config.sequence import ControlSpec, SequenceConfig, StateSpec
from nursery.errors import InternalError, InvalidArgument
from nursery.execution.sequence import SlotStates
from nursery.protocol.codecs import binary_tensor
from nursery.protocol.codecs import grpc_messages as grpc_codec
from nursery.protocol.codecs import json_tensors as json_codec
from nursery.scheduling.sequence_policy import SlotRow
from nursery.scheduling.sequence_schedule import SequenceSchedule
from nursery.schema import inference as pb
from nursery.types import DataType, InferenceRequest, Tensor

BODY = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}]}


def _json(params: dict[str, Any]) -> InferenceRequest:
    request, _ = json_codec.decode_request({**BODY, "parameters": params}, "m", "",
                                           binary_tensor.BlockReader(None, "m"), 1 << 20)
    return request


def test_json_sequence_parameters() -> None:
    r = _json({"sequence_id": 2**64 - 1, "sequence_start": True, "sequence_end": False})
    assert (r.sequence_id, r.sequence_start, r.sequence_end) == (2**64 - 1, True, False)
    assert _json({"sequence_id": "abc", "sequence_end": True}).sequence_id == "abc"
    assert _json({}).sequence_id == 0 and not _json({}).sequence_start
    assert "sequence_id" not in _json({"sequence_id": 3}).parameters  # not passed to the model
    for bad in (-1, 1.5, True, None, 2**64):
        with pytest.raises(InternalError, match="Unable to parse 'sequence_id'"):
            _json({"sequence_id": bad})
    with pytest.raises(InternalError, match="Unable to parse 'sequence_start': attempt to "
                                            "access JSON non-boolean as boolean"):
        _json({"sequence_start": 1})


def _grpc(params: dict[str, pb.InferParameter]) -> InferenceRequest:
    message = pb.ModelInferRequest(model_name="m", parameters=params, inputs=[
        pb.ModelInferRequestInferInputTensor(name="X", datatype="INT32", shape=[1],
                                             contents=pb.InferTensorContents(int_contents=[1]))])
    return grpc_codec.decode_request(message)


def test_grpc_sequence_parameters() -> None:
    r = _grpc({"sequence_id": pb.InferParameter(int64_param=-1),
               "sequence_start": pb.InferParameter(bool_param=True)})
    assert (r.sequence_id, r.sequence_start, r.sequence_end) == (2**64 - 1, True, False)
    r = _grpc({"sequence_id": pb.InferParameter(string_param="s"),
               "sequence_end": pb.InferParameter(bool_param=True)})
    assert (r.sequence_id, r.sequence_start, r.sequence_end) == ("s", False, True)
    with pytest.raises(InvalidArgument) as err:
        _grpc({"sequence_id": pb.InferParameter(bool_param=True)})
    assert err.value.message == ("invalid value type for 'sequence_id' parameter, expected "
                                 "int64_param or string_param.")
    with pytest.raises(InvalidArgument) as err:
        _grpc({"sequence_end": pb.InferParameter(int64_param=1)})
    assert err.value.message == ("invalid value type for 'sequence_end' parameter, expected "
                                 "bool_param.")


class _Config:
    """The parts of ModelConfig that SlotStates reads."""

    def __init__(self, sequence: SequenceConfig, max_batch_size: int) -> None:
        self.sequence = sequence
        self.max_batch_size = max_batch_size
        self.inputs = ()
        self.outputs = ()
        self.output_map: dict[str, Any] = {}
        self.batch_inputs = ()
        self.batch_scatter: dict[str, str] = {}
        self.name = "m"


@pytest.mark.parametrize("corrid", [DataType.UINT64, DataType.INT32, DataType.BYTES])
def test_slot_state_tensors(corrid: DataType) -> None:
    initial = np.array([7.0], np.float32)
    seq = SequenceConfig(
        SequenceSchedule(),
        (ControlSpec("CONTROL_SEQUENCE_START", "S", DataType.BOOL, False, True),
         ControlSpec("CONTROL_SEQUENCE_END", "E", DataType.FP32, 0.5, 2.5),
         ControlSpec("CONTROL_SEQUENCE_READY", "R", DataType.INT32, -1, 9)),
        ("C", corrid),
        (StateSpec("IS", "OS", DataType.FP32, (1,), initial),))
    states = SlotStates(_Config(seq, 4))  # type: ignore[arg-type]
    ids: list[Any] = ["x", "y"] if corrid is DataType.BYTES else [2**32 + 3, 5]
    rows = (SlotRow(0, 0, True, False, ids[0]), SlotRow(1, -1),
            SlotRow(2, 1, False, True, ids[1]))
    req = InferenceRequest("m", "", {"X": Tensor("X", DataType.FP32, (1, 1),
                                                 np.ones((1, 1), np.float32))})
    arrays = states.gather([req, req], rows)
    assert arrays["S"].tolist() == [[True], [False], [False]]
    assert arrays["E"].tolist() == [[0.5], [0.5], [2.5]]
    assert arrays["R"].tolist() == [[9], [-1], [9]]
    assert arrays["IS"].tolist() == [[7.0], [7.0], [7.0]]  # nothing held yet: initial
    if corrid is DataType.BYTES:
        assert arrays["C"].tolist() == [[b"x"], [b""], [b"y"]]
    elif corrid is DataType.INT32:
        assert arrays["C"].tolist() == [[3], [0], [5]]  # the low-order 32 bits
    else:
        assert arrays["C"].tolist() == [[2**32 + 3], [0], [5]]
    # the model's state comes back: kept for ready rows, dropped on END, padding untouched
    states.scatter([req, req], rows, {"OS": np.array([[1.0], [2.0], [3.0]], np.float32)}, "1")
    assert {slot: held["IS"].tolist() for slot, held in states.held().items()} == {0: [1.0]}
    again = states.gather([req], (SlotRow(0, 0, False, False, ids[0]),))
    assert again["IS"].tolist() == [[1.0]]
    states.release([0])
    assert states.held() == {}


@pytest.mark.parametrize("datatype", [DataType.INT32, DataType.BYTES])
def test_a_padding_row_takes_the_shape_of_a_grown_state(datatype: DataType) -> None:
    """A variable-size state (dims [-1]) starts as one element and may grow: a padding row's
    state then has the shape of the batch's first real row's, as Triton's null request."""
    blank: Any = b"" if datatype is DataType.BYTES else 0
    initial = np.array([blank], dtype=datatype.numpy_dtype)
    seq = SequenceConfig(SequenceSchedule(), (), None,
                         (StateSpec("IS", "OS", datatype, (-1,), initial),))
    states = SlotStates(_Config(seq, 4))  # type: ignore[arg-type]
    grown = np.array([b"a", b"b"] if datatype is DataType.BYTES else [4, 5],
                     dtype=datatype.numpy_dtype)
    states.held()[0] = {"IS": grown}
    req = InferenceRequest("m", "", {})
    arrays = states.gather([req], (SlotRow(0, 0, False, False, 1), SlotRow(1, -1)), data=False)
    assert arrays["IS"].tolist() == [grown.tolist(), [blank, blank]]


def test_slot_state_tensors_without_the_data_inputs() -> None:
    """A backend that takes whole requests reads each request's own inputs: ``data=False``
    gathers only the controls, so requests whose ragged inputs differ in shape can share a
    batch (joining them into one array would fail)."""

    class _Spec:
        name = "X"
        reshape = None
        ragged = False  # an array batch joins it on the batch dim

    seq = SequenceConfig(
        SequenceSchedule(),
        (ControlSpec("CONTROL_SEQUENCE_READY", "R", DataType.INT32, 0, 1),),
        ("C", DataType.UINT64), ())
    config = _Config(seq, 4)
    config.inputs = (_Spec(),)  # type: ignore[assignment]
    states = SlotStates(config)  # type: ignore[arg-type]

    def req(width: int) -> InferenceRequest:
        return InferenceRequest("m", "", {"X": Tensor("X", DataType.INT32, (1, width),
                                                      np.ones((1, width), np.int32))})

    rows = (SlotRow(0, 0, True, False, 11), SlotRow(1, 1, True, False, 12))
    with pytest.raises(ValueError, match="dimensions except for the concatenation axis"):
        states.gather([req(3), req(5)], rows)  # an array batch needs one shape
    arrays = states.gather([req(3), req(5)], rows, data=False)
    assert sorted(arrays) == ["C", "R"]
    assert arrays["R"].tolist() == [[1], [1]]
    assert arrays["C"].tolist() == [[11], [12]]


def test_a_padding_row_of_a_string_input_is_empty_strings() -> None:
    """Triton's null request zero-fills its input buffers: for BYTES that reads as empty
    strings (an object array of 0s would not be strings at all)."""

    class _Spec:
        name = "X"
        reshape = None
        ragged = False

    seq = SequenceConfig(SequenceSchedule(), (), None, ())
    config = _Config(seq, 4)
    config.inputs = (_Spec(),)  # type: ignore[assignment]
    states = SlotStates(config)  # type: ignore[arg-type]
    text = np.array([[b"hi"]], dtype=object)
    req = InferenceRequest("m", "", {"X": Tensor("X", DataType.BYTES, (1, 1), text)})
    arrays = states.gather([req], (SlotRow(0, 0, False, False, 1), SlotRow(1, -1)))
    assert arrays["X"].tolist() == [[b"hi"], [b""]]

"""The gRPC codec: raw and typed contents decode to the same tensors; responses carry one
raw_output_contents entry per output."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from nursery.errors import InvalidArgument
from nursery.protocol import grpc_codec
from nursery.protocol._generated import inference as pb
from nursery.types import DataType, InferenceResponse, Tensor, deserialize_bytes_tensor, serialize_bytes_tensor
from tests.property.strategies import tensors


def _raw(dt: str, arr: np.ndarray) -> bytes:
    return serialize_bytes_tensor(arr) if dt == "BYTES" else arr.astype(arr.dtype.newbyteorder("<")).tobytes()


@settings(max_examples=300, deadline=None)
@given(tensors())
def test_raw_and_typed_agree(tensor: tuple[str, np.ndarray]) -> None:
    dt, arr = tensor
    raw_msg = pb.ModelInferRequest(
        model_name="m", inputs=[pb.ModelInferRequestInferInputTensor(name="X", datatype=dt,
                                                                     shape=list(arr.shape))],
        raw_input_contents=[_raw(dt, arr)])
    got = grpc_codec.decode_request(pb.ModelInferRequest().parse(bytes(raw_msg))).inputs["X"]
    assert got.datatype is DataType(dt) and got.shape == arr.shape
    if dt == "BYTES":
        assert list(got.data.reshape(-1)) == list(arr.reshape(-1))
    else:
        np.testing.assert_array_equal(got.data, arr)
    if dt == "FP16":
        return  # raw only
    field = grpc_codec._CONTENTS_FIELD[DataType(dt)]
    contents = pb.InferTensorContents(**{field: arr.reshape(-1).tolist()})
    typed_msg = pb.ModelInferRequest(
        model_name="m", inputs=[pb.ModelInferRequestInferInputTensor(
            name="X", datatype=dt, shape=list(arr.shape), contents=contents)])
    typed = grpc_codec.decode_request(pb.ModelInferRequest().parse(bytes(typed_msg))).inputs["X"]
    if dt == "BYTES":
        assert list(typed.data.reshape(-1)) == list(arr.reshape(-1))
    elif dt == "FP32":
        np.testing.assert_array_equal(typed.data, arr.astype(np.float32))
    else:
        np.testing.assert_array_equal(typed.data, arr)


@settings(max_examples=200, deadline=None)
@given(tensors())
def test_response_raw_contents(tensor: tuple[str, np.ndarray]) -> None:
    dt, arr = tensor
    message = grpc_codec.encode_response(
        InferenceResponse("m", "1", [Tensor("Y", DataType(dt), arr.shape, arr)], id="i"))
    parsed = pb.ModelInferResponse().parse(bytes(message))
    assert parsed.outputs[0].shape == list(arr.shape) and parsed.outputs[0].datatype == dt
    assert len(parsed.raw_output_contents) == 1
    raw = parsed.raw_output_contents[0]
    if dt == "BYTES":
        assert list(deserialize_bytes_tensor(raw, arr.size)) == list(arr.reshape(-1))
    else:
        np.testing.assert_array_equal(
            np.frombuffer(raw, DataType(dt).numpy_dtype).reshape(arr.shape), arr)


def test_mixed_raw_and_typed_rejected() -> None:
    message = pb.ModelInferRequest(
        model_name="m",
        inputs=[pb.ModelInferRequestInferInputTensor(
            name="X", datatype="FP32", shape=[1],
            contents=pb.InferTensorContents(fp32_contents=[1.0]))],
        raw_input_contents=[b"\0\0\0\0"])
    with pytest.raises(InvalidArgument, match="contents field must not be specified"):
        grpc_codec.decode_request(message)


def test_parameters() -> None:
    message = pb.ModelInferRequest(model_name="m", parameters={
        "priority": pb.InferParameter(uint64_param=2),
        "timeout": pb.InferParameter(int64_param=100),
        "custom": pb.InferParameter(string_param="x"),
    })
    request = grpc_codec.decode_request(message)
    assert request.priority == 2 and request.timeout_us == 100
    assert request.parameters == {"custom": "x"}
    with pytest.raises(InvalidArgument, match="reserved for Triton"):
        grpc_codec.decode_request(pb.ModelInferRequest(
            model_name="m", parameters={"triton_x": pb.InferParameter(bool_param=True)}))

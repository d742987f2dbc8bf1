"""The gRPC codec: raw and typed contents decode to the same tensors; responses carry one
raw_output_contents entry per output."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery.errors import InvalidArgument, NurseryError
from nursery.protocol.codecs import grpc_messages as grpc_codec
from nursery.protocol.codecs.grpc_wire import WireError, decode_infer_request
from nursery.schema import inference as pb
from nursery.types import (
    DataType,
    InferenceRequest,
    InferenceResponse,
    Tensor,
    deserialize_bytes_tensor,
    serialize_bytes_tensor,
)
from tests.property.strategies import message_bytes, tensors


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
    wire = grpc_codec.encode_response(
        InferenceResponse("m", "1", [Tensor("Y", DataType(dt), arr.shape, arr)], id="i",
                          parameters={"p": 3}))
    parsed = pb.ModelInferResponse().parse(wire)
    assert (parsed.model_name, parsed.model_version, parsed.id) == ("m", "1", "i")
    assert parsed.parameters["p"].int64_param == 3
    assert parsed.outputs[0].shape == list(arr.shape) and parsed.outputs[0].datatype == dt
    assert len(parsed.raw_output_contents) == 1
    raw = parsed.raw_output_contents[0]
    if dt == "BYTES":
        assert list(deserialize_bytes_tensor(raw, arr.size)) == list(arr.reshape(-1))
    else:
        np.testing.assert_array_equal(
            np.frombuffer(raw, DataType(dt).numpy_dtype).reshape(arr.shape), arr)


def _same_request(a: InferenceRequest, b: InferenceRequest) -> None:
    assert (a.model_name, a.model_version, a.id, a.priority, a.timeout_us) == (
        b.model_name, b.model_version, b.id, b.priority, b.timeout_us)
    assert a.parameters == b.parameters and a.requested_outputs == b.requested_outputs
    assert list(a.inputs) == list(b.inputs)
    for name in a.inputs:
        x, y = a.inputs[name], b.inputs[name]
        assert (x.datatype, x.shape) == (y.datatype, y.shape)
        if x.datatype is DataType.BYTES:
            assert list(x.data.reshape(-1)) == list(y.data.reshape(-1))
        else:
            np.testing.assert_array_equal(x.data, y.data)


def _outcome(fn: Any) -> Any:
    try:
        return "ok", fn()
    except NurseryError as exc:
        return "error", exc.message


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(message_bytes(pb.ModelInferRequest, depth=3))
def test_hot_path_decoder_agrees_with_betterproto(raw: bytes) -> None:
    """Whatever a valid ModelInferRequest holds, the hand-written decoder reads it as betterproto
    does: same request, or the same error."""
    slow = _outcome(lambda: grpc_codec.decode_request(pb.ModelInferRequest().parse(raw)))
    fast = _outcome(lambda: grpc_codec.decode_request(decode_infer_request(raw)))
    assert slow[0] == fast[0], (slow, fast)
    if slow[0] == "ok":
        _same_request(slow[1], fast[1])
    else:
        assert slow[1] == fast[1]


@given(st.binary(max_size=120))
def test_hot_path_decoder_rejects_or_parses(raw: bytes) -> None:
    try:
        decode_infer_request(raw)
    except (WireError, UnicodeDecodeError, ValueError, EOFError, IndexError):
        pass


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


@st.composite
def valid_requests(draw: st.DrawFn) -> bytes:
    """Well-formed ModelInferRequests: raw or typed inputs of any datatype, parameters,
    requested outputs (with classification)."""
    raw_mode = draw(st.booleans())
    inputs, raw = [], []
    for i in range(draw(st.integers(0, 3))):
        typed = [d.value for d in grpc_codec._CONTENTS_FIELD]
        dt, arr = draw(tensors(None if raw_mode else typed))
        tensor = pb.ModelInferRequestInferInputTensor(name=f"IN{i}", datatype=dt,
                                                      shape=list(arr.shape))
        if raw_mode:
            raw.append(_raw(dt, arr))
        else:
            field = grpc_codec._CONTENTS_FIELD[DataType(dt)]
            tensor.contents = pb.InferTensorContents(**{field: arr.reshape(-1).tolist()})
        inputs.append(tensor)
    params = {}
    if draw(st.booleans()):
        params["priority"] = pb.InferParameter(uint64_param=draw(st.integers(0, 5)))
    if draw(st.booleans()):
        params["custom"] = draw(st.sampled_from([
            pb.InferParameter(string_param="s"), pb.InferParameter(bool_param=True),
            pb.InferParameter(double_param=1.5), pb.InferParameter(int64_param=-3)]))
    outputs = [pb.ModelInferRequestInferRequestedOutputTensor(
        name=f"OUT{j}", parameters={"classification": pb.InferParameter(int64_param=2)}
        if draw(st.booleans()) else {}) for j in range(draw(st.integers(0, 2)))]
    message = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(["m", "add_sub", "ünï"])),
        model_version=draw(st.sampled_from(["", "1", "12"])),
        id=draw(st.sampled_from(["", "req-1"])),
        parameters=params, inputs=inputs, outputs=outputs, raw_input_contents=raw)
    return bytes(message)


@settings(max_examples=400, deadline=None)
@given(valid_requests())
def test_hot_path_decoder_agrees_on_valid_requests(raw: bytes) -> None:
    slow = grpc_codec.decode_request(pb.ModelInferRequest().parse(raw))
    fast = grpc_codec.decode_request(decode_infer_request(raw))
    _same_request(slow, fast)

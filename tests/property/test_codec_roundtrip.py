"""JSON and binary tensor encodings round-trip for every datatype and shape."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.errors import InternalError, InvalidArgument, NurseryError
from nursery.protocol.codecs import binary_tensor
from nursery.protocol.codecs import json_tensors as json_codec
from nursery.types import (
    DataType,
    InferenceResponse,
    Tensor,
    deserialize_bytes_tensor,
    serialize_bytes_tensor,
)
from tests.property.strategies import tensors

LIMIT = 1 << 26


def _request_body(name: str, dt: str, arr: np.ndarray, binary: bool) -> tuple[bytes, bytes | None]:
    entry: dict = {"name": name, "datatype": dt, "shape": list(arr.shape)}
    blob = b""
    if binary:
        little = arr.astype(arr.dtype.newbyteorder("<"))
        blob = serialize_bytes_tensor(arr) if dt == "BYTES" else little.tobytes()
        entry["parameters"] = {"binary_data_size": len(blob)}
    elif dt == "BYTES":
        entry["data"] = [x.decode("latin-1") for x in arr.reshape(-1)]
    else:
        entry["data"] = arr.reshape(-1).tolist()
    head = json.dumps({"inputs": [entry]}).encode()
    return head + blob, (str(len(head)).encode() if binary else None)


def _decode(body: bytes, header: bytes | None) -> Tensor:
    js, binary = binary_tensor.split_body(body, header)
    request, _ = json_codec.decode_request(json_codec.parse_json(js), "m", "",
                                           binary_tensor.BlockReader(binary, "m"), LIMIT)
    return request.inputs["X"]


@settings(max_examples=300, deadline=None)
@given(tensors(), st.booleans())
def test_request_round_trip(tensor: tuple[str, np.ndarray], binary: bool) -> None:
    dt, arr = tensor
    if dt == "FP16" and not binary:
        binary = True  # JSON cannot carry FP16 (tested separately)
    if not binary and dt in ("FP32", "FP64") and not np.all(np.isfinite(arr)):
        arr = np.nan_to_num(arr, nan=0.0, posinf=1.0, neginf=-1.0)
    body, header = _request_body("X", dt, arr, binary)
    got = _decode(body, header)
    assert got.datatype is DataType(dt)
    assert got.shape == arr.shape
    if dt == "BYTES" and not binary:
        assert [x.decode("utf-8") for x in got.data.reshape(-1)] == [
            x.decode("latin-1") for x in arr.reshape(-1)]
    elif dt == "BYTES":
        assert list(got.data.reshape(-1)) == list(arr.reshape(-1))
    else:
        np.testing.assert_array_equal(got.data, arr)


def _client_parse(head: bytes, blocks: list) -> dict:
    """What a client does with a response: JSON header, then blocks in output order. The
    header is read as a parser that does not check UTF-8 reads it (rapidjson's default, the C++
    client's): BYTES elements that are not UTF-8 come back as their bytes (surrogate-escaped)."""
    result = json.loads(head.decode("utf-8", "surrogateescape"))
    buffer = b"".join(bytes(b) for b in blocks)
    pos = 0
    for out in result["outputs"]:
        size = out.get("parameters", {}).get("binary_data_size")
        if size is not None:
            out["raw"] = buffer[pos : pos + size]
            pos += size
    assert pos == len(buffer)
    return result


@settings(max_examples=300, deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=3), st.booleans())
def test_response_round_trip(outputs: list[tuple[str, np.ndarray]], binary: bool) -> None:
    tensors_ = [Tensor(f"O{i}", DataType(dt), arr.shape, arr) for i, (dt, arr) in enumerate(outputs)]
    response = InferenceResponse("m", "1", tensors_, id="x")
    fmt = json_codec.OutputFormat({}, binary)
    if not binary and any(dt == "FP16" for dt, _ in outputs):
        with pytest.raises(InvalidArgument, match="sending FP16 data via JSON"):
            json_codec.encode_response(response, fmt)
        return
    head, blocks = json_codec.encode_response(response, fmt)
    parsed = _client_parse(head, blocks)
    assert parsed["id"] == "x" and parsed["model_version"] == "1"
    for (dt, arr), out in zip(outputs, parsed["outputs"], strict=True):
        assert out["datatype"] == dt and out["shape"] == list(arr.shape)
        if binary:
            assert out["parameters"] == {"binary_data_size": len(out["raw"])}
            if dt == "BYTES":
                got = deserialize_bytes_tensor(out["raw"], arr.size)
                assert list(got) == list(arr.reshape(-1))
            else:
                got = np.frombuffer(out["raw"], dtype=DataType(dt).numpy_dtype)
                np.testing.assert_array_equal(got.reshape(arr.shape), arr)
        elif dt == "BYTES":
            assert out["data"] == [x.decode("utf-8", "surrogateescape") for x in arr.reshape(-1)]
        elif dt in ("FP32", "FP64"):
            np.testing.assert_array_equal(np.array(out["data"], dtype=arr.dtype),
                                          arr.reshape(-1))
        else:
            assert out["data"] == arr.reshape(-1).tolist()


@given(st.lists(st.binary(max_size=20), max_size=8))
def test_bytes_serialization(items: list[bytes]) -> None:
    arr = np.array(items, dtype=object)
    raw = serialize_bytes_tensor(arr)
    assert list(deserialize_bytes_tensor(raw, len(items))) == items


@given(st.binary(max_size=40), st.integers(0, 5))
def test_bytes_deserialization_never_crashes(raw: bytes, count: int) -> None:
    try:
        deserialize_bytes_tensor(raw, count)
    except InvalidArgument:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.one_of(st.none(), st.integers(-5, 250).map(lambda n: str(n).encode())))
def test_arbitrary_bodies_give_clean_errors(body: bytes, header: bytes | None) -> None:
    """Whatever arrives, decoding ends in a request or a NurseryError, nothing else."""
    try:
        js, binary = binary_tensor.split_body(body, header)
        json_codec.decode_request(json_codec.parse_json(js), "m", "",
                                  binary_tensor.BlockReader(binary, "m"), LIMIT)
    except NurseryError:
        pass


def test_json_element_type_errors() -> None:
    with pytest.raises(InternalError, match="non-boolean as boolean"):
        _decode(*_json_input("BOOL", [1, 0]))
    with pytest.raises(InternalError, match="non-signed-integer as signed-integer"):
        _decode(*_json_input("INT32", [1.5, 2]))
    with pytest.raises(InternalError, match="non-string as string"):
        _decode(*_json_input("BYTES", [1, 2]))
    with pytest.raises(InternalError, match="Shape does not match"):
        _decode(*_json_input("INT32", [1, 2, 3]))


def _json_input(dt: str, data: list) -> tuple[bytes, None]:
    return json.dumps({"inputs": [{"name": "X", "datatype": dt, "shape": [2], "data": data}]}).encode(), None


def test_nested_data_flattens() -> None:
    body = json.dumps({"inputs": [{"name": "X", "datatype": "INT64", "shape": [2, 2],
                                   "data": [[1, 2], [3, 4]]}]}).encode()
    np.testing.assert_array_equal(_decode(body, None).data, [[1, 2], [3, 4]])


def test_too_deep_nesting_is_rejected() -> None:
    data: list = [1]
    for _ in range(150):
        data = [data]
    body = json.dumps({"inputs": [{"name": "X", "datatype": "INT64", "shape": [1],
                                   "data": data}]}).encode()
    with pytest.raises(NurseryError):
        _decode(body, None)


def test_zero_element_tensor() -> None:
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [0, 3],
                                   "data": []}]}).encode()
    assert _decode(body, None).data.shape == (0, 3)


def test_output_format_selection() -> None:
    arr = np.ones((1, 2), np.float32)
    response = InferenceResponse("m", "1", [Tensor("A", DataType.FP32, (1, 2), arr),
                                            Tensor("B", DataType.FP32, (1, 2), arr)])
    head, blocks = json_codec.encode_response(
        response, json_codec.OutputFormat({"A": True, "B": False}, False))
    parsed = json.loads(head)
    assert parsed["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert parsed["outputs"][1]["data"] == [1.0, 1.0]
    assert "id" not in parsed and len(blocks) == 1

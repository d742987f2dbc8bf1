"""Bad JSON inference bodies: each costs its request a clean error with Triton's status.

Triton's HTTP frontend (src/http_server.cc, ``ParseJsonTritonIO``) first asks which content
field an input sets (``ValidateInputContentType``): a member lookup on anything but an object
finds nothing, so an ``inputs`` element that is not an object is INVALID_ARG (400) "... But no
field is set". Members that are missing or of the wrong type are TritonJson errors, which
Triton 2.51 answers INTERNAL (500, recorded in tests/conformance). A repeated requested output
is refused by core's ``AddOriginalRequestedOutput`` (INVALID_ARG).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.errors import NurseryError
from nursery.protocol.codecs import binary_tensor
from nursery.protocol.codecs import json_tensors as json_codec
from nursery.protocol.codecs.status import http_error
from nursery.types import DataType

LIMIT = 1 << 26
_GOOD = {"name": "X", "datatype": "INT32", "shape": [2], "data": [1, 2]}


def _status(doc: Any) -> tuple[int, str]:
    body = json.dumps(doc).encode()
    try:
        json_codec.decode_request(json_codec.parse_json(body), "m", "",
                                  binary_tensor.BlockReader(None, "m"), LIMIT)
    except NurseryError as error:
        status, payload = http_error(error)
        return status, json.loads(payload)["error"]
    return 200, ""


@pytest.mark.parametrize("element", [5, "x", None, [], [_GOOD], True, 1.5])
def test_an_input_that_is_not_an_object_is_400(element: Any) -> None:
    status, message = _status({"inputs": [element]})
    assert status == 400
    assert message.endswith("But no field is set")


def test_content_fields_come_before_the_name() -> None:
    assert _status({"inputs": [{"name": 5}]}) == (
        400, json_codec._CONTENT_FIELDS + " no field is set")


@pytest.mark.parametrize(("member", "doc", "words"), [
    ("name", {"datatype": "INT32", "shape": [2], "data": [1, 2]}, "non-existing object member 'name'"),
    ("name", {"name": 1, "datatype": "INT32", "shape": [2], "data": [1, 2]}, "JSON non-string as string"),
    ("datatype", {"name": "X", "shape": [2], "data": [1, 2]}, "non-existing object member 'datatype'"),
    ("shape", {"name": "X", "datatype": "INT32", "data": [1, 2]}, "non-existing object member 'shape'"),
])
def test_missing_and_mistyped_members_use_tritonjson_words(member: str, doc: dict[str, Any],
                                                           words: str) -> None:
    assert _status({"inputs": [doc]}) == (500, f"Unable to parse '{member}': attempt to access {words}")


def test_input_parameters_that_are_not_an_object_are_ignored() -> None:
    assert _status({"inputs": [{**_GOOD, "parameters": 5}]}) == (200, "")


def test_an_output_that_is_not_an_object() -> None:
    assert _status({"inputs": [_GOOD], "outputs": [5]}) == (
        500, "Unable to parse 'name': attempt to access non-existing object member 'name'")


def test_duplicate_requested_outputs_are_refused() -> None:
    doc = {"inputs": [_GOOD], "outputs": [{"name": "Y"}, {"name": "Y", "parameters": {"binary_data": True}}]}
    assert _status(doc) == (400, "[request id: <id_unknown>] output 'Y' already exists in request")
    assert _status({**doc, "id": "r7"}) == (400, "[request id: r7] output 'Y' already exists in request")
    assert _status({**doc, "outputs": [{"name": "Y"}, {"name": "Z"}]}) == (200, "")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["name", "datatype", "shape", "data", "parameters", "binary_data_size",
                         "shared_memory_region", "binary_data", "classification"]),
        inner, max_size=4),
    max_leaves=12,
)


def _near(value: Any) -> st.SearchStrategy[Any]:
    """Documents one edit away from a good request: one member replaced by any JSON."""
    good: dict[str, Any] = {"inputs": [dict(_GOOD)], "outputs": [{"name": "Y"}]}
    return st.sampled_from([
        ("inputs",), ("outputs",), ("inputs", 0), ("outputs", 0), ("inputs", 0, "name"),
        ("inputs", 0, "datatype"), ("inputs", 0, "shape"), ("inputs", 0, "data"),
        ("inputs", 0, "parameters"), ("outputs", 0, "name"), ("outputs", 0, "parameters"),
        ("parameters",), ("id",),
    ]).map(lambda path: _replace(good, path, value))


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_bad_json_near_a_good_request_costs_only_the_request(data: st.DataObject) -> None:
    """Any one member replaced by any JSON: a request or a NurseryError, never anything else;
    a 500 only with the words Triton answers 500 with (a TritonJson parse error)."""
    doc = data.draw(_JSON.flatmap(_near))
    status, message = _status(doc)
    if status == 500:
        assert message.startswith(("Unable to parse", "failed to parse", "Failed to parse")), message
    assert status in (200, 400, 500)



# -- BYTES outputs that are not UTF-8, asked for as JSON ----------------------------------------

def test_non_utf8_bytes_are_written_as_triton_writes_them() -> None:
    """Triton's HTTP frontend appends each element with rapidjson (no encoding check) and
    answers 200: the bytes travel unchanged inside the JSON string, only escapes added."""
    import numpy as np

    from nursery.types import DataType, InferenceResponse, Tensor

    values = np.array([b"caf\xe9", b'q"\\\n\x01', "ünï".encode()], dtype=object)
    response = InferenceResponse("m", "1", [Tensor("Y", DataType.BYTES, (3,), values)])
    head, blocks = json_codec.encode_response(response, json_codec.OutputFormat({}, False))
    assert not blocks
    assert b'"data":["caf\xe9","q\\"\\\\\\n\\u0001","\xc3\xbcn\xc3\xaf"]' in head
    parsed = json.loads(head.decode("utf-8", "surrogateescape"))
    assert [x.encode("utf-8", "surrogateescape") for x in parsed["outputs"][0]["data"]] == list(values)


def test_utf8_bytes_stay_plain_json() -> None:
    import numpy as np

    from nursery.types import DataType, InferenceResponse, Tensor

    values = np.array(["ünï".encode(), b"a"], dtype=object)
    response = InferenceResponse("m", "1", [Tensor("Y", DataType.BYTES, (2,), values)], id="i")
    head, _ = json_codec.encode_response(response, json_codec.OutputFormat({}, False))
    assert json.loads(head)["outputs"][0]["data"] == ["ünï", "a"]


@pytest.mark.parametrize("value", [b"", b"plain", b"\x00\x1f\x7f\x80\xff", b'"\\/'])
def test_raw_json_string_is_valid_json_for_utf8_and_keeps_bytes(value: bytes) -> None:
    text = json_codec.raw_json_string(value)
    assert json.loads(text.decode("utf-8", "surrogateescape")).encode(
        "utf-8", "surrogateescape") == value


def test_json_data_shapes_that_overflow_are_400_in_tritons_words() -> None:
    """L0_http's test_buffer_size_overflow: the element count past INT64_MAX, then the byte
    size past it, each refused before any array is made."""
    count_overflow = {"name": "X", "datatype": "FP32", "shape": [2**4, 2**60 + 2], "data": [1.0]}
    assert _status({"inputs": [count_overflow]}) == (
        400, "invalid shape for input 'X': shape [16,1152921504606846978] causes total element "
             "count to exceed maximum size of 9223372036854775807")
    byte_overflow = {"name": "X", "datatype": "FP32", "shape": [2**2, 2**60 + 2], "data": [1.0]}
    assert _status({"inputs": [byte_overflow]}) == (
        400, "byte size overflow for input 'X': element count (4611686018427387912) * data type "
             "size (4) exceeds maximum allowed size (9223372036854775807)")


@pytest.mark.parametrize(("datatype", "values"), [("INT32", [1, 2, 3]), ("BYTES", ["a", "b", "c"])])
def test_too_many_and_too_few_elements_have_tritons_two_messages(datatype: str,
                                                                  values: list[Any]) -> None:
    """ReadDataFromJson: an overrun is found while reading, a shortfall once all are read."""
    def status(n: int) -> tuple[int, str]:
        return _status({"inputs": [{"name": "X", "datatype": datatype, "shape": [2],
                                    "data": values[:n]}]})
    assert status(3) == (500, "Unable to parse 'data': Shape does not match true shape of "
                              "'data' field")
    assert status(1) == (500, "Failed to parse 'data' field: shape does not match true shape")
    assert status(2) == (200, "")


def test_a_number_past_fp32_range_is_infinity() -> None:
    """As Triton's cast of the parsed double to float (hypothesis found numpy's overflow
    warning through the generate endpoint's `temperature`)."""
    array = json_codec.json_array([3.4028235677973366e38, -1e39, 1.5], DataType.FP32,
                                  (3,), "x", 3)
    assert array.tolist() == [float("inf"), float("-inf"), 1.5]

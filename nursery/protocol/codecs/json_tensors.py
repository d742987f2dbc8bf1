"""KServe v2 JSON inference bodies <-> the core's request and response types (pure).

Errors follow Triton 2.51's HTTP frontend, including its status codes: a body that is not
JSON, or JSON of the wrong type (``shape`` with a negative number, ``data`` whose element
count does not match ``shape``), is INTERNAL (HTTP 500) there; everything else is
INVALID_ARG (400). ``tests/conformance`` compares answers case by case with recorded Triton
answers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nursery.errors import InternalError, InvalidArgument
from nursery.protocol.codecs import deep_json
from nursery.protocol.codecs.binary_tensor import BlockReader
from nursery.shm.system import ShmAccess, ShmBinding
from nursery.types import (
    DataType,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
    checked_count,
    input_bytes_tensor,
    tensor_to_bytes,
)

try:  # orjson is several times faster on tensor-sized JSON; the stdlib is the fallback
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)

except ImportError:  # pragma: no cover - exercised only without orjson
    import json

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    _JSONError = ValueError

# Request parameters with a meaning of their own; other keys are passed to the model.
_RESERVED = {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
             "binary_data_output", "headers"}
_MAX_SHAPE_DIM = 2**63 - 1

_CONTENT_FIELDS = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in "
    "'parameters', 'shared_memory_region' in 'parameters'. But"
)


@dataclass(slots=True)
class OutputFormat:
    """Which outputs go back as binary blocks (HTTP only)."""

    listed: dict[str, bool]  # output name -> binary, for outputs the request listed
    default_binary: bool  # for every output when none were listed
    shm: dict[str, ShmBinding] = field(default_factory=dict)  # outputs written to regions
    registry: ShmAccess | None = None


def parse_json(data: bytes | memoryview) -> Any:
    """The request JSON, however deeply nested (``deep_json``: never a recursion that a hostile
    body could overflow; a body deeper than ``deep_json.FAST_DEPTH`` is parsed in Python, so
    callers on the event loop check ``deep_json.shallow`` and run such a parse in a thread)."""
    try:
        return deep_json.loads(data)
    except ValueError as exc:  # orjson's JSONDecodeError and deep_json's are ValueErrors
        raise InternalError(f"failed to parse the request JSON buffer: {exc}") from None
    except (RecursionError, MemoryError):
        raise InvalidArgument("failed to parse the request JSON buffer: nested too deeply") from None


def _flatten(data: Any, out: list[Any], depth: int = 0) -> None:
    if depth > 100:
        raise InvalidArgument("JSON nesting depth exceeds maximum allowed limit (100)")
    for item in data:
        if isinstance(item, list):
            _flatten(item, out, depth + 1)
        else:
            out.append(item)


# Triton's HTTP frontend (ReadDataFromJson): more elements than the shape holds are found while
# reading, fewer once all are read, each with its own words
_OVERRUN = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_SHORT = "Failed to parse 'data' field: shape does not match true shape"


def _json_array(data: Any, datatype: DataType, shape: tuple[int, ...], name: str,
                count: int) -> np.ndarray:
    """``data`` (already parsed: its size is bounded by the body) as an array of ``count``
    elements (the caller checked ``shape``)."""
    if not isinstance(data, list):
        data = [data]
    if datatype is DataType.BYTES:
        flat = _flat(data)
        if len(flat) > count:
            raise InternalError(_OVERRUN)
        out = np.empty(len(flat), dtype=object)
        for i, item in enumerate(flat):
            if not isinstance(item, str):
                raise InternalError(
                    "Unable to parse 'data': attempt to access JSON non-string as string"
                )
            out[i] = item.encode("utf-8")
        if len(flat) < count:
            raise InternalError(_SHORT)
        return out.reshape(shape)
    flat = None  # type: ignore[assignment]  # the BYTES branch above returned
    try:  # numpy reads flat and nested (rectangular) lists alike, without a Python loop
        arr = np.array(data)
    except (ValueError, OverflowError):  # ragged nesting or huge integers
        arr = None
    if arr is None or arr.dtype == object:
        flat = _flat(data)
        try:
            arr = np.array(flat)
        except (ValueError, OverflowError):
            raise InternalError("Unable to parse 'data': elements are not all numbers") from None
    if arr.size > count:
        raise InternalError(_OVERRUN)
    kind = arr.dtype.kind
    if datatype is DataType.BOOL:
        if kind != "b" and arr.size:
            raise InternalError("Unable to parse 'data': attempt to access JSON non-boolean as boolean")
    elif datatype in (DataType.FP32, DataType.FP64):
        if kind not in "iuf" and arr.size:
            raise InternalError("Unable to parse 'data': attempt to access JSON non-number as double")
    elif kind not in "iu" and arr.size:  # integer types
        # numpy widens a mix of int64 and larger uint64 values to float: check the elements
        flat = _flat(data) if flat is None else flat
        if not all(type(x) is int for x in flat):
            what = "unsigned-integer" if datatype.name.startswith("U") else "signed-integer"
            raise InternalError(
                f"Unable to parse 'data': attempt to access JSON non-{what} as {what}"
            )
        arr = np.array(flat, dtype=object)
    if arr.size < count:  # read every element, then found too few
        raise InternalError(_SHORT)
    try:
        # a number past FP32's (or FP16's) range becomes infinity, as Triton's C++ cast of the
        # parsed double gives it; numpy would warn
        with np.errstate(over="ignore"):
            return arr.astype(datatype.numpy_dtype, copy=False).reshape(shape)
    except (ValueError, OverflowError) as exc:
        raise InvalidArgument(f"input '{name}': {exc}") from None


def json_array(data: Any, datatype: DataType, shape: tuple[int, ...], name: str,
               count: int) -> np.ndarray:
    """JSON values (a scalar or a list) as an array of ``count`` elements of ``shape``, with
    Triton's messages for values of the wrong type (the generate extension's inputs)."""
    return _json_array(data, datatype, shape, name, count)


def _flat(data: list[Any]) -> list[Any]:
    if data and isinstance(data[0], list):
        flat: list[Any] = []
        _flatten(data, flat)
        return flat
    for item in data:
        if isinstance(item, list):
            flat = []
            _flatten(data, flat)
            return flat
    return data


def _member_error(obj: Any, key: str, kind: str) -> InternalError:
    """TritonJson's words for a member that is missing (or whose holder is not an object) and
    for one of the wrong type; INTERNAL, as Triton 2.51 answers them (500)."""
    if not isinstance(obj, dict) or key not in obj:
        return InternalError(
            f"Unable to parse '{key}': attempt to access non-existing object member '{key}'")
    return InternalError(f"Unable to parse '{key}': attempt to access JSON non-{kind} as {kind}")


INT64_MAX = 2**63 - 1


def _check_json_size(name: str, shape: tuple[int, ...], datatype: DataType) -> None:
    """Triton's HTTP frontend's overflow checks for an input given as JSON data, its words."""
    total = 1
    for d in shape:
        total *= d
    if total > INT64_MAX:
        raise InvalidArgument(
            f"invalid shape for input '{name}': shape [{','.join(str(d) for d in shape)}] "
            f"causes total element count to exceed maximum size of {INT64_MAX}")
    size = datatype.itemsize if datatype is not DataType.BYTES else 1
    if size > 1 and total > INT64_MAX // size:
        raise InvalidArgument(
            f"byte size overflow for input '{name}': element count ({total}) * data type "
            f"size ({size}) exceeds maximum allowed size ({INT64_MAX})")


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise InternalError("Unable to parse 'shape': attempt to access JSON non-array as array")
    for d in value:
        if type(d) is not int or d < 0:
            raise InternalError(
                "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
                "unsigned-integer"
            )
        if d > _MAX_SHAPE_DIM:
            raise InvalidArgument(f"Unable to parse 'shape': dimension {d} is too large")
    return tuple(value)


def _check_parameters(params: Any, where: str) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InternalError(f"Unable to parse '{where}': attempt to access JSON non-object as object")
    return params


def decode_request(
    body: Any,
    model_name: str,
    model_version: str,
    blocks: BlockReader,
    max_bytes: int,
    shm: ShmAccess | None = None,
) -> tuple[InferenceRequest, OutputFormat]:
    """Turn a parsed request JSON (and its binary blocks) into an :class:`InferenceRequest`."""
    if not isinstance(body, dict):
        raise InternalError(
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
        )
    raw_inputs = body.get("inputs")
    if raw_inputs is None:
        raise InternalError(
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
        )
    if not isinstance(raw_inputs, list):
        raise InternalError("Unable to parse 'inputs': attempt to access JSON non-array as array")
    request_id = body.get("id", "")
    if not isinstance(request_id, str):
        raise InternalError("Unable to parse 'id': attempt to access JSON non-string as string")

    params = _check_parameters(body.get("parameters"), "parameters")
    custom: dict[str, Any] = {}
    for key, value in params.items():
        if key.startswith("triton_"):  # every one over HTTP, as Triton (http_server.cc)
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified."
            )
        if key in _RESERVED:
            continue
        if not isinstance(value, str | int | bool | float):
            raise InvalidArgument(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )
        custom[key] = value
    priority = _uint_param(params, "priority")
    timeout = _uint_param(params, "timeout")
    sequence_id, sequence_start, sequence_end = _sequence_params(params)
    default_binary = params.get("binary_data_output", False)
    if not isinstance(default_binary, bool):
        raise InternalError(
            "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean"
        )

    inputs: dict[str, Tensor] = {}
    for item in raw_inputs:
        # Triton's order: which content field is set comes first (ValidateInputContentType:
        # a member lookup on anything but an object finds nothing, so an input that is not an
        # object sets no field: 400), then name, datatype and shape
        found = item if isinstance(item, dict) else {}
        found_params = found.get("parameters")
        if not isinstance(found_params, dict):
            found_params = {}
        has_data = "data" in found
        has_binary = "binary_data_size" in found_params
        has_shm = "shared_memory_region" in found_params
        if has_data + has_binary + has_shm != 1:
            set_fields = "".join(
                f" '{f}'" for f, on in (("data", has_data), ("binary_data_size", has_binary),
                                        ("shared_memory_region", has_shm)) if on
            )
            given = " set" + set_fields if set_fields else " no field is set"
            raise InvalidArgument(f"{_CONTENT_FIELDS}{given}")
        name = item.get("name")
        if not isinstance(name, str):
            raise _member_error(item, "name", "string")
        dt_text = item.get("datatype")
        if not isinstance(dt_text, str):
            raise _member_error(item, "datatype", "string")
        if "shape" not in item:
            raise _member_error(item, "shape", "array")
        shape = _shape(item["shape"])
        # input parameters that are not an object hold no binary or shared-memory fields
        # for Triton either (its Find on them finds nothing): ignored, not an error
        iparams = found_params
        try:
            datatype = DataType.from_protocol(dt_text)
        except InvalidArgument:
            raise InvalidArgument(f"invalid datatype for input {name}") from None
        prefix = f"[request id: {request_id or '<id_unknown>'}] "
        if has_data and not has_binary and not has_shm:
            _check_json_size(name, shape, datatype)
        count = checked_count(
            shape, datatype, f"{prefix}unexpected shape for input '{name}' for model '{model_name}'")
        if has_data and datatype is not DataType.BYTES and count * datatype.itemsize > max_bytes:
            # JSON data becomes a new array of this size: bounded, as Triton bounds it (its
            # words since --http-max-input-size came); binary blocks are views on the body
            raise InvalidArgument(
                f"JSON input '{name}' has a byte_size ({count * datatype.itemsize} bytes) that "
                f"exceeds the maximum allowed value of {max_bytes} bytes. Use "
                "--http-max-input-size to increase the limit."
            )
        if has_shm:
            data = _shm_input(iparams, name, datatype, shape, count, model_name, request_id, shm)
        elif has_binary:
            size = iparams["binary_data_size"]
            if type(size) is not int or size < 0:
                raise InternalError(
                    "Unable to parse 'binary_data_size': attempt to access JSON "
                    "non-unsigned-integer as unsigned-integer"
                )
            block = blocks.take(name, size)
            if datatype is DataType.BYTES:
                data = input_bytes_tensor(block, shape, name, model_name,
                                          f"[request id: {request_id or '<id_unknown>'}] ")
            else:
                expected = count * datatype.itemsize
                if size != expected:
                    raise InvalidArgument(
                        f"[request id: {request_id or '<id_unknown>'}] input byte size mismatch "
                        f"for input '{name}' for model '{model_name}'. Expected {expected}, "
                        f"got {size}"
                    )
                data = np.frombuffer(block, dtype=datatype.numpy_dtype, count=count).reshape(shape)
        else:
            if not datatype.json_capable:
                raise InvalidArgument(
                    f"receiving {datatype.value} data via JSON is not supported. Please use the "
                    f"binary data format for input {name}"
                )
            data = _json_array(item["data"], datatype, shape, name, count)
        if name in inputs:
            raise InvalidArgument(f"input '{name}' already exists in request")
        inputs[name] = Tensor(name, datatype, shape, data)
    blocks.finish()

    outputs: list[RequestedOutput] = []
    listed: dict[str, bool] = {}
    shm_outputs: dict[str, ShmBinding] = {}
    raw_outputs = body.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InternalError("Unable to parse 'outputs': attempt to access JSON non-array as array")
        for item in raw_outputs:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise _member_error(item, "name", "string")
            if item["name"] in listed:  # core's AddOriginalRequestedOutput refuses a repeat
                raise InvalidArgument(
                    f"[request id: {request_id or '<id_unknown>'}] output '{item['name']}' "
                    "already exists in request")
            oparams = _check_parameters(item.get("parameters"), "parameters")
            binary = oparams.get("binary_data", False)
            if not isinstance(binary, bool):
                raise InternalError(
                    "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean"
                )
            classes = oparams.get("classification", 0)
            if type(classes) is not int or classes < 0:
                raise InvalidArgument("Unable to set 'classification': it must be a non-negative integer")
            if "shared_memory_region" in oparams:
                if classes:
                    raise InvalidArgument(
                        "Output can't set both 'shared_memory_region' and 'classification'"
                    )
                if binary:
                    raise InvalidArgument("Output can't set both 'shared_memory_region' and 'binary_data'")
                binding = _shm_binding(oparams)
                if shm is None:
                    raise InvalidArgument("shared memory is not available on this endpoint")
                shm.lookup(binding.region, binding.offset, binding.byte_size)
                shm_outputs[item["name"]] = binding
            outputs.append(RequestedOutput(item["name"], classes))
            listed[item["name"]] = binary

    request = InferenceRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=inputs,
        requested_outputs=tuple(outputs),
        id=request_id,
        parameters=custom,
        priority=priority,
        timeout_us=timeout,
        sequence_id=sequence_id,
        sequence_start=sequence_start,
        sequence_end=sequence_end,
    )
    return request, OutputFormat(listed, default_binary, shm_outputs, shm)


def _shm_binding(params: dict[str, Any]) -> ShmBinding:
    """Triton's HTTP ``CheckSharedMemoryData``: region (string), offset and byte size
    (unsigned, 0 when absent)."""
    region = params["shared_memory_region"]
    if not isinstance(region, str):
        raise InternalError(
            "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string")
    return ShmBinding(region, _uint_param(params, "shared_memory_offset"),
                      _uint_param(params, "shared_memory_byte_size"))


def _shm_input(params: dict[str, Any], name: str, datatype: DataType, shape: tuple[int, ...],
               count: int, model: str, request_id: str,
               shm: ShmAccess | None) -> np.ndarray:
    """An input read from a registered region: a copy of exactly its bytes, taken now (the
    region's owner may shrink it while the request waits), after the sizes agree."""
    if shm is None:
        raise InvalidArgument("shared memory is not available on this endpoint")
    binding = _shm_binding(params)
    if datatype is not DataType.BYTES and binding.byte_size != count * datatype.itemsize:
        shm.lookup(binding.region, binding.offset, binding.byte_size)  # Triton checks it first
        raise InvalidArgument(
            f"[request id: {request_id or '<id_unknown>'}] input byte size mismatch for input "
            f"'{name}' for model '{model}'. Expected {count * datatype.itemsize}, got "
            f"{binding.byte_size}")
    block = shm.read(binding.region, binding.offset, binding.byte_size)
    if datatype is DataType.BYTES:
        return input_bytes_tensor(block, shape, name, model,
                                  f"[request id: {request_id or '<id_unknown>'}] ")
    return np.frombuffer(block, dtype=datatype.numpy_dtype, count=count).reshape(shape)


def _sequence_params(params: dict[str, Any]) -> tuple[int | str, bool, bool]:
    """Triton's ``sequence_id`` (unsigned integer, else string), ``sequence_start`` and
    ``sequence_end`` (booleans) request parameters."""
    if not params:
        return 0, False, False
    sequence_id = params.get("sequence_id", 0)
    if not (type(sequence_id) is int and 0 <= sequence_id < 2**64) and not isinstance(
            sequence_id, str):
        raise InternalError(
            "Unable to parse 'sequence_id': attempt to access JSON non-string as string")
    flags = []
    for key in ("sequence_start", "sequence_end"):
        value = params.get(key, False)
        if not isinstance(value, bool):
            raise InternalError(
                f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")
        flags.append(value)
    return sequence_id, flags[0], flags[1]


def _uint_param(params: dict[str, Any], key: str) -> int:
    value = params.get(key, 0)
    if type(value) is not int or value < 0:
        raise InternalError(
            f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer"
        )
    return value


# rapidjson's string escapes (Triton writes its JSON with rapidjson, without validating the
# encoding): the short forms, \u00XX (upper-case hex) for the other control characters;
# every other byte is written as it is
_RAW_ESCAPES: dict[int, bytes] = {c: b"\\u%04X" % c for c in range(0x20)}
_RAW_ESCAPES.update({0x08: b"\\b", 0x09: b"\\t", 0x0A: b"\\n", 0x0C: b"\\f",
                     0x0D: b"\\r", 0x22: b'\\"', 0x5C: b"\\\\"})
_NEEDS_ESCAPE = frozenset(_RAW_ESCAPES)


def raw_json_string(value: bytes) -> bytes:
    """``value`` as a JSON string the way Triton's HTTP frontend writes a BYTES element:
    escaped as rapidjson escapes, its bytes otherwise untouched (not UTF-8 checked)."""
    if not _NEEDS_ESCAPE.intersection(value):
        return b'"' + value + b'"'
    return b'"' + b"".join(_RAW_ESCAPES.get(c, bytes((c,))) for c in value) + b'"'


def _json_data(tensor: Tensor) -> list[Any] | bytes:
    """The ``data`` of a JSON output: a list for ``dumps``, or, for BYTES elements that are
    not all UTF-8, the finished JSON array as bytes (Triton sends such bytes unchanged, inside
    the JSON string, with status 200; a UTF-8 text is never altered, as U+FFFD would)."""
    data = tensor.data
    if tensor.datatype is DataType.BYTES:
        flat = [x if isinstance(x, bytes | bytearray) else str(x).encode() for x in data.reshape(-1)]
        try:
            return [bytes(x).decode("utf-8") for x in flat]
        except UnicodeDecodeError:
            return b"[" + b",".join(raw_json_string(bytes(x)) for x in flat) + b"]"
    return data.reshape(-1).tolist()  # type: ignore[no-any-return]


def encode_response(
    response: InferenceResponse, fmt: OutputFormat
) -> tuple[bytes, list[bytes | memoryview]]:
    """The response JSON header and the binary blocks that follow it (possibly none)."""
    outputs = []
    blocks: list[bytes | memoryview] = []
    raw_data: dict[str, bytes] = {}  # placeholder -> a finished JSON array (non-UTF-8 BYTES)
    for tensor in response.outputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype.value,
            "shape": list(tensor.shape),
        }
        binary = fmt.listed.get(tensor.name, fmt.default_binary) if fmt.listed else fmt.default_binary
        binding = fmt.shm.get(tensor.name) if fmt.shm else None
        if binding is not None:
            assert fmt.registry is not None
            raw = tensor_to_bytes(tensor.data, tensor.datatype)
            # Triton answers a shared-memory output with its name, datatype and shape only
            # (and the C++ client reads "parameters" as binary-data ones)
            fmt.registry.write(binding.region, binding.offset, binding.byte_size, raw, tensor.name)
        elif binary:
            raw = tensor_to_bytes(tensor.data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            if len(raw):
                blocks.append(raw)
        else:
            if not tensor.datatype.json_capable:
                raise InvalidArgument(
                    f"sending {tensor.datatype.value} data via JSON is not supported. Please use "
                    f"the binary data format for output {tensor.name}"
                )
            data = _json_data(tensor)
            if isinstance(data, bytes):
                placeholder = f"\0raw-{uuid.uuid4().hex}\0"
                raw_data[placeholder] = data
                entry["data"] = placeholder
            else:
                entry["data"] = data
        outputs.append(entry)
    head: dict[str, Any] = {}
    if response.id:
        head["id"] = response.id
    head["model_name"] = response.model_name
    head["model_version"] = response.model_version
    if response.parameters:
        head["parameters"] = response.parameters
    head["outputs"] = outputs
    text = dumps(head)
    for placeholder, data in raw_data.items():  # the array in place of its placeholder string
        text = text.replace(dumps(placeholder), data, 1)
    return text, blocks


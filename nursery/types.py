"""The core data model: datatypes, tensors, inference requests and responses.

Tensors carry numpy arrays. BYTES tensors are numpy ``object`` arrays whose elements are
``bytes``. BF16 has no numpy type: a BF16 tensor carries its raw 2-byte elements as a
``uint16`` array, which is exactly what travels on the wire.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nursery.errors import InvalidArgument


class DataType(enum.Enum):
    """A tensor datatype; the value is the protocol string (``"FP32"``)."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"
    BF16 = "BF16"

    # Filled in below the class: numpy dtype, element size, config enum value.
    numpy_dtype: np.dtype[Any]
    itemsize: int  # 0 for BYTES (variable)
    config_value: int  # model_config.proto DataType number

    @classmethod
    def from_protocol(cls, text: str) -> DataType:
        try:
            return _BY_PROTOCOL[text]
        except (KeyError, TypeError):
            raise InvalidArgument(f"invalid datatype '{text}'") from None

    @classmethod
    def from_config(cls, value: int) -> DataType:
        try:
            return _BY_CONFIG[int(value)]
        except KeyError:
            raise InvalidArgument(f"invalid model config data type {value}") from None

    @property
    def config_name(self) -> str:
        return _CONFIG_NAMES[self.config_value]

    @property
    def json_capable(self) -> bool:
        """Whether the datatype may travel as JSON ``data`` (Triton: not FP16/BF16)."""
        return self not in (DataType.FP16, DataType.BF16)


_TABLE: dict[str, tuple[str, int, int]] = {
    # protocol: (numpy dtype, itemsize, config enum number)
    "BOOL": ("bool", 1, 1),
    "UINT8": ("uint8", 1, 2),
    "UINT16": ("<u2", 2, 3),
    "UINT32": ("<u4", 4, 4),
    "UINT64": ("<u8", 8, 5),
    "INT8": ("int8", 1, 6),
    "INT16": ("<i2", 2, 7),
    "INT32": ("<i4", 4, 8),
    "INT64": ("<i8", 8, 9),
    "FP16": ("<f2", 2, 10),
    "FP32": ("<f4", 4, 11),
    "FP64": ("<f8", 8, 12),
    "BYTES": ("object", 0, 13),
    "BF16": ("<u2", 2, 14),
}
_CONFIG_NAMES = {
    0: "TYPE_INVALID", 1: "TYPE_BOOL", 2: "TYPE_UINT8", 3: "TYPE_UINT16", 4: "TYPE_UINT32",
    5: "TYPE_UINT64", 6: "TYPE_INT8", 7: "TYPE_INT16", 8: "TYPE_INT32", 9: "TYPE_INT64",
    10: "TYPE_FP16", 11: "TYPE_FP32", 12: "TYPE_FP64", 13: "TYPE_STRING", 14: "TYPE_BF16",
}
for _dt in DataType:
    _np, _size, _cfg = _TABLE[_dt.value]
    _dt.numpy_dtype = np.dtype(_np)
    _dt.itemsize = _size
    _dt.config_value = _cfg
_BY_PROTOCOL = {dt.value: dt for dt in DataType}
_BY_CONFIG = {dt.config_value: dt for dt in DataType}
_BY_NUMPY_KIND = {
    np.dtype(np.bool_): DataType.BOOL,
    np.dtype(np.uint8): DataType.UINT8,
    np.dtype(np.uint16): DataType.UINT16,
    np.dtype(np.uint32): DataType.UINT32,
    np.dtype(np.uint64): DataType.UINT64,
    np.dtype(np.int8): DataType.INT8,
    np.dtype(np.int16): DataType.INT16,
    np.dtype(np.int32): DataType.INT32,
    np.dtype(np.int64): DataType.INT64,
    np.dtype(np.float16): DataType.FP16,
    np.dtype(np.float32): DataType.FP32,
    np.dtype(np.float64): DataType.FP64,
    np.dtype(np.object_): DataType.BYTES,
}


def datatype_of_array(array: np.ndarray) -> DataType:
    """The protocol datatype for a numpy array (``bytes``/``str`` arrays are BYTES)."""
    dt = array.dtype
    if dt.kind in ("S", "U", "O"):
        return DataType.BYTES
    try:
        return _BY_NUMPY_KIND[dt.newbyteorder("=") if dt.byteorder == ">" else dt]
    except KeyError:
        raise InvalidArgument(f"numpy dtype {dt} has no protocol datatype") from None


def tensor_of(name: str, array: Any) -> Tensor:
    """A tensor named ``name`` over ``array``, its datatype and shape read from the array."""
    array = np.asarray(array)
    return Tensor(name, datatype_of_array(array), tuple(array.shape), array)


def element_count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


MAX_DIMS = 64  # numpy's limit on an array's rank
MAX_ARRAY_BYTES = 2**63 - 1  # numpy's limit on an array's byte size (its intp)
BYTES_PREFIX = 4  # a BYTES element's length prefix: the least wire bytes one element takes


def checked_count(shape: tuple[int, ...], datatype: DataType, what: str) -> int:
    """The element count of ``shape``, once numpy could hold such an array at all.

    A client's shape is a claim, not an allocation: ``[0, 2**62, 4]`` holds no element yet
    numpy refuses even its empty array (the product of the other dimensions overflows its
    byte size), and a rank over :data:`MAX_DIMS` cannot be built either. Python integers do
    not overflow, so the products here are exact; the check stops at the first dimension
    that passes the limit, so a long shape of huge numbers costs no big-integer work.
    """
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(
            f"{what}: shape has {len(shape)} dimensions, more than the {MAX_DIMS} supported")
    limit = MAX_ARRAY_BYTES // datatype.numpy_dtype.itemsize
    count = 1
    nonzero = 1
    for d in shape:
        if d < 0:
            raise InvalidArgument(f"{what}: shape {list(shape)} has a negative dimension")
        count *= d
        if d:
            nonzero *= d
            if nonzero > limit:
                raise InvalidArgument(
                    f"{what}: shape {list(shape)} of {datatype.value} is too large for a tensor")
    return count


# -- BYTES serialization: 4-byte little-endian length, then the bytes, per element --------

_LEN = struct.Struct("<I")


def serialize_bytes_tensor(array: np.ndarray) -> bytes:
    """Serialize a BYTES tensor (elements ``bytes`` or ``str``) in row-major order."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, bytes | bytearray):
            item = str(item).encode("utf-8")
        parts.append(_LEN.pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def deserialize_bytes_tensor(
    buffer: bytes | memoryview, count: int, what: str = "BYTES tensor"
) -> np.ndarray:
    """Parse exactly ``count`` length-prefixed elements; the buffer must be used up."""
    view = memoryview(buffer)
    pos = 0
    end = len(view)
    if count * BYTES_PREFIX > end:  # before the array: the count is the client's word
        raise InvalidArgument(
            f"{what}: expected {count} string elements but {end} bytes hold at most "
            f"{end // BYTES_PREFIX}")
    out = np.empty(count, dtype=object)
    for i in range(count):
        if pos + 4 > end:
            raise InvalidArgument(
                f"{what}: expected {count} string elements but the data ends after {i}"
            )
        (length,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + length > end:
            raise InvalidArgument(
                f"{what}: element {i} declares {length} bytes but only {end - pos} remain"
            )
        out[i] = bytes(view[pos : pos + length])
        pos += length
    if pos != end:
        raise InvalidArgument(
            f"{what}: {end - pos} bytes left over after {count} string elements"
        )
    return out


def input_bytes_tensor(buffer: bytes | memoryview, shape: tuple[int, ...], name: str,
                       model: str, prefix: str) -> np.ndarray:
    """A request's BYTES input: ``shape``'s count of length-prefixed elements, checked as
    Triton checks a request's string inputs, in its words (``prefix``: the request-id prefix
    of its messages): too few elements, more than the shape holds, a length prefix cut off by
    the end of the data. An element whose declared length runs past the end is refused too
    (Triton leaves that to its backends)."""
    count = checked_count(shape, DataType.BYTES, f"input '{name}' for model '{model}'")
    view = memoryview(buffer)
    end = len(view)
    where = f"for inference input '{name}' for model '{model}'"
    # the array only when the data can hold the count (the count is the client's word); else
    # the walk finds what is wrong without keeping the elements
    out = np.empty(count, dtype=object) if count * BYTES_PREFIX <= end else None
    seen = 0
    pos = 0
    while pos < end:
        if end - pos < BYTES_PREFIX:
            raise InvalidArgument(
                f"{prefix}incomplete string length indicator {where}, expecting "
                f"{BYTES_PREFIX} bytes but only {end - pos} bytes available. Please make sure "
                "the string length indicator is in one buffer.")
        if seen == count:
            raise InvalidArgument(
                f"{prefix}unexpected number of string elements {count + 1} {where}, "
                f"expecting {count}")
        (length,) = _LEN.unpack_from(view, pos)
        pos += BYTES_PREFIX
        if length > end - pos:
            raise InvalidArgument(
                f"{prefix}element {seen} of inference input '{name}' for model '{model}' "
                f"declares {length} bytes but only {end - pos} remain")
        if out is not None:
            out[seen] = bytes(view[pos:pos + length])
        seen += 1
        pos += length
    if seen != count or out is None:
        raise InvalidArgument(f"{prefix}expected {count} string elements {where}, got {seen}")
    return out.reshape(shape)


def serialized_byte_size(array: np.ndarray, datatype: DataType) -> int:
    if datatype is DataType.BYTES:
        return sum(4 + len(x if isinstance(x, bytes) else str(x).encode()) for x in array.flat)
    return array.size * datatype.itemsize


def tensor_to_bytes(array: np.ndarray, datatype: DataType) -> bytes | memoryview:
    """The wire bytes of a tensor: row-major, little-endian, BYTES length-prefixed."""
    if datatype is DataType.BYTES:
        return serialize_bytes_tensor(array)
    arr = np.ascontiguousarray(array)
    if arr.dtype != datatype.numpy_dtype:
        arr = arr.astype(datatype.numpy_dtype)
    return arr.data.cast("B") if arr.size else b""


def tensor_from_bytes(
    buffer: bytes | memoryview, datatype: DataType, shape: tuple[int, ...], what: str
) -> np.ndarray:
    """A numpy view (no copy) over wire bytes, checked against shape and datatype."""
    count = checked_count(shape, datatype, what)
    if datatype is DataType.BYTES:
        return deserialize_bytes_tensor(buffer, count, what).reshape(shape)
    expected = count * datatype.itemsize
    if len(buffer) != expected:
        raise InvalidArgument(
            f"{what}: expected {expected} bytes for shape {list(shape)} of {datatype.value}, "
            f"got {len(buffer)}"
        )
    return np.frombuffer(buffer, dtype=datatype.numpy_dtype, count=count).reshape(shape)


# -- requests and responses ---------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Tensor:
    name: str
    datatype: DataType
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(slots=True, frozen=True)
class RequestedOutput:
    name: str
    classification: int = 0  # top-K classes instead of the raw tensor (0 = off)


@dataclass(slots=True, eq=False)
class InferenceRequest:
    """A decoded request, protocol-free. ``model_version`` is "" for "the server's choice"."""

    model_name: str
    model_version: str
    inputs: dict[str, Tensor]
    requested_outputs: tuple[RequestedOutput, ...] = ()
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    timeout_us: int = 0
    # a nursery.observability.tracing.Trace when sampled for tracing; None: not sampled yet; False: sampled
    # by the frontend and not traced
    trace: Any = None
    sequence_id: int | str = 0  # correlation ID: uint64 or string; 0 / "" = none
    sequence_start: bool = False
    sequence_end: bool = False
    # with --model-namespacing, the namespace to look the model up in first (an ensemble
    # step's: its ensemble's repository); None: the name alone (a client's request)
    model_namespace: str | None = None


@dataclass(slots=True, eq=False)
class InferenceResponse:
    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

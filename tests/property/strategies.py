"""Hypothesis strategies: any betterproto message (from its field metadata), tensors."""

from __future__ import annotations

from typing import Any

import betterproto
import numpy as np
from hypothesis import strategies as st

from nursery.config.pbtext import FieldInfo, fields_of, mark_present

_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1), "sint32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1), "sint64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1),
}

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


def scalar(proto_type: str, cls: Any) -> st.SearchStrategy[Any]:
    if proto_type in _INT_RANGES:
        lo, hi = _INT_RANGES[proto_type]
        return st.integers(lo, hi)
    if proto_type == "bool":
        return st.booleans()
    if proto_type == "string":
        return _text
    if proto_type == "bytes":
        return st.binary(max_size=8)
    if proto_type == "float":
        return st.floats(width=32, allow_nan=False)
    if proto_type == "double":
        return st.floats(allow_nan=False)
    if proto_type == "enum":
        return st.sampled_from(list(cls))
    raise AssertionError(proto_type)


def messages(cls: type[betterproto.Message], depth: int = 3) -> st.SearchStrategy[Any]:
    """Random instances of ``cls``: a random subset of fields set, oneofs respected."""
    return message_bytes(cls, depth).map(lambda raw: cls().parse(raw))


def message_bytes(cls: type[betterproto.Message], depth: int = 3) -> st.SearchStrategy[bytes]:
    """Like :func:`messages`, as wire bytes. Sub-messages are drawn as bytes too, so that
    hypothesis never has to print a betterproto message (its dataclass printer reads unset
    oneof members, which betterproto refuses)."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        msg = cls()
        mark_present(msg)
        groups_used: set[str] = set()
        for info in fields_of(cls).values():
            if not draw(st.booleans()):
                continue
            if info.group is not None:
                if info.group in groups_used:
                    continue
                groups_used.add(info.group)
            value = draw(_field_value(info, depth))
            if value is None:
                continue
            setattr(msg, info.name, _materialize(info, value))
        return bytes(msg)

    return build()


def _materialize(info: FieldInfo, value: Any) -> Any:
    if info.proto_type == "map" and info.map_types and info.map_types[1] == "message":
        return {k: _present(info.cls().parse(v)) for k, v in value.items()}
    if info.proto_type == "message":
        if info.repeated:
            return [_present(info.cls().parse(v)) for v in value]
        return _present(info.cls().parse(value))
    return value


def _present(message: Any) -> Any:
    mark_present(message)
    return message


def _field_value(info: FieldInfo, depth: int) -> st.SearchStrategy[Any]:
    if info.proto_type == "map":
        assert info.map_types is not None
        key_type, value_type = info.map_types
        if value_type == "message":
            if depth <= 0:
                return st.just(None)
            values = message_bytes(info.cls, depth - 1)
        else:
            values = scalar(value_type, info.cls)
        return st.dictionaries(scalar(key_type, None), values, max_size=2)
    if info.proto_type == "message":
        if depth <= 0:
            return st.just(None)
        sub = message_bytes(info.cls, depth - 1)
        return st.lists(sub, max_size=2) if info.repeated else sub
    base = scalar(info.proto_type, info.cls)
    return st.lists(base, max_size=3) if info.repeated else base


_DTYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}


@st.composite
def tensors(draw: st.DrawFn, datatypes: list[str] | None = None) -> tuple[str, np.ndarray]:
    """(protocol datatype, array) for any datatype but BF16 (which numpy cannot carry)."""
    dt = draw(st.sampled_from(datatypes or [*_DTYPES, "BYTES"]))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    n = int(np.prod(shape)) if shape else 1
    if dt == "BYTES":
        items = draw(st.lists(st.binary(max_size=10), min_size=n, max_size=n))
        return dt, np.array(items, dtype=object).reshape(shape)
    raw = draw(st.binary(min_size=n * np.dtype(_DTYPES[dt]).itemsize,
                         max_size=n * np.dtype(_DTYPES[dt]).itemsize))
    arr = np.frombuffer(raw, dtype=_DTYPES[dt]).reshape(shape).copy()
    if dt == "BOOL":
        arr = arr.view(np.uint8) % 2 == 1
    return dt, arr

"""A strict protobuf codec for grpclib: malformed bytes are refused before betterproto sees them.

betterproto's parser is lenient: a length-delimited field that declares more bytes than the
message holds is silently cut short, so a lying length would reach the core as a shorter model
name or tensor. :func:`check` walks the wire format (nested messages included, from the
generated classes' field metadata) and raises on any truncated or invalid field; the codec
then answers INTERNAL "Unable to parse request", as Triton does.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import betterproto
import grpclib
import grpclib.const
from grpclib.encoding.proto import ProtoCodec

from nursery.pbtext import FieldInfo, fields_of


class WireError(ValueError):
    pass


@cache
def _class_fields(cls: type[betterproto.Message]) -> dict[int, FieldInfo]:
    meta = cls._betterproto  # type: ignore[attr-defined]
    names = {info.name: info for info in fields_of(cls).values()}
    return {number: names[name] for number, name in meta.field_name_by_number.items()}


@cache
def _entry_fields(value_cls: Any, is_message: bool) -> dict[int, FieldInfo]:
    """A map entry: key = 1 (scalar), value = 2 (checked further when it is a message)."""
    if not is_message:
        return {}
    return {2: FieldInfo("value", "value", "message", False, None, value_cls, None)}


class _MapEntry:
    def __init__(self, info: FieldInfo) -> None:
        self.info = info


def _fields_for(cls: Any) -> dict[int, FieldInfo]:
    if isinstance(cls, _MapEntry):
        assert cls.info.map_types is not None
        return _entry_fields(cls.info.cls, cls.info.map_types[1] == "message")
    return _class_fields(cls)


def _varint(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint too long")


def check(data: bytes | memoryview, cls: Any, pos: int = 0, end: int | None = None,
          depth: int = 0) -> None:
    """Raise :class:`WireError` unless ``data[pos:end]`` is well-formed ``cls`` wire data."""
    if depth > 64:
        raise WireError("message nested too deeply")
    end = len(data) if end is None else end
    fields = _fields_for(cls)
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == 0:
            _, pos = _varint(data, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(data, pos, end)
            stop = pos + length
            if stop > end:
                raise WireError("length-delimited field runs past the end of the message")
            info = fields.get(number)
            if info is not None and info.proto_type == "message":
                check(data, info.cls, pos, stop, depth + 1)
            elif info is not None and info.proto_type == "map":
                check(data, _MapEntry(info), pos, stop, depth + 1)
            pos = stop
        else:
            raise WireError(f"invalid wire type {wire}")
        if pos > end:
            raise WireError("field runs past the end of the message")


class StrictProtoCodec(ProtoCodec):
    """grpclib's protobuf codec for betterproto messages, refusing malformed input."""

    def decode(self, data: bytes, message_type: Any) -> Any:
        try:
            check(data, message_type)
            return message_type().parse(data)
        except (WireError, EOFError, ValueError, IndexError, UnicodeDecodeError):
            raise grpclib.GRPCError(grpclib.const.Status.INTERNAL,
                                    "Unable to parse request") from None

"""A model configuration as JSON, exactly in the shape Triton's ``/config`` endpoint returns.

Protobuf JSON with the original snake_case names; every scalar, repeated and map field printed
even when default; unset sub-messages and oneof members left out (perf_analyzer reads the
scheduler kind from which keys are present); enums by name; 64-bit integers as strings except
for the fields Triton turns back into numbers.
"""

from __future__ import annotations

import base64
import math
from typing import Any, TypeVar

import betterproto

from nursery.config.pbtext import fields_of, is_present, mark_present
from nursery.schema import inference as pb

_INT64 = {"int64", "uint64", "sint64", "fixed64", "sfixed64"}

# Triton (model_config_utils.cc) rewrites these 64-bit fields as JSON numbers.
_NUMERIC_INT64: set[tuple[type, str]] = {
    (pb.ModelInput, "dims"),
    (pb.ModelOutput, "dims"),
    (pb.ModelTensorReshape, "shape"),
    (pb.ModelVersionPolicySpecific, "versions"),
    (pb.ModelDynamicBatching, "max_queue_delay_microseconds"),
    (pb.ModelDynamicBatching, "priority_levels"),
    (pb.ModelDynamicBatching, "default_priority_level"),
    (pb.ModelQueuePolicy, "default_timeout_microseconds"),
    (pb.ModelSequenceBatching, "max_sequence_idle_microseconds"),
    (pb.ModelSequenceBatchingStrategyOldest, "max_queue_delay_microseconds"),
    (pb.ModelSequenceBatchingStrategyDirect, "max_queue_delay_microseconds"),
    (pb.ModelSequenceBatchingState, "dims"),
    (pb.ModelEnsemblingStep, "model_version"),
    (pb.ModelWarmupInput, "dims"),
}


def _scalar(value: Any, proto_type: str, numeric: bool) -> Any:
    if proto_type == "enum":
        return value.name if getattr(value, "name", None) else int(value)
    if proto_type in _INT64:
        return int(value) if numeric else str(int(value))
    if proto_type == "bytes":
        return base64.b64encode(value).decode()
    if proto_type in ("float", "double"):
        if math.isnan(value) or math.isinf(value):
            return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return value
    return value


def message_to_json(message: betterproto.Message) -> dict[str, Any]:
    cls = type(message)
    out: dict[str, Any] = {}
    for info in fields_of(cls).values():
        numeric = (cls, info.name) in _NUMERIC_INT64
        if info.proto_type == "message":
            if info.repeated:
                out[info.proto_name] = [message_to_json(m) for m in getattr(message, info.name)]
            elif is_present(message, info):
                out[info.proto_name] = message_to_json(getattr(message, info.name))
            continue
        if info.group is not None and not is_present(message, info):
            continue
        value = getattr(message, info.name)
        if info.proto_type == "map":
            assert info.map_types is not None
            vtype = info.map_types[1]
            out[info.proto_name] = {
                str(k): message_to_json(v) if vtype == "message" else _scalar(v, vtype, False)
                for k, v in value.items()
            }
        elif info.repeated:
            out[info.proto_name] = [_scalar(v, info.proto_type, numeric) for v in value]
        else:
            out[info.proto_name] = _scalar(value, info.proto_type, numeric)
    return out


def config_to_json(config: pb.ModelConfig) -> dict[str, Any]:
    return message_to_json(config)


# -- JSON -> configuration (a load request's "config" override) -----------------------------

_INTS = {"int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64",
         "sfixed32", "sfixed64"}


class ConfigJsonError(ValueError):
    pass


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _json_scalar(value: Any, proto_type: str, cls: Any, where: str) -> Any:
    if proto_type == "string":
        if not isinstance(value, str):
            raise ConfigJsonError(f"{where}: expected a string, got {json_type(value)}")
        return value
    if proto_type == "bool":
        if not isinstance(value, bool):
            raise ConfigJsonError(f"{where}: expected true or false, got {json_type(value)}")
        return value
    if proto_type in _INTS:
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if type(value) is not int:
            raise ConfigJsonError(f"{where}: expected an integer, got {json_type(value)}")
        return value
    if proto_type in ("float", "double"):
        if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
            return float(value.replace("Infinity", "inf"))
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigJsonError(f"{where}: expected a number, got {json_type(value)}")
        return float(value)
    if proto_type == "enum":
        if isinstance(value, str):
            for member in cls:
                if member.name.lower() == value.lower():
                    return member
            names = ", ".join(m.name for m in cls)
            raise ConfigJsonError(f"{where}: unknown value '{value}' (one of: {names})")
        if type(value) is int:
            try:
                return cls(value)
            except ValueError:
                raise ConfigJsonError(f"{where}: unknown enum value {value}") from None
        raise ConfigJsonError(f"{where}: expected an enum name, got {json_type(value)}")
    if proto_type == "bytes":
        try:
            return base64.b64decode(value, validate=True)
        except Exception:
            raise ConfigJsonError(f"{where}: expected base64 bytes") from None
    raise ConfigJsonError(f"{where}: unsupported field type {proto_type}")


def json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


M = TypeVar("M", bound=betterproto.Message)


def message_from_json(data: Any, cls: type[M], where: str) -> M:
    if not isinstance(data, dict):
        raise ConfigJsonError(f"{where}: expected an object, got {json_type(data)}")
    schema = fields_of(cls)
    by_json = {_camel(name): info for name, info in schema.items()}
    message = cls()
    mark_present(message)
    groups: dict[str, str] = {}
    for key, value in data.items():
        info = schema.get(key) or by_json.get(key)
        if info is None:
            raise ConfigJsonError(f"{where}: unknown field '{key}' in {cls.__name__}")
        here = f"{where}.{info.proto_name}"
        if value is None:
            continue
        if info.group is not None:
            if info.group in groups:
                raise ConfigJsonError(f"{here}: '{groups[info.group]}' of oneof '{info.group}' "
                                      "is already set")
            groups[info.group] = info.proto_name
        if info.proto_type == "map":
            assert info.map_types is not None
            if not isinstance(value, dict):
                raise ConfigJsonError(f"{here}: expected an object, got {json_type(value)}")
            key_type, value_type = info.map_types
            out = {}
            for k, v in value.items():
                mk = _json_scalar(k, key_type, None, f"{here}[{k}]") if key_type != "string" else k
                out[mk] = (message_from_json(v, info.cls, f"{here}[{k}]") if value_type == "message"
                           else _json_scalar(v, value_type, info.cls, f"{here}[{k}]"))
            setattr(message, info.name, out)
        elif info.repeated:
            if isinstance(value, dict | str | int | float) and not isinstance(value, list):
                # as protobuf's C++ JSON reader that Triton uses: one value where an array
                # belongs is an array of that one (L0_lifecycle's instance_group object)
                value = [value]
            if not isinstance(value, list):
                raise ConfigJsonError(f"{here}: expected an array, got {json_type(value)}")
            if info.proto_type == "message":
                setattr(message, info.name,
                        [message_from_json(v, info.cls, f"{here}[{i}]") for i, v in enumerate(value)])
            else:
                setattr(message, info.name,
                        [_json_scalar(v, info.proto_type, info.cls, f"{here}[{i}]")
                         for i, v in enumerate(value)])
        elif info.proto_type == "message":
            setattr(message, info.name, message_from_json(value, info.cls, here))
        else:
            setattr(message, info.name, _json_scalar(value, info.proto_type, info.cls, here))
    return message


def _quote_bare_keys(text: str | bytes) -> str | None:
    """``text`` with its unquoted object keys quoted (``{direct: {}}``), or None when it has
    none: protobuf's JSON parser, which Triton's config override goes through, takes a key
    that is a bare identifier, and Triton's own qa sends one (L0_iterative_sequence). Strings
    are left as they are."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
    out: list[str] = []
    i, n, changed = 0, len(text), False
    expecting_key = False  # just after '{' or ',' (whitespace aside)
    while i < n:
        c = text[i]
        if c == '"':  # a string, copied through to its closing quote
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i, expecting_key = j + 1, False
            continue
        if expecting_key and (c.isalpha() or c == "_"):
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":":
                out.append(f'"{text[i:j]}"')
                i, changed, expecting_key = j, True, False
                continue
        if c in "{,":
            expecting_key = True
        elif c not in " \t\r\n":
            expecting_key = False
        out.append(c)
        i += 1
    return "".join(out) if changed else None


def config_from_json(text: str | bytes) -> pb.ModelConfig:
    """A ModelConfig from protobuf JSON (snake_case or lowerCamelCase names, enums by name in
    any case, 64-bit integers as numbers or strings, unknown fields rejected; object keys may
    be bare identifiers, as protobuf's parser takes them)."""
    import json

    try:
        try:
            data = json.loads(text)
        except ValueError as exc:
            lenient = _quote_bare_keys(text)
            if lenient is None:
                raise ConfigJsonError(f"failed to parse the config JSON: {exc}") from None
            try:
                data = json.loads(lenient)
            except ValueError:
                raise ConfigJsonError(f"failed to parse the config JSON: {exc}") from None
    except RecursionError:
        raise ConfigJsonError("failed to parse the config JSON: nested too deeply") from None
    try:
        return message_from_json(data, pb.ModelConfig, "config")
    except RecursionError:  # a JSON nesting just under the parser's limit, walked again here
        raise ConfigJsonError("the config JSON is nested too deeply") from None

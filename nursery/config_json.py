"""A model configuration as JSON, exactly in the shape Triton's ``/config`` endpoint returns.

Protobuf JSON with the original snake_case names; every scalar, repeated and map field printed
even when default; unset sub-messages and oneof members left out (perf_analyzer reads the
scheduler kind from which keys are present); enums by name; 64-bit integers as strings except
for the fields Triton turns back into numbers.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import betterproto

from nursery.pbtext import fields_of, is_present
from nursery.protocol._generated import inference as pb

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

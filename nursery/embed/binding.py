"""What ``Server.bind`` takes (as PyTriton's ``Tensor`` and ``DynamicBatcher``) and the
``config.pbtxt`` it writes for a bound function (pure: no trio, no files)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nursery.backends.callable import BACKEND
from nursery.types import DataType, datatype_of_array


@dataclass(frozen=True)
class Tensor:
    """An input or output of a bound function: its name, numpy dtype (``bytes`` / ``object``
    / ``np.bytes_`` for BYTES) and shape without the batch dimension (``-1``: any size)."""

    name: str
    dtype: Any
    shape: tuple[int, ...]
    optional: bool = False

    @property
    def datatype(self) -> DataType:
        if isinstance(self.dtype, DataType):
            return self.dtype
        if isinstance(self.dtype, str) and self.dtype.upper() in DataType.__members__:
            return DataType[self.dtype.upper()]
        try:
            dt = np.dtype(self.dtype)
        except TypeError:
            raise ValueError(f"tensor '{self.name}': dtype {self.dtype!r} is not a numpy "
                             "dtype") from None
        try:
            return datatype_of_array(np.empty(0, dt))
        except Exception:
            raise ValueError(f"tensor '{self.name}': numpy dtype {dt} has no Triton "
                             "datatype") from None


@dataclass(frozen=True)
class QueuePolicy:
    """The dynamic batcher's queue policy (model_config.proto's ModelQueuePolicy)."""

    timeout_action: str = "REJECT"  # or "DELAY"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True)
class DynamicBatcher:
    """The dynamic batcher's settings (model_config.proto's ModelDynamicBatching)."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: Sequence[int] = ()
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: dict[int, QueuePolicy] = field(default_factory=dict)


DynamicBatching = DynamicBatcher  # the spelling the issue uses


def _tensors(kind: str, tensors: Sequence[Tensor]) -> str:
    if not tensors:
        return ""
    items = []
    for t in tensors:
        if not isinstance(t, Tensor):
            raise ValueError(f"{kind}s must be nursery.embed.Tensor values, got {t!r}")
        dims = ", ".join(str(int(d)) for d in t.shape)
        optional = " optional: true" if t.optional else ""
        items.append(f"  {{ name: {json.dumps(t.name)} data_type: {t.datatype.config_name} "
                     f"dims: [ {dims} ]{optional} }}")
    return f"{kind} [\n" + ",\n".join(items) + "\n]\n"


def _queue_policy(policy: QueuePolicy) -> str:
    return (f"{{ timeout_action: {policy.timeout_action} "
            f"default_timeout_microseconds: {int(policy.default_timeout_microseconds)} "
            f"allow_timeout_override: {str(bool(policy.allow_timeout_override)).lower()} "
            f"max_queue_size: {int(policy.max_queue_size)} }}")


def _batcher(b: DynamicBatcher) -> str:
    lines = [f"  max_queue_delay_microseconds: {int(b.max_queue_delay_microseconds)}"]
    if b.preferred_batch_size:
        sizes = ", ".join(str(int(s)) for s in b.preferred_batch_size)
        lines.append(f"  preferred_batch_size: [ {sizes} ]")
    if b.preserve_ordering:
        lines.append("  preserve_ordering: true")
    if b.priority_levels:
        lines.append(f"  priority_levels: {int(b.priority_levels)}")
        lines.append(f"  default_priority_level: {int(b.default_priority_level)}")
    if b.default_queue_policy is not None:
        lines.append(f"  default_queue_policy: {_queue_policy(b.default_queue_policy)}")
    for level, policy in sorted(b.priority_queue_policy.items()):
        lines.append(f"  priority_queue_policy {{ key: {int(level)} "
                     f"value: {_queue_policy(policy)} }}")
    return "dynamic_batching {\n" + "\n".join(lines) + "\n}\n"


def config_text(name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor], *,
                max_batch_size: int = 0, batching: DynamicBatcher | bool | None = None,
                instances: int = 1, response_cache: bool = False) -> str:
    """The ``config.pbtxt`` of a bound function; the server completes and validates it like
    any model's (a bad value fails the load with the configuration's message)."""
    if not outputs:
        raise ValueError(f"model '{name}': a bound function needs at least one output")
    text = (f"name: {json.dumps(name)}\nbackend: \"{BACKEND}\"\n"
            f"max_batch_size: {int(max_batch_size)}\n")
    text += _tensors("input", inputs) + _tensors("output", outputs)
    if batching is True:
        batching = DynamicBatcher()
    if isinstance(batching, DynamicBatcher):
        text += _batcher(batching)
    text += f"instance_group [ {{ kind: KIND_CPU count: {int(instances)} }} ]\n"
    if response_cache:
        text += "response_cache { enable: true }\n"
    return text


__all__ = ["DynamicBatcher", "DynamicBatching", "QueuePolicy", "Tensor", "config_text"]

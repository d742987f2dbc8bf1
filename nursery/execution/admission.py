"""Admission of one request: Triton's checks against the model's frozen configuration, once,
with Triton's messages, and the :class:`~nursery.messages.InferWork` a scheduler takes."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

from nursery.config.model import ModelConfig
from nursery.errors import InvalidArgument
from nursery.execution import sequence as sequence_batching
from nursery.messages import InferWork
from nursery.types import InferenceRequest


def _dims(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def _count_error(
    prefix: str, request: InferenceRequest, config: ModelConfig, required: list[str]
) -> None:
    inputs = request.inputs
    missing = [n for n in required if n not in inputs]
    got = "[" + ",".join(f"'{n}'" for n in inputs) + "]"
    miss = "[" + ",".join(f"'{n}'" for n in missing) + "]"
    if len(required) == len(config.inputs):
        expected = f"expected {len(config.inputs)} inputs"
    else:
        expected = f"expected number of inputs between {len(required)} and {len(config.inputs)}"
    raise InvalidArgument(
        f"{prefix}{expected} but got {len(inputs)} inputs for model '{config.name}'. Got input(s) "
        f"{got}, but missing required input(s) {miss}. Please provide all required input(s)."
    )


def validate_request(request: InferenceRequest, config: ModelConfig) -> int:
    """Check a request against the model (Triton's order and messages); return its batch size."""
    prefix = f"[request id: {request.id or '<id_unknown>'}] "
    model = config.name
    for out in request.requested_outputs:
        if out.name not in config.output_map:
            raise InvalidArgument(f"unexpected inference output '{out.name}' for model '{model}'")
    inputs = request.inputs
    required = [s.name for s in config.inputs if not s.optional]
    if len(inputs) > len(config.inputs) or len(inputs) < len(required):
        _count_error(prefix, request, config, required)
    batching = config.max_batch_size > 0
    batch_size = 1 if not batching else -1
    for name, tensor in inputs.items():
        spec = config.input_map.get(name)
        if spec is None:
            raise InvalidArgument(f"unexpected inference input '{name}' for model '{model}'")
        shape = tensor.shape
        if batching and not spec.is_shape_tensor:
            if not shape:
                raise InvalidArgument(
                    f"{prefix}input '{name}' has no shape but model requires batch dimension "
                    f"for '{model}'"
                )
            if batch_size == -1:
                batch_size = shape[0]
            elif shape[0] != batch_size:
                raise InvalidArgument(
                    f"{prefix}input '{name}' batch size does not match other inputs for '{model}'"
                )
    if any(n not in inputs for n in required):
        _count_error(prefix, request, config, required)
    if batching and batch_size > config.max_batch_size:
        raise InvalidArgument(
            f"{prefix}inference request batch-size must be <= {config.max_batch_size} for "
            f"'{model}'"
        )
    for name, tensor in inputs.items():
        spec = config.input_map[name]
        if tensor.datatype is not spec.datatype:
            raise InvalidArgument(
                f"{prefix}inference input '{name}' data-type is '{tensor.datatype.value}', but "
                f"model '{model}' expects '{spec.datatype.value}'"
            )
        dims = tensor.shape[1:] if batching and not spec.is_shape_tensor else tensor.shape
        if len(dims) != len(spec.dims) or any(
            c != -1 and c != d for c, d in zip(spec.dims, dims, strict=True)
        ):
            full = spec.full_shape(config.max_batch_size)
            note = _BATCH_NOTE if batching else ""
            raise InvalidArgument(
                f"{prefix}unexpected shape for input '{name}' for model '{model}'. Expected "
                f"{_dims(full)}, got {_dims(tensor.shape)}. {note}".rstrip()
            )
    return batch_size if batching else 1


def make_work(request: InferenceRequest, config: ModelConfig, reply: Any) -> InferWork:
    """Validate ``request`` for the model (Triton's checks) and wrap it for its scheduler,
    with the signature that decides which requests may share a batch."""
    batch_size = validate_request(request, config)
    if config.sequence is not None:
        sequence_batching.check_request(request, config, batch_size)
    signature: Hashable = None
    if (config.batching is not None or config.objective is not None
            or (config.sequence is not None and config.max_batch_size > 0)):
        signature = tuple(request.inputs[n].shape[1:] if n in request.inputs else None
                          for n in config.shape_checked_inputs)
        if config.has_optional_inputs:
            signature = (signature, frozenset(request.inputs))
    return InferWork(request, reply, batch_size, time.monotonic_ns(), signature,
                     request.priority, request.timeout_us)

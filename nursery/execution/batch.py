"""Assemble a batch's inputs and split its outputs back per request (pure, no trio).

Runs on the instance worker's thread. One request passes its arrays straight through (no
copy); several are concatenated along the batch dimension, which the scheduler only does for
requests whose other dimensions and datatypes agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from nursery.config.model import ModelConfig, TensorSpec
from nursery.errors import InternalError
from nursery.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor


def output_names(requests: Sequence[InferenceRequest], config: ModelConfig) -> list[str]:
    """Outputs the backend must produce: the union of what the requests asked for."""
    if len(requests) == 1:
        wanted = requests[0].requested_outputs
        return [o.name for o in wanted] if wanted else [o.name for o in config.outputs]
    names: dict[str, None] = {}
    for r in requests:
        if not r.requested_outputs:
            return [o.name for o in config.outputs]
        names.update((o.name, None) for o in r.requested_outputs)
    return list(names)


def gather_inputs(
    requests: Sequence[InferenceRequest], config: ModelConfig
) -> dict[str, np.ndarray]:
    batching = config.max_batch_size > 0
    if len(requests) == 1:
        arrays = {name: t.data for name, t in requests[0].inputs.items()}
    else:
        arrays = {}
        for spec in config.inputs:
            parts = [r.inputs[spec.name].data for r in requests if spec.name in r.inputs]
            if not parts:
                continue
            if len(parts) != len(requests):
                raise InternalError(
                    f"optional input '{spec.name}' is given by only some requests of a batch"
                )
            arrays[spec.name] = np.concatenate(parts, axis=0)
    for name, array in arrays.items():
        spec = config.input_map[name]
        if spec.reshape is not None:
            arrays[name] = _reshape(array, spec.reshape, batching)
    return arrays


def _reshape(array: np.ndarray, shape: tuple[int, ...], batching: bool) -> np.ndarray:
    target = (array.shape[0], *shape) if batching else shape
    return array.reshape(target)


def split_outputs(
    requests: Sequence[InferenceRequest],
    batch_sizes: Sequence[int],
    results: Mapping[str, np.ndarray],
    config: ModelConfig,
    model_version: str,
) -> list[InferenceResponse]:
    batching = config.max_batch_size > 0
    total = sum(batch_sizes)
    arrays: dict[str, np.ndarray] = {}
    for name, array in results.items():
        spec = config.output_map.get(name)
        if spec is None:
            raise InternalError(f"model '{config.name}' produced an unexpected output '{name}'")
        arrays[name] = _conform_output(np.asarray(array), spec, config, batching, total)
    responses = []
    offset = 0
    for request, rows in zip(requests, batch_sizes, strict=True):
        wanted: Sequence[RequestedOutput | TensorSpec] = request.requested_outputs or config.outputs
        outputs = []
        for item in wanted:
            array = arrays[item.name]
            if len(requests) > 1:
                array = array[offset : offset + rows]
            spec = config.output_map[item.name]
            outputs.append(Tensor(item.name, spec.datatype, tuple(array.shape), array))
        offset += rows
        responses.append(
            InferenceResponse(
                model_name=config.name,
                model_version=model_version,
                outputs=outputs,
                id=request.id,
            )
        )
    return responses


def _conform_output(
    array: np.ndarray, spec: TensorSpec, config: ModelConfig, batching: bool, total: int
) -> np.ndarray:
    """Check an output against its config datatype and shape; apply the config reshape."""
    dt = spec.datatype
    if dt is DataType.BYTES:
        if array.dtype != object:
            array = array.astype(object)
    elif dt is DataType.BF16:
        if array.dtype != np.uint16:
            raise InternalError(
                f"model '{config.name}' output '{spec.name}' is {array.dtype}, expected BF16"
            )
    elif array.dtype != dt.numpy_dtype:
        if array.dtype.newbyteorder("<") == dt.numpy_dtype or array.dtype.kind == dt.numpy_dtype.kind:
            array = array.astype(dt.numpy_dtype)
        else:
            raise InternalError(
                f"model '{config.name}' output '{spec.name}' has numpy type {array.dtype} but "
                f"config.pbtxt says {dt.config_name}"
            )
    if spec.reshape is not None:
        dims = [d if d != -1 else -1 for d in spec.dims]
        target = (total, *dims) if batching else tuple(dims)
        if sum(1 for d in target if d == -1) <= 1:
            array = array.reshape(target)
    if batching and (array.ndim == 0 or array.shape[0] != total):
        raise InternalError(
            f"model '{config.name}' output '{spec.name}' has shape {list(array.shape)}, whose "
            f"first dimension should be the batch size {total}"
        )
    return array

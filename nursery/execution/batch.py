"""Assemble a batch's inputs and split its outputs back per request (pure, no trio).

Runs on the instance worker's thread. One request passes its arrays straight through (no
copy); several are concatenated along the batch dimension, which the scheduler only does for
requests whose other dimensions and datatypes agree.

Ragged batching, as Triton's ONNX Runtime and LibTorch backends do it: an input with
``allow_ragged_batch`` reaches the model flattened, the elements of every request of the batch
one after another (shape ``[total elements]``, one request's too), so requests whose shapes
differ share a batch; an output named by a ``batch_output`` of kind
``BATCH_SCATTER_WITH_INPUT_SHAPE`` is cut back into each request's part in the same order,
each part taking the shape of that request's source input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from nursery.config.model import BatchInputSpec, ModelConfig, TensorSpec
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
        for spec in config.inputs:
            if spec.ragged and spec.name in arrays:  # flattened, as a batch's
                arrays[spec.name] = arrays[spec.name].reshape(-1)
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
            if spec.ragged:
                parts = [p.reshape(-1) for p in parts]
            arrays[spec.name] = np.concatenate(parts, axis=0)
    for name, array in arrays.items():
        given = config.input_map.get(name)  # None: an input the sequence batcher provides
        if given is not None and given.reshape is not None and not given.ragged:
            arrays[name] = _reshape(array, given.reshape, batching)
    for made in config.batch_inputs:
        array = batch_input(made, requests)
        for target in made.targets:
            arrays[target] = array
    return arrays


def batch_input(spec: BatchInputSpec, requests: Sequence[InferenceRequest]) -> np.ndarray:
    """A ``batch_input`` tensor for a batch, as Triton's backends make it from the shapes of
    each request's ``source`` input (the batch dim included): the element counts
    (BATCH_ELEMENT_COUNT, shape [requests]), their running sums (ACCUMULATED, [requests];
    WITH_ZERO, [requests + 1] from 0), a tensor whose shape is the largest count
    (BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, zeros), each batch item's shape without the batch dim
    (BATCH_ITEM_SHAPE, [items, rank - 1]; FLATTEN, one row)."""
    shapes = []
    for r in requests:
        tensor = r.inputs.get(spec.source)
        if tensor is None:
            raise InternalError(f"batch input '{spec.targets[0] if spec.targets else ''}' "
                                f"needs input '{spec.source}' from every request")
        shapes.append(tuple(tensor.shape))
    return batch_input_of_shapes(spec, shapes)


def batch_input_of_shapes(spec: BatchInputSpec,
                          shapes: Sequence[tuple[int, ...]]) -> np.ndarray:
    """:func:`batch_input` from the ``source`` input's shape in each request of the batch
    (a sequence batch's padding rows included, in the shape Triton's null request copies)."""
    dtype = np.float32 if spec.datatype is DataType.FP32 else np.int32
    counts = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
    kind = spec.kind
    if kind == "BATCH_ELEMENT_COUNT":
        return np.array(counts, dtype=dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts).astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(max(counts, default=0), dtype=dtype)
    if kind in ("BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"):
        rank = max((len(shape) - 1 for shape in shapes), default=0)
        rows = [shape[1:] for shape in shapes for _ in range(shape[0] if shape else 0)]
        items = np.array(rows, dtype=dtype).reshape(len(rows), rank)
        return items.reshape(-1) if kind == "BATCH_ITEM_SHAPE_FLATTEN" else items
    raise InternalError(f"unsupported batch input kind {kind}")


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
    scattered: dict[str, list[np.ndarray]] = {}  # batch outputs: each request's part
    for name, array in results.items():
        spec = config.output_map.get(name)
        if spec is None:
            raise InternalError(f"model '{config.name}' produced an unexpected output '{name}'")
        source = config.batch_scatter.get(name)
        if source is not None:
            scattered[name] = _scatter(np.asarray(array), spec, source, requests, config)
        else:
            arrays[name] = _conform_output(np.asarray(array), spec, config, batching, total)
    responses = []
    offset = 0
    for index, (request, rows) in enumerate(zip(requests, batch_sizes, strict=True)):
        wanted: Sequence[RequestedOutput | TensorSpec] = request.requested_outputs or config.outputs
        outputs = []
        for item in wanted:
            if item.name in scattered:
                array = scattered[item.name][index]
            else:
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


def _scatter(array: np.ndarray, spec: TensorSpec, source: str,
             requests: Sequence[InferenceRequest], config: ModelConfig) -> list[np.ndarray]:
    """A BATCH_SCATTER_WITH_INPUT_SHAPE output cut into each request's part: as many elements
    as the request's ``source`` input has, in the shape of that input (Triton's
    BackendOutputResponder::ProcessBatchOutput)."""
    array = _conform_datatype(array, spec, config).reshape(-1)
    shapes = [tuple(r.inputs[source].shape) if source in r.inputs else None for r in requests]
    if any(shape is None for shape in shapes):
        raise InternalError(f"model '{config.name}': batch output '{spec.name}' needs input "
                            f"'{source}' from every request")
    counts = [int(np.prod(shape)) for shape in shapes if shape is not None]
    if sum(counts) != array.size:
        raise InternalError(
            f"model '{config.name}' output '{spec.name}' has {array.size} elements, the batch "
            f"output needs {sum(counts)} (the elements of input '{source}')")
    parts = []
    offset = 0
    for shape, count in zip(shapes, counts, strict=True):
        assert shape is not None
        parts.append(array[offset : offset + count].reshape(shape))
        offset += count
    return parts


def _conform_datatype(array: np.ndarray, spec: TensorSpec, config: ModelConfig) -> np.ndarray:
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
    return array


def _conform_output(
    array: np.ndarray, spec: TensorSpec, config: ModelConfig, batching: bool, total: int
) -> np.ndarray:
    """Check an output against its config datatype and shape; apply the config reshape."""
    array = _conform_datatype(array, spec, config)
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

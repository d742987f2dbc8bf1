"""Triton's classification extension: an output replaced by its top-K classes as BYTES.

Each element reads ``"<value>:<index>"`` or ``"<value>:<index>:<label>"`` (labels from the
output's ``label_filename``, one per line), sorted by value, highest first. Floats are
formatted like C++ ``std::to_string`` (six decimals), integers plainly. As in Triton (its
frontends' TopkClassifications) it applies to whatever the model answered, whatever the
backend: integer, FP32 and FP64 outputs only, at most a million elements per batch entry, and
a refused output fails only its own request (the model's execution still counts as a success).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from nursery.config.model import ModelConfig, TensorSpec
from nursery.errors import InvalidArgument, NurseryError
from nursery.types import DataType, InferenceRequest, InferenceResponse, Tensor

# Triton's bound on the elements of one batch entry's output (kMaxClassificationElements)
MAX_ELEMENTS = 1_000_000
_UNSUPPORTED = (DataType.BYTES, DataType.BF16, DataType.FP16, DataType.BOOL)


@lru_cache(maxsize=64)
def _labels(path: str) -> tuple[str, ...]:
    try:
        return tuple(Path(path).read_text().splitlines())
    except OSError:
        return ()


def _format(value: np.number[Any] | np.bool_, datatype: DataType) -> str:
    """One element of the output tensor as Triton prints it in a class result."""
    if datatype in (DataType.FP16, DataType.FP32, DataType.FP64):
        return f"{float(value):.6f}"
    if datatype is DataType.BOOL:
        return "1" if value else "0"
    return str(int(value))


def classify(
    array: np.ndarray, k: int, batching: bool, spec: TensorSpec, model_path: Path,
    datatype: DataType | None = None,
) -> np.ndarray:
    """``array`` (the output ``spec`` names, of ``datatype``: the spec's when None) as its
    top-``k`` class strings, one row per batch entry when ``batching``."""
    datatype = spec.datatype if datatype is None else datatype
    if datatype in _UNSUPPORTED:
        raise InvalidArgument(
            f"class result not available for output due to unsupported type '{datatype.value}'")
    labels = _labels(str(model_path / spec.label_filename)) if spec.label_filename else ()
    batching = batching and array.ndim > 0
    rows = array.reshape(array.shape[0], -1) if batching else array.reshape(1, -1)
    if rows.shape[1] > MAX_ELEMENTS:
        raise InvalidArgument("classification output tensor too large")
    count = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], count), dtype=object)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        for c, idx in enumerate(order):
            text = f"{_format(row[idx], datatype)}:{idx}"
            if idx < len(labels):
                text += f":{labels[idx]}"
            out[r, c] = text.encode()
    return out if batching else out.reshape(count)


LabelSource = Callable[[str], "tuple[Path, TensorSpec] | None"]


def classify_response(request: InferenceRequest, response: Any,
                      config: ModelConfig, labels: LabelSource | None = None) -> Any:
    """``response`` with the outputs ``request`` asks classes of replaced by them; an
    :class:`InvalidArgument` for the request when one cannot be. Anything that is not a
    response (an error, None for an answer already sent) passes unchanged. ``labels``: where
    an output's labels are (the folder and the spec naming the file), when not in
    ``config`` (an ensemble's output labelled by the model that produced it)."""
    wanted = {o.name: o.classification for o in request.requested_outputs if o.classification}
    if not wanted or not isinstance(response, InferenceResponse):
        return response
    outputs = []
    for tensor in response.outputs:
        k = wanted.get(tensor.name, 0)
        if not k:
            outputs.append(tensor)
            continue
        spec = config.output_map.get(tensor.name) or TensorSpec(tensor.name, tensor.datatype, ())
        folder = config.path
        found = labels(tensor.name) if labels is not None else None
        if found is not None:
            folder, spec = found
        try:
            array = classify(np.asarray(tensor.data), k, config.max_batch_size > 0, spec,
                             folder, tensor.datatype)
        except NurseryError as exc:
            return exc
        outputs.append(Tensor(tensor.name, DataType.BYTES, tuple(array.shape), array))
    response.outputs = outputs
    return response

"""Triton's classification extension: an output replaced by its top-K classes as BYTES.

Each element reads ``"<value>:<index>"`` or ``"<value>:<index>:<label>"`` (labels from the
output's ``label_filename``, one per line), sorted by value, highest first. Floats are
formatted like C++ ``std::to_string`` (six decimals), integers plainly.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from nursery.config.model import TensorSpec
from nursery.errors import InvalidArgument
from nursery.types import DataType


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
    array: np.ndarray, k: int, batching: bool, spec: TensorSpec, model_path: Path
) -> np.ndarray:
    if spec.datatype in (DataType.BYTES, DataType.BF16):
        raise InvalidArgument(
            f"class result not available for output '{spec.name}' due to unsupported type "
            f"'{spec.datatype.value}'"
        )
    labels = _labels(str(model_path / spec.label_filename)) if spec.label_filename else ()
    rows = array.reshape(array.shape[0], -1) if batching else array.reshape(1, -1)
    count = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], count), dtype=object)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        for c, idx in enumerate(order):
            text = f"{_format(row[idx], spec.datatype)}:{idx}"
            if idx < len(labels):
                text += f":{labels[idx]}"
            out[r, c] = text.encode()
    return out if batching else out.reshape(count)

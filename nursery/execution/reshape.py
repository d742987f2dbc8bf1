"""A tensor between its configured ``dims`` and its ``reshape`` (pure, no trio).

Triton normalizes a request's inputs that have a ``reshape`` into that shape before any backend
sees them, and reports every output that has one in its configured dims: the core's
``InferenceResponse::AddOutput`` reshapes each output of every response a model makes, so a
decoupled model's streamed responses, a non-decoupled model's response sent through its
response sender, BLS answers and ensemble steps are all in dims. The batch dim is kept and
variable dims are filled in order (``convert_dims``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nursery.config.model import ModelConfig
from nursery.scheduling.ensemble_plan import convert_dims
from nursery.types import Tensor


def converted(t: Tensor, from_dims: Sequence[int], to_dims: Sequence[int],
              batching: bool) -> Tensor:
    """``t`` from one configured shape to the other; ``t`` itself when the shape stays as it
    is (a shape that does not fit ``from_dims`` is left as it is)."""
    shape = convert_dims(tuple(t.shape), from_dims, to_dims, batching)
    if shape == tuple(t.shape):
        return t
    return Tensor(t.name, t.datatype, shape, np.asarray(t.data).reshape(shape))


def outputs_in_dims(outputs: list[Tensor], config: ModelConfig) -> list[Tensor]:
    """A response's outputs, those with a ``reshape`` in the model's configuration in their
    dims (a model that takes whole requests, a Python model, makes them in the reshape's
    shape); ``outputs`` itself when the model has no such output."""
    reshaped = config.reshaped_outputs
    if not reshaped:
        return outputs
    batching = config.max_batch_size > 0
    out = []
    for t in outputs:
        spec = reshaped.get(t.name)
        if spec is not None and spec.reshape is not None:
            t = converted(t, spec.reshape, spec.dims, batching)
        out.append(t)
    return out

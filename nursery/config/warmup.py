"""``model_warmup``: the requests an instance runs before it is ready (building them is pure).

Each ``ModelWarmup`` entry names a sample: its inputs (``data_type``, ``dims`` without the batch
dimension, and ``zero_data``, ``random_data`` or ``input_data_file`` read from the model's
``warmup/`` folder), the ``batch_size`` it runs at (a sample with 0 is skipped, as in Triton)
and how many times it runs (``count``, 0 meaning 1). A sample that does not fit the model is
a load error naming the sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import betterproto
import numpy as np

from nursery.config.model import ModelConfig, config_boundary
from nursery.config.repository import safe_relative_path
from nursery.errors import ConfigError
from nursery.schema import inference as pb
from nursery.types import DataType, InferenceRequest, Tensor, element_count, tensor_from_bytes

WARMUP_FOLDER = "warmup"


@dataclass(frozen=True)
class WarmupSample:
    name: str
    count: int
    request: InferenceRequest
    batch_size: int


def _data(spec: pb.ModelWarmupInput, datatype: DataType, shape: tuple[int, ...],
          item_shape: tuple[int, ...], model_path: Path, label: str) -> np.ndarray:
    which, _ = betterproto.which_one_of(spec, "input_data_type")
    count = element_count(shape)
    if which == "input_data_file":
        value = spec.input_data_file
        rel = safe_relative_path(value)
        folder = (model_path / WARMUP_FOLDER).resolve()
        path = (folder / rel).resolve() if rel else None
        if path is None or folder not in path.parents:
            raise ConfigError(f"{label}: input_data_file '{value}' must be a file inside the "
                              f"model's '{WARMUP_FOLDER}' folder")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{label}: cannot read input_data_file '{value}': {exc}") from exc
        item = tensor_from_bytes(raw, datatype, item_shape, f"{label}: input_data_file '{value}'")
        batch = shape[0] if len(shape) > len(item_shape) else 1
        return np.stack([item] * batch) if len(shape) > len(item_shape) else item
    if datatype is DataType.BYTES:  # Triton's random data for strings is zeros too
        return np.array([b""] * count, dtype=object).reshape(shape)
    if which == "random_data":
        rng = np.random.default_rng(0)
        if datatype is DataType.BOOL:
            return rng.integers(0, 2, count).astype(bool).reshape(shape)
        if datatype in (DataType.FP16, DataType.FP32, DataType.FP64):
            return rng.standard_normal(count).astype(datatype.numpy_dtype).reshape(shape)
        raw = rng.integers(0, 256, count * datatype.itemsize, dtype=np.uint8).tobytes()
        return np.frombuffer(raw, dtype=datatype.numpy_dtype).reshape(shape).copy()
    return np.zeros(shape, dtype=datatype.numpy_dtype)  # zero_data (and the default)


def warmup_samples(config: ModelConfig) -> list[WarmupSample]:
    """The model's warmup samples; raises only :class:`~nursery.errors.NurseryError` (anything
    unexpected becomes a :class:`ConfigError` naming the model and ``model_warmup``)."""
    with config_boundary(config.name, "model_warmup"):
        return _samples(config)


def _samples(config: ModelConfig) -> list[WarmupSample]:
    samples = []
    for i, w in enumerate(config.proto.model_warmup):
        name = w.name or f"warmup_{i}"
        label = f"model '{config.name}': model_warmup '{name}'"
        batch = w.batch_size
        if batch == 0:
            continue  # Triton skips a sample with no batch size
        if config.max_batch_size == 0 and batch != 1:
            raise ConfigError(f"{label}: batch_size must be 1 for a model that does not batch")
        if config.max_batch_size and batch > config.max_batch_size:
            raise ConfigError(f"{label}: batch_size {batch} exceeds max_batch_size "
                              f"{config.max_batch_size}")
        inputs = {}
        # a sequence model's sample may give the inputs its sequence batcher provides (its
        # control inputs, as L0_warmup's START and READY): Triton hands a sample's tensors to
        # the model as they are, bypassing the scheduler
        extra = config.sequence.extra_input_types if config.sequence is not None else {}
        for input_name, spec in w.inputs.items():
            model_input = config.input_map.get(input_name)
            expected = model_input.datatype if model_input is not None else extra.get(input_name)
            if expected is None:
                raise ConfigError(f"{label}: '{input_name}' is not an input of the model")
            try:
                datatype = DataType.from_config(spec.data_type)
            except Exception:
                raise ConfigError(f"{label}: input '{input_name}' has no valid data_type") from None
            if datatype is not expected:
                raise ConfigError(f"{label}: input '{input_name}' is {datatype.config_name} but "
                                  f"the model expects {expected.config_name}")
            item_shape = tuple(int(d) for d in spec.dims)
            if any(d < 0 for d in item_shape):
                raise ConfigError(f"{label}: input '{input_name}' dims must be fixed, got "
                                  f"{list(item_shape)}")
            shape = (batch, *item_shape) if config.max_batch_size else item_shape
            data = _data(spec, datatype, shape, item_shape, config.path, f"{label} input "
                         f"'{input_name}'")
            inputs[input_name] = Tensor(input_name, datatype, shape, data)
        missing = [t.name for t in config.inputs if not t.optional and t.name not in inputs]
        if missing:
            raise ConfigError(f"{label}: no data for input(s) {', '.join(missing)}")
        samples.append(WarmupSample(name, w.count or 1,
                                    InferenceRequest(config.name, "", inputs), batch))
    return samples

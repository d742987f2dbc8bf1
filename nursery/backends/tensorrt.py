"""TensorRT backend (``backend: "tensorrt"`` / ``platform: "tensorrt_plan"``, ``model.plan``).

GPU only. Each model instance deserializes the engine on its own thread, creates one
execution context and one CUDA stream (CuPy) there, and runs every batch on that stream:
host-to-device copies, ``execute_async_v3`` and device-to-host copies into pinned host memory,
then one stream synchronize. Dynamic shapes go through the engine's optimization profiles
(profile 0, or the first one the instance group names); a batch whose shape falls outside the
profile is refused with the profile's bounds. Inputs and outputs (and ``max_batch_size``) can
be auto-completed from the engine, as Triton's TensorRT backend does.

Everything here imports ``tensorrt`` and ``cupy`` lazily: on a machine without them (or without
a GPU) a TensorRT model fails to load with the reason, and everything else serves.

This module has been written without a GPU to run it on: its tests are marked ``gpu``
(``pytest -m gpu``) and have not run yet.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nursery.config.model import ModelConfig
from nursery.errors import ConfigError, InternalError, InvalidArgument
from nursery.runtime.devices import InstancePlacement
from nursery.schema import inference as pb
from nursery.types import DataType

log = logging.getLogger("nursery.backends.tensorrt")

_TRT_TYPES = {  # trt.DataType name -> protocol datatype
    "FLOAT": DataType.FP32, "HALF": DataType.FP16, "BF16": DataType.BF16,
    "INT8": DataType.INT8, "INT32": DataType.INT32, "INT64": DataType.INT64,
    "BOOL": DataType.BOOL, "UINT8": DataType.UINT8,
}


def _modules() -> tuple[Any, Any]:
    try:
        import cupy
        import tensorrt
    except ImportError as exc:
        raise ConfigError(
            f"the TensorRT backend needs the 'tensorrt' and 'cupy-cuda12x' packages (the 'gpu' "
            f"extra) and a GPU: {exc}") from None
    return tensorrt, cupy


def _datatype(trt_type: Any, name: str) -> DataType:
    dt = _TRT_TYPES.get(getattr(trt_type, "name", str(trt_type)))
    if dt is None:
        raise ConfigError(f"tensor '{name}' has TensorRT type {trt_type}, which is not supported")
    return dt


class _Logger:
    """A TensorRT logger writing to ours (created lazily: trt.ILogger is a pybind class)."""

    _instance: Any = None

    @classmethod
    def get(cls, trt: Any) -> Any:
        if cls._instance is None:
            class Forward(trt.ILogger):
                def __init__(self) -> None:
                    trt.ILogger.__init__(self)

                def log(self, severity: Any, msg: str) -> None:
                    level = {trt.ILogger.INTERNAL_ERROR: logging.ERROR,
                             trt.ILogger.ERROR: logging.ERROR,
                             trt.ILogger.WARNING: logging.WARNING}.get(severity, logging.DEBUG)
                    log.log(level, "TensorRT: %s", msg)

            cls._instance = Forward()
        return cls._instance


def _engine_io(engine: Any, trt: Any) -> tuple[list[tuple[str, Any, list[int]]],
                                                 list[tuple[str, Any, list[int]]]]:
    ins: list[tuple[str, Any, list[int]]] = []
    outs: list[tuple[str, Any, list[int]]] = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        entry = (name, engine.get_tensor_dtype(name), list(engine.get_tensor_shape(name)))
        (ins if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outs).append(entry)
    return ins, outs


def _deserialize(path: Path, trt: Any, model: str) -> Any:
    runtime = trt.Runtime(_Logger.get(trt))
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise ConfigError(f"model '{model}': unable to deserialize the TensorRT engine '{path}' "
                          "(built for another TensorRT version or GPU?)")
    _RUNTIMES[id(engine)] = runtime  # the runtime must outlive its engine
    return engine


_RUNTIMES: dict[int, Any] = {}


class TensorRTInstance:
    """One engine, one execution context, one stream; every method runs on the instance's own
    thread (the context and the stream never cross threads)."""

    def __init__(self, config: ModelConfig, engine: Any, placement: InstancePlacement,
                 profile: int) -> None:
        trt, cp = _modules()
        self._trt, self._cp = trt, cp
        self._model = config.name
        self._device = cp.cuda.Device(placement.device_id)
        self._device.use()  # this thread's current device, for good
        self._engine = engine
        self._context = engine.create_execution_context()
        if self._context is None:
            raise ConfigError(f"model '{config.name}': unable to create a TensorRT execution "
                              "context (out of GPU memory?)")
        self._stream = cp.cuda.Stream(non_blocking=True)
        self._profile = profile
        if profile:
            self._context.set_optimization_profile_async(profile, self._stream.ptr)
            self._stream.synchronize()
        ins, outs = _engine_io(engine, trt)
        self._inputs = {n: (dt, shape) for n, dt, shape in ins}
        self._outputs = {n: (dt, shape) for n, dt, shape in outs}
        self._batching = config.max_batch_size > 0
        self._pinned: dict[str, Any] = {}  # output name -> pinned host buffer, grown as needed
        for spec in config.inputs:
            if spec.name not in self._inputs:
                raise ConfigError(
                    f"model '{config.name}': unexpected inference input '{spec.name}', allowed "
                    f"inputs are: {', '.join(sorted(self._inputs))}")
        for spec in config.outputs:
            if spec.name not in self._outputs:
                raise ConfigError(
                    f"model '{config.name}': unexpected inference output '{spec.name}', allowed "
                    f"outputs are: {', '.join(sorted(self._outputs))}")
        for name, (dt, _) in {**self._inputs, **self._outputs}.items():
            declared = config.input_map.get(name) or config.output_map.get(name)
            if declared is not None and _datatype(dt, name) is not declared.datatype:
                raise ConfigError(
                    f"model '{config.name}': '{name}' is {dt} in the engine but "
                    f"{declared.datatype.config_name} in config.pbtxt")

    def _check_profile(self, name: str, shape: tuple[int, ...]) -> None:
        lo, _, hi = self._engine.get_tensor_profile_shape(name, self._profile)
        if len(shape) != len(lo) or any(s < a or s > b for s, a, b in zip(shape, lo, hi,
                                                                           strict=False)):
            raise InvalidArgument(
                f"model '{self._model}': input '{name}' shape {list(shape)} is outside the "
                f"engine's optimization profile {self._profile}: min {list(lo)}, max {list(hi)}")

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        cp, ctx, stream = self._cp, self._context, self._stream
        keep: list[Any] = []  # device buffers live until the stream is done with them
        with self._device, stream:
            for name, array in inputs.items():
                dt, engine_shape = self._inputs[name]
                host = np.ascontiguousarray(array)
                if -1 in engine_shape:
                    self._check_profile(name, host.shape)
                if not ctx.set_input_shape(name, host.shape):
                    raise InvalidArgument(f"model '{self._model}': TensorRT refused shape "
                                          f"{list(host.shape)} for input '{name}'")
                device = cp.empty(host.shape, dtype=host.dtype)
                device.set(host, stream=stream)
                ctx.set_tensor_address(name, device.data.ptr)
                keep.append(device)
            outs = {}
            for name in self._outputs:  # every output needs an address, asked for or not
                shape = tuple(ctx.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise InternalError(f"model '{self._model}': output '{name}' has unresolved "
                                        f"shape {list(shape)}")
                dtype = _datatype(self._outputs[name][0], name).numpy_dtype
                device = cp.empty(shape, dtype=dtype)
                ctx.set_tensor_address(name, device.data.ptr)
                outs[name] = device
            if not ctx.execute_async_v3(stream.ptr):
                raise InternalError(f"model '{self._model}': TensorRT execution failed")
            result = {}
            for name in output_names:
                device = outs[name]
                host = self._pinned_buffer(name, device)
                device.get(stream=stream, out=host)
                result[name] = np.array(host, copy=True)  # pinned buffers are reused
            stream.synchronize()
        del keep
        return result

    def _pinned_buffer(self, name: str, device: Any) -> np.ndarray:
        import cupyx

        buf = self._pinned.get(name)
        if buf is None or buf.size < device.size or buf.dtype != device.dtype:
            buf = cupyx.empty_pinned((max(device.size, 1),), dtype=device.dtype)
            self._pinned[name] = buf
        return buf[: device.size].reshape(device.shape)  # type: ignore[no-any-return]

    def close(self) -> None:
        self._stream.synchronize()
        runtime = _RUNTIMES.pop(id(self._engine), None)
        del self._context, self._engine, self._pinned
        del runtime


class TensorRTFactory:
    name = "tensorrt"
    platform = "tensorrt_plan"
    default_filename = "model.plan"

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        """Triton's TensorRT auto-complete: IO, and max_batch_size from profile 0 when every
        tensor's first dimension is dynamic."""
        if config.input and config.output:
            return
        trt, _ = _modules()
        path = version_path / (config.default_model_filename or "model.plan")
        engine = _deserialize(path, trt, config.name)
        ins, outs = _engine_io(engine, trt)
        batchable = all(shape and shape[0] == -1 for _, _, shape in ins + outs)
        if batchable and config.max_batch_size == 0:
            maxes = [engine.get_tensor_profile_shape(n, 0)[2][0] for n, _, _ in ins]
            config.max_batch_size = int(min(maxes)) if maxes else 1
        strip = batchable and config.max_batch_size > 0
        if not config.input:
            for name, dt, shape in ins:
                config.input.append(pb.ModelInput(
                    name=name, data_type=pb.DataType(_datatype(dt, name).config_value),
                    dims=(shape[1:] if strip else shape) or [1]))
        if not config.output:
            for name, dt, shape in outs:
                config.output.append(pb.ModelOutput(
                    name=name, data_type=pb.DataType(_datatype(dt, name).config_value),
                    dims=(shape[1:] if strip else shape) or [1]))
        runtime = _RUNTIMES.pop(id(engine), None)
        del engine
        del runtime

    def load(
        self, config: ModelConfig, version_path: Path, placement: InstancePlacement
    ) -> TensorRTInstance:
        if placement.kind != "gpu":
            raise ConfigError(
                f"model '{config.name}': TensorRT engines run only on a GPU; instance "
                f"{placement.name} has no GPU here (KIND_GPU with a CUDA device is required)")
        trt, _ = _modules()
        path = version_path / (config.default_model_filename or "model.plan")
        if not path.exists():
            raise ConfigError(f"unable to find '{path}' for model instance '{placement.name}'")
        engine = _deserialize(path, trt, config.name)
        profile = 0
        for group in config.proto.instance_group:
            if group.name == placement.group_name and group.profile:
                profile = int(group.profile[0])
        return TensorRTInstance(config, engine, placement, profile)


FACTORY = TensorRTFactory()

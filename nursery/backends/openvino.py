"""OpenVINO backend (``backend: "openvino"``): OpenVINO IR (``model.xml`` + ``model.bin``), and
the other formats OpenVINO reads (``default_model_filename: "model.onnx"``, ...).

Reads Triton's OpenVINO ``config.pbtxt`` parameters: ``PERFORMANCE_HINT`` (``LATENCY``,
``THROUGHPUT``, ``CUMULATIVE_THROUGHPUT``), ``NUM_STREAMS`` (``AUTO``, ``NUMA`` or a number),
``INFERENCE_NUM_THREADS``, ``COMPILATION_NUM_THREADS``, ``HINT_BF16``, ``CPU_EXTENSION_PATH``,
``TARGET_DEVICE`` (default ``CPU``), and the switches ``RESHAPE_IO_LAYERS`` (the config's dims,
``-1`` for dynamic, become the model's input shapes), ``SKIP_OV_DYNAMIC_BATCHSIZE`` and
``ENABLE_BATCH_PADDING``; values are case-insensitive and bad ones fail the load with Triton's
words. As in Triton, the config's datatypes are what the compiled model takes and gives
(OpenVINO converts to the model's own), a batching model's first dimension is its batch
(layout ``N...``), and instances are ``KIND_CPU`` only.

One difference, on purpose: Triton fixes a batching model's batch dimension at
``max_batch_size`` and refuses smaller batches unless ``ENABLE_BATCH_PADDING`` is ``YES``; here
a model saved with a dynamic batch dimension keeps it, so any batch up to ``max_batch_size``
runs as it is. A model saved with a fixed batch dimension (its graph may build on it: Triton's
qa models reshape to ``[max_batch_size, ...]``), or ``SKIP_OV_DYNAMIC_BATCHSIZE: YES``, gets
Triton's behaviour: a static batch of ``max_batch_size``, smaller batches padded with zeros
under ``ENABLE_BATCH_PADDING`` and refused with Triton's message otherwise.

Auto-complete, as Triton's: inputs and outputs from the model (name, datatype, dims: a
dimension OpenVINO does not know is ``-1``), ``max_batch_size`` 4 and dynamic batching when
every input and output has a layout with a batch dimension.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import betterproto
import numpy as np

from nursery.backends.base import AutofillsBatching, missing_extra
from nursery.backends.onnxruntime import check_dims
from nursery.config.model import ModelConfig
from nursery.errors import ConfigError, InternalError
from nursery.runtime.devices import InstancePlacement
from nursery.schema import inference as pb
from nursery.types import DataType

log = logging.getLogger("nursery.backends.openvino")

EXTRA = "openvino"
DEFAULT_FILENAME = "model.xml"
# OpenVINO element type name -> nursery datatype
_OV_TYPES = {
    "boolean": DataType.BOOL, "u8": DataType.UINT8, "u16": DataType.UINT16,
    "u32": DataType.UINT32, "u64": DataType.UINT64, "i8": DataType.INT8,
    "i16": DataType.INT16, "i32": DataType.INT32, "i64": DataType.INT64,
    "f16": DataType.FP16, "f32": DataType.FP32, "f64": DataType.FP64, "bf16": DataType.BF16,
}
_CONFIG_TO_OV = {dt: name for name, dt in _OV_TYPES.items()}


@dataclass(frozen=True, slots=True)
class OpenVinoOptions:
    properties: dict[str, str] = field(default_factory=dict)  # compile_model's config
    skip_dynamic_batch: bool = False
    batch_padding: bool = False
    reshape_io_layers: bool = False
    target_device: str = "CPU"
    cpu_extension: str = ""


def _yes(parameters: Mapping[str, str], key: str) -> bool:
    return parameters.get(key, "").strip().lower() == "yes"  # Triton: anything else is no


def parse_options(parameters: Mapping[str, str], model: str) -> OpenVinoOptions:
    """Triton's OpenVINO parameters as OpenVINO properties; errors in Triton's words."""
    props: dict[str, str] = {}

    def bad(key: str, expected: str, value: str) -> ConfigError:
        return ConfigError(f"model '{model}': expected the parameter '{key}' to be {expected}, "
                           f"got {value}")

    for key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
        if key in parameters:
            value = parameters[key].strip().lower()
            if not value.isdigit():
                raise bad(key, "a non-negative number", value)
            props[key] = str(int(value))
    if "HINT_BF16" in parameters:
        value = parameters["HINT_BF16"].strip().lower()
        if value != "yes":
            raise bad("HINT_BF16", "YES", value)
        props["INFERENCE_PRECISION_HINT"] = "bf16"
    if "NUM_STREAMS" in parameters:
        value = parameters["NUM_STREAMS"].strip().lower()
        if value in ("auto", "numa"):
            props["NUM_STREAMS"] = value.upper()
        elif value.isdigit():
            props["NUM_STREAMS"] = str(int(value))
        else:
            raise bad("NUM_STREAMS", "either AUTO/NUMA/<int_value>", value)
    if "PERFORMANCE_HINT" in parameters:
        value = parameters["PERFORMANCE_HINT"].strip().lower()
        if value not in ("latency", "throughput", "cumulative_throughput"):
            raise bad("PERFORMANCE_HINT", "LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT", value)
        props["PERFORMANCE_HINT"] = value.upper()
    return OpenVinoOptions(
        properties=props,
        skip_dynamic_batch=_yes(parameters, "SKIP_OV_DYNAMIC_BATCHSIZE"),
        batch_padding=_yes(parameters, "ENABLE_BATCH_PADDING"),
        reshape_io_layers=_yes(parameters, "RESHAPE_IO_LAYERS"),
        target_device=parameters.get("TARGET_DEVICE", "").strip().upper() or "CPU",
        cpu_extension=parameters.get("CPU_EXTENSION_PATH", "").strip(),
    )


def _ov(model: str) -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise missing_extra(model, "OpenVINO", EXTRA, exc) from None
    return openvino


def model_path(default_model_filename: str, version_path: Path) -> Path:
    return version_path / (default_model_filename or DEFAULT_FILENAME)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _read(core: Any, path: Path, model: str) -> Any:
    if not path.exists():
        raise ConfigError(f"unable to find '{path}' for model '{model}'")
    try:
        return core.read_model(str(path))
    except Exception as exc:  # OpenVINO raises RuntimeError with its own text
        raise ConfigError(f"model '{model}': OpenVINO failed to read '{path}': "
                          f"{_one_line(exc)}") from None


def _dims(partial_shape: Any) -> list[int]:
    return [d.get_length() if d.is_static else -1 for d in partial_shape]


def _batch_free(shape: list[int], batching: bool) -> list[int]:
    """A batching model's shape with its batch dimension as -1, whatever size the model file
    gives it: the batch is set below (dynamic, or ``max_batch_size``), as Triton's backend
    sets it (Triton's qa models are saved with a static batch of ``max_batch_size``)."""
    return [-1, *shape[1:]] if batching and shape else shape


def _datatype(element: Any, tensor: str, model: str) -> DataType:
    dt = _OV_TYPES.get(element.get_type_name())
    if dt is None:
        raise ConfigError(f"model '{model}': tensor '{tensor}' has OpenVINO type "
                          f"{element.get_type_name()}, which is not supported")
    return dt


class OpenVinoInstance:
    """One compiled model and its infer request; every call runs on the owning instance
    worker's thread."""

    inline_safe = False

    def __init__(self, compiled: Any, config: ModelConfig, options: OpenVinoOptions,
                 static_batch: int) -> None:
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self._model = config.name
        self._options = options
        self._static_batch = static_batch  # > 0: the model's fixed batch (Triton's way)
        self._outputs = {o.get_any_name(): o for o in compiled.outputs}
        for o in compiled.outputs:
            for name in o.get_names():
                self._outputs.setdefault(name, o)

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        feeds = dict(inputs)
        rows = 0
        if self._static_batch:
            rows = next(iter(feeds.values())).shape[0] if feeds else 0
            if rows != self._static_batch:
                if not self._options.batch_padding:
                    raise InternalError(
                        f"expected requests with batch size '{self._static_batch}', got "
                        f"'{rows}'... this error can be avoided by setting "
                        "'ENABLE_BATCH_PADDING' parameter in model configuration to 'YES' at "
                        "a performance cost.")
                feeds = {name: _pad(array, self._static_batch) for name, array in feeds.items()}
        try:
            self._request.infer(feeds)
        except Exception as exc:
            raise InternalError(f"model '{self._model}': OpenVINO inference failed: "
                                f"{_one_line(exc)}") from exc
        result = {}
        for name in output_names:
            # the request reuses its output tensors: copy before the next call
            array = np.array(self._request.get_tensor(self._outputs[name]).data, copy=True)
            if self._static_batch and rows != self._static_batch:
                array = array[:rows]
            result[name] = array
        return result

    def close(self) -> None:
        del self._request
        del self._compiled


def _pad(array: np.ndarray, rows: int) -> np.ndarray:
    padded = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    padded[: array.shape[0]] = array
    return padded


class OpenVinoFactory(AutofillsBatching):
    name = "openvino"
    platform = ""
    default_filename = DEFAULT_FILENAME

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        """Triton's OpenVINO AutoCompleteConfig: batching from the model's layouts, then the
        inputs and outputs the config leaves out."""
        if config.input and config.output:
            return
        ov = _ov(config.name)
        model = _read(ov.Core(), model_path(config.default_model_filename, version_path),
                      config.name)
        ports = [*model.inputs, *model.outputs]
        batching = bool(ports) and all(
            ov.layout_helpers.has_batch(ov.layout_helpers.get_layout(p)) for p in ports)
        if batching:
            if config.max_batch_size == 0 and self.default_max_batch > 0:
                config.max_batch_size = self.default_max_batch  # --backend-config, 4 by default
                log.warning(
                    "autofilled max_batch_size to %d for model '%s' since batching is supported "
                    "but no max_batch_size is specified in model configuration. Must specify "
                    "max_batch_size to utilize autofill with a larger max batch size",
                    self.default_max_batch, config.name)
            if config.max_batch_size > 1 and betterproto.which_one_of(
                    config, "scheduling_choice")[0] == "":
                config.dynamic_batching = pb.ModelDynamicBatching()
        elif config.max_batch_size != 0:
            log.warning("model layout for model %s does not support batching while non-zero "
                        "max_batch_size is specified", config.name)
        skip = 1 if config.max_batch_size > 0 else 0
        if not config.input:
            for port in model.inputs:
                dt = _datatype(port.get_element_type(), port.get_any_name(), config.name)
                config.input.append(pb.ModelInput(
                    name=port.get_any_name(), data_type=pb.DataType(dt.config_value),
                    dims=_dims(port.get_partial_shape())[skip:]))
        if not config.output:
            for port in model.outputs:
                dt = _datatype(port.get_element_type(), port.get_any_name(), config.name)
                config.output.append(pb.ModelOutput(
                    name=port.get_any_name(), data_type=pb.DataType(dt.config_value),
                    dims=_dims(port.get_partial_shape())[skip:]))

    def load(
        self, config: ModelConfig, version_path: Path, placement: InstancePlacement
    ) -> OpenVinoInstance:
        if placement.kind == "gpu":
            raise ConfigError(f"unable to load model '{config.name}', Triton OpenVINO backend "
                              "supports only Kind CPU and AUTO")
        options = parse_options(config.parameters, config.name)
        ov = _ov(config.name)
        core = ov.Core()
        if options.cpu_extension:
            try:
                core.add_extension(options.cpu_extension)
            except Exception as exc:
                raise ConfigError(f"model '{config.name}': loading custom CPU extensions "
                                  f"'{options.cpu_extension}': {_one_line(exc)}") from None
        path = model_path(config.default_model_filename, version_path)
        model = _read(core, path, config.name)
        model, static_batch = _configure(ov, model, config, options, path)
        try:
            compiled = core.compile_model(model, options.target_device, options.properties)
        except Exception as exc:
            raise ConfigError(f"model '{config.name}': OpenVINO failed to compile '{path}' for "
                              f"{options.target_device}: {_one_line(exc)}") from None
        log.info("model '%s' instance %s: OpenVINO on %s, %s streams, %s threads, precision %s",
                 config.name, placement.name, options.target_device,
                 compiled.get_property("NUM_STREAMS"),
                 compiled.get_property("INFERENCE_NUM_THREADS"),
                 compiled.get_property("INFERENCE_PRECISION_HINT"))
        return OpenVinoInstance(compiled, config, options, static_batch)


def _configure(ov: Any, model: Any, config: ModelConfig, options: OpenVinoOptions,
               path: Path) -> tuple[Any, int]:
    """Check the config's inputs and outputs against the model and build the model the
    config describes (Triton's ValidateInputs, then ValidateOutputs on the reshaped model);
    the static batch size, or 0."""
    from openvino.preprocess import PrePostProcessor

    batching = config.max_batch_size > 0
    reshapes: dict[str, Any] = {}
    saved_static = False  # a batching model saved with a fixed batch dimension
    if len(model.inputs) != len(config.inputs):
        raise ConfigError(f"unable to load model '{config.name}', configuration expects "
                          f"{len(config.inputs)} inputs, model provides {len(model.inputs)} "
                          f"('{path}')")
    for spec in config.inputs:
        port = _port(model.inputs, "input", spec.name, config.name, path)
        dims = list(spec.reshape if spec.reshape is not None else spec.dims)
        shape = port.get_partial_shape()
        if batching and len(shape) > 0 and shape[0].is_static:
            saved_static = True
        if options.reshape_io_layers:
            new = list(shape)
            start = 1 if batching else 0
            if len(dims) + start != len(new):
                raise ConfigError(
                    f"model '{config.name}': input '{spec.name}': RESHAPE_IO_LAYERS gives "
                    f"{len(dims)} dims {dims}, the model in '{path}' has rank {len(new)}")
            for i, d in enumerate(dims):
                if d != -1 and d <= 0:
                    raise ConfigError("openvino backend does not support dimensions values "
                                      "other than `-1` or positive integers")
                new[start + i] = ov.Dimension(d) if d > 0 else ov.Dimension()
            reshapes[spec.name] = ov.PartialShape(new)
        else:
            _check_shape(config, spec.name, _batch_free(_dims(shape), batching), dims, path,
                         exact=False)
    try:
        if reshapes:
            model.reshape(reshapes)
    except Exception as exc:
        raise ConfigError(f"model '{config.name}': OpenVINO cannot reshape '{path}' as "
                          f"config.pbtxt asks: {_one_line(exc)}") from None
    for spec in config.outputs:
        port = _port(model.outputs, "output", spec.name, config.name, path)
        dims = list(spec.reshape if spec.reshape is not None else spec.dims)
        _check_shape(config, spec.name, _batch_free(_dims(port.get_partial_shape()), batching),
                     dims, path, exact=True)
    try:
        ppp = PrePostProcessor(model)
        for what, specs in (("input", config.inputs), ("output", config.outputs)):
            for spec in specs:
                element = _CONFIG_TO_OV.get(spec.datatype)
                if element is None:
                    raise ConfigError(f"unsupported datatype {spec.datatype.config_name} for "
                                      f"{what} '{spec.name}' for model '{config.name}'")
                io = ppp.input(spec.name) if what == "input" else ppp.output(spec.name)
                io.tensor().set_element_type(getattr(ov.Type, element))
                if what == "input" and batching:
                    io.tensor().set_layout(ov.Layout("N..."))
        model = ppp.build()
        static_batch = 0
        if batching:
            # a model saved with a fixed batch may build on it (a Reshape to [8, 16], as
            # Triton's qa generator saves them): Triton's way, a static batch of
            # max_batch_size; a model saved with a dynamic batch stays dynamic
            if options.skip_dynamic_batch or saved_static:
                ov.set_batch(model, config.max_batch_size)
                static_batch = config.max_batch_size
            else:
                ov.set_batch(model, -1)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"model '{config.name}': OpenVINO cannot shape '{path}' as "
                          f"config.pbtxt asks: {_one_line(exc)}") from None
    return model, static_batch


def _port(ports: Sequence[Any], what: str, name: str, model: str, path: Path) -> Any:
    for port in ports:
        if name in port.get_names():
            return port
    allowed = ", ".join(sorted(p.get_any_name() for p in ports))
    raise ConfigError(f"model '{model}': unexpected inference {what} '{name}', allowed "
                      f"{what}s are: {allowed} ('{path}')")


def _check_shape(config: ModelConfig, name: str, model_shape: list[int], dims: list[int],
                 path: Path, *, exact: bool) -> None:
    error = check_dims(config.name, name, model_shape, dims, config.max_batch_size, exact=exact)
    if error is not None:
        raise ConfigError(f"{error} ('{path}')")


FACTORY = OpenVinoFactory()

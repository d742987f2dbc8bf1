"""TensorFlow backend (``backend: "tensorflow"``; ``platform: "tensorflow_savedmodel"`` or
``"tensorflow_graphdef"``), on the CPU.

SavedModel (``model.savedmodel/``): loaded with the graph tag ``TF_GRAPH_TAG`` (default
``serve``) and served through one signature, chosen as Triton chooses it: ``TF_SIGNATURE_DEF``
when the config names one, else ``serving_default``, else (with a warning) the first other
signature; a SavedModel with none fails to load with Triton's words. The config's input and
output names are the signature's keys. Auto-complete fills inputs, outputs (name, datatype,
dims) and ``max_batch_size`` from the signature, with Triton's rule: a signature whose every
tensor has a variable first dimension batches.

GraphDef (``model.graphdef``, a frozen ``GraphDef``): the config names the graph's tensors
(``x`` is ``x:0``); as in Triton, a GraphDef has nothing to auto-complete from.

Parameters read as Triton's TensorFlow backend reads them: ``TF_NUM_INTRA_THREADS`` and
``TF_NUM_INTER_THREADS`` (TensorFlow's thread pools are per process here: the first model
that sets them decides, later different values are logged and ignored),
``TF_USE_PER_SESSION_THREADS`` (accepted; TensorFlow 2 has no per-session pools),
``TF_GRAPH_TAG``, ``TF_SIGNATURE_DEF`` and ``MAX_SESSION_SHARE_COUNT`` (instances of a model
share one loaded model, up to that many each; default 1). ``TF_INIT_OPS_FILE`` is refused with
a clear reason (GraphDef init ops are not run here). ``optimization`` options Triton accepts for
TensorFlow (``graph { level }``, ``execution_accelerators``) are accepted; the GPU ones have no
effect on a CPU and say so in the log.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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

log = logging.getLogger("nursery.backends.tensorflow")

EXTRA = "tensorflow"
SAVEDMODEL, GRAPHDEF = "tensorflow_savedmodel", "tensorflow_graphdef"
DEFAULT_FILES = {SAVEDMODEL: "model.savedmodel", GRAPHDEF: "model.graphdef"}
_RESERVED_SIGNATURES = ("__saved_model_init_op", "__saved_model_train_op")
_TF_TYPES = {
    "bool": DataType.BOOL, "uint8": DataType.UINT8, "uint16": DataType.UINT16,
    "uint32": DataType.UINT32, "uint64": DataType.UINT64, "int8": DataType.INT8,
    "int16": DataType.INT16, "int32": DataType.INT32, "int64": DataType.INT64,
    "float16": DataType.FP16, "float32": DataType.FP32, "float64": DataType.FP64,
    "string": DataType.BYTES,
}


@dataclass(frozen=True, slots=True)
class TfOptions:
    intra_threads: int = 0
    inter_threads: int = 0
    per_session_threads: bool = False
    graph_tag: str = ""
    signature_def: str = ""
    share_count: int = 1
    init_ops_file: str = ""


def parse_options(parameters: Mapping[str, str], model: str) -> TfOptions:
    def number(key: str, default: int) -> int:
        if key not in parameters:
            return default
        value = parameters[key].strip()
        if not value.lstrip("-").isdigit():
            raise ConfigError(f"model '{model}': failed to convert '{value}' to an integer "
                              f"for parameter '{key}'")
        return int(value)

    return TfOptions(
        intra_threads=number("TF_NUM_INTRA_THREADS", 0),
        inter_threads=number("TF_NUM_INTER_THREADS", 0),
        per_session_threads=parameters.get("TF_USE_PER_SESSION_THREADS", "").strip().lower()
        in ("true", "on", "1", "yes"),
        graph_tag=parameters.get("TF_GRAPH_TAG", "").strip(),
        signature_def=parameters.get("TF_SIGNATURE_DEF", "").strip(),
        share_count=max(1, number("MAX_SESSION_SHARE_COUNT", 1)),
        init_ops_file=parameters.get("TF_INIT_OPS_FILE", "").strip(),
    )


_THREADS_LOCK = threading.Lock()
_THREADS_SET: dict[str, int] = {}
_THREADS_WARNED: set[tuple[str, str]] = set()


def _tf(model: str) -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ chatter
    try:
        import tensorflow
    except ImportError as exc:
        raise missing_extra(model, "TensorFlow", EXTRA, exc) from None
    return tensorflow


def _apply_threads(tf: Any, options: TfOptions, model: str) -> None:
    """TensorFlow's pools are the process's: set once, before TensorFlow starts them."""
    with _THREADS_LOCK:
        for key, value, setter in (
                ("TF_NUM_INTRA_THREADS", options.intra_threads,
                 tf.config.threading.set_intra_op_parallelism_threads),
                ("TF_NUM_INTER_THREADS", options.inter_threads,
                 tf.config.threading.set_inter_op_parallelism_threads)):
            if value <= 0:
                continue
            if key not in _THREADS_SET:
                try:
                    setter(value)
                    _THREADS_SET[key] = value
                except RuntimeError:  # TensorFlow already started its pools
                    _THREADS_SET[key] = -1
            if _THREADS_SET[key] != value and (model, key) not in _THREADS_WARNED:
                _THREADS_WARNED.add((model, key))
                log.warning("model '%s': %s %d not applied: TensorFlow's thread pools are per "
                            "process and already started", model, key, value)


def model_path(config_filename: str, version_path: Path, platform: str) -> Path:
    return version_path / (config_filename or DEFAULT_FILES.get(platform, DEFAULT_FILES[SAVEDMODEL]))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@dataclass(frozen=True)
class _Signature:
    """One callable model: inputs and outputs by the config's names, with model shapes."""
    call: Any  # feeds by name -> outputs by name
    inputs: dict[str, tuple[DataType, list[int]]]
    outputs: dict[str, tuple[DataType, list[int]]]


def _dims(shape: Any) -> list[int]:
    if shape.rank is None:
        return []
    return [-1 if d is None else int(d) for d in shape.as_list()]


def _dtype(tf_dtype: Any, tensor: str, model: str, what: str) -> DataType:
    dt = _TF_TYPES.get(tf_dtype.name)
    if dt is None:
        raise ConfigError(f"unable to process {what} '{tensor}' for '{model}', unsupported "
                          f"datatype '{tf_dtype.name}'")
    return dt


def _load_savedmodel(tf: Any, path: Path, options: TfOptions, model: str) -> _Signature:
    if not path.is_dir():
        raise ConfigError(f"model '{model}': unable to find SavedModel folder '{path}'")
    tag = options.graph_tag or "serve"
    try:
        loaded = tf.saved_model.load(str(path), tags=[tag])
    except Exception as exc:
        text = _one_line(exc)
        if "MetaGraphDef associated with tags" in text or "tags" in text and tag in text:
            raise ConfigError(f"unable to load model '{model}', expected '{tag}' tag in "
                              f"'{path}': {text}") from None
        raise ConfigError(f"model '{model}': TensorFlow failed to load '{path}': {text}") from None
    signatures = {k: v for k, v in loaded.signatures.items() if k not in _RESERVED_SIGNATURES}
    wanted = options.signature_def or "serving_default"
    key = wanted if wanted in signatures else None
    if key is None and not options.signature_def and signatures:
        key = sorted(signatures)[0]
        log.warning("model '%s': unable to find serving signature '%s'; using signature '%s'",
                    model, wanted, key)
    if key is None:
        raise ConfigError(f"unable to load model '{model}', expected '{wanted}' signature in "
                          f"'{path}' (it has: {', '.join(sorted(signatures)) or 'none'})")
    fn = signatures[key]
    _, kwargs = fn.structured_input_signature
    inputs = {name: (_dtype(spec.dtype, name, model, "input"), _dims(spec.shape))
              for name, spec in kwargs.items()}
    outs = fn.structured_outputs
    if not isinstance(outs, Mapping):
        raise ConfigError(f"model '{model}': signature '{key}' of '{path}' does not name its "
                          "outputs")
    outputs = {name: (_dtype(spec.dtype, name, model, "output"), _dims(spec.shape))
               for name, spec in outs.items()}

    def call(feeds: Mapping[str, Any]) -> Mapping[str, Any]:
        result: Mapping[str, Any] = fn(**feeds)
        return result

    call.keep = loaded  # type: ignore[attr-defined]  # the signature needs its object alive
    return _Signature(call, inputs, outputs)


def _tensor_name(name: str) -> str:
    return name if ":" in name else f"{name}:0"


def _load_graphdef(tf: Any, path: Path, config: ModelConfig) -> _Signature:
    model = config.name
    if not path.is_file():
        raise ConfigError(f"model '{model}': unable to find '{path}'")
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(path.read_bytes())
    except Exception as exc:
        raise ConfigError(f"model '{model}': '{path}' is not a TensorFlow GraphDef: "
                          f"{_one_line(exc)}") from None
    if not graph_def.node:
        raise ConfigError(f"model {model} has an empty network ('{path}')")
    try:
        wrapped = tf.compat.v1.wrap_function(
            lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
    except Exception as exc:
        raise ConfigError(f"model '{model}': TensorFlow failed to import '{path}': "
                          f"{_one_line(exc)}") from None
    graph = wrapped.graph

    def tensor(name: str, what: str) -> Any:
        try:
            return graph.get_tensor_by_name(_tensor_name(name))
        except (KeyError, ValueError):
            raise ConfigError(f"model '{model}': unexpected inference {what} '{name}': no such "
                              f"tensor in '{path}'") from None

    in_names = [t.name for t in config.inputs]
    out_names = [t.name for t in config.outputs]
    feeds = [tensor(n, "input") for n in in_names]
    fetches = [tensor(n, "output") for n in out_names]
    try:
        pruned = wrapped.prune(feeds=feeds, fetches=fetches)
    except Exception as exc:
        raise ConfigError(f"model '{model}': TensorFlow cannot run outputs {out_names} from "
                          f"inputs {in_names} in '{path}': {_one_line(exc)}") from None
    inputs = {n: (_dtype(t.dtype, n, model, "input"), _dims(t.shape))
              for n, t in zip(in_names, feeds, strict=True)}
    outputs = {n: (_dtype(t.dtype, n, model, "output"), _dims(t.shape))
               for n, t in zip(out_names, fetches, strict=True)}

    def call(values: Mapping[str, Any]) -> Mapping[str, Any]:
        results = pruned(*[values[n] for n in in_names])
        return dict(zip(out_names, results, strict=True))

    return _Signature(call, inputs, outputs)


_SHARED_LOCK = threading.Lock()
_SHARED: dict[tuple[Any, ...], list[Any]] = {}  # key -> [signature, instances using it]


class TensorFlowInstance:
    """One loaded model (maybe shared with other instances of its model); every call runs on
    the owning instance worker's thread."""

    inline_safe = False

    def __init__(self, tf: Any, signature: _Signature, config: ModelConfig,
                 release: Any) -> None:
        self._tf = tf
        self._signature = signature
        self._model = config.name
        self._bytes = {t.name for t in config.inputs if t.datatype is DataType.BYTES}
        self._release = release

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        tf = self._tf
        feeds = {}
        for name, array in inputs.items():
            if name in self._bytes:
                feeds[name] = tf.constant(array.astype(object), dtype=tf.string)
            else:
                feeds[name] = tf.constant(array)
        try:
            results = self._signature.call(feeds)
        except Exception as exc:
            raise InternalError(f"model '{self._model}': TensorFlow failed: "
                                f"{_one_line(exc)}") from exc
        out = {}
        for name in output_names:
            value = results[name].numpy()
            out[name] = value
        return out

    def close(self) -> None:
        self._release()


class TensorFlowFactory(AutofillsBatching):
    name = "tensorflow"
    platform = SAVEDMODEL
    default_filename = DEFAULT_FILES[SAVEDMODEL]

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        """Triton's TensorFlow AutoCompleteConfig: from a SavedModel's signature (a GraphDef
        tells nothing)."""
        if config.platform == GRAPHDEF or (config.input and config.output):
            return
        path = model_path(config.default_model_filename, version_path, SAVEDMODEL)
        if not path.exists():
            return  # as Triton: nothing to complete from; the load names the missing file
        tf = _tf(config.name)
        options = parse_options({k: v.string_value for k, v in config.parameters.items()},
                                config.name)
        try:
            signature = _load_savedmodel(tf, path, options, config.name)
        except ConfigError as exc:
            raise ConfigError(f"unable to auto-complete model configuration for "
                              f"'{config.name}', failed to load model: {exc}") from None
        tensors = [*signature.inputs.values(), *signature.outputs.values()]
        batches = bool(tensors) and all(dims and dims[0] == -1 for _, dims in tensors)
        if not batches and config.max_batch_size > 0:
            raise ConfigError(f"unable to autofill for '{config.name}', configuration specified "
                              f"max-batch {config.max_batch_size} but model signature does not "
                              "support batching")
        if batches and config.max_batch_size == 0 and self.default_max_batch > 0:
            config.max_batch_size = self.default_max_batch  # --backend-config, 4 by default
            log.warning("autofilled max_batch_size to %d for model '%s' since batching is "
                        "supported but no max_batch_size is specified in model configuration. "
                        "Must specify max_batch_size to utilize autofill with a larger max "
                        "batch size", self.default_max_batch, config.name)
        if config.max_batch_size > 1 and betterproto.which_one_of(
                config, "scheduling_choice")[0] == "":
            config.dynamic_batching = pb.ModelDynamicBatching()
        skip = 1 if config.max_batch_size > 0 else 0
        for what, found, target in (("input", signature.inputs, config.input),
                                    ("output", signature.outputs, config.output)):
            if target:
                continue
            for name, (dt, dims) in sorted(found.items()):
                if not dims:
                    raise ConfigError(f"Unable to autofill for '{config.name}': the rank of "
                                      f"model tensor '{name}' is 0 and dimensions are not "
                                      "defined")
                kept = dims[skip:]
                cls = pb.ModelInput if what == "input" else pb.ModelOutput
                entry = cls(name=name, data_type=pb.DataType(dt.config_value), dims=kept or [1])
                if not kept:
                    entry.reshape = pb.ModelTensorReshape(shape=[])
                target.append(entry)  # type: ignore[arg-type]

    def load(
        self, config: ModelConfig, version_path: Path, placement: InstancePlacement
    ) -> TensorFlowInstance:
        options = parse_options(config.parameters, config.name)
        if options.init_ops_file:
            raise ConfigError(f"model '{config.name}': parameter TF_INIT_OPS_FILE is not "
                              "supported here (GraphDef init ops are not run); freeze the "
                              "variables into the GraphDef, or use a SavedModel")
        if placement.kind == "gpu":
            log.warning("model '%s' instance %s: TensorFlow runs on the CPU here",
                        config.name, placement.name)
        accelerators = config.proto.optimization.execution_accelerators
        if accelerators.gpu_execution_accelerator:
            log.warning("model '%s': gpu_execution_accelerator has no effect on a CPU",
                        config.name)
        tf = _tf(config.name)
        _apply_threads(tf, options, config.name)
        platform = config.platform or SAVEDMODEL
        path = model_path(config.default_model_filename, version_path, platform)
        key = (str(path), platform, options.graph_tag, options.signature_def,
               tuple((t.name, t.datatype) for t in (*config.inputs, *config.outputs)))
        with _SHARED_LOCK:
            entry = _SHARED.get(key)
            if entry is not None and entry[1] < options.share_count:
                entry[1] += 1
                log.info("model '%s' instance %s shares a loaded model "
                         "(MAX_SESSION_SHARE_COUNT %d)", config.name, placement.name,
                         options.share_count)
            else:
                entry = None
        if entry is None:
            if platform == GRAPHDEF:
                signature = _load_graphdef(tf, path, config)
            else:
                signature = _load_savedmodel(tf, path, options, config.name)
            _check_io(config, signature, path)
            entry = [signature, 1]
            if options.share_count > 1:
                with _SHARED_LOCK:
                    _SHARED[key] = entry
        shared = entry

        def release() -> None:
            with _SHARED_LOCK:
                shared[1] -= 1
                if shared[1] <= 0 and _SHARED.get(key) is shared:
                    del _SHARED[key]

        return TensorFlowInstance(tf, shared[0], config, release)


def _check_io(config: ModelConfig, signature: _Signature, path: Path) -> None:
    """The config's inputs and outputs against the signature: names, datatypes, shapes."""
    for what, specs, found in (("input", config.inputs, signature.inputs),
                               ("output", config.outputs, signature.outputs)):
        for spec in specs:
            if spec.name not in found:
                raise ConfigError(
                    f"model '{config.name}': unexpected inference {what} '{spec.name}', "
                    f"allowed {what}s are: {', '.join(sorted(found))} ('{path}')")
            dt, dims = found[spec.name]
            if dt is not spec.datatype:
                raise ConfigError(
                    f"unable to load model '{config.name}', {what} '{spec.name}' data-type "
                    f"{dt.config_name} doesn't match configuration data-type "
                    f"{spec.datatype.config_name} ('{path}')")
            if not dims and config.platform == GRAPHDEF:
                continue  # a GraphDef tensor of unknown rank: TensorFlow checks at run time
            want = list(spec.reshape if spec.reshape is not None else spec.dims)
            error = check_dims(config.name, spec.name, dims, want, config.max_batch_size,
                               exact=what == "output")
            if error is not None:
                raise ConfigError(f"{error} ('{path}')")
    missing = [n for n in signature.inputs if n not in config.input_map]
    if missing:
        raise ConfigError(f"model '{config.name}': the signature in '{path}' needs inputs the "
                          f"configuration does not list: {', '.join(missing)}")


FACTORY = TensorFlowFactory()

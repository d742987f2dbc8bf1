"""ONNX Runtime backend (``backend: "onnxruntime"`` / ``platform: "onnxruntime_onnx"``).

One ``InferenceSession`` per model instance, created on the instance's own thread. CPU
instances use the CPU execution provider; GPU instances use the CUDA provider on their
device when onnxruntime-gpu and a GPU are present, and fall back to the CPU with one log
line otherwise. Session options come from the config ``parameters`` Triton's ORT backend
reads (``intra_op_thread_count``, ``inter_op_thread_count``, ``execution_mode``,
``enable_mem_arena``, ``enable_mem_pattern``) and ``optimization { graph { level } }``; any
parameter whose key starts with ``session.`` is passed to ONNX Runtime as a session config
entry (for example ``session.intra_op.allow_spinning``: "0" stops the intra-op pool spinning
between calls).

One default differs from ONNX Runtime's: a model whose dynamic batcher waits for a batch to
fill (``max_queue_delay_microseconds`` above 0) gets ``session.intra_op.allow_spinning`` "0"
unless its config sets the key. Between two batches such a model's intra-op threads would
spin for the whole queue delay, on the cores the server's own thread needs for the requests
in between. On the 2-core machine, the peer sweep's MLP (784-1024-1024-10, 1 ms delay,
max batch 32; interleaved rounds, HTTP binary) gave with spinning off: c=1 487 against 312
infer/s (server CPU per request 900 against 3,065 µs), c=16 4,051 against 3,266 (196 against
389 µs), c=64 4,791 against 4,740 (180 against 289 µs). Without a queue delay the calls come
back to back and spinning pays (no batching, c=1: 1,983 infer/s spinning against 1,574), so
ONNX Runtime's default stays there.

Where the intra-op threads do spin, they spin at the lowest CPU priority (nice 19; Linux, CPU
instances; config parameter ``intra_op_thread_nice``, 0 to 19, 0 leaves them as created). A
thread spinning between two calls takes whatever core the scheduler gives it, as much as the
thread serving requests gets, on a machine whose cores are all busy; at nice 19 it runs only
where nothing else wants the core, so it still catches the next call at once on an idle
machine. No call waits on it: ONNX Runtime's calling thread runs every part of a parallel
loop that no pool thread has taken. Measured on the 2-core machine (peer MLP, no batching,
interleaved rounds): HTTP JSON c=16 1.09-1.15x, gRPC c=16 1.23x, the c=1 rows unchanged;
beside two busy processes, c=1 p99 5.8-6.1 ms against 8.1-8.4 and c=16 1.3-1.45x.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import betterproto
import numpy as np

from nursery.backends.base import AutofillsBatching
from nursery.config.model import ModelConfig
from nursery.errors import ConfigError, InternalError, InvalidArgument
from nursery.runtime.devices import InstancePlacement
from nursery.schema import inference as pb
from nursery.types import DataType

if TYPE_CHECKING:
    import onnxruntime as ort

log = logging.getLogger("nursery.backends.onnxruntime")

_ORT_TYPES = {
    "tensor(bool)": DataType.BOOL,
    "tensor(uint8)": DataType.UINT8,
    "tensor(uint16)": DataType.UINT16,
    "tensor(uint32)": DataType.UINT32,
    "tensor(uint64)": DataType.UINT64,
    "tensor(int8)": DataType.INT8,
    "tensor(int16)": DataType.INT16,
    "tensor(int32)": DataType.INT32,
    "tensor(int64)": DataType.INT64,
    "tensor(float16)": DataType.FP16,
    "tensor(float)": DataType.FP32,
    "tensor(double)": DataType.FP64,
    "tensor(string)": DataType.BYTES,
    "tensor(bfloat16)": DataType.BF16,
}
_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16


def _ort() -> Any:
    import onnxruntime

    return onnxruntime


def _model_file(config_filename: str, version_path: Path) -> Path:
    path = version_path / (config_filename or "model.onnx")
    if path.is_dir():  # Triton accepts a folder holding model.onnx (external data)
        path = path / "model.onnx"
    return path


def _dims(shape: Sequence[Any]) -> list[int]:
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


SPINNING = "session.intra_op.allow_spinning"
# a RunOptions entry ("cpu:0", "gpu:0;cpu:0"): shrink those arenas after each run
ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"


def spinning_default(config: ModelConfig) -> dict[str, str]:
    """The session config entries nursery adds by default (see the module's docstring): no
    intra-op spinning for a model whose batcher waits between batches, unless it says so."""
    batching = config.batching
    if SPINNING in config.parameters or batching is None or batching.max_queue_delay_us <= 0:
        return {}
    return {SPINNING: "0"}


NICE = "intra_op_thread_nice"
_LOWEST = 19


def pool_nice(parameters: Mapping[str, str], model: str) -> int:
    """The nice value for a CPU session's intra-op threads: ``intra_op_thread_nice`` when the
    config sets it (0 to 19), else the lowest priority where they spin and 0 where they do
    not (see the module's docstring)."""
    value = parameters.get(NICE)
    if value is not None:
        try:
            nice = int(value)
        except ValueError:
            nice = -1
        if not 0 <= nice <= _LOWEST:
            raise ConfigError(
                f"model '{model}': parameter '{NICE}' must be an integer from 0 to {_LOWEST}, "
                f"got '{value}'"
            )
        return nice
    return 0 if parameters.get(SPINNING, "1").strip() == "0" else _LOWEST


def _new_session(ort: Any, path: Path, opts: Any, providers: list[Any], nice: int) -> Any:
    """``ort.InferenceSession``, its intra-op threads at ``nice``. ONNX Runtime starts them in
    the constructor and a Linux thread takes its nice value from the thread that starts it,
    so the constructor runs on a short-lived thread lowered first (a thread cannot raise its
    own priority back without privileges)."""
    if not nice or sys.platform != "linux":
        return ort.InferenceSession(str(path), sess_options=opts, providers=providers)
    made: dict[str, Any] = {}

    def construct() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except OSError as exc:  # a sandbox that forbids it: ONNX Runtime's threads as they are
            log.debug("intra-op threads keep their priority: %s", exc)
        try:
            made["session"] = ort.InferenceSession(str(path), sess_options=opts,
                                                   providers=providers)
        except BaseException as exc:  # handed to the loading thread
            made["error"] = exc

    maker = threading.Thread(target=construct, name="ort-session", daemon=True)
    maker.start()
    maker.join()
    if "error" in made:
        raise made["error"]
    return made["session"]


def _session_options(parameters: Mapping[str, str], graph_level: int, model: str) -> Any:
    ort = _ort()
    opts = ort.SessionOptions()

    def int_param(key: str) -> int | None:
        if key not in parameters:
            return None
        try:
            return int(parameters[key])
        except ValueError:
            raise ConfigError(
                f"model '{model}': parameter '{key}' must be an integer, got '{parameters[key]}'"
            ) from None

    def bool_param(key: str) -> bool | None:
        if key not in parameters:
            return None
        v = parameters[key].strip().lower()
        if v in ("true", "1"):
            return True
        if v in ("false", "0"):
            return False
        raise ConfigError(f"model '{model}': failed to convert {key} '{parameters[key]}' to boolean")

    if (n := int_param("intra_op_thread_count")) and n > 0:
        opts.intra_op_num_threads = n
    if (n := int_param("inter_op_thread_count")) and n > 0:
        opts.inter_op_num_threads = n
    mode = int_param("execution_mode")
    if mode is not None:
        if mode not in (0, 1):
            raise ConfigError(
                f"model '{model}': execution_mode must be 0 (sequential) or 1 (parallel), got {mode}"
            )
        opts.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
        )
    if (arena := bool_param("enable_mem_arena")) is not None:
        opts.enable_cpu_mem_arena = arena
        log.debug("Configuring enable_mem_arena to %s", parameters["enable_mem_arena"])
    if (pattern := bool_param("enable_mem_pattern")) is not None:
        opts.enable_mem_pattern = pattern
        log.debug("Configuring enable_mem_pattern to %s", parameters["enable_mem_pattern"])
    for key, value in parameters.items():
        if not key.startswith("session."):
            continue
        if key == "session.use_device_allocator_for_initializers":  # Triton logs this one
            log.debug("Configuring '%s' to '%s' for '%s'", key, value, model)
        try:
            opts.add_session_config_entry(key, value)
        except Exception as exc:  # onnxruntime's own error types
            raise ConfigError(f"model '{model}': session config entry {key}={value!r}: {exc}") from exc
    levels = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }
    opts.graph_optimization_level = levels.get(graph_level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return opts


def _cuda_available() -> bool:
    return "CUDAExecutionProvider" in _ort().get_available_providers()


class OnnxRuntimeInstance:
    """One session; every method runs on the owning instance worker's thread, or (CPU
    sessions, batches measured to compute in less than a thread hand-off costs) on the trio
    thread: ``inline_safe``."""

    def __init__(self, session: ort.InferenceSession, model: str, stream: Any = None,
                 gpu: bool = False) -> None:
        self._session = session
        self._model = model
        self._stream = stream  # the instance's own CUDA stream (ORT computes on it), or None
        self._input_types = {i.name: i.type for i in session.get_inputs()}
        self._output_types = {o.name: o.type for o in session.get_outputs()}
        self._needs_ortvalues = "tensor(bfloat16)" in set(self._input_types.values()) | set(
            self._output_types.values()
        )
        self._run_options = _ort().RunOptions()
        # GPU sessions: IO binding, so ORT moves inputs and outputs on the compute stream
        self.inline_safe = not gpu
        self._io_binding = gpu and not self._needs_ortvalues and "tensor(string)" not in set(
            self._input_types.values()) | set(self._output_types.values())

    def run_config_entry(self, key: str, value: str) -> None:
        """An entry of the RunOptions every run of this instance uses."""
        self._run_options.add_run_config_entry(key, value)

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        feeds: dict[str, Any] = {}
        for name, array in inputs.items():
            ort_type = self._input_types.get(name)
            if ort_type == "tensor(string)":
                feeds[name] = _text_array(array, name)
            else:
                feeds[name] = array
        names = list(output_names)
        try:
            if self._io_binding:
                return self._execute_bound(feeds, names)
            if self._needs_ortvalues:
                return self._execute_ortvalues(feeds, names)
            results = self._session.run(names, feeds, self._run_options)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise InternalError(f"onnx runtime error: {exc}") from exc
        return dict(zip(names, results, strict=True))

    def _execute_bound(self, feeds: dict[str, Any], names: list[str]) -> dict[str, np.ndarray]:
        """CUDA provider: host inputs bound to the session, outputs bound to host memory; ORT
        does both copies and the kernels on the instance's stream (``user_compute_stream``)."""
        binding = self._session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in names:
            binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(binding, self._run_options)
        return dict(zip(names, binding.copy_outputs_to_cpu(), strict=True))

    def _execute_ortvalues(self, feeds: dict[str, Any], names: list[str]) -> dict[str, np.ndarray]:
        ort = _ort()
        values = {}
        for name, array in feeds.items():
            if self._input_types[name] == "tensor(bfloat16)":
                values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(array, dtype=np.uint16), onnx_element_type=_ONNX_BFLOAT16
                )
            else:
                values[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
        outs = self._session.run_with_ort_values(names, values, self._run_options)
        result = {}
        for name, value in zip(names, outs, strict=True):
            if self._output_types[name] == "tensor(bfloat16)":
                shape = value.shape()
                count = int(np.prod(shape)) if shape else 1
                raw = (ctypes.c_uint16 * count).from_address(value.data_ptr())
                result[name] = np.array(raw, dtype=np.uint16).reshape(shape)
            else:
                result[name] = value.numpy()
        return result

    def close(self) -> None:
        del self._session


def _text_array(array: np.ndarray, name: str) -> np.ndarray:
    """ONNX Runtime string tensors take Python ``str``; BYTES elements must be UTF-8."""
    out = np.empty(array.shape, dtype=object)
    flat_in = array.reshape(-1)
    flat_out = out.reshape(-1)
    for i, item in enumerate(flat_in):
        if isinstance(item, bytes | bytearray):
            try:
                flat_out[i] = bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(
                    f"input '{name}' element {i} is not valid UTF-8; ONNX Runtime string tensors "
                    "carry UTF-8 text"
                ) from None
        else:
            flat_out[i] = str(item)
    return out


class OnnxRuntimeFactory(AutofillsBatching):
    name = "onnxruntime"
    platform = "onnxruntime_onnx"
    default_filename = "model.onnx"

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        """Triton's ORT AutoCompleteConfig: IO and max_batch_size from the model file."""
        if config.input and config.output:
            return
        path = _model_file(config.default_model_filename, version_path)
        if not path.exists():
            raise ConfigError(f"model '{config.name}': unable to find '{path}'")
        ort = _ort()
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        ins = [(i.name, i.type, _dims(i.shape)) for i in session.get_inputs()]
        outs = [(o.name, o.type, _dims(o.shape)) for o in session.get_outputs()]
        batchable = all(d and d[0] == -1 for _, _, d in ins + outs)
        if batchable:
            if config.max_batch_size == 0 and self.default_max_batch > 0:
                config.max_batch_size = self.default_max_batch  # --backend-config, 4 by default
                log.warning(
                    "autofilled max_batch_size to %d for model '%s' since batching is supported "
                    "but no max_batch_size is specified in model configuration",
                    self.default_max_batch, config.name,
                )
            if config.max_batch_size > 1 and betterproto.which_one_of(
                config, "scheduling_choice"
            )[0] == "":
                config.dynamic_batching = pb.ModelDynamicBatching()
        elif config.max_batch_size != 0:
            raise ConfigError(
                f"autofill failed for model '{config.name}': model does not support batching "
                "while non-zero max_batch_size is specified"
            )
        strip = config.max_batch_size > 0
        if not config.input:
            for name, ort_type, dims in ins:
                config.input.append(pb.ModelInput(name=name, data_type=_config_type(ort_type, name),
                                                  dims=_config_dims(dims, strip)))
                if strip and len(dims) == 1:
                    config.input[-1].reshape = pb.ModelTensorReshape(shape=[])
        if not config.output:
            for name, ort_type, dims in outs:
                config.output.append(pb.ModelOutput(name=name, data_type=_config_type(ort_type, name),
                                                    dims=_config_dims(dims, strip)))
                if strip and len(dims) == 1:
                    config.output[-1].reshape = pb.ModelTensorReshape(shape=[])

    def load(
        self, config: ModelConfig, version_path: Path, placement: InstancePlacement
    ) -> OnnxRuntimeInstance:
        ort = _ort()
        path = _model_file(config.default_model_filename, version_path)
        if not path.exists():
            raise ConfigError(f"model '{config.name}': unable to find '{path}'")
        parameters = {**spinning_default(config), **config.parameters}
        opts = _session_options(parameters, config.proto.optimization.graph.level, config.name)
        nice = pool_nice(parameters, config.name)
        providers: list[Any] = ["CPUExecutionProvider"]
        stream = None
        if placement.kind == "gpu":
            if _cuda_available():
                cuda_options: dict[str, Any] = {"device_id": placement.device_id}
                stream = _instance_stream(placement.device_id)  # created on this thread
                if stream is not None:
                    cuda_options["user_compute_stream"] = str(stream.ptr)
                else:
                    log.info("model '%s' instance %s: no CuPy here, ONNX Runtime uses a stream "
                             "of its own", config.name, placement.name)
                providers = [("CUDAExecutionProvider", cuda_options), "CPUExecutionProvider"]
            else:
                log.warning(
                    "model '%s' instance %s: onnxruntime has no CUDA provider here (install the "
                    "'gpu' extra for onnxruntime-gpu); running on the CPU",
                    config.name, placement.name,
                )
        try:
            session = _new_session(ort, path, opts, providers,
                                   0 if placement.kind == "gpu" else nice)
        except Exception as exc:
            raise ConfigError(f"model '{config.name}': onnx runtime failed to load '{path}': {exc}") from exc
        _check_io(config, session)
        on_gpu = "CUDAExecutionProvider" in session.get_providers()
        instance = OnnxRuntimeInstance(session, config.name, stream, on_gpu)
        shrinkage = config.parameters.get(ARENA_SHRINKAGE)
        if shrinkage is not None:  # a run option, per instance, as in Triton
            log.debug("Configuring %s to %s", ARENA_SHRINKAGE, shrinkage)
            try:
                instance.run_config_entry(ARENA_SHRINKAGE, shrinkage)
            except Exception as exc:  # onnxruntime's own error types
                raise ConfigError(f"model '{config.name}': run config entry {ARENA_SHRINKAGE}="
                                  f"{shrinkage!r}: {exc}") from exc
        return instance


def _instance_stream(device_id: int) -> Any:
    """A CUDA stream for one instance (CuPy), or None without CuPy."""
    try:
        import cupy
    except ImportError:
        return None
    with cupy.cuda.Device(device_id):
        return cupy.cuda.Stream(non_blocking=True)


def _config_type(ort_type: str, name: str) -> pb.DataType:
    dt = _ORT_TYPES.get(ort_type)
    if dt is None:
        raise ConfigError(f"tensor '{name}' has ONNX type {ort_type}, which is not supported")
    return pb.DataType(dt.config_value)


def _config_dims(dims: list[int], strip_batch: bool) -> list[int]:
    out = dims[1:] if strip_batch else dims
    return out or [1]


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def check_dims(model: str, tensor: str, model_shape: list[int], dims: list[int],
               max_batch_size: int, *, exact: bool, ragged: bool = False) -> str | None:
    """Why a config's ``dims`` (the reshape if there is one) contradict the model's shape, in
    Triton's ORT backend words, or None. ``exact``: outputs, where a variable model dimension
    must be variable in the config too; inputs may narrow it."""
    if ragged:
        if model_shape != [-1]:
            return (f"unable to load model '{model}', configuration expects model provides "
                    f"input with shape [-1]  for ragged input '{tensor}', model provides "
                    f"{_shape_text(model_shape)}")
        return None
    if not model_shape:  # a scalar: the config may only say 1s
        if any(d != 1 for d in dims):
            return (f"unable to load model '{model}', scalar tensor '{tensor}', should only "
                    "provide 1 in the model configuration when the model doesn't support "
                    f"batching. Model configuration provided: {_shape_text(dims)}.")
        return None
    expected = dims
    if max_batch_size > 0:
        if model_shape[0] != -1:
            return (f"model '{model}', tensor '{tensor}': for the model to support batching the "
                    "shape should have at least 1 dimension and the first dimension must be "
                    f"-1; but shape expected by the model is {_shape_text(model_shape)}")
        expected = [-1, *dims]
    same = len(model_shape) == len(expected) and all(
        m == d for m, d in zip(model_shape, expected, strict=True) if exact or m != -1)
    if same:
        return None
    head = (f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} "
            f"dimensions (shape {_shape_text(model_shape)}) but the model configuration "
            f"specifies {len(expected)} dimensions ")
    if max_batch_size > 0:
        return head + ("(an initial batch dimension because max_batch_size > 0 followed by the "
                       f"explicit tensor shape, making complete shape {_shape_text(expected)})")
    return head + f"(shape {_shape_text(expected)})"


def _check_io(config: ModelConfig, session: Any) -> None:
    """The config's inputs and outputs must exist in the model, with the model's datatype and
    a shape the model accepts: Triton's ORT backend (``ValidateInputs`` / ``ValidateOutputs``
    and ``CompareDimsSupported`` in onnxruntime_backend), its checks and words. An input's
    dims may be more specific than the model's variable ones; an output's must match exactly."""
    model_inputs = {i.name: i for i in session.get_inputs()}
    # initializers listed among the graph's inputs: a request may give one (the model then
    # computes with it) or leave it to the stored value; Triton's config marks them optional
    overridable = {i.name: i for i in session.get_overridable_initializers()}
    model_outputs = {o.name: o for o in session.get_outputs()}
    proto = config.proto
    ragged = {i.name for i in proto.input if i.allow_ragged_batch}
    batch_outputs = {name for b in proto.batch_output for name in b.target_name}
    extras = config.sequence.extra_inputs if config.sequence is not None else ()
    # the batch inputs the server makes count as inputs too: Triton's ORT backend counts one
    # per `batch_input` entry, and takes all their target names
    # as Triton counts: the config's optional inputs are left out (they may be initializers)
    expected = (sum(1 for spec in config.inputs if not spec.optional) + len(extras)
                + len(config.batch_inputs))
    extras = (*extras, *(t for b in config.batch_inputs for t in b.targets))
    if len(model_inputs) != expected:  # Triton's first check, before any name
        required = [n for n in model_inputs if n not in config.input_map and n not in extras]
        missing = f" (missing from config.pbtxt: {', '.join(required)})" if required else ""
        raise ConfigError(
            f"unable to load model '{config.name}', configuration expects {expected} inputs, "
            f"model provides {len(model_inputs)}{missing}")
    for what, specs, found in (("input", config.inputs, {**model_inputs, **overridable}),
                               ("output", config.outputs, model_outputs)):
        for spec in specs:
            arg = found.get(spec.name)
            if arg is None:
                allowed = ", ".join(sorted(found))
                raise ConfigError(
                    f"model '{config.name}': unexpected inference {what} '{spec.name}', allowed "
                    f"{what}s are: {allowed}"
                )
            dt = _ORT_TYPES.get(arg.type)
            if dt is not spec.datatype:
                provided = dt.value if dt is not None else "INVALID"
                raise ConfigError(
                    f"unable to load model '{config.name}', configuration expects datatype "
                    f"{spec.datatype.config_name} for {what} '{spec.name}', model provides "
                    f"TYPE_{provided}"
                )
            if what == "output" and spec.name in batch_outputs:
                continue  # a batch output's shape need not match the model
            dims = list(spec.reshape if spec.reshape is not None else spec.dims)
            model_shape = _dims(arg.shape)
            error = check_dims(config.name, spec.name, model_shape, dims,
                               config.max_batch_size, exact=what == "output",
                               ragged=spec.name in ragged)
            if error is not None:
                raise ConfigError(error)
    required = [n for n in model_inputs if n not in config.input_map and n not in extras]
    if required:
        raise ConfigError(
            f"unable to load model '{config.name}', configuration expects "
            f"{len(config.inputs)} inputs, model provides {len(model_inputs)} (missing from "
            f"config.pbtxt: {', '.join(required)})"
        )


FACTORY = OnnxRuntimeFactory()

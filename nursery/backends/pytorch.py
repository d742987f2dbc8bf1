"""PyTorch backend (``backend: "pytorch"`` / ``platform: "pytorch_libtorch"``).

One TorchScript module (``model.pt``, ``torch.jit.load``) per model instance, loaded on the
instance's own thread; ``model.pt2`` (a ``torch.export`` program, or an AOTInductor package)
is loaded the same way. Inputs reach ``forward`` as Triton's PyTorch backend passes them:

- every config input is a ``forward`` argument name: by that argument's position;
- else every name is ``<name>__<index>``: by the index;
- else in config order (with Triton's warning when a ``__`` suffix is not a number).

A single ``Dict[str, Tensor]`` argument gets every input by name. Outputs are matched by
``<name>__<index>`` into the returned tensor / tuple, else by config order. BYTES tensors are
``List[str]`` (one dimension, as in Triton).

An AOTInductor package (Triton's ``platform: "torch_aoti"``) is called with the flat leaves of
its call specification: inputs and outputs are named as Triton's torch_aoti models name them,
``ARGS`` / ``KWARGS`` / ``RESULT`` followed by each level's index or key in brackets
(``ARGS[2][option1]``, ``RESULT[BBB][0]``; ``RESULT`` alone for one tensor), else
``<name>__<index>`` gives the leaf.

``KIND_GPU`` instances run on their device, on a CUDA stream the instance creates on its own
thread at load and uses for every copy and every kernel; outputs come back through pinned
host memory and one stream synchronize. Without a usable CUDA build of torch the instance
runs on the CPU after one log line.

The ``parameters`` of Triton's PyTorch backend: ``DISABLE_OPTIMIZED_EXECUTION``,
``INFERENCE_MODE`` (default true, as in current Triton), ``DISABLE_CUDNN``,
``ENABLE_CACHE_CLEANING``, ``ENABLE_WEIGHT_SHARING``, ``ENABLE_JIT_EXECUTOR``,
``ENABLE_JIT_PROFILING``, ``ENABLE_TENSOR_FUSER``, ``INTRA_OP_THREAD_COUNT``,
``INTER_OP_THREAD_COUNT`` are applied; ``ENABLE_NVFUSER`` (gone from current torch) is
accepted and ignored with a log line.
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
import weakref
import zipfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nursery.backends.base import drop_bogus_module
from nursery.config.model import ModelConfig, TensorSpec
from nursery.errors import ConfigError, InternalError, InvalidArgument
from nursery.runtime.devices import InstancePlacement
from nursery.schema import inference as pb
from nursery.types import DataType

log = logging.getLogger("nursery.backends.pytorch")

_INDEX_NAME = re.compile(r"^.*?__(\d*)$")

_KNOWN_PARAMETERS = {
    "DISABLE_OPTIMIZED_EXECUTION", "INFERENCE_MODE", "DISABLE_CUDNN", "ENABLE_CACHE_CLEANING",
    "ENABLE_WEIGHT_SHARING", "ENABLE_JIT_EXECUTOR", "ENABLE_JIT_PROFILING",
    "ENABLE_TENSOR_FUSER", "ENABLE_NVFUSER", "INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT",
}


_TORCH_IMPORT = threading.Lock()
_torch_module: Any = None


def _torch() -> Any:
    """torch, imported once, by one thread (instances load on threads of their own), after
    the bogus module '' is gone from sys.modules (base.drop_bogus_module)."""
    global _torch_module
    drop_bogus_module()  # torch's lazy imports walk sys.modules
    if _torch_module is None:
        with _TORCH_IMPORT:
            if _torch_module is None:
                import torch

                _torch_module = torch
    return _torch_module


def _torch_dtype(dt: DataType) -> Any:
    torch = _torch()
    return {
        DataType.BOOL: torch.bool, DataType.UINT8: torch.uint8, DataType.INT8: torch.int8,
        DataType.INT16: torch.int16, DataType.INT32: torch.int32, DataType.INT64: torch.int64,
        DataType.FP16: torch.float16, DataType.FP32: torch.float32, DataType.FP64: torch.float64,
        DataType.BF16: torch.bfloat16,
        # UINT16/32/64: torch's unsigned types beyond uint8 have few operators, and Triton's
        # PyTorch backend refuses them ("unsupported datatype TYPE_UINT32 for input ...")
    }.get(dt)


def _config_type_name(dtype: Any) -> str:
    """Triton's name for a torch dtype, as its error messages print it."""
    for dt in DataType:
        if dt is not DataType.BYTES and _torch_dtype(dt) == dtype:
            return f"TYPE_{dt.value}"
    return str(dtype)


# -- parameters ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TorchOptions:
    optimized_execution: bool = True
    inference_mode: bool = True
    cudnn: bool = True
    cache_cleaning: bool = False
    weight_sharing: bool = False
    jit_executor: bool | None = None  # None: leave torch's default alone
    jit_profiling: bool | None = None
    tensor_fuser: bool | None = None


def _bool(parameters: Mapping[str, str], key: str, model: str) -> bool | None:
    if key not in parameters:
        return None
    value = parameters[key].strip().lower()
    if value in ("true", "1", "on", "yes"):
        return True
    if value in ("false", "0", "off", "no"):
        return False
    raise ConfigError(f"model '{model}': failed to convert {key} '{parameters[key]}' to boolean")


def _int(parameters: Mapping[str, str], key: str, model: str) -> int | None:
    if key not in parameters:
        return None
    try:
        return int(parameters[key])
    except ValueError:
        raise ConfigError(
            f"model '{model}': parameter '{key}' must be an integer, got '{parameters[key]}'"
        ) from None


_THREADS_SET: dict[str, int] = {}
_THREADS_LOCK = threading.Lock()


def parse_options(parameters: Mapping[str, str], model: str) -> TorchOptions:
    """Triton's PyTorch ``parameters`` as options (pure; thread counts are applied by load)."""
    for key in parameters:
        if key not in _KNOWN_PARAMETERS:
            log.info("model '%s': parameter '%s' is not used by the PyTorch backend", model, key)
    if _bool(parameters, "ENABLE_NVFUSER", model) is not None:
        log.info("model '%s': ENABLE_NVFUSER is accepted and ignored (NvFuser is not part of "
                 "this torch; the default fuser is used)", model)
    disable_opt = _bool(parameters, "DISABLE_OPTIMIZED_EXECUTION", model)
    inference = _bool(parameters, "INFERENCE_MODE", model)
    disable_cudnn = _bool(parameters, "DISABLE_CUDNN", model)
    return TorchOptions(
        optimized_execution=not disable_opt if disable_opt is not None else True,
        inference_mode=inference if inference is not None else True,
        cudnn=not disable_cudnn if disable_cudnn is not None else True,
        cache_cleaning=bool(_bool(parameters, "ENABLE_CACHE_CLEANING", model)),
        weight_sharing=bool(_bool(parameters, "ENABLE_WEIGHT_SHARING", model)),
        jit_executor=_bool(parameters, "ENABLE_JIT_EXECUTOR", model),
        jit_profiling=_bool(parameters, "ENABLE_JIT_PROFILING", model),
        tensor_fuser=_bool(parameters, "ENABLE_TENSOR_FUSER", model),
    )


def _apply_thread_counts(parameters: Mapping[str, str], model: str) -> None:
    """INTRA/INTER_OP_THREAD_COUNT are process-wide in torch: the first model to set one wins,
    as in Triton (which sets them once)."""
    torch = _torch()
    for key, setter in (("INTRA_OP_THREAD_COUNT", torch.set_num_threads),
                        ("INTER_OP_THREAD_COUNT", torch.set_num_interop_threads)):
        n = _int(parameters, key, model)
        if n is None or n <= 0:
            continue
        with _THREADS_LOCK:
            if key in _THREADS_SET:
                if _THREADS_SET[key] != n:
                    log.warning("model '%s': %s=%d ignored; torch already uses %d for this "
                                "process", model, key, n, _THREADS_SET[key])
                continue
            try:
                setter(n)
            except RuntimeError as exc:  # interop threads: only before the first parallel op
                log.warning("model '%s': %s=%d could not be applied: %s", model, key, n, exc)
                continue
            _THREADS_SET[key] = n
        log.info("model '%s': %s is set to %d", model, key, n)


# -- naming conventions --------------------------------------------------------------------


def _index_of(name: str) -> int | None:
    """``<name>__<index>`` -> index; None when the name does not follow the convention."""
    pos = name.find("__")
    if pos == -1:
        return None
    suffix = name[pos + 2:]
    return int(suffix) if suffix.isdigit() else None


def input_positions(names: Sequence[str], forward_args: Sequence[str], model: str) -> list[int]:
    """The ``forward`` position of each config input (Triton's three conventions)."""
    if forward_args and all(n in forward_args for n in names):
        return [forward_args.index(n) for n in names]
    return _indexed_positions(
        names, model,
        "input '%s' or previous input(s) are neither an input argument to the model '%s' "
        "nor do they follow the <name>__<index> naming convention. Falling back to "
        "enforcing strict ordering from model configuration.")


def _extra_position(name: str, forward_args: Sequence[str]) -> int:
    """The ``forward`` position of a sequence control or state input: its argument's, else
    its ``<name>__<index>`` (Triton's LibTorch backend requires one of the two)."""
    if name in forward_args:
        return list(forward_args).index(name)
    index = _index_of(name)
    if index is None:
        raise ConfigError(f"input '{name}' does not follow <name>__<index> naming convention.")
    return index


def _aoti_position(name: str, leaves: Mapping[str, int], what: str, model: str) -> int:
    """An input's or output's leaf in an AOTInductor package: by its call-specification name,
    else by ``<name>__<index>``."""
    if name in leaves:
        return leaves[name]
    index = _index_of(name)
    if index is None or index >= len(leaves):
        raise ConfigError(
            f"{what} '{name}' of model '{model}' is not one the AOTInductor package has "
            f"({_leaf_names(leaves)}) and does not follow the <name>__<index> naming "
            "convention.")
    return index


def _leaf_names(leaves: Mapping[str, int]) -> str:
    return ", ".join(sorted(leaves, key=lambda n: leaves[n]))


def output_positions(names: Sequence[str], model: str) -> list[int]:
    return _indexed_positions(
        names, model,
        "output '%s' or previous output(s) of the model '%s' do not follow the "
        "<name>__<index> naming convention. Falling back to enforcing strict ordering "
        "from model configuration.")


def _indexed_positions(names: Sequence[str], model: str, warning: str) -> list[int]:
    """The ``<name>__<index>`` positions when every name has one; else config order, with
    Triton's ``warning`` (name, model) when some names looked like they meant to."""
    indices = [_index_of(n) for n in names]
    if all(i is not None for i in indices):
        return [int(i) for i in indices]  # type: ignore[arg-type]
    if any("__" in n for n in names):
        bad = next(n for n, i in zip(names, indices, strict=True) if i is None)
        log.warning(warning, bad, model)
    return list(range(len(names)))


# -- loading --------------------------------------------------------------------------------


def _model_file(config: ModelConfig, version_path: Path) -> Path:
    name = config.default_model_filename or "model.pt"
    path = version_path / name
    if name == "model.pt" and not path.exists() and (version_path / "model.pt2").exists():
        return version_path / "model.pt2"  # an exported program under the default name
    return path


def _is_aoti_package(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return any("aotinductor" in n for n in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


_SHARED: weakref.WeakValueDictionary[tuple[Any, ...], Any] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


@dataclass(slots=True, weakref_slot=True)
class _Loaded:
    module: Any  # a callable: ScriptModule or the exported program's module
    arg_names: list[str]
    arg_kinds: list[str]  # "TensorType", "ListType", "DictType", ...
    # an AOTInductor package: its call specification's leaves by Triton's torch_aoti names
    # ("ARGS[0]", "ARGS[2][option1]", "KWARGS[x]"; "RESULT", "RESULT[AAA]", "RESULT[BBB][0]")
    aoti_inputs: dict[str, int] | None = None
    aoti_outputs: dict[str, int] | None = None


def _path_name(prefix: str, path: Sequence[Any]) -> str:
    parts = []
    for key in path:
        for attr in ("idx", "key", "name"):  # pytree's SequenceKey, MappingKey, GetAttrKey
            if hasattr(key, attr):
                parts.append(f"[{getattr(key, attr)}]")
                break
    return prefix + "".join(parts)


def aoti_names(runner: Any) -> tuple[dict[str, int], dict[str, int]]:
    """The leaves of an AOTInductor package's call specification by the names Triton's
    torch_aoti models use: ``ARGS`` / ``KWARGS`` then each level's index or key in brackets
    for the inputs, ``RESULT`` likewise for the outputs (``RESULT`` alone for one tensor)."""
    pytree = _torch().utils._pytree
    in_text, out_text = runner.loader.get_call_spec()
    in_spec, out_spec = pytree.treespec_loads(in_text), pytree.treespec_loads(out_text)
    inputs = {}
    structure = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
    for path, leaf in pytree.tree_flatten_with_path(structure)[0]:
        first = path[0] if path else None
        prefix = "KWARGS" if getattr(first, "idx", 0) == 1 else "ARGS"
        inputs[_path_name(prefix, path[1:])] = leaf
    outputs = {}
    result = pytree.tree_unflatten(list(range(out_spec.num_leaves)), out_spec)
    for path, leaf in pytree.tree_flatten_with_path(result)[0]:
        outputs[_path_name("RESULT", path)] = leaf
    return inputs, outputs


def _load_module(path: Path, device: Any, options: TorchOptions, model: str) -> _Loaded:
    torch = _torch()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.* is "deprecated"
            if path.suffix == ".pt2":
                if _is_aoti_package(path):
                    runner = torch._inductor.aoti_load_package(
                        str(path), device_index=device.index if device.type == "cuda" else -1)
                    named_in, named_out = aoti_names(runner)
                    return _Loaded(runner, [], [], named_in, named_out)
                program = torch.export.load(str(path))
                module = program.module()
                if device.type != "cpu":
                    module = module.to(device)
                user = [s.arg.name for s in program.graph_signature.input_specs
                        if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
                return _Loaded(module, user, ["TensorType"] * len(user))
            with torch.inference_mode(options.inference_mode):
                module = torch.jit.load(str(path), map_location=device)
            module.eval()
    except Exception as exc:
        raise ConfigError(f"failed to load model '{model}': {exc}") from exc
    arguments = list(module.forward.schema.arguments)
    if arguments and arguments[0].type.kind() == "ClassType":
        arguments = arguments[1:]
    return _Loaded(module, [a.name for a in arguments], [a.type.kind() for a in arguments])


def _cuda_usable(device_id: int) -> bool:
    try:
        torch = _torch()
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > device_id
    except Exception:
        return False


class PyTorchInstance:
    """One loaded module; every method runs on the owning instance worker's thread."""

    def __init__(self, config: ModelConfig, loaded: _Loaded, device: Any,
                 options: TorchOptions) -> None:
        torch = _torch()
        self._torch = torch
        self._model = config.name
        self._loaded = loaded  # keeps a shared (ENABLE_WEIGHT_SHARING) module alive
        self._module = loaded.module
        self._device = device
        self._options = options
        self._gpu = device.type == "cuda"
        # the instance's own stream, created here: on the instance thread, on its device
        self._stream = torch.cuda.Stream(device=device) if self._gpu else None
        names = [s.name for s in config.inputs]
        # the sequence batcher's control and implicit-state inputs are the model's inputs too
        seq = config.sequence
        extra_types = dict(seq.extra_input_types) if seq is not None else {}
        # and so are the batch inputs the server makes for each batch (`batch_input`)
        for batch_input in config.batch_inputs:
            for target in batch_input.targets:
                extra_types.setdefault(target, batch_input.datatype)
        extras = [n for n in extra_types if n not in names]
        self._dict_input = loaded.arg_kinds == ["DictType"]
        self._aoti = loaded.aoti_inputs is not None
        if loaded.aoti_inputs is not None:
            # an AOTInductor package: its call specification's names (Triton's torch_aoti
            # naming), else <name>__<index> as the leaf's index; every leaf given once
            self._in_pos = {n: _aoti_position(n, loaded.aoti_inputs, "input", config.name)
                            for n in names + extras}
            if sorted(self._in_pos.values()) != list(range(len(loaded.aoti_inputs))):
                raise ConfigError(
                    f"unable to load model '{config.name}', configuration expects inputs "
                    f"{', '.join(names + extras)}, the AOTInductor package takes "
                    f"{_leaf_names(loaded.aoti_inputs)}")
        elif not self._dict_input:
            for name, kind in zip(loaded.arg_names, loaded.arg_kinds, strict=True):
                if kind == "DictType":
                    raise ConfigError(
                        f"model '{config.name}': Multiple inputs of kind DictType were detected. "
                        "Only a single input of type Dict(str, Tensor) is supported.")
                if kind not in ("TensorType", "ListType"):
                    raise ConfigError(
                        f"model '{config.name}': An input of type '{kind}' was detected in the "
                        f"model (argument '{name}'). Only a single input of type Dict(str, Tensor) "
                        "or input(s) of type Tensor are supported.")
            expected = len(names) + len(extras)
            if loaded.arg_names and len(loaded.arg_names) != expected:
                raise ConfigError(
                    f"unable to load model '{config.name}', configuration expects {expected} "
                    f"inputs, model provides {len(loaded.arg_names)}")
            positions = input_positions(names, loaded.arg_names, config.name)
            positions += [_extra_position(n, loaded.arg_names) for n in extras]
            if sorted(positions) != list(range(expected)):
                raise ConfigError(
                    f"model '{config.name}': input indices {positions} (from the "
                    "<name>__<index> names) must be 0.." + str(expected - 1) + ", each once")
            self._in_pos = dict(zip(names + extras, positions, strict=True))
        else:
            self._in_pos = {n: i for i, n in enumerate(names + extras)}
        self._n_args = len(names) + len(extras)
        out_names = [s.name for s in config.outputs]
        if loaded.aoti_outputs is not None:
            self._out_pos = {n: _aoti_position(n, loaded.aoti_outputs, "output", config.name)
                             for n in out_names}
        else:
            self._out_pos = dict(zip(out_names, output_positions(out_names, config.name),
                                     strict=True))
        self._specs: dict[str, TensorSpec] = {s.name: s for s in (*config.inputs, *config.outputs)}
        for name in extras:
            self._specs[name] = TensorSpec(name, extra_types[name], ())
        for state in seq.states if seq is not None else ():
            # Triton enforces <name>__<index> for these (an AOTInductor package: its names)
            index = (_aoti_position(state.output_name, loaded.aoti_outputs, "output state",
                                    config.name)
                     if loaded.aoti_outputs is not None else _index_of(state.output_name))
            if index is None:
                raise ConfigError(f"output state '{state.output_name}' does not follow "
                                  "<name>__<index> naming convention.")
            self._out_pos[state.output_name] = index
            self._specs[state.output_name] = TensorSpec(state.output_name, state.datatype,
                                                        state.dims)
        for spec in (*config.inputs, *config.outputs):
            if spec.datatype is DataType.BYTES:
                batch = 1 if config.max_batch_size > 0 else 0
                if len(spec.reshape if spec.reshape is not None else spec.dims) + batch > 1:
                    raise ConfigError(
                        f"Triton only supports 1 dimensional List of String as input/output for "
                        f"'{spec.name}' for model '{config.name}'")
            elif _torch_dtype(spec.datatype) is None:
                what = "input" if spec in config.inputs else "output"
                raise ConfigError(f"unsupported datatype TYPE_{spec.datatype.value} for {what} "
                                  f"'{spec.name}' for model '{config.name}'")
        for name, datatype in extra_types.items():  # the server's control and batch inputs
            if datatype is not DataType.BYTES and _torch_dtype(datatype) is None:
                raise ConfigError(f"input '{name}' type 'TYPE_{datatype.value}' is not "
                                  "supported by PyTorch.")

    # -- inputs ---------------------------------------------------------------------------

    def _to_torch(self, name: str, array: np.ndarray) -> Any:
        torch = self._torch
        spec = self._specs[name]
        if spec.datatype is DataType.BYTES:
            return [x.decode("utf-8", "surrogateescape") if isinstance(x, bytes | bytearray)
                    else str(x) for x in array.reshape(-1)]
        if spec.datatype is DataType.BF16:
            tensor = torch.from_dlpack(np.ascontiguousarray(array).view(np.int16))
            tensor = tensor.view(torch.bfloat16)
        elif array.dtype.kind == "u" and array.dtype.itemsize > 1:
            # dlpack of unsigned wide ints is not everywhere; torch.from_numpy handles them
            tensor = torch.from_numpy(np.array(array, copy=not array.flags.writeable))
        else:
            # from_dlpack: zero copy, and unlike from_numpy fine with read-only request bytes
            tensor = torch.from_dlpack(np.ascontiguousarray(array))
        if self._gpu:
            tensor = tensor.to(self._device, non_blocking=True)
        return tensor

    # -- outputs --------------------------------------------------------------------------

    def _to_numpy(self, name: str, value: Any) -> np.ndarray:
        torch = self._torch
        spec = self._specs[name]
        if isinstance(value, list):
            if spec.datatype is not DataType.BYTES:
                raise InvalidArgument(f"output '{name}' must be of type Tensor or List[str].")
            out = np.empty(len(value), dtype=object)
            out[:] = [s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)
                      for s in value]
            return out
        if not isinstance(value, torch.Tensor):
            raise InvalidArgument(f"output '{name}' must be of type Tensor or List[str].")
        if value.dim() == 0:
            raise InvalidArgument(f"output '{name}' is a scalar which is not supported.")
        expected = _torch_dtype(spec.datatype)
        if value.dtype != expected:
            raise InvalidArgument(
                f"configuration expects datatype TYPE_{spec.datatype.value} for output '{name}', "
                f"model provides {_config_type_name(value.dtype)}")
        value = value.detach()
        if value.device.type != "cpu":
            host = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=True)
            host.copy_(value, non_blocking=True)
            value = host  # valid once the stream is synchronized (execute does it)
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view(np.uint16)
        return value.numpy()  # shares the tensor's memory: no copy

    # -- execution ------------------------------------------------------------------------

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        torch = self._torch
        opts = self._options
        with ExitStack() as stack:
            if self._stream is not None:
                stack.enter_context(torch.cuda.stream(self._stream))
            stack.enter_context(torch.jit.optimized_execution(opts.optimized_execution))
            stack.enter_context(torch.inference_mode(opts.inference_mode))
            stack.enter_context(torch.no_grad())
            if self._gpu:
                torch.backends.cudnn.enabled = opts.cudnn
            if opts.jit_profiling is not None:
                torch._C._jit_set_profiling_mode(opts.jit_profiling)
            if opts.jit_executor is not None:
                torch._C._jit_set_profiling_executor(opts.jit_executor)
            if opts.tensor_fuser is not None:
                torch._C._jit_set_texpr_fuser_enabled(opts.tensor_fuser)
            if self._dict_input:
                args: list[Any] = [{n: self._to_torch(n, a) for n, a in inputs.items()}]
            else:
                args = [None] * self._n_args
                for name, array in inputs.items():
                    args[self._in_pos[name]] = self._to_torch(name, array)
                if any(a is None for a in args):
                    missing = [n for n, p in self._in_pos.items() if args[p] is None]
                    raise InvalidArgument(
                        f"model '{self._model}': the PyTorch backend needs every input; "
                        f"missing {', '.join(missing)}")
            try:
                if self._aoti:  # the call specification's leaves in, its leaves out
                    outputs = list(self._module.loader.boxed_run(args))
                else:
                    outputs = _flatten_outputs(self._module(*args))
            except InternalError:
                raise
            except Exception as exc:  # TorchScript raises its own error types
                raise InternalError(f"PyTorch execute failure: {exc}") from exc
            count = len(outputs)
            arrays = {}
            for name in output_names:
                pos = self._out_pos[name]
                if pos >= count:
                    raise InvalidArgument(
                        f"The output {name} in the model configuration refers to an output "
                        f"index which doesn't exist. This model has {count} outputs")
                arrays[name] = self._to_numpy(name, outputs[pos])
            if self._stream is not None:
                self._stream.synchronize()  # the pinned host copies are complete after this
                if opts.cache_cleaning:
                    torch.cuda.empty_cache()
        return arrays

    def close(self) -> None:
        del self._module, self._loaded
        if self._gpu and self._options.cache_cleaning:
            self._torch.cuda.empty_cache()


def _flatten_outputs(result: Any) -> list[Any]:
    torch = _torch()
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, tuple):
        return list(result)
    if isinstance(result, list):
        if all(isinstance(x, str) for x in result):
            return [result]
        return list(result)  # exported programs return a list of tensors
    raise InternalError(
        "PyTorch execute failure: output must be of type Tensor, List[str] or Tuple containing "
        "one of these two types. It should not be a List / Dictionary of Tensors or a Scalar")


def _log_options(options: TorchOptions, parameters: Mapping[str, str], model: str) -> None:
    """Triton's PyTorch backend's lines for a model's parameters, once per model version it
    loads (its ModelState), when the configuration has ``parameters``; tools grep for them."""
    for what, enabled in (("Optimized execution", options.optimized_execution),
                          ("Cache Cleaning", options.cache_cleaning),
                          ("Inference Mode", options.inference_mode),
                          ("cuDNN", options.cudnn)):
        log.info("%s is %s for model instance '%s'", what,
                 "enabled" if enabled else "disabled", model)
    for what, key, on in (("Tensor fuser", "ENABLE_TENSOR_FUSER", options.tensor_fuser),
                          ("Weight sharing", "ENABLE_WEIGHT_SHARING", options.weight_sharing)):
        if key in parameters:
            log.info("%s is %s for model instance '%s'", what,
                     "enabled" if on else "disabled", model)


class PyTorchFactory:
    name = "pytorch"
    platform = "pytorch_libtorch"
    default_filename = "model.pt"

    def __init__(self) -> None:
        # the configuration each model version was last loaded with (its options are logged
        # once per version load, not once per instance; a weak reference, as an id could be
        # reused by the next load's configuration)
        self._logged: dict[tuple[str, str], weakref.ref[ModelConfig]] = {}
        self._logged_lock = threading.Lock()

    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None:
        if not (config.input and config.output):
            log.warning("skipping model configuration auto-complete for '%s': not supported for "
                        "pytorch backend", config.name)

    def load(
        self, config: ModelConfig, version_path: Path, placement: InstancePlacement
    ) -> PyTorchInstance:
        try:
            torch = _torch()
        except ImportError as exc:
            raise ConfigError(
                f"model '{config.name}': the PyTorch backend needs the 'torch' package "
                f"(pip install torch): {exc}") from None
        if not config.outputs:  # the PyTorch backend's rule; the core has none
            raise ConfigError(f"model '{config.name}': model configuration must contain at "
                              "least one output, none were specified")
        path = _model_file(config, version_path)
        if not path.exists():
            raise ConfigError(
                f"unable to find '{path}' for model instance '{placement.name}'")
        options = parse_options(config.parameters, config.name)
        if config.parameters:
            version = (config.name, str(version_path))
            with self._logged_lock:
                last = self._logged.get(version)
                first = last is None or last() is not config
                self._logged[version] = weakref.ref(config)
            if first:
                _log_options(options, config.parameters, config.name)
        _apply_thread_counts(config.parameters, config.name)
        device = torch.device("cpu")
        if placement.kind == "gpu":
            if _cuda_usable(placement.device_id):
                device = torch.device("cuda", placement.device_id)
                torch.cuda.set_device(device)  # this thread's current device, for good
            else:
                log.warning(
                    "model '%s' instance %s: this torch build has no usable CUDA device %d; "
                    "running on the CPU", config.name, placement.name, placement.device_id)
        if options.weight_sharing:
            st = path.stat()
            key = (str(path), st.st_mtime_ns, st.st_size, str(device))
            with _SHARED_LOCK:
                loaded = _SHARED.get(key)
                if loaded is None:
                    loaded = _load_module(path, device, options, config.name)
                    _SHARED[key] = loaded
                else:
                    log.info("Reusing TorchScript model for instance '%s'", placement.name)
        else:
            loaded = _load_module(path, device, options, config.name)
        return PyTorchInstance(config, loaded, device, options)


FACTORY = PyTorchFactory()

"""A model's configuration: read ``config.pbtxt`` once, complete it, validate it, freeze it.

``read_model_config`` turns a model folder into a frozen :class:`ModelConfig`:

1. parse ``config.pbtxt`` (protobuf text format) into the typed ``pb.ModelConfig``;
2. fill ``name``, ``platform`` and ``backend`` as Triton does (the backend from the model
   file when the config names none);
3. let the backend auto-complete what the model file knows (inputs, outputs,
   ``max_batch_size``), unless auto-complete is disabled;
4. normalize: default version policy, instance groups, preferred batch sizes, pinned memory;
5. validate, with errors that name the model, the file and the field.

Whatever goes wrong on the way fails that model only: an unexpected exception (a bug here, or
in a library, on a configuration nobody foresaw) becomes a :class:`ConfigError` naming the
model, ``config.pbtxt`` and the field being read (:func:`config_boundary`), so it can never
stop the start-up or the server.

Nothing downstream reads the text or the message's raw fields again: actors get the frozen
:class:`ModelConfig`, whose ``proto`` is kept (read-only) for the ``/config`` answers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import betterproto

from nursery.config import pbtext
from nursery.config.json_form import config_to_json
from nursery.config.platforms import (
    AOTI_FILENAME,
    BACKEND_TO_PLATFORM,
    DEFAULT_FILENAMES,
    PLATFORM_FILENAMES,
    PLATFORM_TO_BACKEND,
    SUFFIX_TO_BACKEND,
    detect_backend,
    tensorflow_platform,
)
from nursery.config.sequence import SequenceConfig, sequence_config
from nursery.config.validate import validate_model_config, validate_model_io
from nursery.config.versions import available_versions, select_versions
from nursery.errors import ConfigError, InvalidArgument, NoVersionError, NurseryError
from nursery.observability.logs import LIBPROTOBUF
from nursery.runtime.devices import InstancePlacement, gpu_count
from nursery.scheduling.batch_policy import BatchConfig, QueuePolicy
from nursery.scheduling.ensemble_plan import EnsemblePlan, EnsembleStep
from nursery.scheduling.latency_objective import BATCHER_KEY, Objective, objective_from_parameters
from nursery.schema import inference as pb
from nursery.types import DataType

log = logging.getLogger("nursery.config")

CONFIG_FILENAME = "config.pbtxt"
# the metric families whose histogram buckets model_metrics may set
CUSTOMIZABLE_METRICS = frozenset({"nv_inference_first_response_histogram_ms"})
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: DataType
    dims: tuple[int, ...]  # without the batch dimension; -1 = variable
    optional: bool = False
    is_shape_tensor: bool = False
    reshape: tuple[int, ...] | None = None
    label_filename: str = ""
    ragged: bool = False  # an input with allow_ragged_batch

    def full_shape(self, max_batch_size: int) -> list[int]:
        """The shape as metadata reports it: ``-1`` prepended when the model batches."""
        return [-1, *self.dims] if max_batch_size > 0 else list(self.dims)


@dataclass(frozen=True, slots=True)
class BatchInputSpec:
    """A ``batch_input``: a tensor the server makes for each batch from the requests' shapes
    (Triton's BackendInputCollector), given to the model as input ``targets``."""
    kind: str  # BATCH_ELEMENT_COUNT, BATCH_ACCUMULATED_ELEMENT_COUNT, ...
    targets: tuple[str, ...]
    datatype: DataType  # FP32 or INT32 (Triton writes int32 for any other)
    source: str  # the input whose shapes it describes


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    name: str
    kind: str  # "cpu", "gpu" or "model"
    count: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class ModelConfig:
    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    instance_groups: tuple[InstanceGroup, ...]
    scheduler: str  # "default", "dynamic", "sequence" or "ensemble"
    decoupled: bool
    default_model_filename: str
    parameters: Mapping[str, str]
    path: Path
    proto: pb.ModelConfig = field(repr=False, compare=False)
    batching: BatchConfig | None = None  # the dynamic batcher's settings, when configured
    sequence: SequenceConfig | None = None  # the sequence batcher's settings, when configured
    ensemble: EnsemblePlan | None = None  # an ensemble's validated step graph
    # nursery's latency-objective batcher, selected by the parameter nursery.batcher
    objective: Objective | None = None
    input_map: Mapping[str, TensorSpec] = field(init=False, repr=False, compare=False)
    output_map: Mapping[str, TensorSpec] = field(init=False, repr=False, compare=False)
    json: Mapping[str, Any] = field(init=False, repr=False, compare=False)
    shape_checked_inputs: tuple[str, ...] = field(init=False, repr=False, compare=False)
    has_optional_inputs: bool = field(init=False, repr=False, compare=False)
    # batch_output BATCH_SCATTER_WITH_INPUT_SHAPE: output name -> its source input
    batch_scatter: Mapping[str, str] = field(init=False, repr=False, compare=False)
    batch_inputs: tuple[BatchInputSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # inputs whose shapes must agree for requests to share a batch (Triton's
        # enforce_equal_shape_tensors: variable dims, no ragged batching; shape tensors)
        object.__setattr__(self, "shape_checked_inputs", tuple(
            t.name for t in self.inputs
            if t.is_shape_tensor or (-1 in t.dims and not t.ragged)))
        object.__setattr__(self, "batch_scatter", MappingProxyType({
            target: out.source_input[0] for out in self.proto.batch_output
            if out.kind == pb.BatchOutputKind.BATCH_SCATTER_WITH_INPUT_SHAPE
            and out.source_input for target in out.target_name}))
        object.__setattr__(self, "batch_inputs", tuple(_batch_inputs(self.proto)))
        object.__setattr__(self, "has_optional_inputs", any(t.optional for t in self.inputs))
        object.__setattr__(self, "input_map", MappingProxyType({t.name: t for t in self.inputs}))
        object.__setattr__(self, "output_map", MappingProxyType({t.name: t for t in self.outputs}))
        object.__setattr__(self, "json", config_to_json(self.proto))

    @functools.cached_property
    def reshaped_inputs(self) -> Mapping[str, TensorSpec]:
        """The inputs that have a `reshape`, by name."""
        return MappingProxyType({t.name: t for t in self.inputs if t.reshape is not None})

    @functools.cached_property
    def reshaped_outputs(self) -> Mapping[str, TensorSpec]:
        """The outputs that have a `reshape`, by name."""
        return MappingProxyType({t.name: t for t in self.outputs if t.reshape is not None})

    @functools.cached_property
    def uses_response_cache(self) -> bool:
        """``response_cache { enable: true }`` on a model the cache may serve (never decoupled
        or sequence models, as in Triton)."""
        return bool(self.proto.response_cache.enable) and not self.decoupled and (
            self.scheduler != "sequence")

    @functools.cached_property
    def first_response_buckets(self) -> tuple[float, ...]:
        """Bounds (ms) of ``nv_inference_first_response_histogram_ms``: Triton's defaults, or
        ``model_metrics { metric_control { histogram_options { buckets } } }``."""
        for control in self.proto.model_metrics.metric_control:
            if control.metric_identifier.family == "nv_inference_first_response_histogram_ms":
                return tuple(sorted(control.histogram_options.buckets))
        return (100.0, 500.0, 2000.0, 5000.0)

    @property
    def platform_name(self) -> str:
        """What model metadata reports as ``platform``: the platform, else the backend."""
        return self.platform or self.backend

    def model_filename(self) -> str:
        return self.default_model_filename or DEFAULT_FILENAMES.get(self.backend, "")

    def instance_signatures(self) -> list[bytes]:
        """One per placement, in the same order: what an instance must keep for a reload to
        keep it (Triton's instance signature: its group's settings but for the name and the
        count, and its device), so a renamed or regrouped instance stays."""
        out: list[bytes] = []
        for group in self.proto.instance_group:
            settings = pb.ModelInstanceGroup().parse(bytes(group))
            settings.name = ""
            settings.count = 1
            key = bytes(settings)
            devices = group.gpus if group.kind == pb.ModelInstanceGroupKind.KIND_GPU else [0]
            for device in devices:
                out += [key + b"@" + str(device).encode()] * max(group.count, 0)
        return out

    def same_but_instances(self, other: ModelConfig) -> bool:
        """Whether ``other`` differs from this configuration at most in its instance groups
        and version policy: Triton then updates the serving version's instances in place
        instead of loading it anew (ConfigChangeRequiresReload)."""
        mine, theirs = (pb.ModelConfig().parse(bytes(c.proto)) for c in (self, other))
        for proto in (mine, theirs):
            proto.instance_group = []
            proto.version_policy = pb.ModelVersionPolicy()
        return mine.to_dict() == theirs.to_dict()

    def placements(self) -> list[InstancePlacement]:
        """One placement per model instance, in group order.

        A KIND_GPU group on a machine without a usable GPU runs on the CPU instead (logged
        once per model): nursery must serve wherever it is started.
        """
        out: list[InstancePlacement] = []
        gpus_here = gpu_count()
        warned = False
        for group in self.instance_groups:
            devices: tuple[int, ...] = group.gpus if group.kind == "gpu" else (0,)
            for device in devices:
                for _ in range(group.count):
                    kind = "cpu" if group.kind != "gpu" else "gpu"
                    if kind == "gpu" and device >= gpus_here:
                        if not warned:
                            log.warning(
                                "model '%s': instance group '%s' asks for GPU %d but %s; "
                                "running it on the CPU", self.name, group.name, device,
                                "no GPU is available" if gpus_here == 0
                                else f"only {gpus_here} GPU(s) are present",
                            )
                            warned = True
                        kind, device = "cpu", 0
                    out.append(InstancePlacement(group.name, len(out), kind, device))
        return out


class AutoCompleter(Protocol):
    def auto_complete(self, config: pb.ModelConfig, version_path: Path) -> None: ...


BackendLookup = Callable[[str, str], AutoCompleter]  # (backend name, model name) -> its factory


# -- reading ------------------------------------------------------------------------------


@contextmanager
def config_boundary(model_name: str, field: str = "",
                    filename: str = CONFIG_FILENAME) -> Iterator[None]:
    """Turn an unexpected exception raised while reading or validating a configuration into a
    :class:`ConfigError` that names the model, the file and (when given) the field; a
    :class:`NurseryError` passes through as it is. Boundaries nest: the innermost one, which
    knows the field, speaks."""
    try:
        yield
    except NurseryError:
        raise
    except Exception as exc:  # the boundary: this model fails, never the server
        try:
            text = str(exc).replace("\n", " ")
        except Exception:  # a broken __str__ must not break the boundary
            text = ""
        detail = f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
        place = f"{filename}: '{field}'" if field else filename
        log.debug("model '%s': unexpected error reading %s", model_name, place, exc_info=True)
        raise ConfigError(f"model '{model_name}': {place} could not be read: {detail}") from exc


def parse_config_text(text: str, model_name: str, filename: str = CONFIG_FILENAME) -> pb.ModelConfig:
    with config_boundary(model_name, filename=filename):
        try:
            return pbtext.parse(text, pb.ModelConfig())
        except pbtext.TextFormatError as exc:
            # under Triton libprotobuf logs the parse error itself, unescaped, before
            # Triton's own message (L0_simple_ensemble greps the log for that line)
            log.error("Error parsing text-format inference.ModelConfig: %s", exc,
                      extra={LIBPROTOBUF: True})
            raise ConfigError(f"model '{model_name}': {filename}:{exc}") from None


def config_file(model_path: Path, config_name: str = "") -> str:
    """The model's configuration file, relative to its folder: ``configs/<name>.pbtxt`` when
    a custom configuration name is given and the folder has that file (Triton's
    --model-config-name), else ``config.pbtxt``."""
    if config_name:
        custom = f"configs/{config_name}.pbtxt"
        if (model_path / custom).is_file():
            return custom
    return CONFIG_FILENAME


def read_config_proto(model_path: Path, model_name: str, auto_complete: bool,
                      config_name: str = "") -> pb.ModelConfig:
    filename = config_file(model_path, config_name)
    path = model_path / filename
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if not auto_complete:
            # Triton's words (its file system's), then why nothing else stood in for it
            raise ConfigError(
                f"failed to open text file for read {path}: No such file or directory "
                f"(model '{model_name}': {filename} is missing and auto-complete is disabled: "
                "--disable-auto-complete-config / --strict-model-config=true)"
            ) from None
        return pb.ModelConfig()
    except OSError as exc:
        raise ConfigError(f"model '{model_name}': cannot read {filename}: {exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"model '{model_name}': {filename} is not UTF-8 text (byte {exc.start})"
        ) from None
    return parse_config_text(text, model_name, filename)


def read_model_config(
    model_path: Path,
    model_name: str,
    *,
    backends: BackendLookup,
    auto_complete: bool = True,
    proto: pb.ModelConfig | None = None,
    config_name: str = "",
    warn_versions: bool = False,
) -> tuple[ModelConfig, list[int]]:
    """The frozen configuration of a model folder and the versions its policy selects.
    ``config_name``: read ``configs/<name>.pbtxt`` where the folder has it (config_file).
    ``warn_versions``: log Triton's warning for each folder that is not a version (a load's
    reading, not a tool's).

    ``backends`` finds the backend a configuration names (an unknown one fails the model), whose
    factory then auto-completes the configuration from the model file (the caller's registry,
    :func:`nursery.backends.base.get_factory` in the server: configuration never imports backends).

    ``proto`` replaces the file's configuration (a load request's ``config`` override).
    Blocking (reads files; auto-complete may open the model): call it off the trio thread.
    Raises only :class:`NurseryError` (:class:`ConfigError` for anything unexpected).
    """
    with config_boundary(model_name):
        return _read_model_config(model_path, model_name, backends=backends,
                                  auto_complete=auto_complete, proto=proto,
                                  config_name=config_name, warn_versions=warn_versions)


def _read_model_config(
    model_path: Path,
    model_name: str,
    *,
    backends: BackendLookup,
    auto_complete: bool,
    proto: pb.ModelConfig | None,
    config_name: str = "",
    warn_versions: bool = False,
) -> tuple[ModelConfig, list[int]]:
    if proto is None:
        proto = read_config_proto(model_path, model_name, auto_complete, config_name)
    where = f"model '{model_name}'"
    if not proto.name or model_path.name != model_name:
        # a folder that serves under another name (a registered repository's mapping, the
        # SageMaker multi-model endpoint's) takes that name, as in Triton
        proto.name = model_name
    versions_on_disk = available_versions(model_path, warn=warn_versions)
    with config_boundary(model_name, "backend"):
        _fill_backend(proto, model_path, versions_on_disk, where)
    with config_boundary(model_name, "version_policy"):
        if not _present(proto, "version_policy"):
            policy = pb.ModelVersionPolicy(latest=pb.ModelVersionPolicyLatest(num_versions=1))
            proto.version_policy = policy
        versions = select_versions(proto.version_policy, versions_on_disk)
    if proto.platform == "ensemble":
        auto_complete = False  # nothing to complete from: an ensemble has no model file
    # Triton validates the configuration before it looks for versions: what needs no model
    # file always, inputs and outputs too when there is nothing to auto-complete them from
    with config_boundary(model_name):
        validate_model_config(proto, f"{where}: {CONFIG_FILENAME}")
        if not auto_complete:
            validate_model_io(proto, f"{where}: {CONFIG_FILENAME}")
    if proto.name != model_name:  # after the rules, as Triton checks it
        raise ConfigError(
            f"{where}: {CONFIG_FILENAME}: 'name' is '{proto.name}' but the model folder is "
            f"'{model_name}'; they must match (Triton: unexpected directory name "
            f"'{model_name}' for model '{proto.name}', directory name must equal model name)"
        )
    if not versions:
        if not auto_complete:  # the rest of the configuration's errors come first too
            _normalize(proto)
            _freeze(proto, model_path, where)
        raise NoVersionError(
            f"{where}: no version to serve: found versions {versions_on_disk or 'none'} in "
            f"'{model_path}', and the version policy selects none of them (a version is a "
            "numbered folder holding the model file)"
        )
    if proto.platform != "ensemble":
        with config_boundary(model_name, "backend"):
            _check_runtime(proto, model_path, where)
            factory = backends(proto.backend, model_name)
    if auto_complete:
        version_path = model_path / str(versions[-1])
        try:
            factory.auto_complete(proto, version_path)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"{where}: auto-complete from the model file failed: {exc}") from exc
        with config_boundary(model_name):
            validate_model_io(proto, f"{where}: {CONFIG_FILENAME}")
    _normalize(proto)
    config = _freeze(proto, model_path, where)
    return config, versions


def _check_runtime(proto: pb.ModelConfig, model_path: Path, where: str) -> None:
    """The ``runtime`` field names the backend's library: nursery's backends are built in, so
    only their own names (``libtriton_<backend>.so``, and ``model.py`` for a Python-based
    backend) are accepted; a name that leaves its folder, or any other name, is refused in
    Triton's words (backend_model.cc)."""
    runtime = proto.runtime
    if not runtime or runtime in (PYTHON_BASED_RUNTIME, f"libtriton_{proto.backend}.so"):
        return
    parts = Path(runtime).parts
    if Path(runtime).is_absolute() or ".." in parts:
        raise ConfigError(
            f"{where}: backend library name '{runtime}' escapes backend directory "
            f"'{model_path}', for model '{proto.name}', check model config runtime field")
    raise ConfigError(f"{where}: unable to find backend library '{runtime}' for model "
                      f"'{proto.name}' (nursery's backends are built in: leave 'runtime' out, "
                      f"or name libtriton_{proto.backend}.so)")


PYTHON_BASED_RUNTIME = "model.py"  # Triton's runtime for a Python-based backend


def _present(message: betterproto.Message, name: str) -> bool:
    return pbtext.is_present(message, pbtext.fields_of(type(message))[name])


def _fill_backend(
    proto: pb.ModelConfig, model_path: Path, versions: list[int], where: str
) -> None:
    if proto.platform == "ensemble":
        if proto.backend:
            raise ConfigError(f"{where}: {CONFIG_FILENAME}: Ensemble model '{proto.name}' must "
                              "have platform type 'ensemble' and empty backend type")
        return  # no backend and no model file: its steps are other models
    version_paths = [model_path / str(v) for v in reversed(versions)]
    if not proto.backend and proto.platform:
        backend = PLATFORM_TO_BACKEND.get(proto.platform)
        if backend is None:
            # Triton still fills the backend from the model file's name, then refuses the
            # pair; with no backend found it refuses the platform (its words, then ours)
            found = SUFFIX_TO_BACKEND.get(Path(proto.default_model_filename).suffix, "") or (
                detect_backend(version_paths) or "")
            if found:
                raise ConfigError(f"{where}: {CONFIG_FILENAME}: unexpected 'platform' and "
                                  f"'backend' pair, got:{proto.platform}, {found}")
            raise ConfigError(
                f"{where}: {CONFIG_FILENAME}: unexpected platform type '{proto.platform}' for "
                f"{proto.name} (known: {', '.join(sorted(PLATFORM_TO_BACKEND))}, ensemble)"
            )
        proto.backend = backend
    if not proto.backend and not proto.platform and not proto.default_model_filename and (
            detect_backend(version_paths) is None
            and any((p / AOTI_FILENAME).is_file() for p in version_paths)):
        # Triton: a version folder holding model.pt2 (and no model.pt) is an AOTInductor
        # package for the PyTorch backend
        proto.backend, proto.platform = "pytorch", "torch_aoti"
    if not proto.backend:
        if proto.default_model_filename:
            for path in version_paths:
                if (path / proto.default_model_filename).exists():
                    suffix = Path(proto.default_model_filename).suffix
                    proto.backend = SUFFIX_TO_BACKEND.get(suffix, "")
                    break
        if not proto.backend and not proto.platform and not proto.default_model_filename and (
                detect_backend(version_paths) is None):
            # Triton's custom-backend autofill: a model named '<name>.<backend>' runs on
            # <backend>; any other name is refused in its words
            _, dot, suffix = proto.name.partition(".")
            if not dot:
                raise ConfigError(
                    f"{where}: Invalid model name: Could not determine backend for model "
                    f"'{proto.name}' with no backend in model configuration. Expected model "
                    "name of the form 'model.<backend_name>'. (No 'backend' or 'platform' "
                    "is named, and no version folder holds a known model file: "
                    f"{', '.join(DEFAULT_FILENAMES.values())})")
            proto.backend, proto.default_model_filename = suffix, f"model.{suffix}"
        if not proto.backend:
            detected = detect_backend(version_paths)
            if detected is None:
                raise ConfigError(
                    f"{where}: {CONFIG_FILENAME} names no 'backend' or 'platform', and no "
                    f"version folder holds a known model file "
                    f"({', '.join(DEFAULT_FILENAMES.values())})"
                )
            proto.backend = detected
            if detected == "pytorch":
                # Triton sets LibTorch's platform together with a backend found from the model
                # file, and then leaves default_model_filename empty (the backend finds model.pt)
                proto.platform = BACKEND_TO_PLATFORM[detected]
    if not proto.platform and proto.backend == "tensorflow":
        proto.platform = tensorflow_platform(proto.default_model_filename, version_paths)
    # (Triton gives LibTorch a default_model_filename only when it fills the platform itself;
    # an AOTInductor package's is model.pt2 whoever named the platform)
    if not proto.default_model_filename and proto.platform == "torch_aoti":
        proto.default_model_filename = AOTI_FILENAME
    if not proto.default_model_filename and not (proto.backend == "pytorch" and proto.platform):
        default = PLATFORM_FILENAMES.get(proto.platform) or DEFAULT_FILENAMES.get(proto.backend)
        if default:
            proto.default_model_filename = default
    if not proto.platform and proto.backend in BACKEND_TO_PLATFORM:
        proto.platform = BACKEND_TO_PLATFORM[proto.backend]
    elif proto.platform and PLATFORM_TO_BACKEND.get(proto.platform, proto.backend) != proto.backend:
        raise ConfigError(f"{where}: {CONFIG_FILENAME}: unexpected 'platform' and 'backend' "
                          f"pair, got:{proto.platform}, {proto.backend}")


def _normalize(proto: pb.ModelConfig) -> None:
    """Triton's NormalizeModelConfig and NormalizeInstanceGroup, each part inside a boundary
    that names its field."""
    # a oneof's set member is read by name once which_one_of named it (reading an unset one
    # raises AttributeError); its value from which_one_of is untyped
    scheduling, _ = betterproto.which_one_of(proto, "scheduling_choice")
    with config_boundary(proto.name, scheduling or "scheduling"):
        _normalize_scheduling(proto, scheduling)
    if scheduling != "ensemble_scheduling":
        with config_boundary(proto.name, "optimization"):
            _normalize_optimization(proto)
        with config_boundary(proto.name, "instance_group"):
            _normalize_instance_groups(proto)


def _normalize_scheduling(proto: pb.ModelConfig, scheduling: str) -> None:
    if scheduling == "dynamic_batching":
        dynamic = proto.dynamic_batching
        if not dynamic.preferred_batch_size and proto.max_batch_size > 0:
            dynamic.preferred_batch_size.append(proto.max_batch_size)
    elif scheduling == "sequence_batching":
        sequence = proto.sequence_batching
        if sequence.max_sequence_idle_microseconds == 0:
            sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        strategy, _ = betterproto.which_one_of(sequence, "strategy_choice")
        if (strategy == "oldest" and not sequence.oldest.preferred_batch_size
                and proto.max_batch_size > 0):
            sequence.oldest.preferred_batch_size.append(proto.max_batch_size)


def _normalize_optimization(proto: pb.ModelConfig) -> None:
    opt = proto.optimization
    for name in ("input_pinned_memory", "output_pinned_memory"):
        if not _present(opt, name):
            buf = pb.ModelOptimizationPolicyPinnedMemoryBuffer(enable=True)
            setattr(opt, name, buf)
    pbtext.mark_present(opt)
    proto.optimization = opt


def _normalize_instance_groups(proto: pb.ModelConfig) -> None:
    if not proto.instance_group:
        proto.instance_group.append(pb.ModelInstanceGroup(name=proto.name))
    gpus = gpu_count()
    for i, group in enumerate(proto.instance_group):
        if not group.name:
            group.name = f"{proto.name}_{i}"
        if group.kind == pb.ModelInstanceGroupKind.KIND_AUTO:
            kind = pb.ModelInstanceGroupKind.KIND_GPU if gpus else pb.ModelInstanceGroupKind.KIND_CPU
            group.kind = kind  # type: ignore[assignment]  # mypy types betterproto enum members as int
        if group.count < 1:
            # Triton's SetDefaultInstanceCount: 2 CPU instances for ONNX Runtime
            cpu = group.kind == pb.ModelInstanceGroupKind.KIND_CPU
            group.count = 2 if cpu and proto.backend in _TWO_CPU_INSTANCES else 1
        if group.kind == pb.ModelInstanceGroupKind.KIND_GPU and not group.gpus:
            group.gpus.extend(range(max(gpus, 1)))


_TWO_CPU_INSTANCES = {"onnxruntime", "tensorflow"}

_KIND_NAMES = {
    pb.ModelInstanceGroupKind.KIND_CPU: "cpu",
    pb.ModelInstanceGroupKind.KIND_GPU: "gpu",
    pb.ModelInstanceGroupKind.KIND_MODEL: "model",
}


def _tensor_specs(
    tensors: list[pb.ModelInput] | list[pb.ModelOutput], what: str, where: str
) -> tuple[TensorSpec, ...]:
    specs: list[TensorSpec] = []
    seen: set[str] = set()
    for t in tensors:
        if not t.name:
            raise ConfigError(f"{where}: {CONFIG_FILENAME}: every model {what} must have a 'name'")
        label = f"{where}: {CONFIG_FILENAME}: {what} '{t.name}'"
        if t.name in seen:
            raise ConfigError(f"{label} is specified more than once")
        seen.add(t.name)
        if t.data_type == pb.DataType.TYPE_INVALID:
            raise ConfigError(f"{label} must specify 'data_type'")
        try:
            datatype = DataType.from_config(t.data_type)
        except InvalidArgument as exc:
            raise ConfigError(f"{label}: {exc}") from None
        if not t.dims:
            raise ConfigError(f"{label} must specify 'dims'")
        for d in t.dims:
            if d < 1 and d != -1:
                raise ConfigError(
                    f"{label}: dimension {d} in 'dims' {list(t.dims)} is invalid; a dimension "
                    "must be an integer >= 1, or -1 for a variable-size dimension"
                )
        reshape: tuple[int, ...] | None = None
        if pbtext.is_present(t, pbtext.fields_of(type(t))["reshape"]):
            reshape = tuple(t.reshape.shape)
        specs.append(
            TensorSpec(
                name=t.name,
                datatype=datatype,
                dims=tuple(int(d) for d in t.dims),
                optional=bool(getattr(t, "optional", False)),
                is_shape_tensor=t.is_shape_tensor,
                reshape=reshape,
                label_filename=getattr(t, "label_filename", ""),
                ragged=bool(getattr(t, "allow_ragged_batch", False)),
            )
        )
    return tuple(specs)


def decoupled_cache_refusal(where: str, name: str) -> ConfigError:
    """Triton's refusal of ``response_cache`` on a decoupled model (an ensemble with a
    decoupled step is one)."""
    return ConfigError(f"{where}: Response Cache does not currently support model '{name}' "
                       "with 'decoupled' transaction policy. Please disable the response cache.")


def _freeze(proto: pb.ModelConfig, model_path: Path, where: str) -> ModelConfig:
    if proto.max_batch_size < 0:
        raise ConfigError(
            f"{where}: {CONFIG_FILENAME}: 'max_batch_size' must be >= 0, got {proto.max_batch_size}"
        )
    name = proto.name
    with config_boundary(name, "input"):
        inputs = _tensor_specs(proto.input, "input", where)
    with config_boundary(name, "output"):
        outputs = _tensor_specs(proto.output, "output", where)
    with config_boundary(name, "instance_group"):
        groups = _instance_groups(proto, where)
    scheduling, _ = betterproto.which_one_of(proto, "scheduling_choice")
    scheduler = {
        "dynamic_batching": "dynamic",
        "sequence_batching": "sequence",
        "ensemble_scheduling": "ensemble",
    }.get(scheduling, "default")
    batching: BatchConfig | None = None
    sequence: SequenceConfig | None = None
    ensemble: EnsemblePlan | None = None
    if scheduling == "dynamic_batching":
        with config_boundary(name, scheduling):
            batching = _batch_config(proto, where)
    elif scheduling == "sequence_batching":
        with config_boundary(name, scheduling):
            sequence = sequence_config(proto, model_path, where)
    if (scheduling == "ensemble_scheduling") != (proto.platform == "ensemble"):
        raise ConfigError(
            f"{where}: {CONFIG_FILENAME}: 'ensemble_scheduling' goes with platform 'ensemble' "
            "(and an ensemble needs 'ensemble_scheduling')")
    if scheduling == "ensemble_scheduling":
        with config_boundary(name, scheduling):
            ensemble = EnsemblePlan.build(
                proto.name, [t.name for t in inputs], [t.name for t in outputs],
                [EnsembleStep(s.model_name,
                              int(s.model_version) if s.model_version > 0 else -1,  # unset: latest
                              MappingProxyType(dict(s.input_map)),
                              MappingProxyType(dict(s.output_map)))
                 for s in proto.ensemble_scheduling.step],
                optional_inputs=[t.name for t in inputs if t.optional],
                max_inflight=proto.ensemble_scheduling.max_inflight_requests)
        groups = []
    with config_boundary(name, "version_policy"):
        which, _ = betterproto.which_one_of(proto.version_policy, "policy_choice")
        if which == "latest" and proto.version_policy.latest.num_versions < 1:
            raise ConfigError(
                f"{where}: {CONFIG_FILENAME}: version_policy latest must have num_versions >= 1"
            )
    with config_boundary(name, "parameters"):
        parameters = {k: v.string_value for k, v in proto.parameters.items()}
        try:
            objective = objective_from_parameters(parameters)
        except ValueError as exc:
            raise ConfigError(f"{where}: {CONFIG_FILENAME}: {exc}") from None
        if objective is not None and scheduler in ("sequence", "ensemble"):
            raise ConfigError(f"{where}: {CONFIG_FILENAME}: parameter '{BATCHER_KEY}' cannot "
                              f"be used with {scheduling}: the latency-objective batcher "
                              "schedules stateless models (remove one of the two)")
    for control in proto.model_metrics.metric_control:
        if control.metric_identifier.family not in CUSTOMIZABLE_METRICS:  # Triton's words
            log.warning("Metric family '%s' in 'metric_identifier' is not a customizable metric "
                        "in Triton core.", control.metric_identifier.family)
    if proto.response_cache.enable and proto.model_transaction_policy.decoupled:
        raise decoupled_cache_refusal(where, proto.name)
    return ModelConfig(
        name=proto.name,
        platform=proto.platform,
        backend=proto.backend,
        max_batch_size=proto.max_batch_size,
        inputs=inputs,
        outputs=outputs,
        instance_groups=tuple(groups),
        scheduler=scheduler,
        decoupled=proto.model_transaction_policy.decoupled,
        default_model_filename=proto.default_model_filename,
        parameters=MappingProxyType(parameters),
        path=model_path,
        proto=proto,
        batching=batching,
        sequence=sequence,
        ensemble=ensemble,
        objective=objective,
    )


def _instance_groups(proto: pb.ModelConfig, where: str) -> list[InstanceGroup]:
    groups = []
    for g in proto.instance_group:
        kind = _KIND_NAMES.get(g.kind)
        if kind is None:
            raise ConfigError(f"{where}: {CONFIG_FILENAME}: instance group '{g.name}' has no kind")
        if g.gpus and kind != "gpu":  # Triton's words (ValidateInstanceGroup)
            raise ConfigError(
                f"{where}: {CONFIG_FILENAME}: instance group {g.name} of model {proto.name} has "
                f"kind KIND_{kind.upper()} but specifies one or more GPUs"
            )
        for gpu in g.gpus:
            if gpu < 0:
                raise ConfigError(
                    f"{where}: {CONFIG_FILENAME}: instance group {g.name} of model {proto.name} "
                    f"specifies invalid or "
                    f"unsupported gpu id {gpu}. GPUs with at least the minimum required CUDA "
                    f"compute compatibility of 6.000000 are: "
                    f"{', '.join(str(i) for i in range(gpu_count()))}"
                )
        groups.append(InstanceGroup(g.name, kind, g.count, tuple(g.gpus)))
    return groups


def _queue_policy(p: pb.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        reject_on_timeout=p.timeout_action == pb.ModelQueuePolicyTimeoutAction.REJECT,
        default_timeout_us=p.default_timeout_microseconds,
        allow_timeout_override=p.allow_timeout_override,
        max_queue_size=p.max_queue_size,
    )


def _batch_config(proto: pb.ModelConfig, where: str) -> BatchConfig:
    """The dynamic_batching block, validated with Triton's rules and messages."""
    db = proto.dynamic_batching
    name = proto.name
    label = f"{where}: {CONFIG_FILENAME}"
    for size in db.preferred_batch_size:
        if size < 1:
            raise ConfigError(f"{label}: dynamic batching preferred size must be positive for {name}")
        if size > max(proto.max_batch_size, 0):
            raise ConfigError(f"{label}: dynamic batching preferred size must be <= max batch size "
                              f"for {name} (preferred {size}, max_batch_size {proto.max_batch_size})")
    levels = db.priority_levels
    if levels:
        if not 1 <= db.default_priority_level <= levels:
            raise ConfigError(f"{label}: default priority level must be in range [1, {levels}] "
                              f"for {name}")
        for level in db.priority_queue_policy:
            if not 1 <= level <= levels:
                raise ConfigError(f"{label}: priority queue policy must have priority level in "
                                  f"range [1, {levels}] for {name}")
    policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
    if db.preserve_ordering:
        if levels > 1:
            raise ConfigError(f"{label}: Only one priority level is allowed when "
                              f"'preserve_ordering' is true for {name}")
        for p in policies:
            if p.default_timeout_microseconds and p.timeout_action == pb.ModelQueuePolicyTimeoutAction.DELAY:
                raise ConfigError(f"{label}: Queue policy can not have DELAY as timeout action "
                                  f"when 'preserve_ordering' is true for {name}")
    return BatchConfig(
        max_batch_size=proto.max_batch_size,
        preferred_batch_sizes=tuple(sorted(db.preferred_batch_size)),
        max_queue_delay_us=db.max_queue_delay_microseconds,
        preserve_ordering=db.preserve_ordering,
        priority_levels=levels,
        default_priority_level=db.default_priority_level if levels else 0,
        default_queue_policy=_queue_policy(db.default_queue_policy),
        level_policies={int(k): _queue_policy(v) for k, v in db.priority_queue_policy.items()},
    )


def _batch_inputs(proto: pb.ModelConfig) -> Iterator[BatchInputSpec]:
    """The configuration's batch inputs (validate.py has checked their sources and kinds)."""
    for b in proto.batch_input:
        try:
            datatype = DataType.from_config(b.data_type)
        except Exception:
            datatype = DataType.INT32
        yield BatchInputSpec(pb.BatchInputKind(b.kind).name or "", tuple(b.target_name),
                             datatype, b.source_input[0] if b.source_input else "")

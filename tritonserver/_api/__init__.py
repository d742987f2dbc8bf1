"""The ``tritonserver`` in-process API (Triton's Python package of that name), served by
nursery: :class:`Server` starts a ``nursery.Server`` in this process (no port open: the
``tritonfrontend`` package opens them), :class:`Model` sends it requests and iterates the
responses, synchronously or under asyncio, as Triton's package does."""

from __future__ import annotations

import asyncio
import enum
import json
import os
import queue
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import outcome

from nursery.errors import NurseryError, StartupError
from nursery.messages import Part
from nursery.types import InferenceRequest as _Request
from nursery.types import tensor_of
from tritonserver._errors import (
    InternalError,
    InvalidArgumentError,
    TritonError,
    UnavailableError,
    triton_error,
)
from tritonserver._metrics import REGISTRY
from tritonserver._tensor import MemoryType, Tensor, parse_device


class ModelControlMode(enum.IntEnum):
    NONE = 0
    POLL = 1
    EXPLICIT = 2


class RateLimitMode(enum.IntEnum):
    OFF = 0
    EXEC_COUNT = 1


class LogFormat(enum.IntEnum):
    DEFAULT = 0
    ISO8601 = 1


class InstanceGroupKind(enum.IntEnum):
    AUTO = 0
    CPU = 1
    GPU = 2
    MODEL = 3


class MetricFormat(enum.IntEnum):
    PROMETHEUS = 0


class ModelBatchFlag(enum.IntFlag):
    UNKNOWN = 1
    FIRST_DIM = 2


class ModelTxnPropertyFlag(enum.IntFlag):
    ONE_TO_ONE = 1
    DECOUPLED = 2


REQUEST_FLAG_SEQUENCE_START = 1
REQUEST_FLAG_SEQUENCE_END = 2


@dataclass
class RateLimiterResource:
    name: str
    count: int
    device: int


@dataclass
class ModelLoadDeviceLimit:
    kind: InstanceGroupKind
    device: int
    fraction: float


_STR = (str,)
_BOOL = (bool,)
_INT = (int,)


@dataclass
class Options:
    """The server's settings, Triton's names and defaults (checked at :meth:`Server.start`).
    Settings for what nursery does not have (pinned and CUDA memory pools, peer access,
    host policies) are accepted and have no effect."""

    model_repository: str | list[str] = field(default_factory=list)
    server_id: str = "triton"
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    startup_models: list[str] = field(default_factory=list)
    strict_model_config: bool = False
    rate_limiter_mode: RateLimitMode = RateLimitMode.OFF
    rate_limiter_resources: list[RateLimiterResource] = field(default_factory=list)
    pinned_memory_pool_size: int = 1 << 28
    cuda_memory_pool_sizes: dict[int, int] = field(default_factory=dict)
    cache_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_directory: str = "/opt/tritonserver/caches"
    min_supported_compute_capability: float = 6.0
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout: int = 30
    buffer_manager_thread_count: int = 0
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0
    model_namespacing: bool = False
    enable_peer_access: bool = True
    log_file: str | None = None
    log_info: bool = False
    log_warn: bool = False
    log_error: bool = False
    log_format: LogFormat = LogFormat.DEFAULT
    log_verbose: int = 0
    metrics: bool = True
    gpu_metrics: bool = True
    cpu_metrics: bool = True
    metrics_interval: int = 2000
    backend_directory: str = "/opt/tritonserver/backends"
    repo_agent_directory: str = "/opt/tritonserver/repoagents"
    model_load_device_limits: list[ModelLoadDeviceLimit] = field(default_factory=list)
    backend_configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    metrics_configuration: dict[str, dict[str, str]] = field(default_factory=dict)

    def _flags(self) -> tuple[list[str], dict[str, Any]]:
        """The repositories and the ``nursery.Server`` flags; TypeError or
        InvalidArgumentError for a setting of the wrong kind."""
        for name, kinds in (("server_id", _STR), ("exit_on_error", _BOOL),
                            ("strict_model_config", _BOOL), ("strict_readiness", _BOOL),
                            ("model_namespacing", _BOOL), ("log_info", _BOOL),
                            ("log_warn", _BOOL), ("log_error", _BOOL), ("metrics", _BOOL),
                            ("exit_timeout", _INT), ("log_verbose", _INT + _BOOL),
                            ("metrics_interval", _INT)):
            value = getattr(self, name)
            if not isinstance(value, kinds):
                raise TypeError(f"Options.{name} must be {kinds[0].__name__}, got "
                                f"{type(value).__name__}")
        repos = self.model_repository
        if repos is None or (not isinstance(repos, (str, os.PathLike)) and not repos):
            raise InvalidArgumentError("Invalid argument: a model repository must be "
                                       "specified (Options.model_repository)")
        if isinstance(repos, (str, os.PathLike)):
            repos = [repos]
        if not isinstance(repos, (list, tuple)) or not all(
                isinstance(r, (str, os.PathLike)) for r in repos):
            raise TypeError("Options.model_repository must be str or list[str]")
        flags: dict[str, Any] = {
            "id": self.server_id,
            "model_control_mode": ModelControlMode(self.model_control_mode).name.lower(),
            "strict_model_config": self.strict_model_config,
            "exit_on_error": self.exit_on_error,
            "strict_readiness": self.strict_readiness,
            "exit_timeout_secs": int(self.exit_timeout),
            "model_namespacing": self.model_namespacing,
            "allow_metrics": False,
            "allow_gpu_metrics": self.gpu_metrics,
            "allow_cpu_metrics": self.cpu_metrics,
            "metrics_interval_ms": int(self.metrics_interval),
            # the program itself loads models here: Triton's API takes `file:` contents
            "allow_model_file_upload": True,
        }
        if self.startup_models:
            flags["load_model"] = list(self.startup_models)
        if self.rate_limiter_mode == RateLimitMode.EXEC_COUNT:
            flags["rate_limit"] = "execution_count"
            flags["rate_limit_resource"] = [f"{r.name}:{r.count}:{r.device}"
                                            for r in self.rate_limiter_resources]
        cache = [f"{name},{key}={value}" for name, settings in self.cache_config.items()
                 for key, value in settings.items()]
        if cache:
            flags["cache_config"] = cache
        backend = [f"{name},{key}={value}"
                   for name, settings in self.backend_configuration.items()
                   for key, value in settings.items()]
        if backend:
            flags["backend_config"] = backend
        if self.backend_directory != "/opt/tritonserver/backends":
            flags["backend_directory"] = self.backend_directory
        metric_config = [f"{key}={value}" for settings in self.metrics_configuration.values()
                         for key, value in settings.items()]
        if metric_config:
            flags["metrics_config"] = metric_config
        # logging: Triton's in-process server logs nothing unless asked (log_* false)
        verbose = int(self.log_verbose)
        if self.log_file or self.log_info or self.log_warn or self.log_error or verbose:
            flags.update(log_info=self.log_info, log_warning=self.log_warn,
                         log_error=self.log_error, log_verbose=verbose,
                         log_format="ISO8601" if self.log_format == LogFormat.ISO8601
                         else "default")
            if self.log_file:
                flags["log_file"] = self.log_file
        return [os.fspath(r) for r in repos], flags


class Server:
    """An in-process server (``tritonserver.Server(options)`` or
    ``tritonserver.Server(model_repository=...)``), started by :meth:`start`."""

    def __init__(self, options: Options | None = None, **kwargs: Any) -> None:
        self.options = options if options is not None else Options(**kwargs)
        self._server: Any = None  # the nursery.Server, once started

    def start(self, wait_until_ready: bool = False, polling_interval: float = 0.1,
              timeout: float | None = None) -> Server:
        """Start the server (its start-up models loaded); with ``wait_until_ready``, wait
        until it is ready (UnavailableError after ``timeout`` seconds)."""
        if self._server is not None:
            raise InvalidArgumentError("Server already started")
        repos, flags = self.options._flags()
        from nursery.embed import Server as Embedded  # the server's packages, on first use

        try:
            # several servers of a process may serve one repository, as Triton's may
            self._server = Embedded(model_repository=repos, exclusive=False,
                                    custom_metrics=REGISTRY,
                                    sample_metrics=bool(self.options.metrics), **flags)
        except StartupError as exc:
            raise InternalError(str(exc).removeprefix("creating server: ")) from None
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        except NurseryError as exc:
            raise triton_error(exc) from None
        started = time.monotonic()
        while wait_until_ready and not self.ready():
            if timeout is not None and time.monotonic() - started >= timeout:
                raise UnavailableError("Timeout before ready")
            time.sleep(polling_interval)
        return self

    def stop(self) -> None:
        """Stop the frontends started on it, drain and unload the models."""
        if self._server is not None:
            self._server.close()

    def __del__(self) -> None:  # an unreferenced server stops, as Triton's object does
        try:
            self.stop()
        except Exception:  # noqa: BLE001, S110 - interpreter teardown
            pass

    def _started(self) -> Any:
        if self._server is None:
            raise InvalidArgumentError("Server not started")
        return self._server

    def _embedded(self) -> Any:
        server = self._started()
        if server.closed:
            raise UnavailableError("Server is stopped")
        return server

    def _do(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self._embedded(), method)(*args, **kwargs)
        except NurseryError as exc:
            raise triton_error(exc) from None

    def live(self) -> bool:
        return not self._started().closed and bool(self._do("live"))

    def ready(self) -> bool:
        return not self._started().closed and bool(self._do("ready"))

    def metadata(self) -> dict[str, Any]:
        return self._do("server_metadata")  # type: ignore[no-any-return]

    def model(self, model_name: str, model_version: int = -1) -> Model:
        self._embedded()
        return Model(self, model_name, model_version)

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        index = self._do("repository_index", exclude_not_ready)
        models = []
        for entry in index:
            version = int(entry["version"]) if entry.get("version") else -1
            models.append(Model(self, entry["name"], version, entry.get("state")))
        return ModelDictionary(self, models)

    def load(self, model_name: str,
             parameters: dict[str, str | int | bool | bytes] | None = None) -> Model:
        """Load (or reload) a model; ``parameters``: ``config`` (a JSON configuration) and
        ``file:<version>/<path>`` contents, as the repository API's load."""
        config = None
        files: dict[str, bytes] = {}
        for key, value in (parameters or {}).items():
            if key == "config":
                config = value if isinstance(value, str) else json.dumps(value)
            elif key.startswith("file:"):
                files[key.removeprefix("file:")] = value if isinstance(value, bytes) \
                    else str(value).encode()
            else:
                raise InvalidArgumentError(f"unexpected parameter '{key}' for load")
        self._do("load", model_name, config=config, files=files or None)
        return self.model(model_name)

    def unload(self, model: str | Model, unload_dependents: bool = False,
               wait_until_unloaded: bool = False, polling_interval: float = 0.1,
               timeout: float | None = None) -> None:
        name = model.name if isinstance(model, Model) else model
        self._do("unload", name, unload_dependents=unload_dependents)
        started = time.monotonic()
        while wait_until_unloaded and self.model(name).ready():
            if timeout is not None and time.monotonic() - started >= timeout:
                raise UnavailableError("Timeout before unloaded")
            time.sleep(polling_interval)

    def register_model_repository(self, repository_path: str,
                                  name_mapping: dict[str, str] | None = None) -> None:
        """Serve one more repository (explicit model control): its models are then loaded
        by name; ``name_mapping`` gives a folder another model name."""
        self._do("register_repository", repository_path, name_mapping)

    def unregister_model_repository(self, repository_path: str) -> None:
        self._do("unregister_repository", repository_path)

    def metrics(self, metric_format: MetricFormat = MetricFormat.PROMETHEUS) -> str:
        return self._do("metrics_text")  # type: ignore[no-any-return]


class ModelDictionary(dict[tuple[str, int], "Model"]):
    """Models by (name, version); a name alone finds its first version."""

    def __init__(self, server: Server, models: list[Model]) -> None:
        super().__init__({(m.name, m.version): m for m in models})
        self._server = server

    def __getitem__(self, key: Any) -> Model:
        if isinstance(key, str):
            for (name, _version), model in self.items():
                if name == key:
                    return model
            raise KeyError(key)
        return super().__getitem__(key)


class Model:
    """One model of a server (``server.model(name)``): requests, metadata, configuration,
    statistics."""

    def __init__(self, server: Server, name: str, version: int = -1,
                 state: str | None = None) -> None:
        self._server = server
        self.name = name
        self.version = version
        self.state = state

    def _version(self) -> str:
        return "" if self.version is None or int(self.version) < 0 else str(self.version)

    def __str__(self) -> str:
        return str({"name": self.name, "version": self.version, "state": self.state})

    __repr__ = __str__

    def create_request(self, **kwargs: Any) -> InferenceRequest:
        return InferenceRequest(model=self, **kwargs)

    def infer(self, inference_request: InferenceRequest | None = None,
              raise_on_error: bool = True, **kwargs: Any) -> ResponseIterator:
        """Send one request now; its responses, in order (the last ``final``)."""
        request = inference_request or InferenceRequest(model=self, **kwargs)
        return ResponseIterator(self, request, raise_on_error)

    def async_infer(self, inference_request: InferenceRequest | None = None,
                    raise_on_error: bool = True, **kwargs: Any) -> AsyncResponseIterator:
        """:meth:`infer` for asyncio code: an async iterator of the responses."""
        request = inference_request or InferenceRequest(model=self, **kwargs)
        return AsyncResponseIterator(self, request, raise_on_error)

    def metadata(self) -> dict[str, Any]:
        return self._server._do("model_metadata", self.name,  # type: ignore[no-any-return]
                                self._version())

    def ready(self) -> bool:
        return bool(self._server._do("model_ready", self.name, self._version()))

    def config(self, config_version: int = 1) -> dict[str, Any]:
        return self._server._do("model_config", self.name,  # type: ignore[no-any-return]
                                self._version())

    def statistics(self) -> dict[str, Any]:
        return self._server._do("statistics", self.name,  # type: ignore[no-any-return]
                                self._version())

    def batch_properties(self) -> ModelBatchFlag:
        config = self.config()
        return ModelBatchFlag.FIRST_DIM if config.get("max_batch_size", 0) > 0 \
            else ModelBatchFlag.UNKNOWN

    def transaction_properties(self) -> ModelTxnPropertyFlag:
        policy = self.config().get("model_transaction_policy", {})
        return ModelTxnPropertyFlag.DECOUPLED if policy.get("decoupled") \
            else ModelTxnPropertyFlag.ONE_TO_ONE


_PARAMETER_TYPES = (str, int, float, bool)


@dataclass
class InferenceRequest:
    """One request: inputs (Tensor, numpy array, or anything numpy takes; str and bytes
    arrays are BYTES), parameters (str, int, float or bool), where outputs go."""

    model: Model
    request_id: str | None = None
    flags: int = 0
    correlation_id: int | str | None = None
    priority: int = 0
    timeout: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: Any = None
    response_queue: queue.SimpleQueue[Any] | asyncio.Queue[Any] | None = None

    def _nursery_request(self) -> _Request:
        for key, value in self.parameters.items():
            if not isinstance(value, _PARAMETER_TYPES):
                raise InvalidArgumentError(
                    f"Invalid parameter type {type(value).__name__} for key '{key}': "
                    "parameters must be str, int, float or bool")
        if self.output_memory_type is not None:
            parse_device(self.output_memory_type)  # InvalidArgumentError when unknown
        tensors = {}
        for name, value in self.inputs.items():
            array = _input_array(value)
            try:
                tensors[name] = tensor_of(name, array)
            except NurseryError as exc:
                raise InvalidArgumentError(f"input '{name}': {exc.message}") from None
        return _Request(
            model_name=self.model.name, model_version=self.model._version(), inputs=tensors,
            id=self.request_id or "", parameters=dict(self.parameters),
            priority=int(self.priority), timeout_us=int(self.timeout),
            sequence_id=self.correlation_id or 0,
            sequence_start=bool(self.flags & REQUEST_FLAG_SEQUENCE_START),
            sequence_end=bool(self.flags & REQUEST_FLAG_SEQUENCE_END))


def _input_array(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return value._array()
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        return Tensor.from_dlpack(value)._array()
    array = np.asarray(value)
    if array.dtype.kind in ("S", "U", "O"):
        array = np.array([v.encode() if isinstance(v, str) else v
                          for v in array.reshape(-1).tolist()],
                         dtype=object).reshape(array.shape)
    return array


@dataclass
class InferenceResponse:
    """One response: its outputs by name (Tensors), parameters, error, and whether it is
    the request's last."""

    model: Model
    request_id: str | None = None
    parameters: dict[str, str | int | bool] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: TritonError | None = None
    classification_label: str | None = None
    final: bool = False


def _answer(model: Model, request: InferenceRequest, part: Part) -> InferenceResponse:
    result = InferenceResponse(model, request.request_id, final=part.final)
    if part.error is not None:
        result.error = triton_error(part.error)
        return result
    answer = part.response
    if answer is None:
        return result
    result.request_id = answer.id or request.request_id
    result.parameters = dict(answer.parameters)
    outputs = {t.name: Tensor._from_numpy(np.asarray(t.data)) for t in answer.outputs}
    if request.output_memory_type is not None:
        kind, _ = parse_device(request.output_memory_type)
        if kind is MemoryType.GPU:
            outputs = {name: t.to_device(request.output_memory_type)
                       for name, t in outputs.items()}
    result.outputs = outputs
    return result


class _Stream:
    """One request in flight: its responses as they come, to the iterator's queue and the
    caller's ``response_queue``."""

    def __init__(self, model: Model, request: InferenceRequest, put: Any,
                 user_put: Any) -> None:
        self.model, self.request = model, request
        self._put, self._user_put = put, user_put
        self._final_seen = False
        nursery_request = request._nursery_request()
        self.cancel = model._server._do("submit_stream", nursery_request, self._deliver)

    def _deliver(self, item: Any) -> None:  # on the server's thread
        if isinstance(item, Part):
            response = _answer(self.model, self.request, item)
            self._final_seen = self._final_seen or item.final
        elif isinstance(item, outcome.Error):
            if self._final_seen:
                return
            response = InferenceResponse(self.model, self.request.request_id,
                                         error=triton_error(item.error), final=True)
        else:  # the call's end after its final part
            if self._final_seen:
                return
            response = InferenceResponse(self.model, self.request.request_id, final=True)
        self._put(response)
        if self._user_put is not None:
            self._user_put(response)


class ResponseIterator:
    """The responses of one request, for plain (blocking) code."""

    def __init__(self, model: Model, request: InferenceRequest, raise_on_error: bool) -> None:
        self._queue: queue.SimpleQueue[InferenceResponse] = queue.SimpleQueue()
        user = request.response_queue
        self._raise = raise_on_error
        self._done = False
        self._stream = _Stream(model, request, self._queue.put,
                               user.put if user is not None else None)

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        response = self._queue.get()
        self._done = response.final
        if response.error is not None and self._raise:
            raise response.error
        return response

    def cancel(self) -> None:
        self._stream.cancel()


class AsyncResponseIterator:
    """The responses of one request, for asyncio code."""

    def __init__(self, model: Model, request: InferenceRequest, raise_on_error: bool,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[InferenceResponse] = asyncio.Queue()
        user = request.response_queue
        self._raise = raise_on_error
        self._done = False
        loop_ = self._loop

        def put(response: InferenceResponse) -> None:
            loop_.call_soon_threadsafe(self._queue.put_nowait, response)

        user_put: Any = None
        if isinstance(user, asyncio.Queue):
            aqueue = user

            def put_user(response: InferenceResponse) -> None:
                loop_.call_soon_threadsafe(aqueue.put_nowait, response)
            user_put = put_user
        elif user is not None:
            user_put = user.put
        self._stream = _Stream(model, request, put, user_put)

    def __aiter__(self) -> AsyncIterator[InferenceResponse]:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._done:
            raise StopAsyncIteration
        response = await self._queue.get()
        self._done = response.final
        if response.error is not None and self._raise:
            raise response.error
        return response

    def cancel(self) -> None:
        self._stream.cancel()



# Triton's package keeps each type in a submodule of its own; programs written for it name
# some by that path (its OpenAI frontend: ``tritonserver._api._response.InferenceResponse``)
from tritonserver._api import _response as _response  # noqa: E402

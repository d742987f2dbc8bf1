"""The transport-neutral facade every frontend calls.

Frontends decode wire bytes into an :class:`InferenceRequest`, call :meth:`Core.infer` (or a
readiness / metadata / config call), and encode what comes back. Requests are validated here
against the model's frozen configuration, once, with Triton's messages, before anything
reaches a scheduler.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from nursery import __version__
from nursery.actors.directory import Directory, ModelHandle
from nursery.actors.model_manager import IndexEntry, IndexRepository, LoadModel, UnloadModel
from nursery.config.model import ModelConfig
from nursery.errors import InvalidArgument, NotFound, NurseryError, Unavailable
from nursery.execution import sequence as sequence_batching
from nursery.messages import CacheInsert, CacheLookup, CacheOutcome, CacheStatsQuery, InferWork
from nursery.observability.stats import StatsSnapshot
from nursery.observability.tracing import TraceManager, TraceSettings
from nursery.runtime.supervision import FaultCounter
from nursery.scheduling.cache_store import frozen_copy, request_key
from nursery.shm import cuda as cuda_shm
from nursery.shm.system import SharedMemoryRegistry
from nursery.types import InferenceRequest, InferenceResponse

SERVER_NAME = "triton"  # what Triton's clients expect in server metadata; --id changes it

EXTENSIONS = (  # in Triton's order
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)


def _dims(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def _count_error(
    prefix: str, request: InferenceRequest, config: ModelConfig, required: list[str]
) -> None:
    inputs = request.inputs
    missing = [n for n in required if n not in inputs]
    got = "[" + ",".join(f"'{n}'" for n in inputs) + "]"
    miss = "[" + ",".join(f"'{n}'" for n in missing) + "]"
    if len(required) == len(config.inputs):
        expected = f"expected {len(config.inputs)} inputs"
    else:
        expected = f"expected number of inputs between {len(required)} and {len(config.inputs)}"
    raise InvalidArgument(
        f"{prefix}{expected} but got {len(inputs)} inputs for model '{config.name}'. Got input(s) "
        f"{got}, but missing required input(s) {miss}. Please provide all required input(s)."
    )


def validate_request(request: InferenceRequest, config: ModelConfig) -> int:
    """Check a request against the model (Triton's order and messages); return its batch size."""
    prefix = f"[request id: {request.id or '<id_unknown>'}] "
    model = config.name
    for out in request.requested_outputs:
        if out.name not in config.output_map:
            raise InvalidArgument(f"unexpected inference output '{out.name}' for model '{model}'")
    inputs = request.inputs
    required = [s.name for s in config.inputs if not s.optional]
    if len(inputs) > len(config.inputs) or len(inputs) < len(required):
        _count_error(prefix, request, config, required)
    batching = config.max_batch_size > 0
    batch_size = 1 if not batching else -1
    for name, tensor in inputs.items():
        spec = config.input_map.get(name)
        if spec is None:
            raise InvalidArgument(f"unexpected inference input '{name}' for model '{model}'")
        shape = tensor.shape
        if batching and not spec.is_shape_tensor:
            if not shape:
                raise InvalidArgument(
                    f"{prefix}input '{name}' has no shape but model requires batch dimension "
                    f"for '{model}'"
                )
            if batch_size == -1:
                batch_size = shape[0]
            elif shape[0] != batch_size:
                raise InvalidArgument(
                    f"{prefix}input '{name}' batch size does not match other inputs for '{model}'"
                )
    if any(n not in inputs for n in required):
        _count_error(prefix, request, config, required)
    if batching and batch_size > config.max_batch_size:
        raise InvalidArgument(
            f"{prefix}inference request batch-size must be <= {config.max_batch_size} for "
            f"'{model}'"
        )
    for name, tensor in inputs.items():
        spec = config.input_map[name]
        if tensor.datatype is not spec.datatype:
            raise InvalidArgument(
                f"{prefix}inference input '{name}' data-type is '{tensor.datatype.value}', but "
                f"model '{model}' expects '{spec.datatype.value}'"
            )
        dims = tensor.shape[1:] if batching and not spec.is_shape_tensor else tensor.shape
        if len(dims) != len(spec.dims) or any(
            c != -1 and c != d for c, d in zip(spec.dims, dims, strict=True)
        ):
            full = spec.full_shape(config.max_batch_size)
            note = _BATCH_NOTE if batching else ""
            raise InvalidArgument(
                f"{prefix}unexpected shape for input '{name}' for model '{model}'. Expected "
                f"{_dims(full)}, got {_dims(tensor.shape)}. {note}".rstrip()
            )
    return batch_size if batching else 1


def make_work(request: InferenceRequest, config: ModelConfig, reply: Any) -> InferWork:
    """Validate ``request`` for the model (Triton's checks) and wrap it for its scheduler,
    with the signature that decides which requests may share a batch."""
    batch_size = validate_request(request, config)
    if config.sequence is not None:
        sequence_batching.check_request(request, config, batch_size)
    signature = None
    if config.batching is not None:
        signature = tuple(request.inputs[n].shape[1:] if n in request.inputs else None
                          for n in config.shape_checked_inputs)
        if config.has_optional_inputs:
            signature = (signature, frozenset(request.inputs))
    return InferWork(request, reply, batch_size, time.monotonic_ns(), signature,
                     request.priority, request.timeout_us)


class Core:
    """What the frontends may ask of the server."""

    def __init__(self, directory: Directory, *, server_name: str = SERVER_NAME,
                 strict_readiness: bool = True, control_mode: str = "none") -> None:
        self.directory = directory
        self.server_name = server_name
        self.strict_readiness = strict_readiness
        self.control_mode = control_mode
        self.live = True
        self.accepting = False  # ready for traffic: set once start-up loading is done
        self.manager: trio.MemorySendChannel[Any] | None = None  # the ModelManager's inbox
        self.tracer = TraceManager(TraceSettings())  # the server replaces it from its flags
        self.log_manager: Any = None  # nursery.observability.logs.LogManager, set by the server
        self.cache: trio.MemorySendChannel[Any] | None = None  # the ResponseCache's inbox
        self.arrival_log: Any = None  # nursery.observability.arrival_log.ArrivalLog with --arrival-log
        self.shm = SharedMemoryRegistry()  # regions registered through the shm extensions
        # failures the supervision boundaries caught (frontends, manager, model versions)
        self.faults = FaultCounter()

    # -- health and metadata ---------------------------------------------------------------

    def server_live(self) -> bool:
        return self.live

    def server_ready(self) -> bool:
        if not self.accepting:
            return False
        return self.directory.all_ready() if self.strict_readiness else True

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.directory.is_ready(name, version)

    def server_metadata(self) -> dict[str, Any]:
        extensions = list(EXTENSIONS)
        if cuda_shm.available():  # only where CUDA regions can be opened
            extensions.insert(extensions.index("system_shared_memory") + 1, "cuda_shared_memory")
        return {"name": self.server_name, "version": __version__, "extensions": extensions}

    def resolve(self, name: str, version: str = "") -> ModelHandle:
        return self.directory.resolve(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        handle = self.directory.resolve(name, version)
        config = handle.config
        if version:
            versions = [version]
        else:
            entry = self.directory.entry(name)
            versions = [str(v) for v in entry.ready_versions()] if entry else []
        mbs = config.max_batch_size

        def tensors(specs: Any) -> list[dict[str, Any]]:
            return [
                {"name": s.name, "datatype": s.datatype.value, "shape": s.full_shape(mbs)}
                for s in specs
            ]

        return {
            "name": name,
            "versions": versions,
            "platform": config.platform_name,
            "inputs": tensors(config.inputs),
            "outputs": tensors(config.outputs),
        }

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return dict(self.directory.resolve(name, version).config.json)

    # -- inference -------------------------------------------------------------------------

    async def infer(self, request: InferenceRequest,
                    handle: ModelHandle | None = None) -> InferenceResponse:
        """Validate and run one request. ``handle`` saves a lookup when the caller has it."""
        if handle is None:
            handle = self.directory.resolve(request.model_name, request.model_version)
        if self.cache is not None and handle.config.uses_response_cache:
            return await self._cached_infer(request, handle, self.cache)
        return await self._infer_traced(request, handle)

    async def _cached_infer(self, request: InferenceRequest, handle: ModelHandle,
                            cache: trio.MemorySendChannel[Any]) -> InferenceResponse:
        """Ask the ResponseCache first; on a miss run the model and give it the answer."""
        validate_request(request, handle.config)  # an invalid request never reaches the cache
        t0 = time.monotonic_ns()
        key = request_key(handle.name, handle.version, request)
        send, receive = trio.open_memory_channel[Any](1)
        try:
            cache.send_nowait(CacheLookup(key, send))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return await self._infer_traced(request, handle)  # shutting down: no cache
        with receive:
            found = await receive.receive()
        t1 = time.monotonic_ns()
        if found is not None:
            handle.report(CacheOutcome(True, t1 - t0, t1 - t0))
            return InferenceResponse(found.model_name, found.model_version, found.outputs,
                                     request.id, dict(found.parameters))
        response = await self._infer_traced(request, handle)
        t2 = time.monotonic_ns()
        try:
            cache.send_nowait(CacheInsert(key, frozen_copy(response)))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        handle.report(CacheOutcome(False, (t1 - t0) + (time.monotonic_ns() - t2)))
        return response

    async def _infer_traced(self, request: InferenceRequest,
                            handle: ModelHandle) -> InferenceResponse:
        trace = request.trace  # None: not sampled yet; False: sampled, not traced
        own_trace = False
        if trace is None and self.tracer.active:
            trace = request.trace = self.tracer.start(handle.name)
            own_trace = trace is not None
        if trace:
            return await self._traced_infer(request, handle, trace, own_trace)
        return await self._infer(request, handle)

    async def _traced_infer(self, request: InferenceRequest, handle: ModelHandle, trace: Any,
                            own_trace: bool) -> InferenceResponse:
        trace.model_version = handle.version
        trace.request_id = request.id
        trace.stamp("REQUEST_START")
        for name, tensor in request.inputs.items():
            trace.tensor("TENSOR_QUEUE_INPUT", name, tensor.datatype.value, tensor.data)
        try:
            response = await self._infer(request, handle)
            for out in response.outputs:
                trace.tensor("TENSOR_BACKEND_OUTPUT", out.name, out.datatype.value, out.data)
            return response
        finally:
            trace.stamp("REQUEST_END")
            if own_trace:
                trace.finish()

    async def _infer(self, request: InferenceRequest, handle: ModelHandle) -> InferenceResponse:
        work, receive = self.submit(request, handle)
        return await self.wait(work, receive, handle)

    def submit(self, request: InferenceRequest, handle: ModelHandle | None = None
               ) -> tuple[InferWork, trio.MemoryReceiveChannel[Any]]:
        """Validate and queue a request without waiting (a stream queues its requests in the
        order they came, which a sequence needs); :meth:`wait` gets the answer."""
        if handle is None:
            handle = self.directory.resolve(request.model_name, request.model_version)
        send, receive = trio.open_memory_channel[Any](1)
        work = make_work(request, handle.config, send)
        if request.trace:
            request.trace.stamp("QUEUE_START", work.enqueued_ns)
        if self.arrival_log is not None:
            self.arrival_log.record(handle.name, handle.version, work)
        handle.submit(work)
        return work, receive

    async def wait(self, work: InferWork, receive: trio.MemoryReceiveChannel[Any],
                   handle: ModelHandle) -> InferenceResponse:
        try:
            with receive:  # leaving (also by cancellation) tells the scheduler nobody waits
                answer = await receive.receive()
        except trio.Cancelled:
            handle.cancel(work)  # drop it from the queue now rather than at dispatch
            raise
        if isinstance(answer, NurseryError):
            raise answer
        return answer  # type: ignore[no-any-return]

    async def cache_totals(self) -> Any:
        """The ResponseCache's figures (None without a cache)."""
        if self.cache is None:
            return None
        send, receive = trio.open_memory_channel[Any](1)
        try:
            self.cache.send_nowait(CacheStatsQuery(send))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return None
        with receive:
            return await receive.receive()

    # -- model repository extension --------------------------------------------------------

    async def _ask_manager(self, make: Any) -> Any:
        if self.manager is None:
            raise Unavailable("the model manager is not running")
        send, receive = trio.open_memory_channel[Any](1)
        try:
            await self.manager.send(make(send))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise Unavailable("the server is shutting down") from None
        with receive:
            return await receive.receive()

    def _check_explicit(self) -> None:
        if self.control_mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries: list[IndexEntry] | NurseryError = await self._ask_manager(
            lambda reply: IndexRepository(ready_only, reply))
        if isinstance(entries, NurseryError):
            raise entries
        return entries

    async def load_model(self, name: str, config: Any = None,
                         files: dict[str, bytes] | None = None) -> None:
        self._check_explicit()
        error = await self._ask_manager(lambda reply: LoadModel(name, reply, config, files))
        if error is not None:
            raise error

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_explicit()
        error = await self._ask_manager(
            lambda reply: UnloadModel(name, reply, unload_dependents))
        if error is not None:
            raise error

    async def model_statistics(
        self, name: str = "", version: str = ""
    ) -> list[tuple[str, str, StatsSnapshot]]:
        """(model, version, snapshot) for every ready version asked for (all models when
        ``name`` is empty), each from its scheduler."""
        if name:
            if version:
                handles = [self.directory.resolve(name, version)]
            else:
                entry = self.directory.entry(name)
                if entry is None:
                    raise NotFound(f"Request for unknown model: '{name}' is not found")
                handles = [entry.versions[v].handle for v in entry.ready_versions()]  # type: ignore[misc]
                if not handles:
                    raise InvalidArgument(f"requested model '{name}' is not available")
        else:
            handles = [entry.versions[v].handle  # type: ignore[misc]
                       for _, entry in sorted(self.directory.table.models.items())
                       for v in entry.ready_versions()]
        out = []
        for h in handles:
            assert h is not None
            out.append((h.name, h.version_str, await h.query_stats()))
        return out


__all__ = ["Core", "make_work", "validate_request"]

"""The transport-neutral facade every frontend calls.

Frontends decode wire bytes into an :class:`InferenceRequest`, call :meth:`Core.infer` (or a
readiness / metadata / config / repository call), and encode what comes back. The core is
built once, by the server, from a frozen :class:`Services` record; it holds no wiring of its
own and starts nothing. Requests go to models through the :class:`ModelClient`; repository
commands go to the ModelManager's inbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from nursery.actors import mailbox
from nursery.actors.demand import DemandLoader
from nursery.actors.directory import Directory, ModelEntry, ModelHandle, ModelState
from nursery.actors.model_client import ModelClient
from nursery.errors import InvalidArgument, NotFound, NurseryError, Unavailable, Unsupported
from nursery.messages import (
    CacheStatsQuery,
    IndexEntry,
    IndexRepository,
    LoadModel,
    ManagerCommand,
    RegisterRepository,
    UnloadModel,
    UnregisterRepository,
)
from nursery.observability.arrival_log import ArrivalLog
from nursery.observability.logs import LogManager
from nursery.observability.stats import StatsSnapshot
from nursery.observability.tracing import TraceManager
from nursery.runtime.about import VERSION
from nursery.runtime.supervision import FaultCounter
from nursery.scheduling.cache_store import CacheTotals
from nursery.shm import cuda as cuda_shm
from nursery.shm.system import SharedMemoryRegistry
from nursery.types import InferenceRequest, InferenceResponse

# a load with `file:` parameters while --allow-model-file-upload is off (nursery only: Triton
# writes any client's files, a model.py included, and runs them); worded as Triton's refusal
# of client shared memory
FILE_UPLOAD_DISABLED = ("Model file upload is disabled. Start the server with "
                        "'--allow-model-file-upload=true' to enable.")

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


@dataclass(eq=False)
class Lifecycle:
    """The server's own state, which only the server changes."""

    live: bool = True
    accepting: bool = False  # ready for traffic: set once start-up loading is done


@dataclass(frozen=True, slots=True, eq=False)
class Services:
    """Everything the core needs, built once by the server (or by a test)."""

    directory: Directory
    client: ModelClient
    manager: trio.MemorySendChannel[ManagerCommand]  # the ModelManager's inbox
    shm: SharedMemoryRegistry = field(default_factory=SharedMemoryRegistry)
    faults: FaultCounter = field(default_factory=FaultCounter)
    log_manager: LogManager | None = None  # None: the logging extension answers UNAVAILABLE
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    server_name: str = SERVER_NAME
    strict_readiness: bool = True
    control_mode: str = "none"  # --model-control-mode
    allow_model_file_upload: bool = False  # --allow-model-file-upload: `file:` load parameters
    # --model-load-on-demand / --model-load-budget (explicit mode); None: neither
    demand: DemandLoader | None = None


class Core:
    """What the frontends may ask of the server."""

    __slots__ = ("services", "directory", "client", "shm", "faults", "tracer", "log_manager",
                 "arrival_log", "lifecycle", "_manager", "demand")

    def __init__(self, services: Services) -> None:
        self.services = services
        # read by the frontends for the extensions they serve themselves
        self.directory = services.directory
        self.client = services.client
        services.client.core = self  # a model's own load / unload / readiness calls
        self.shm = services.shm
        self.faults = services.faults
        self.tracer: TraceManager = services.client.tracer
        self.log_manager = services.log_manager
        self.arrival_log: ArrivalLog | None = services.client.arrival_log
        self.lifecycle = services.lifecycle
        self._manager = services.manager
        self.demand = services.demand if services.demand and services.demand.active else None

    @classmethod
    def over(cls, directory: Directory,
             manager: trio.MemorySendChannel[ManagerCommand] | None = None,
             **services: Any) -> Core:
        """A core over ``directory`` with a model client of its own (actor tests, benchmarks,
        embedding); repository commands go to ``manager`` (none: they answer UNAVAILABLE).
        Call it from the trio thread."""
        if manager is None:
            manager, receive = trio.open_memory_channel[ManagerCommand](0)
            receive.close()
        return cls(Services(directory, ModelClient(directory), manager, **services))

    @property
    def cache(self) -> trio.MemorySendChannel[Any] | None:
        """The ResponseCache's inbox (None without --cache-config)."""
        return self.client.cache

    @property
    def accepting(self) -> bool:
        return self.lifecycle.accepting

    # -- health and metadata ---------------------------------------------------------------

    def server_live(self) -> bool:
        return self.lifecycle.live

    async def server_ready(self) -> bool:
        if not self.lifecycle.accepting:
            return False
        if not self.services.strict_readiness:
            return True
        return await self.directory.check_all_ready()

    async def model_ready(self, name: str, version: str = "") -> bool:
        """Ready, as Triton answers it: a READY version whose instances are healthy and
        whose backends' readiness hooks (a Python model's ``is_ready()``) say so."""
        return await self.directory.check_ready(name, version)

    async def check_trace_model(self, name: str) -> None:
        """A model's trace settings are read or changed only while it is ready (Triton's
        trace-setting handlers ask ModelIsReady, and refuse with these words)."""
        if not await self.model_ready(name):
            raise InvalidArgument(f"Request for unknown model : {name}")

    def server_metadata(self) -> dict[str, Any]:
        extensions = list(EXTENSIONS)
        if not self.shm.allow_client:  # --allow-client-shm is off: clients cannot use it
            extensions.remove("system_shared_memory")
        elif cuda_shm.available():  # only where CUDA regions can be opened
            extensions.insert(extensions.index("system_shared_memory") + 1, "cuda_shared_memory")
        return {"name": self.services.server_name, "version": VERSION,
                "extensions": extensions}

    def resolve(self, name: str, version: str = "") -> ModelHandle:
        return self.directory.resolve(name, version)

    def load_durations(self) -> dict[tuple[str, str], float]:
        """(model, version) -> seconds its load took, for every ready version (the model by
        its identifier: its name, or with --model-namespacing ``<namespace>::<name>``)."""
        return {(key, str(v)): status.load_secs
                for key, entry in self.directory.table.models.items()
                for v, status in entry.versions.items()
                if status.state is ModelState.READY}

    async def acquire(self, name: str, version: str = "") -> ModelHandle:
        """The version an inference request goes to: :meth:`resolve`, and with
        ``--model-load-on-demand`` a model that is not loaded is loaded first (its use is
        counted for ``--model-load-budget``)."""
        if self.demand is None:
            return self.directory.resolve(name, version)
        return await self.demand.acquire(name, version)

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
        """Check and run one request. ``handle``: the version the frontend resolved (once)."""
        return await self.client.infer(request, handle)

    async def cache_totals(self) -> CacheTotals | None:
        """The ResponseCache's figures (None without a cache)."""
        if self.cache is None:
            return None
        try:
            return await mailbox.ask(self.cache, CacheStatsQuery, gone="no cache")
        except Unavailable:
            return None

    # -- model repository extension --------------------------------------------------------

    async def _ask_manager(self, make: Any) -> Any:
        return await mailbox.ask(self._manager, make, gone="the server is shutting down")

    def _check_explicit(self) -> None:
        if self.services.control_mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries: list[IndexEntry] | NurseryError = await self._ask_manager(
            lambda reply: IndexRepository(ready_only, reply))
        if isinstance(entries, NurseryError):
            raise entries
        return entries

    async def load_model(self, name: str, config: Any = None,
                         files: dict[str, bytes] | None = None, *,
                         any_mode: bool = False) -> None:
        """Load (or reload) ``name``. ``any_mode``: the server's own load, in any control
        mode (the in-process API's bound functions); clients' loads need explicit mode."""
        if not any_mode:
            self._check_explicit()
        if files and not self.services.allow_model_file_upload:
            raise Unsupported(FILE_UPLOAD_DISABLED)
        error = await self._ask_manager(lambda reply: LoadModel(name, reply, config, files))
        if error is not None:
            raise error
        if self.demand is not None:  # a load through the API counts against the budget too
            await self.demand.enforce(keep=name)

    async def unload_model(self, name: str, unload_dependents: bool = False, *,
                           any_mode: bool = False) -> None:
        if not any_mode:
            self._check_explicit()
        error = await self._ask_manager(
            lambda reply: UnloadModel(name, reply, unload_dependents))
        if error is not None:
            raise error

    async def register_repository(self, path: Path,
                                  names: tuple[tuple[str, str], ...] = ()) -> None:
        """Add a model repository whose folders ``names`` maps serve as those models (Triton's
        repository registration, used by the SageMaker multi-model endpoint); explicit
        model control only, as there."""
        if self.services.control_mode != "explicit":
            raise Unsupported("repository registration is not allowed if model control mode "
                              "is not EXPLICIT")
        error = await self._ask_manager(lambda reply: RegisterRepository(path, names, reply))
        if error is not None:
            raise error

    async def unregister_repository(self, path: Path) -> None:
        if self.services.control_mode != "explicit":
            raise Unsupported("repository unregistration is not allowed if model control "
                              "mode is not EXPLICIT")
        error = await self._ask_manager(lambda reply: UnregisterRepository(path, reply))
        if error is not None:
            raise error

    async def version_statistics(self) -> list[tuple[str, ModelEntry, ModelHandle,
                                                      StatsSnapshot]]:
        """(identifier, model, version, snapshot) of every ready version: the metrics
        port's view (with --model-namespacing two models may share a name, not an
        identifier: ``<namespace>::<name>``)."""
        out = []
        for key, entry in sorted(self.directory.table.models.items()):
            for v in entry.ready_versions():
                handle = entry.versions[v].handle
                assert handle is not None
                out.append((key, entry, handle, await handle.query_stats()))
        return out

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


__all__ = ["Core", "Lifecycle", "Services"]

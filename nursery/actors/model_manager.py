"""ModelManager: owns every model version's lifecycle and the nursery it lives in.

Only this actor changes a version's state (UNKNOWN, LOADING, READY, UNLOADING, UNAVAILABLE)
and it publishes each change as a new immutable table in the :class:`Directory`. A version is
served by its own nursery (its instance workers and its scheduler); loading opens it, starts
the workers (each loads its backend on its own thread), then the scheduler, and only then
marks the version READY. Unloading marks it UNLOADING, closes the intake, lets the scheduler
finish the queue and the workers finish their batches, bounded by the unload timeout.

Commands arrive on the inbox (``LoadModel``, ``UnloadModel``, ``RepositoryIndex``); when the
inbox closes (server shutdown) every model is drained and unloaded.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

import trio

from nursery.actors import ensemble, instance_worker, scheduler
from nursery.actors import model_client as gateway
from nursery.actors.directory import Directory, ModelEntry, ModelHandle, ModelState, ModelTable, VersionStatus
from nursery.backends.base import get_factory
from nursery.config.model import ModelConfig, read_model_config
from nursery.config.repository import (
    ModelFingerprint,
    ModelLocation,
    check_model_name,
    fingerprint,
    safe_relative_path,
    scan,
)
from nursery.config.warmup import warmup_samples
from nursery.errors import (
    ConfigError,
    ErrorKind,
    InternalError,
    InvalidArgument,
    NurseryError,
    Unavailable,
)
from nursery.messages import CloseIntake, ExecuteBatch, InferWork
from nursery.runtime.supervision import Boundary, FaultCounter
from nursery.scheduling.batch_policy import DynamicBatchPolicy
from nursery.scheduling.fifo import FifoPolicy
from nursery.scheduling.sequence_policy import SequencePolicy
from nursery.schema import inference as pb

log = logging.getLogger("nursery.manager")

MAX_QUEUE = 65536  # requests the default scheduler holds before rejecting (UNAVAILABLE)
# Places per instance under the default scheduler: the thread holds its next request while it
# computes (see nursery/scheduling/fifo.py).
DEFAULT_SCHEDULER_SLOTS = 2
# A version that fails while serving is reloaded at most RESTARTS times in RESTART_WINDOW
# seconds (Erlang/OTP's restart intensity), then left UNAVAILABLE with the reason.
RESTARTS = 3
RESTART_WINDOW = 60.0

# Triton's Status code strings, used in the "reason" of a failed version
_CODE_STRINGS = {
    ErrorKind.UNKNOWN: "Unknown",
    ErrorKind.INTERNAL: "Internal",
    ErrorKind.NOT_FOUND: "Not found",
    ErrorKind.INVALID_ARG: "Invalid argument",
    ErrorKind.UNAVAILABLE: "Unavailable",
    ErrorKind.UNSUPPORTED: "Unsupported",
    ErrorKind.ALREADY_EXISTS: "Already exists",
    ErrorKind.CANCELLED: "Cancelled",
    ErrorKind.DEADLINE_EXCEEDED: "Deadline exceeded",
    ErrorKind.RESOURCE_EXHAUSTED: "Resource exhausted",
}


def failure_reason(exc: BaseException) -> str:
    """Triton's ``Status::AsString()`` form: ``"Invalid argument: <message>"``."""
    error = first_error(exc)
    if isinstance(error, NurseryError):
        return f"{_CODE_STRINGS[error.kind]}: {error.message}"
    return f"Internal: {error}"


def first_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (trio wraps nursery failures in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


@dataclass(frozen=True, slots=True, eq=False)
class LoadModel:
    """Load or reload a model; ``config`` and ``files`` override what is on disk."""

    name: str
    reply: trio.MemorySendChannel[NurseryError | None]
    config: pb.ModelConfig | None = None
    files: Mapping[str, bytes] | None = None  # "<version>/<path>" -> content (needs config)


@dataclass(frozen=True, slots=True, eq=False)
class UnloadModel:
    name: str
    reply: trio.MemorySendChannel[NurseryError | None]
    unload_dependents: bool = False


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: int | None = None
    state: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class IndexRepository:
    ready_only: bool
    reply: trio.MemorySendChannel[list[IndexEntry]]


class StartupError(Exception):
    pass


@dataclass(eq=False)
class _ModelLock:
    lock: trio.Lock = field(default_factory=trio.Lock)
    users: int = 0


@dataclass(eq=False)
class _Live:
    """A running version: its handle, the manager's control channel, its cancel scope."""

    handle: ModelHandle
    control: trio.MemorySendChannel[Any]
    scope: trio.CancelScope
    done: trio.Event


class _Manager:
    def __init__(
        self,
        repositories: tuple[Path, ...],
        directory: Directory,
        nursery: trio.Nursery,
        *,
        auto_complete: bool,
        unload_timeout: float,
        rate_limiter: Any = None,
        faults: FaultCounter | None = None,
    ) -> None:
        self.faults = faults or FaultCounter()
        self.locks: dict[str, _ModelLock] = {}  # per model, while a command holds or awaits it
        self.loads: dict[str, trio.CancelScope] = {}  # load commands running, by model
        self.restarts: dict[str, list[float]] = {}  # when each model's failed versions restarted
        self.restarting: set[trio.CancelScope] = set()  # restarts in progress
        self.stopping = False  # unload_all has begun: nothing is started any more
        self.rate_limiter = rate_limiter  # a RateLimiterClient with --rate-limit execution_count
        self.repositories = repositories
        self.directory = directory
        self.nursery = nursery
        self.auto_complete = auto_complete
        self.unload_timeout = unload_timeout
        self.entries: dict[str, ModelEntry] = {}
        self.live: dict[tuple[str, int], _Live] = {}
        self.config_limiter = trio.CapacityLimiter(4)
        # what each model's folder held when it last loaded, to reload only on change
        self.loaded_from: dict[str, ModelFingerprint | None] = {}
        self.override_root = Path(tempfile.mkdtemp(prefix="nursery-overrides-"))
        self.loading: dict[str, trio.Event] = {}  # models being loaded by load_many
        self.ensembles_waiting: set[str] = set()
        # models loaded only because an ensemble needed them (never asked for by name):
        # what unloading an ensemble with unload_dependents takes along
        self.dependency_only: set[str] = set()

    # -- commands (each in its own task) ----------------------------------------------------

    async def serve_command(self, command: LoadModel | UnloadModel) -> None:
        """One repository command, answered exactly once whatever happens: its result, an
        INTERNAL error if the command failed unexpectedly, or UNAVAILABLE if the server stops
        (or an unload cancels a load) before it is done."""
        what = f"{'load' if isinstance(command, LoadModel) else 'unload'} of model " \
            f"'{command.name[:100]}'"
        result: NurseryError | None = Unavailable(f"{what} did not finish: the server is stopping")
        try:
            with Boundary(self.faults, "manager", log, what) as boundary:
                result = await self._command(command)
            if boundary.failure is not None:
                result = InternalError(f"{what} failed: {boundary.failure}")
        finally:
            _reply(command.reply, result)

    async def _command(self, command: LoadModel | UnloadModel) -> NurseryError | None:
        name = command.name
        if isinstance(command, UnloadModel):
            scope = self.loads.get(name)
            if scope is not None:  # an unload stops a load still in progress (hung, perhaps)
                scope.cancel()
            async with self._lock(name):
                return await self.unload(name, command.unload_dependents)
        async with self._lock(name):
            self.dependency_only.discard(name)  # asked for by name now
            with trio.CancelScope() as scope:
                self.loads[name] = scope
                try:
                    return await self.load(name, command.config, command.files)
                finally:
                    if self.loads.get(name) is scope:
                        del self.loads[name]
            return Unavailable(f"load of model '{name}' was stopped by an unload of it")

    @asynccontextmanager
    async def _lock(self, name: str) -> AsyncIterator[None]:
        """Commands for one model in arrival order; the lock is forgotten once unused, so
        names that clients make up cost nothing after their command."""
        entry = self.locks.get(name)
        if entry is None:
            entry = self.locks[name] = _ModelLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self.locks[name]

    def answer_index(self, ready_only: bool) -> list[IndexEntry] | NurseryError:
        with Boundary(self.faults, "manager", log, "repository index") as boundary:
            return self.index(ready_only)
        return InternalError(f"repository index failed: {boundary.failure}")

    # -- state (the only writer) -----------------------------------------------------------

    def _set(self, name: str, version: int, state: ModelState, reason: str = "",
             handle: ModelHandle | None = None) -> None:
        entry = self.entries.get(name) or ModelEntry(name, MappingProxyType({}))
        versions = dict(entry.versions)
        versions[version] = VersionStatus(version, state, reason, handle)
        self.entries[name] = ModelEntry(name, MappingProxyType(versions), "", entry.config)
        self._publish()

    def _set_model_failure(self, name: str, reason: str) -> None:
        entry = self.entries.get(name) or ModelEntry(name, MappingProxyType({}))
        self.entries[name] = ModelEntry(name, entry.versions, reason, entry.config)
        self._publish()

    def _publish(self) -> None:
        self.directory.publish(ModelTable(MappingProxyType(dict(self.entries))))

    # -- loading ---------------------------------------------------------------------------

    async def load_many(self, names: Iterable[str]) -> list[str]:
        """Load models concurrently; returns the names that failed."""
        failed: list[str] = []
        names = list(names)
        for name in names:  # ensembles wait for the composing models loading beside them
            self.loading.setdefault(name, trio.Event())

        async def one(name: str) -> None:
            self.dependency_only.discard(name)
            try:
                error = await self.load(name)
            finally:
                event = self.loading.pop(name, None)
                if event is not None:
                    event.set()
            if error is not None:
                failed.append(name)

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(one, name)
        return sorted(failed)

    async def load(self, name: str, override: pb.ModelConfig | None = None,
                   files: Mapping[str, bytes] | None = None,
                   force: bool = False) -> NurseryError | None:
        """Load (or reload) every version the policy selects; versions it no longer selects
        are drained and unloaded. A model whose folder did not change since it loaded
        successfully is left as it is (unless a config override is given). Returns the error,
        if any; a failed reload leaves what was serving still serving."""
        poll_error = f"failed to load '{name}', failed to poll from model repository"
        invalid = check_model_name(name)
        if invalid is not None:
            return InternalError(f"{poll_error}: {invalid}")
        if files and override is None:
            return InternalError(f"{poll_error}: file overrides require a 'config' override")
        repo = scan(self.repositories)
        if name in repo.duplicates and not files:
            where = ", ".join(str(p) for p in repo.duplicates[name])
            reason = f"model '{name}' appears in more than one repository ({where})"
            self._set_model_failure(name, f"Invalid argument: {reason}")
            log.error("failed to load '%s': %s", name, reason)
            return NurseryError(reason, ErrorKind.INVALID_ARG)
        if files:
            try:
                location = self._write_override(name, files)
            except NurseryError as exc:
                return exc
        else:
            found = repo.models.get(name)
            if found is None:
                return InternalError(poll_error)
            location = found
        current = None
        if override is None and not files:
            current = await trio.to_thread.run_sync(fingerprint, location.path)
            if current == self.loaded_from.get(name) and self._serving(name) and not force:
                return None  # nothing changed since it loaded: nothing to do
        try:
            config, versions = await trio.to_thread.run_sync(
                partial(read_model_config, location.path, name, backends=get_factory,
                        auto_complete=self.auto_complete,
                        proto=override),
                limiter=self.config_limiter,
            )
        except NurseryError as exc:
            reason = failure_reason(exc)
            log.error("failed to load '%s': %s", name, reason)
            if not self._serving(name):
                self._set_model_failure(name, reason)
            return InternalError(f"{poll_error}: {exc.message}")
        entry = self.entries.get(name)
        self.entries[name] = ModelEntry(
            name, entry.versions if entry else MappingProxyType({}), "", config
        )
        errors: dict[int, NurseryError] = {}

        async def one(version: int) -> None:
            error = await self._load_version(location, config, version)
            if error is not None:
                errors[version] = error

        async with trio.open_nursery() as nursery:
            for version in versions:
                nursery.start_soon(one, version)
        if errors:  # Triton's aggregate: one line per version that failed
            return InvalidArgument(f"load failed for model '{name}': " + "".join(
                f"version {v} is at UNAVAILABLE state: {failure_reason(e)};\n"
                for v, e in sorted(errors.items())))
        dropped = sorted(v for (n, v) in self.live if n == name and v not in versions)
        async with trio.open_nursery() as nursery:
            for version in dropped:  # the new version policy no longer selects these
                nursery.start_soon(self._unload_version, name, version)
        self.loaded_from[name] = current
        return None

    def _serving(self, name: str) -> bool:
        return any(n == name for (n, _) in self.live)

    def _write_override(self, name: str, files: Mapping[str, bytes]) -> ModelLocation:
        """Lay out ``file:`` overrides as a model folder of their own, never outside it."""
        folder = self.override_root / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for raw_path, content in files.items():
            rel = safe_relative_path(raw_path)
            target = (folder / rel).resolve() if rel else None
            if target is None or folder.resolve() not in target.parents:
                raise InternalError(
                    f"failed to load '{name}', failed to poll from model repository: Invalid "
                    f"file parameter 'file:{raw_path}' must stay within model directory "
                    "(a relative path inside the model folder)")
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
            except OSError as exc:  # a path that is a file and a folder at once, too long, ...
                raise InternalError(
                    f"failed to load '{name}', failed to poll from model repository: file "
                    f"parameter 'file:{raw_path[:200]}' cannot be written: "
                    f"{exc.strerror or exc}") from None
        return ModelLocation(name, folder, self.override_root)

    def index(self, ready_only: bool) -> list[IndexEntry]:
        """Every model in the repositories or known to the manager, with each version's state."""
        repo = scan(self.repositories)
        out: list[IndexEntry] = []
        for name in sorted({*repo.models, *repo.duplicates}):  # Triton lists repository folders
            if name in repo.duplicates:
                if not ready_only:
                    out.append(IndexEntry(name, None, ModelState.UNAVAILABLE.value,
                                          "model appears in two or more repositories"))
                continue
            entry = self.entries.get(name)
            if entry is None or (not entry.versions and not entry.reason):
                if not ready_only:
                    out.append(IndexEntry(name))
                continue
            if not entry.versions:
                if not ready_only:
                    out.append(IndexEntry(name, None, ModelState.UNAVAILABLE.value, entry.reason))
                continue
            for version, status in sorted(entry.versions.items()):
                if ready_only and status.state is not ModelState.READY:
                    continue
                out.append(IndexEntry(name, version, status.state.value, status.reason))
        return out

    async def _load_version(
        self, location: ModelLocation, config: ModelConfig, version: int
    ) -> NurseryError | None:
        name = location.name
        old = self.live.get((name, version))
        if old is None:  # a reload keeps the old one READY and serving until the new one is
            self._set(name, version, ModelState.LOADING)
        log.info("loading: %s:%d", name, version)
        scope = trio.CancelScope()
        done = trio.Event()
        try:
            handle, control = await self.nursery.start(
                partial(self._supervise_version, location, config, version, scope, done)
            )
        except BaseException as exc:
            if isinstance(first_error(exc), trio.Cancelled):
                raise
            reason = failure_reason(exc)
            log.error("failed to load '%s' version %d: %s", name, version, reason)
            if old is not None:  # a failed reload leaves the old version serving
                self._set(name, version, ModelState.READY, "", old.handle)
            else:
                self._set(name, version, ModelState.UNAVAILABLE, reason)
            error = first_error(exc)
            return error if isinstance(error, NurseryError) else NurseryError(reason, ErrorKind.INTERNAL)
        self.live[(name, version)] = _Live(handle, control, scope, done)
        self._set(name, version, ModelState.READY, "", handle)
        log.info("successfully loaded '%s' version %d", name, version)
        if old is not None:  # the new version serves; the old one drains
            self.nursery.start_soon(self._drain, old)
        return None

    async def _supervise_version(
        self,
        location: ModelLocation,
        config: ModelConfig,
        version: int,
        scope: trio.CancelScope,
        done: trio.Event,
        task_status: trio.TaskStatus[tuple[ModelHandle, trio.MemorySendChannel[Any]]],
    ) -> None:
        """The supervision boundary of one serving version. A failure while loading goes to
        the loader (the load fails); a failure once it serves (an actor of the version
        crashed) marks the version UNAVAILABLE with the reason, its requests having been
        answered by the actors as they stopped, and the model is reloaded, at most
        ``RESTARTS`` times in ``RESTART_WINDOW`` seconds (then it stays UNAVAILABLE)."""
        serving: list[ModelHandle] = []

        class _Started:
            def started(self, value: tuple[ModelHandle, trio.MemorySendChannel[Any]]) -> None:
                serving.append(value[0])
                task_status.started(value)

        name = location.name
        try:
            await self._serve_version(location, config, version, scope, done,
                                      task_status=_Started())  # type: ignore[arg-type]
            return
        except BaseException as exc:
            if not serving:  # still loading: the loader reports the failure
                raise
            error = exc
        with Boundary(self.faults, "model", log, f"model '{name}' version {version}") as b:
            raise error  # cancellation goes on up; a failure is recorded here
        live = self.live.get((name, version))
        if live is not None and live.handle is serving[0]:
            del self.live[(name, version)]
            self._set(name, version, ModelState.UNAVAILABLE, f"Internal: {b.failure}")
            now = trio.current_time()
            recent = [t for t in self.restarts.get(name, []) if now - t < RESTART_WINDOW]
            if self.stopping:
                pass  # the server is stopping: nothing to restart
            elif len(recent) < RESTARTS:
                self.restarts[name] = [*recent, now]
                log.error("model '%s' version %d failed while serving; restarting it", name,
                          version)
                self.nursery.start_soon(self._restart, name)
            else:
                log.error("model '%s' version %d failed while serving, %d times in %.0f s: "
                          "left UNAVAILABLE", name, version, len(recent) + 1, RESTART_WINDOW)

    async def _restart(self, name: str) -> None:
        """Reload a model whose version failed; the shutdown cancels restarts in progress, so
        nothing comes back to life behind ``unload_all``."""
        with trio.CancelScope() as scope, \
                Boundary(self.faults, "manager", log, f"restart of model '{name}'"):
            self.restarting.add(scope)
            try:
                async with self._lock(name):
                    if name in self.restarts and not self.stopping:  # not unloaded meanwhile
                        await self.load(name, force=True)
            finally:
                self.restarting.discard(scope)

    async def _serve_version(
        self,
        location: ModelLocation,
        config: ModelConfig,
        version: int,
        scope: trio.CancelScope,
        done: trio.Event,
        task_status: trio.TaskStatus[tuple[ModelHandle, trio.MemorySendChannel[Any]]],
    ) -> None:
        """The life of one version: its own nursery holding its workers and scheduler."""
        name = location.name
        if config.ensemble is not None:
            await self._serve_ensemble(config, version, scope, done, task_status)
            return
        version_path = location.path / str(version)
        factory = get_factory(config.backend, name)
        placements = config.placements()
        warmup = tuple(await trio.to_thread.run_sync(warmup_samples, config,
                                                     limiter=self.config_limiter))
        # Unbounded: internal notices (InstanceReady, CloseIntake) must always get in. The
        # scheduler takes every message at once; its policy bounds the queue it keeps.
        intake, inbox = trio.open_memory_channel[Any](math.inf)
        policy: Any
        capacity: float = 0  # the workers' inboxes: their slots (below)
        if config.sequence is not None:
            # the SequenceBatcher: one batch at a time per instance; its inbox also carries
            # ReleaseSlots notices, so it is unbounded (the policy bounds the batches)
            slots = 1
            capacity = math.inf
            policy = SequencePolicy[InferWork](
                config.sequence.schedule, len(placements), model=name,
                describe=lambda work: work.request)
        elif config.batching is not None:
            # the DynamicBatcher: batches form while instances are busy, so an instance takes
            # one batch at a time
            slots = 1
            policy = DynamicBatchPolicy[InferWork](config.batching)
        else:
            slots = DEFAULT_SCHEDULER_SLOTS
            policy = FifoPolicy[InferWork](slots, MAX_QUEUE)
        try:
            with scope:
                async with trio.open_nursery() as version_nursery:
                    worker_channels: list[trio.MemorySendChannel[ExecuteBatch]] = []
                    async with trio.open_nursery() as starting:
                        for placement in placements:
                            send, receive = trio.open_memory_channel[ExecuteBatch](
                                capacity or slots)
                            worker_channels.append(send)
                            starting.start_soon(
                                version_nursery.start,
                                partial(
                                    instance_worker.run,
                                    config=config,
                                    version=str(version),
                                    version_path=version_path,
                                    placement=placement,
                                    factory=factory,
                                    inbox=receive,
                                    scheduler=intake.clone(),
                                    slots=slots,
                                    warmup=warmup,
                                    rate_limiter=self.rate_limiter,
                                ),
                            )
                    await version_nursery.start(
                        partial(
                            scheduler.run,
                            name=name,
                            policy=policy,
                            inbox=inbox,
                            instances=worker_channels,
                            preserve_ordering=bool(config.batching
                                                   and config.batching.preserve_ordering),
                        )
                    )
                    handle = ModelHandle(name, version, config, intake)
                    task_status.started((handle, intake.clone()))
        finally:
            intake.close()
            done.set()

    # -- ensembles -------------------------------------------------------------------------

    async def _serve_ensemble(
        self,
        config: ModelConfig,
        version: int,
        scope: trio.CancelScope,
        done: trio.Event,
        task_status: trio.TaskStatus[tuple[ModelHandle, trio.MemorySendChannel[Any]]],
    ) -> None:
        """An ensemble version: its composing models checked, then its EnsembleScheduler."""
        intake, inbox = trio.open_memory_channel[Any](math.inf)
        try:
            await self._check_ensemble(config)
            gate = gateway.current_or_new(self.directory)
            with scope:
                async with trio.open_nursery() as version_nursery:
                    await version_nursery.start(partial(
                        ensemble.run, plan=config.ensemble, version=str(version),
                        infer=gate.infer, inbox=inbox,
                        stream=gate.stream if config.decoupled else None, faults=self.faults))
                    handle = ModelHandle(config.name, version, config, intake)
                    task_status.started((handle, intake.clone()))
        finally:
            intake.close()
            done.set()

    async def _check_ensemble(self, config: ModelConfig) -> None:
        """Every step's model is loaded (loading it first when it never was), its inputs and
        outputs exist, and each ensemble tensor has one datatype along the graph."""
        plan = config.ensemble
        assert plan is not None
        where = f"ensemble '{config.name}'"
        self.ensembles_waiting.add(config.name)
        try:
            for model in sorted(plan.models()):
                if model == config.name or model in self.ensembles_waiting:
                    raise ConfigError(f"circular dependency between ensembles: {where} and "
                                      f"'{model}' use each other")
                event = self.loading.get(model)
                if event is not None:
                    await event.wait()
                elif not self._serving(model):  # never loaded, unloaded, or failed
                    await self.load(model)  # Triton loads an ensemble's models with it
                    self.dependency_only.add(model)
        finally:
            self.ensembles_waiting.discard(config.name)
        types = {t.name: t.datatype for t in config.inputs}
        types.update((t.name, t.datatype) for t in config.outputs)
        for i, step in enumerate(plan.steps):
            label = f"{where} step {i}"
            try:
                handle = self.directory.resolve(step.model_name, step.version_str)
            except NurseryError as exc:
                entry = self.directory.entry(step.model_name)
                failure = ""
                if entry is not None:
                    reasons = [s.reason for s in entry.versions.values() if s.reason]
                    failure = (entry.reason or (reasons[0] if reasons else ""))
                raise ConfigError(
                    f"{where} depends on '{step.model_name}' which has no loaded version"
                    + (f". Model '{step.model_name}' loading failed with error: {failure}"
                       if failure else f": {exc.message}")) from None
            model = handle.config
            if model.decoupled and not config.decoupled:
                raise ConfigError(
                    f"{label}: model '{model.name}' is decoupled, so the ensemble must be too: "
                    f"add 'model_transaction_policy {{ decoupled: true }}' to ensemble "
                    f"'{config.name}' (its responses then come as a stream, over gRPC "
                    "ModelStreamInfer)")
            for what, mapping, specs in (("input", step.input_map, model.input_map),
                                         ("output", step.output_map, model.output_map)):
                for tensor_name, ensemble_tensor in mapping.items():
                    spec = specs.get(tensor_name)
                    if spec is None:
                        raise ConfigError(
                            f"{label}: model '{model.name}' has no {what} '{tensor_name}' "
                            f"(it has: {', '.join(sorted(specs))})")
                    seen = types.setdefault(ensemble_tensor, spec.datatype)
                    if seen is not spec.datatype:
                        raise ConfigError(
                            f"{label}: ensemble tensor '{ensemble_tensor}' is {seen.value} "
                            f"elsewhere but {what} '{tensor_name}' of model '{model.name}' is "
                            f"{spec.datatype.value}")

    # -- unloading -------------------------------------------------------------------------

    async def _drain(self, live: _Live) -> None:
        """Stop intake, let queued and running requests finish (bounded), then end."""
        live.handle.intake.close()
        try:
            live.control.send_nowait(CloseIntake())
        except (trio.ClosedResourceError, trio.BrokenResourceError, trio.WouldBlock):
            pass
        live.control.close()
        live.scope.deadline = trio.current_time() + self.unload_timeout
        await live.done.wait()

    async def unload(self, name: str, dependents: bool = False) -> NurseryError | None:
        """Unload every version of ``name``. With ``dependents`` (Triton's
        ``unload_dependents``), then also the models an ensemble was made of that were loaded
        only along with an ensemble and that no ensemble still loaded uses, recursively."""
        versions = sorted(v for (n, v) in self.live if n == name)
        composing = set()
        for version in versions:
            plan = self.live[(name, version)].handle.config.ensemble
            if plan is not None:
                composing |= set(plan.models())
        self.loaded_from.pop(name, None)  # unloading what is not loaded succeeds, as in Triton
        self.restarts.pop(name, None)
        self.dependency_only.discard(name)
        async with trio.open_nursery() as nursery:
            for version in versions:
                nursery.start_soon(self._unload_version, name, version)
        if dependents:
            still_used = set()
            for live in self.live.values():
                plan = live.handle.config.ensemble
                if plan is not None:
                    still_used |= set(plan.models())
            for model in sorted((composing & self.dependency_only) - still_used - {name}):
                log.info("unloading '%s' with '%s' (unload_dependents)", model, name)
                await self.unload(model, dependents=True)
        return None

    async def _unload_version(self, name: str, version: int) -> None:
        live = self.live.get((name, version))
        if live is None:
            return
        self._set(name, version, ModelState.UNLOADING, "", None)
        log.info("unloading: %s:%d", name, version)
        await self._drain(live)
        if self.live.get((name, version)) is live:
            del self.live[(name, version)]
        self._set(name, version, ModelState.UNAVAILABLE, "unloaded")
        log.info("successfully unloaded '%s' version %d", name, version)

    async def unload_all(self) -> None:
        self.stopping = True
        for scope in self.restarting:
            scope.cancel()
        # ensembles first: their requests in flight still need the models they are made of
        ensembles = {n for (n, _), live in self.live.items()
                     if live.handle.config.ensemble is not None}
        for group in (ensembles, {n for (n, _) in self.live} - ensembles):
            async with trio.open_nursery() as nursery:
                for name in sorted(group):
                    nursery.start_soon(self.unload, name)


async def run(
    *,
    repositories: tuple[Path, ...],
    directory: Directory,
    inbox: trio.MemoryReceiveChannel[Any],
    startup_models: list[str],
    exit_on_error: bool,
    auto_complete: bool = True,
    unload_timeout: float = 30.0,
    rate_limiter: Any = None,
    faults: FaultCounter | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load ``startup_models``, then serve commands until the inbox closes, then unload all.

    ``task_status.started`` reports the models that failed to load. With ``exit_on_error``
    a failure raises :class:`StartupError` instead.

    Commands are served concurrently, each in its own task inside a supervision boundary:
    commands for one model run one after the other (a per-model lock, in arrival order), so a
    slow or hung load or unload holds up only that model; the index is answered at once.
    """
    async with trio.open_nursery() as nursery:
        manager = _Manager(
            repositories, directory, nursery,
            auto_complete=auto_complete, unload_timeout=unload_timeout,
            rate_limiter=rate_limiter, faults=faults or FaultCounter(),
        )
        failed = await manager.load_many(startup_models)
        if failed and exit_on_error:
            await manager.unload_all()
            raise StartupError("failed to load all models")
        task_status.started(failed)
        async with trio.open_nursery() as commands:
            async with inbox:
                async for command in inbox:
                    if isinstance(command, IndexRepository):
                        _reply(command.reply, manager.answer_index(command.ready_only))  # type: ignore[arg-type]
                    else:
                        commands.start_soon(manager.serve_command, command)
            commands.cancel_scope.cancel()  # shutting down: loads still running stop
        await manager.unload_all()
        shutil.rmtree(manager.override_root, ignore_errors=True)


def _reply(channel: trio.MemorySendChannel[NurseryError | None], value: NurseryError | None) -> None:
    try:
        channel.send_nowait(value)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    channel.close()


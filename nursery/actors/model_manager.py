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
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

import trio

from nursery.actors import mailbox
from nursery.actors.directory import (
    Directory,
    ModelEntry,
    ModelHandle,
    ModelState,
    ModelTable,
    VersionStatus,
    repository_index,
)
from nursery.actors.model_client import ModelClient
from nursery.actors.version import Resize, Started, serve_ensemble, serve_version
from nursery.backends.base import Backends
from nursery.config import pbtext
from nursery.config.ensemble_check import check_wiring
from nursery.config.model import ModelConfig, read_model_config
from nursery.config.repository import (
    ModelFingerprint,
    ModelLocation,
    RepositoryScan,
    Root,
    check_model_name,
    model_fingerprint,
    scan,
    write_override,
)
from nursery.config.storage import mirror, open_store
from nursery.config.storage.base import RemoteModel, StorageError
from nursery.config.storage.url import CloudRoot
from nursery.config.warmup import warmup_samples
from nursery.errors import (
    ConfigError,
    ErrorKind,
    InternalError,
    InvalidArgument,
    NurseryError,
    StartupError,
    Unavailable,
    failure_reason,
    first_error,
)
from nursery.messages import (
    CloseIntake,
    IndexEntry,
    IndexRepository,
    LoadModel,
    ManagerCommand,
    UnloadModel,
)
from nursery.runtime.supervision import Boundary, FaultCounter
from nursery.schema import inference as pb

log = logging.getLogger("nursery.manager")

# A version that fails while serving is reloaded at most RESTARTS times in RESTART_WINDOW
# seconds (Erlang/OTP's restart intensity), then left UNAVAILABLE with the reason.
RESTARTS = 3
RESTART_WINDOW = 60.0

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
    resize: Resize | None = None  # its instances changed in place (None: an ensemble)


class _Manager:
    def __init__(
        self,
        repositories: tuple[Root, ...],
        directory: Directory,
        nursery: trio.Nursery,
        *,
        cloud_cache: str = "",
        client: ModelClient,
        backends: Backends,
        summaries: bool,
        auto_complete: bool,
        unload_timeout: float,
        rate_limiter: Any = None,
        faults: FaultCounter | None = None,
        config_name: str = "",
        load_retries: int = 0,
    ) -> None:
        self.config_name = config_name  # --model-config-name
        self.load_retries = load_retries  # --model-load-retry-count
        self.client = client  # ensembles' steps and Python models' BLS calls go through it
        self.backends = backends
        self.summaries = summaries  # versions keep latency samples for the summary metrics
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
        # what each model's folder held when it last loaded from it (config overrides too):
        # a version whose own files did not change since may be updated in place
        self.folders: dict[str, ModelFingerprint | None] = {}
        self.override_root = Path(tempfile.mkdtemp(prefix="nursery-overrides-"))
        # where models of buckets are made local: --cloud-cache-directory, else a temporary
        # folder per cloud (made on first use, under Triton's mount directory) removed at exit
        self.cloud_cache = Path(cloud_cache) if cloud_cache else None
        self.cloud_temp: dict[str, Path] = {}
        self.has_cloud = any(isinstance(r, CloudRoot) for r in repositories)
        self.loading: dict[str, trio.Event] = {}  # models being loaded by load_many
        # ensembles checking their composing models -> the models they are made of: a
        # dependency path back to an ensemble is a cycle (a nested ensemble is not)
        self.ensembles_waiting: dict[str, frozenset[str]] = {}
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
            mailbox.answer(command.reply, result, close=True)

    async def _command(self, command: LoadModel | UnloadModel) -> NurseryError | None:
        name = command.name
        if isinstance(command, UnloadModel):
            scope = self.loads.get(name)
            if scope is not None:  # an unload stops a load still in progress (hung, perhaps)
                scope.cancel()
            async with self._lock(name):
                return await self.unload(name, command.unload_dependents)
        refused = load_name_problem(name)
        if refused is not None:
            return refused
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
            return repository_index(scan(self.repositories), self.entries, ready_only)
        return InternalError(f"repository index failed: {boundary.failure}")

    async def serve_index(self, command: IndexRepository) -> None:
        """The index when a repository is a bucket: listed off the trio thread (a storage
        server that stops answering holds up this index only)."""
        result: list[IndexEntry] | NurseryError = Unavailable("the server is stopping")
        try:
            with Boundary(self.faults, "manager", log, "repository index") as boundary:
                found = await trio.to_thread.run_sync(scan, self.repositories)
                result = repository_index(found, self.entries, command.ready_only)
            if boundary.failure is not None:
                result = InternalError(f"repository index failed: {boundary.failure}")
        finally:
            mailbox.answer(command.reply, result, close=True)

    def cloud_base(self, root: CloudRoot) -> Path:
        """The folder models of ``root`` are made local in."""
        if self.cloud_cache is not None:
            return self.cloud_cache
        base = self.cloud_temp.get(root.scheme)
        if base is None:
            base = self.cloud_temp[root.scheme] = Path(tempfile.mkdtemp(
                prefix="nursery-cloud-", dir=mirror.mount_directory(root.scheme)))
        return base

    async def _localize(self, remote: RemoteModel) -> Path:
        """The complete local folder of a model in a bucket (downloaded off the trio
        thread, only what the cache lacks)."""
        try:
            base = self.cloud_base(remote.root)
        except OSError as exc:
            raise StorageError(
                f"cannot make a download folder under "
                f"{mirror.mount_directory(remote.root.scheme)}: {exc.strerror or exc}") from None

        def fetch() -> Path:
            return mirror.localize(remote, open_store(remote.root), base)

        return await trio.to_thread.run_sync(fetch)

    # -- state (the only writer) -----------------------------------------------------------

    def _set(self, name: str, version: int, state: ModelState, reason: str = "",
             handle: ModelHandle | None = None, load_secs: float | None = None) -> None:
        entry = self.entries.get(name) or ModelEntry(name, MappingProxyType({}))
        versions = dict(entry.versions)
        if load_secs is None:  # a state change that is not a load keeps the last figure
            old = versions.get(version)
            load_secs = old.load_secs if old is not None else 0.0
        versions[version] = VersionStatus(version, state, reason, handle, load_secs)
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

        # one listing of the buckets for all of them (a bucket is listed, not walked: with
        # ten models, one listing instead of ten)
        scanned = await trio.to_thread.run_sync(scan, self.repositories) if self.has_cloud \
            else None

        async def one(name: str) -> None:
            self.dependency_only.discard(name)
            try:
                error = await self.load(name, scanned=scanned)
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
                   force: bool = False, scanned: RepositoryScan | None = None
                   ) -> NurseryError | None:
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
        if scanned is not None:  # scanned a moment ago for several loads
            repo = scanned
        elif self.has_cloud:
            repo = await trio.to_thread.run_sync(scan, self.repositories)
        else:
            repo = scan(self.repositories)
        if name in repo.duplicates and not files:
            where = ", ".join(str(p) for p in repo.duplicates[name])
            reason = f"model '{name}' appears in more than one repository ({where})"
            self._set_model_failure(name, f"Invalid argument: {reason}")
            log.error("failed to load '%s': %s", name, reason)
            return NurseryError(reason, ErrorKind.INVALID_ARG)
        if files:
            try:
                location = write_override(self.override_root, name, files)
            except NurseryError as exc:
                return exc
        else:
            found = repo.models.get(name)
            if found is None:
                # a bucket that cannot be read may hold it: say why it could not be looked at
                why = [r for root, r in repo.unreadable.items() if isinstance(root, CloudRoot)]
                return InternalError(f"{poll_error}: {why[0]}" if why else poll_error)
            location = found
        current = folder = None
        if not files:
            folder = await trio.to_thread.run_sync(model_fingerprint, location)
        if override is None and not files:
            current = folder
            if current == self.loaded_from.get(name) and self._serving(name) and not force:
                return None  # nothing changed since it loaded: nothing to do
        remote = location.remote
        if remote is not None:  # a model in a bucket: served only from a complete download
            try:
                location = replace(location, path=await self._localize(remote))
            except StorageError as exc:
                reason = f"Internal: {exc}"
                log.error("failed to load '%s': %s", name, exc)
                if not self._serving(name):
                    self._set_model_failure(name, reason)
                return InternalError(f"{poll_error}: {exc}")
        try:
            config, versions = await trio.to_thread.run_sync(
                partial(read_model_config, location.path, name, backends=self.backends,
                        auto_complete=self.auto_complete,
                        proto=override, config_name=self.config_name),
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
        updated: set[int] = set()  # versions served on, their instances changed in place
        before = self.folders.get(name)

        async def one(version: int) -> None:
            live = self.live.get((name, version))
            if (live is not None and live.resize is not None and folder is not None
                    and before is not None and folder.same_model_files(before, version)
                    and live.handle.config.same_but_instances(config)):
                updated.add(version)
                error = await self._update_version(live, config, version)
            else:
                error = await self._load_version(location, config, version)
            if error is not None:
                errors[version] = error

        async with trio.open_nursery() as nursery:
            for version in versions:
                nursery.start_soon(one, version)
        if errors:  # Triton's aggregate: one line per version that failed
            return InvalidArgument(f"load failed for model '{name}': " + "".join(
                f"version {v} is at {'READY' if v in updated else 'UNAVAILABLE'} state: "
                f"{failure_reason(e)};\n"
                for v, e in sorted(errors.items())))
        dropped = sorted(v for (n, v) in self.live if n == name and v not in versions)
        async with trio.open_nursery() as nursery:
            for version in dropped:  # the new version policy no longer selects these
                nursery.start_soon(self._unload_version, name, version)
        self.loaded_from[name] = current
        self.folders[name] = folder
        if remote is not None:  # every version now serves from this copy: drop older ones
            await trio.to_thread.run_sync(mirror.prune, self.cloud_base(remote.root), remote)
        return None

    async def _update_version(self, live: _Live, config: ModelConfig,
                              version: int) -> NurseryError | None:
        """A reload that changed only the instance groups (and nothing in the model's files
        for this version): the serving version keeps the instances whose signature did not
        change, starts the new ones and retires the rest (Triton's UpdateInstanceGroup).
        Requests keep being served throughout; a failure leaves it as it was."""
        name = config.name
        assert live.resize is not None
        log.info("updating instances: %s:%d", name, version)
        try:
            handle = await live.resize(config)
        except BaseException as exc:
            if isinstance(first_error(exc), trio.Cancelled):
                raise
            reason = failure_reason(exc)
            log.error("failed to update '%s' version %d: %s", name, version, reason)
            error = first_error(exc)
            return error if isinstance(error, NurseryError) else NurseryError(reason, ErrorKind.INTERNAL)
        if self.live.get((name, version)) is live:
            live.handle = handle
            self._set(name, version, ModelState.READY, "", handle)
        log.info("successfully updated '%s' version %d", name, version)
        return None

    def _serving(self, name: str) -> bool:
        return any(n == name for (n, _) in self.live)

    async def _load_version(
        self, location: ModelLocation, config: ModelConfig, version: int
    ) -> NurseryError | None:
        name = location.name
        old = self.live.get((name, version))
        if old is None:  # a reload keeps the old one READY and serving until the new one is
            self._set(name, version, ModelState.LOADING)
        log.info("loading: %s:%d", name, version)
        started = time.perf_counter()
        attempt = 0
        while True:
            scope = trio.CancelScope()
            done = trio.Event()
            try:
                handle, control, resize = await self.nursery.start(
                    partial(self._supervise_version, location, config, version, scope, done)
                )
                break
            except BaseException as exc:
                if isinstance(first_error(exc), trio.Cancelled):
                    raise
                failure = exc
            attempt += 1
            if attempt > self.load_retries:
                break
            log.warning("failed to load '%s' version %d (%s); retrying (%d of %d)", name,
                        version, failure_reason(failure), attempt, self.load_retries)
        if attempt > self.load_retries:
            reason = failure_reason(failure)
            log.error("failed to load '%s' version %d: %s", name, version, reason)
            if old is not None:  # a failed reload leaves the old version serving
                self._set(name, version, ModelState.READY, "", old.handle)
            else:
                self._set(name, version, ModelState.UNAVAILABLE, reason)
            error = first_error(failure)
            return error if isinstance(error, NurseryError) else NurseryError(reason, ErrorKind.INTERNAL)
        self.live[(name, version)] = _Live(handle, control, scope, done, resize)
        self._set(name, version, ModelState.READY, "", handle, time.perf_counter() - started)
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
        task_status: Started,
    ) -> None:
        """The supervision boundary of one serving version. A failure while loading goes to
        the loader (the load fails); a failure once it serves (an actor of the version
        crashed) marks the version UNAVAILABLE with the reason, its requests having been
        answered by the actors as they stopped, and the model is reloaded, at most
        ``RESTARTS`` times in ``RESTART_WINDOW`` seconds (then it stays UNAVAILABLE)."""
        serving: list[ModelHandle] = []

        class _Started:
            def started(self, value: tuple[ModelHandle, trio.MemorySendChannel[Any],
                                           Resize | None]) -> None:
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
        if live is not None and live.scope is scope:  # not replaced by a reload meanwhile
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
        task_status: Started,
    ) -> None:
        """The life of one version (``nursery.actors.version``); an ensemble's composing
        models are checked (and loaded) first."""
        if config.ensemble is not None:
            try:
                config = await self._check_ensemble(config)
            except BaseException:
                done.set()
                raise
            await serve_ensemble(config=config, version=version, client=self.client,
                                 faults=self.faults, summaries=self.summaries,
                                 scope=scope, done=done,
                                 task_status=task_status)
            return
        try:
            factory = self.backends(config.backend, location.name)
            warmup = tuple(await trio.to_thread.run_sync(warmup_samples, config,
                                                         limiter=self.config_limiter))
        except BaseException:
            done.set()
            raise
        await serve_version(config=config, version=version,
                            version_path=location.path / str(version), factory=factory,
                            warmup=warmup, client=self.client, rate_limiter=self.rate_limiter,
                            summaries=self.summaries,
                            scope=scope, done=done, task_status=task_status)

    async def _check_ensemble(self, config: ModelConfig) -> ModelConfig:
        """Every step's model is loaded (loading it first when it never was), its inputs and
        outputs exist, and each ensemble tensor has one datatype along the graph. Returns the
        configuration to serve: decoupled exactly when a step's model is, whatever the
        ensemble's own ``model_transaction_policy`` says (Triton fills it in so)."""
        plan = config.ensemble
        assert plan is not None
        where = f"ensemble '{config.name}'"
        models = frozenset(plan.models())
        # Triton's dependency graph first: every step's model is in the repository (or
        # served already, e.g. loaded with a config override), found once
        repo = (await trio.to_thread.run_sync(scan, self.repositories) if self.has_cloud
                else scan(self.repositories))
        missing = sorted(m for m in models if m != config.name and not self._serving(m)
                         and m not in self.loading
                         and (m not in repo.models or m in repo.duplicates))
        if missing:
            raise ConfigError(f"ensemble {config.name} contains models that are not available "
                              f"or ambiguous: {', '.join(missing)}")
        self.ensembles_waiting[config.name] = models
        try:
            for model in sorted(models):  # the graph first, as Triton checks it before loads
                last = config.name if model == config.name else self._depends_on(
                    model, config.name)
                if last is not None:  # Triton's words: start -> ... -> last -> start
                    raise ConfigError(f"circular dependency between ensembles: {config.name} "
                                      f"-> ... -> {last} -> {config.name}")
            for model in sorted(models):
                event = self.loading.get(model)
                if event is not None:
                    await event.wait()
                elif not self._serving(model):  # never loaded, unloaded, or failed
                    # Triton loads an ensemble's models with it; another ensemble needing
                    # the same model meanwhile waits for this load instead of starting its
                    # own (two loads of one version would leave one running unowned)
                    event = self.loading[model] = trio.Event()
                    try:
                        await self.load(model)
                    finally:
                        if self.loading.get(model) is event:
                            del self.loading[model]
                        event.set()
                    self.dependency_only.add(model)
        finally:
            self.ensembles_waiting.pop(config.name, None)
        steps = []
        for step in plan.steps:
            try:
                steps.append(self.directory.resolve(step.model_name, step.version_str).config)
            except NurseryError as exc:
                if step.model_version >= 0 and self._serving(step.model_name):
                    raise ConfigError(  # Triton's words, its period too
                        f"{where} depends on '{step.model_name}' whose required version "
                        f"{step.model_version} is not loaded.") from None
                entry = self.directory.entry(step.model_name)
                failure = ""
                if entry is not None:
                    reasons = [s.reason for s in entry.versions.values() if s.reason]
                    failure = (entry.reason or (reasons[0] if reasons else ""))
                raise ConfigError(
                    f"{where} depends on '{step.model_name}' which has no loaded version"
                    + (f". Model '{step.model_name}' loading failed with error: {failure}"
                       if failure else f": {exc.message}")) from None
        decoupled = check_wiring(config, steps)
        # what tensors need between batching and non-batching models (Triton's
        # ReshapeTensorDims), from the step models as they are loaded now
        # (an output's configured shape is its reshape where it has one, as in Triton; the
        # ensemble's own input and output reshapes apply to its requests and answers)
        config = replace(config, ensemble=plan.shaped(
            config.max_batch_size > 0,
            {t.name: tuple(t.reshape if t.reshape is not None else t.dims)
             for t in config.outputs},
            [(m.max_batch_size > 0, {t.name: tuple(t.dims) for t in m.inputs}) for m in steps],
            input_reshape={t.name: (tuple(t.dims), tuple(t.reshape)) for t in config.inputs
                           if t.reshape is not None},
            output_reshape={t.name: (tuple(t.reshape), tuple(t.dims)) for t in config.outputs
                            if t.reshape is not None}))
        proto = pb.ModelConfig().parse(bytes(config.proto))
        proto.model_transaction_policy.decoupled = decoupled
        # Triton sets the field, so an ensemble's configuration always carries the message
        pbtext.mark_present(proto.model_transaction_policy)
        return replace(config, decoupled=decoupled, proto=proto)

    def _depends_on(self, model: str, ensemble: str) -> str | None:
        """Whether ``model`` uses ``ensemble``, directly or through the ensembles it is made
        of, as far as the ensembles being checked right now tell (an ensemble's models are
        known from its check on; each ensemble of a cycle reaches its check, so the last
        one to reach it finds the cycle): the ensemble on that path that uses ``ensemble``
        itself, or None."""
        seen: set[str] = set()
        todo = [model]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                uses = self.ensembles_waiting.get(name, ())
                if ensemble in uses:
                    return name
                todo.extend(uses)
        return None

    # -- unloading -------------------------------------------------------------------------

    async def _drain(self, live: _Live) -> None:
        """Stop intake, let queued and running requests finish (bounded), then end."""
        live.handle.intake.close()
        mailbox.tell(live.control, CloseIntake())
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
        self.folders.pop(name, None)
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
    repositories: tuple[Root, ...],
    directory: Directory,
    inbox: trio.MemoryReceiveChannel[ManagerCommand],
    startup_models: list[str],
    exit_on_error: bool,
    client: ModelClient | None = None,
    backends: Backends | None = None,
    summaries: bool = False,
    auto_complete: bool = True,
    unload_timeout: float = 30.0,
    rate_limiter: Any = None,
    faults: FaultCounter | None = None,
    cloud_cache: str = "",
    config_name: str = "",
    load_retries: int = 0,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load ``startup_models``, then serve commands until the inbox closes, then unload all.

    ``task_status.started`` reports the models that failed to load. With ``exit_on_error``
    a failure raises :class:`StartupError` instead.

    Commands are served concurrently, each in its own task inside a supervision boundary:
    commands for one model run one after the other (a per-model lock, in arrival order), so a
    slow or hung load or unload holds up only that model; the index is answered at once.

    ``client`` is how the models reach other models (the server's; actor tests let the
    manager make its own over ``directory``); ``backends`` the backends it may load (the
    built-in ones unless given). ``config_name``: Triton's --model-config-name (a model's
    ``configs/<name>.pbtxt`` over its ``config.pbtxt``); ``load_retries``: its
    --model-load-retry-count (a version that fails to load is tried again so often).
    """
    async with trio.open_nursery() as nursery:
        manager = _Manager(
            repositories, directory, nursery,
            client=client if client is not None else ModelClient(directory),
            backends=backends if backends is not None else Backends(),
            summaries=summaries,
            auto_complete=auto_complete, unload_timeout=unload_timeout,
            rate_limiter=rate_limiter, faults=faults or FaultCounter(),
            cloud_cache=cloud_cache, config_name=config_name, load_retries=load_retries,
        )
        startup_failed = False
        async with trio.open_nursery() as commands:

            async def intake() -> None:
                async with inbox:
                    async for command in inbox:
                        if isinstance(command, IndexRepository) and manager.has_cloud:
                            commands.start_soon(manager.serve_index, command)
                        elif isinstance(command, IndexRepository):
                            mailbox.answer(command.reply,
                                           manager.answer_index(command.ready_only), close=True)
                        else:
                            commands.start_soon(manager.serve_command, command)
                commands.cancel_scope.cancel()  # shutting down: loads still running stop

            # commands are taken while the startup models load: a model's initialize may
            # load another model (pb_utils.load_model), as under Triton
            commands.start_soon(intake)
            failed = await manager.load_many(startup_models)
            if failed and exit_on_error:
                startup_failed = True
                commands.cancel_scope.cancel()
            else:
                task_status.started(failed)
        if startup_failed:
            await manager.unload_all()
            raise StartupError("failed to load all models")
        await manager.unload_all()
        shutil.rmtree(manager.override_root, ignore_errors=True)
        for folder in manager.cloud_temp.values():
            shutil.rmtree(folder, ignore_errors=True)


def load_name_problem(name: str) -> NurseryError | None:
    """Triton's check of the name a load command gives (not an unload's, nor a repository
    folder's): blank once the C locale's white space is trimmed, or ``..``, or holding a
    ``/``, is refused before anything is looked up (400)."""
    trimmed = name.strip(" \t\n\v\f\r")
    if not trimmed:
        return InvalidArgument("Model name cannot be empty. Please enter a valid name to deploy.")
    if trimmed == ".." or "/" in trimmed:
        return InvalidArgument(f"invalid model name '{name}', model name must not contain path "
                               "traversal characters")
    return None

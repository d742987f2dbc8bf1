"""ModelManager: owns every model version's lifecycle and the nursery it lives in.

Only this actor changes a version's state (UNKNOWN, LOADING, READY, UNLOADING, UNAVAILABLE)
and it publishes each change as a new immutable table in the :class:`Directory`. A version is
served by its own nursery (its instance workers and its scheduler); loading opens it, starts
the workers (each loads its backend on its own thread), then the scheduler, and only then
marks the version READY. Unloading marks it UNLOADING, closes the intake, lets the scheduler
finish the queue and the workers finish their batches, bounded by the unload timeout.

Commands arrive on the inbox (``LoadModel``, ``UnloadModel``, ``RepositoryIndex``); when the
inbox closes (server shutdown) every model is drained and unloaded.

Models are known by :class:`~nursery.config.namespaces.ModelId`: with ``--model-namespacing``
each repository's model of a name is a model of its own (commands by name act on all of
them); without it the identifier is the name.
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
    index_rows,
    repository_index,
)
from nursery.actors.model_client import ModelClient
from nursery.actors.version import Resize, Started, serve_ensemble, serve_version
from nursery.backends.base import Backends
from nursery.config import pbtext
from nursery.config.ensemble_check import check_wiring
from nursery.config.model import (
    ModelConfig,
    config_file,
    decoupled_cache_refusal,
    read_model_config,
)
from nursery.config.namespaces import ModelId, by_name, step_model
from nursery.config.repository import (
    ModelFingerprint,
    ModelLocation,
    RepositoryScan,
    Root,
    check_model_name,
    model_fingerprint,
    namespace_of,
    scan,
    write_override,
)
from nursery.config.storage import mirror, open_store
from nursery.config.storage.base import RemoteModel, StorageError
from nursery.config.storage.url import CloudRoot
from nursery.config.warmup import warmup_samples
from nursery.errors import (
    AlreadyExists,
    ConfigError,
    ErrorKind,
    InternalError,
    InvalidArgument,
    NoVersionError,
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
    RegisterRepository,
    UnloadModel,
    UnregisterRepository,
)
from nursery.observability.logs import TABLE, render_table
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
        namespacing: bool = False,
    ) -> None:
        # --model-namespacing: each repository is a namespace; models are known by ModelId
        # (without it, every ModelId has the empty namespace and is the model's name)
        self.namespacing = namespacing
        # Triton's global map: the models known (loading, loaded or failed; not unloaded),
        # through which requests' names are resolved with namespacing
        self.present: set[ModelId] = set()
        self.config_name = config_name  # --model-config-name
        self.load_retries = load_retries  # --model-load-retry-count
        self.client = client  # ensembles' steps and Python models' BLS calls go through it
        self.backends = backends
        self.summaries = summaries  # versions keep latency samples for the summary metrics
        self.faults = faults or FaultCounter()
        self.locks: dict[str, _ModelLock] = {}  # per model, while a command holds or awaits it
        # load commands running, by model: each one's scope, and an event set when it ends
        self.loads: dict[str, tuple[trio.CancelScope, trio.Event]] = {}
        self.restarts: dict[ModelId, list[float]] = {}  # when each model's failed versions restarted
        self.restarting: set[trio.CancelScope] = set()  # restarts in progress
        self.stopping = False  # unload_all has begun: nothing is started any more
        self.rate_limiter = rate_limiter  # a RateLimiterClient with --rate-limit execution_count
        self.repositories = repositories
        # registered repositories' folders -> model names (Triton's registration mapping)
        self.renames: dict[Path, dict[str, str]] = {}
        self.directory = directory
        self.nursery = nursery
        self.auto_complete = auto_complete
        self.unload_timeout = unload_timeout
        self.entries: dict[ModelId, ModelEntry] = {}
        self.live: dict[tuple[ModelId, int], _Live] = {}
        self.config_limiter = trio.CapacityLimiter(4)
        # what each model's folder held when it last loaded, to reload only on change
        self.loaded_from: dict[ModelId, ModelFingerprint | None] = {}
        # the configuration a load request overrode a model's with, and when (time.time_ns()):
        # a later load without one keeps it, unless the folder's own configuration file is
        # newer (Triton's rule); forgotten at unload
        self.overrides: dict[ModelId, tuple[pb.ModelConfig, int]] = {}
        # what each model's folder held when it last loaded from it (config overrides too):
        # a version whose own files did not change since may be updated in place
        self.folders: dict[ModelId, ModelFingerprint | None] = {}
        # where load requests' 'file:' overrides are written: made on first use, removed at exit
        self._override_root: Path | None = None
        # where models of buckets are made local: --cloud-cache-directory, else a temporary
        # folder per cloud (made on first use, under Triton's mount directory) removed at exit
        self.cloud_cache = Path(cloud_cache) if cloud_cache else None
        self.cloud_temp: dict[str, Path] = {}
        self.has_cloud = any(isinstance(r, CloudRoot) for r in repositories)
        self.loading: dict[str, trio.Event] = {}  # models being loaded by load_many
        # ensembles checking their composing models -> the models they are made of: a
        # dependency path back to an ensemble is a cycle (a nested ensemble is not)
        self.ensembles_waiting: dict[ModelId, frozenset[str]] = {}
        # models loaded only because an ensemble needed them (never asked for by name):
        # what unloading an ensemble with unload_dependents takes along
        self.dependency_only: set[str] = set()
        # ensembles unloaded because a step's model lost its last version, with the names of
        # those models: Triton's dependency graph keeps them, and loads them again when the
        # models are back (an explicit unload or load of the ensemble forgets it)
        self.orphaned: dict[ModelId, set[str]] = {}

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
            # as in Triton, the unload waits for the loads in progress that involve the model
            # (its own, and an ensemble's that loads it as a step); past the unload timeout
            # (a hung initialize) it stops its own load instead
            running = self.loads.get(name)
            involved = [self.loads[m.name][1] for m, models in self.ensembles_waiting.items()
                        if name in models and m.name != name and m.name in self.loads]
            with trio.move_on_after(self.unload_timeout):
                for ended in [*([running[1]] if running else []), *involved]:
                    await ended.wait()
                step = self.loading.get(name)
                if step is not None:
                    await step.wait()
            if running is not None:
                running[0].cancel()
            self._forget_orphan(name)  # unloaded by name: it stays unloaded
            async with self._lock(name):
                return await self.unload(name, command.unload_dependents, command.namespace)
        refused = load_name_problem(name)
        if refused is not None:
            return refused
        result: NurseryError | None = Unavailable(
            f"load of model '{name}' was stopped by an unload of it: it did not finish within "
            "the unload timeout")
        async with self._lock(name):
            self.dependency_only.discard(name)  # asked for by name now
            self._forget_orphan(name)  # loaded by name now
            with trio.CancelScope() as scope:
                ended = trio.Event()
                self.loads[name] = (scope, ended)
                try:
                    result = await self.load(name, command.config, command.files,
                                             namespace=command.namespace)
                finally:
                    ended.set()
                    if self.loads.get(name, (None,))[0] is scope:
                        del self.loads[name]
        if result is None and self.orphaned:
            await self._restore_orphans(name)
        return result

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

    @property
    def override_root(self) -> Path:
        if self._override_root is None:
            self._override_root = Path(tempfile.mkdtemp(prefix="nursery-overrides-"))
        return self._override_root

    def remove_temporary_folders(self) -> None:
        """The overrides' folder and the buckets' temporary copies (not a
        --cloud-cache-directory, which is the user's)."""
        if self._override_root is not None:
            shutil.rmtree(self._override_root, ignore_errors=True)
        for folder in self.cloud_temp.values():
            shutil.rmtree(folder, ignore_errors=True)

    def scan_repositories(self) -> RepositoryScan:
        """Every model folder of the repositories (registered ones too, their folders under
        the names they were registered with)."""
        return scan(self.repositories, self.renames)

    def register(self, command: RegisterRepository) -> NurseryError | None:
        """Add a repository (Triton's repository registration): refused when it is one
        already, or maps a folder to a name another registration maps."""
        path = command.path
        if path in self.repositories:
            return AlreadyExists(f"model repository '{path}' has already been registered")
        if not path.is_dir():
            return InvalidArgument(f"failed to register '{path}', repository not found")
        taken = {name for names in self.renames.values() for name in names.values()}
        for _, name in command.names:
            if name in taken:
                return AlreadyExists(f"failed to register '{name}', there is a conflicting "
                                     f"mapping for '{name}'")
        self.repositories = (*self.repositories, path)
        if command.names:
            self.renames[path] = dict(command.names)
        return None

    def unregister(self, command: UnregisterRepository) -> NurseryError | None:
        if command.path not in self.repositories:
            return InvalidArgument(
                f"failed to unregister '{command.path}', repository not found")
        self.repositories = tuple(r for r in self.repositories if r != command.path)
        self.renames.pop(command.path, None)
        return None

    def log_status_table(self) -> None:
        """The models' table Triton logs once its start-up loads end (Model, Version, Status:
        READY, or the state and its reason), loaded or not; scripts grep a failed model's
        reason there as it is, unescaped (L0_rate_limiter)."""
        rows = []
        for mid, entry in sorted(self.entries.items(), key=lambda item: (
                item[0].namespace, item[0].name)):
            for row in index_rows(mid.name, entry, ready_only=False):
                status = ("Not loaded: No model version was found" if row.state is None
                          else f"{row.state}: {row.reason}" if row.reason else row.state)
                rows.append([row.name, "-" if row.version is None else str(row.version),
                             status])
        log.info("", extra={TABLE: render_table(("Model", "Version", "Status"), rows)})

    def answer_index(self, ready_only: bool) -> list[IndexEntry] | NurseryError:
        with Boundary(self.faults, "manager", log, "repository index") as boundary:
            return repository_index(self.scan_repositories(), self.entries, ready_only,
                                    self.namespacing)
        return InternalError(f"repository index failed: {boundary.failure}")

    async def serve_index(self, command: IndexRepository) -> None:
        """The index when a repository is a bucket: listed off the trio thread (a storage
        server that stops answering holds up this index only)."""
        result: list[IndexEntry] | NurseryError = Unavailable("the server is stopping")
        try:
            with Boundary(self.faults, "manager", log, "repository index") as boundary:
                found = await trio.to_thread.run_sync(self.scan_repositories)
                result = repository_index(found, self.entries, command.ready_only,
                                          self.namespacing)
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

    def _set(self, mid: ModelId, version: int, state: ModelState, reason: str = "",
             handle: ModelHandle | None = None, load_secs: float | None = None) -> None:
        entry = self.entries.get(mid) or ModelEntry(mid.name, MappingProxyType({}),
                                                    namespace=mid.namespace)
        versions = dict(entry.versions)
        if load_secs is None:  # a state change that is not a load keeps the last figure
            old = versions.get(version)
            load_secs = old.load_secs if old is not None else 0.0
        versions[version] = VersionStatus(version, state, reason, handle, load_secs)
        self.entries[mid] = ModelEntry(mid.name, MappingProxyType(versions), "", entry.config,
                                       mid.namespace)
        self._publish()

    def _set_model_failure(self, mid: ModelId, reason: str, left_out: bool = False) -> None:
        entry = self.entries.get(mid) or ModelEntry(mid.name, MappingProxyType({}))
        self.entries[mid] = ModelEntry(mid.name, entry.versions, reason, entry.config,
                                       mid.namespace, left_out)
        self._publish()

    def _publish(self) -> None:
        self.directory.publish(ModelTable(
            MappingProxyType({mid.key: entry for mid, entry in self.entries.items()}),
            self.namespacing, MappingProxyType(by_name(self.present))))

    # -- loading ---------------------------------------------------------------------------

    async def load_many(self, names: Iterable[str]) -> list[str]:
        """Load models concurrently; returns the names that failed."""
        failed: list[str] = []
        names = list(names)
        for name in names:  # ensembles wait for the composing models loading beside them
            self.loading.setdefault(name, trio.Event())

        # one listing of the buckets for all of them (a bucket is listed, not walked: with
        # ten models, one listing instead of ten)
        scanned = await trio.to_thread.run_sync(self.scan_repositories) if self.has_cloud \
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
                   force: bool = False, scanned: RepositoryScan | None = None,
                   namespace: str | None = None) -> NurseryError | None:
        """Load (or reload) every version the policy selects; versions it no longer selects
        are drained and unloaded. A model whose folder did not change since it loaded
        successfully is left as it is (unless a config override is given). Returns the error,
        if any; a failed reload leaves what was serving still serving.

        With namespacing, the model of that name in every repository loads (each in its
        repository's namespace; ``namespace``: only that repository's, as the poller and a
        restart ask), and a model made of ``files`` has no namespace, as in Triton."""
        poll_error = f"failed to load '{name}', failed to poll from model repository"
        invalid = check_model_name(name)
        if invalid is not None:  # looked up nowhere: a name is one folder of a repository
            log.error("failed to poll model '%s': %s", name, "Invalid model name" if not name
                      else f"model not found in any model repository. ({invalid})")
            return InternalError(f"{poll_error}: {invalid}")
        if files and override is None:
            return InternalError(f"{poll_error}: file overrides require a 'config' override")
        if files:
            try:
                location = write_override(self.override_root, name, files)
            except NurseryError as exc:
                return exc
            return await self._load_at(ModelId("", name), location, override, True, force)
        if scanned is not None:  # scanned a moment ago for several loads
            repo = scanned
        elif self.has_cloud:
            repo = await trio.to_thread.run_sync(self.scan_repositories)
        else:
            repo = self.scan_repositories()
        if self.namespacing:
            found = [(ModelId(namespace_of(loc.repository, True), name), loc)
                     for loc in repo.copies.get(name, ())
                     if namespace is None or namespace_of(loc.repository, True) == namespace]
        elif name in repo.duplicates:
            # Triton's words (it refuses both copies), then where the copies are
            where = ", ".join(str(p) for p in repo.duplicates[name])
            log.error("failed to poll model '%s': not unique across all model repositories",
                      name)
            reason = (f"failed to load '{name}', failed to poll from model repository: not "
                      f"unique across all model repositories ({where})")
            self._set_model_failure(ModelId("", name), f"Internal: {reason}")
            return NurseryError(reason, ErrorKind.INTERNAL)
        else:
            one_location = repo.models.get(name)
            found = [] if one_location is None else [(ModelId("", name), one_location)]
        if not found:
            log.error("failed to poll model '%s': model not found in any model repository.",
                      name)  # Triton's line, for startup models and load requests alike
            # a bucket that cannot be read may hold it: say why it could not be looked at
            why = [r for root, r in repo.unreadable.items() if isinstance(root, CloudRoot)]
            return InternalError(f"{poll_error}: {why[0]}" if why else poll_error)
        if len(found) == 1:
            return await self._load_at(*found[0], override, False, force)
        errors: dict[ModelId, NurseryError] = {}

        async def one(mid: ModelId, location: ModelLocation) -> None:
            error = await self._load_at(mid, location, override, False, force)
            if error is not None:
                errors[mid] = error

        async with trio.open_nursery() as nursery:  # Triton loads them in parallel
            for mid, location in found:
                nursery.start_soon(one, mid, location)
        if not errors:
            return None
        failed = [e for _, e in sorted(errors.items())]
        if all(e.kind is ErrorKind.INVALID_ARG for e in failed):  # Triton's aggregate
            return InvalidArgument("".join(e.message for e in failed))
        return failed[0]

    async def _load_at(self, mid: ModelId, location: ModelLocation,
                       override: pb.ModelConfig | None, overridden: bool, force: bool
                       ) -> NurseryError | None:
        """:meth:`load` of one model, found at ``location`` (``overridden``: a folder made
        of a load request's files)."""
        name = mid.name
        poll_error = f"failed to load '{name}', failed to poll from model repository"
        if mid not in self.present:
            self.present.add(mid)
            self._publish()
        current = folder = None
        if not overridden:
            folder = await trio.to_thread.run_sync(model_fingerprint, location)
        retained = None
        if override is None and not overridden and mid in self.overrides:
            kept, at = self.overrides[mid]
            if location.remote is None and _mtime_ns(
                    location.path / config_file(location.path, self.config_name)) > at:
                del self.overrides[mid]  # the file changed since: it wins again
            else:
                retained = kept
        if override is None and not overridden:
            current = folder
            if current == self.loaded_from.get(mid) and self._serving_id(mid) and not force:
                entry = self.entries.get(mid)
                if self.namespacing and entry is not None and entry.config is not None \
                        and entry.config.ensemble is not None:
                    # Triton polls an ensemble's models with it: those added since load
                    return await self._load_steps(mid, entry.config.ensemble.models())
                return None  # nothing changed since it loaded: nothing to do
        given = override
        if retained is not None:
            override = retained
        remote = location.remote
        if remote is not None:  # a model in a bucket: served only from a complete download
            try:
                location = replace(location, path=await self._localize(remote))
            except StorageError as exc:
                reason = f"Internal: {exc}"
                log.error("failed to load '%s': %s", mid, exc)
                if not self._serving_id(mid):
                    self._set_model_failure(mid, reason)
                return InternalError(f"{poll_error}: {exc}")
        try:
            config, versions = await trio.to_thread.run_sync(
                partial(read_model_config, location.path, name, backends=self.backends,
                        auto_complete=self.auto_complete,
                        proto=override, config_name=self.config_name, warn_versions=True),
                limiter=self.config_limiter,
            )
        except NurseryError as exc:
            reason = failure_reason(exc)
            log.error("failed to load '%s': %s", mid, reason)
            if not self._serving_id(mid):  # unreadable: left out, as by Triton's poll
                self._set_model_failure(mid, reason,
                                        left_out=not isinstance(exc, NoVersionError))
            return InternalError(f"{poll_error}: {exc.message}")
        entry = self.entries.get(mid)
        self.entries[mid] = ModelEntry(
            name, entry.versions if entry else MappingProxyType({}), "", config, mid.namespace
        )
        errors: dict[int, NurseryError] = {}
        updated: set[int] = set()  # versions served on, their instances changed in place
        before = self.folders.get(mid)
        serving_before = {v for (m, v) in self.live if m == mid}

        async def one(version: int) -> None:
            live = self.live.get((mid, version))
            if (live is not None and live.resize is not None and folder is not None
                    and before is not None and folder.same_model_files(before, version)
                    and live.handle.config.same_but_instances(config)):
                updated.add(version)
                error = await self._update_version(mid, live, config, version)
            else:
                error = await self._load_version(mid, location, config, version)
            if error is not None:
                errors[version] = error

        async with trio.open_nursery() as nursery:
            for version in versions:
                nursery.start_soon(one, version)
        if errors:  # Triton's aggregate: one line per version that failed
            # and, as Triton's, a load is all or nothing: the versions this load brought up
            # go down again (a version that served before it stays, as a failed reload does)
            async with trio.open_nursery() as nursery:
                for version in versions:
                    if version not in errors and version not in serving_before:
                        nursery.start_soon(self._unload_version, mid, version)
            return InvalidArgument(f"load failed for model '{mid}': " + "".join(
                f"version {v} is at {'READY' if v in updated else 'UNAVAILABLE'} state: "
                f"{failure_reason(e)};\n"
                for v, e in sorted(errors.items())))
        dropped = sorted(v for (m, v) in self.live if m == mid and v not in versions)
        async with trio.open_nursery() as nursery:
            for version in dropped:  # the new version policy no longer selects these
                nursery.start_soon(self._unload_version, mid, version)
        log.info("successfully loaded '%s'", mid)  # once per load, as Triton says it
        self.loaded_from[mid] = folder if given is not None and not overridden else current
        if given is not None and not overridden:
            self.overrides[mid] = (given, time.time_ns())
        self.folders[mid] = folder
        if remote is not None:  # every version now serves from this copy: drop older ones
            await trio.to_thread.run_sync(mirror.prune, self.cloud_base(remote.root), remote)
        return None

    async def _load_steps(self, ensemble: ModelId, models: Iterable[str]) -> NurseryError | None:
        """With namespacing: load the models of an ensemble's steps that a repository holds
        and that are not serving yet (Triton polls an ensemble's models along with it, every
        repository's model of each name: one added since may now be the step's own)."""
        repo = (await trio.to_thread.run_sync(self.scan_repositories) if self.has_cloud
                else self.scan_repositories())
        held = repo.identified(True)
        for model in sorted(set(models) - {ensemble.name}):
            if any(mid.name == model and not self._serving_id(mid) for mid in held) \
                    and model not in self.loading:
                error = await self.load(model, scanned=repo)
                if error is not None:
                    return error
                self.dependency_only.add(model)
        return None

    async def _update_version(self, mid: ModelId, live: _Live, config: ModelConfig,
                              version: int) -> NurseryError | None:
        """A reload that changed only the instance groups (and nothing in the model's files
        for this version): the serving version keeps the instances whose signature did not
        change, starts the new ones and retires the rest (Triton's UpdateInstanceGroup).
        Requests keep being served throughout; a failure leaves it as it was."""
        name = mid
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
        if self.live.get((mid, version)) is live:
            live.handle = handle
            self._set(mid, version, ModelState.READY, "", handle)
        log.info("successfully updated '%s' version %d", name, version)
        return None

    def _serving(self, name: str) -> bool:
        """Whether a model of that name serves (in any namespace)."""
        return any(m.name == name for (m, _) in self.live)

    def _serving_id(self, mid: ModelId) -> bool:
        return any(m == mid for (m, _) in self.live)

    async def _load_version(
        self, mid: ModelId, location: ModelLocation, config: ModelConfig, version: int
    ) -> NurseryError | None:
        name = mid
        old = self.live.get((mid, version))
        if old is None:  # a reload keeps the old one READY and serving until the new one is
            self._set(mid, version, ModelState.LOADING)
        log.info("loading: %s:%d", name, version)
        started = time.perf_counter()
        attempt = 0
        while True:
            scope = trio.CancelScope()
            done = trio.Event()
            try:
                handle, control, resize = await self.nursery.start(
                    partial(self._supervise_version, mid, location, config, version, scope,
                            done)
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
                self._set(mid, version, ModelState.READY, "", old.handle)
            else:
                self._set(mid, version, ModelState.UNAVAILABLE, reason)
            error = first_error(failure)
            return error if isinstance(error, NurseryError) else NurseryError(reason, ErrorKind.INTERNAL)
        self.live[(mid, version)] = _Live(handle, control, scope, done, resize)
        self._set(mid, version, ModelState.READY, "", handle, time.perf_counter() - started)
        log.info("loaded '%s' version %d", name, version)
        if old is not None:  # the new version serves; the old one drains
            self.nursery.start_soon(self._drain, old)
        return None

    async def _supervise_version(
        self,
        mid: ModelId,
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

        name = mid
        try:
            await self._serve_version(mid, location, config, version, scope, done,
                                      task_status=_Started())  # type: ignore[arg-type]
            return
        except BaseException as exc:
            if not serving:  # still loading: the loader reports the failure
                raise
            error = exc
        with Boundary(self.faults, "model", log, f"model '{name}' version {version}") as b:
            raise error  # cancellation goes on up; a failure is recorded here
        live = self.live.get((mid, version))
        if live is not None and live.scope is scope:  # not replaced by a reload meanwhile
            del self.live[(mid, version)]
            self._set(mid, version, ModelState.UNAVAILABLE, f"Internal: {b.failure}")
            now = trio.current_time()
            recent = [t for t in self.restarts.get(mid, []) if now - t < RESTART_WINDOW]
            if self.stopping:
                pass  # the server is stopping: nothing to restart
            elif len(recent) < RESTARTS:
                self.restarts[mid] = [*recent, now]
                log.error("model '%s' version %d failed while serving; restarting it", name,
                          version)
                self.nursery.start_soon(self._restart, mid)
            else:
                log.error("model '%s' version %d failed while serving, %d times in %.0f s: "
                          "left UNAVAILABLE", name, version, len(recent) + 1, RESTART_WINDOW)

    async def _restart(self, mid: ModelId) -> None:
        """Reload a model whose version failed; the shutdown cancels restarts in progress, so
        nothing comes back to life behind ``unload_all``."""
        with trio.CancelScope() as scope, \
                Boundary(self.faults, "manager", log, f"restart of model '{mid}'"):
            self.restarting.add(scope)
            try:
                async with self._lock(mid.name):
                    if mid in self.restarts and not self.stopping:  # not unloaded meanwhile
                        await self.load(mid.name, force=True,
                                        namespace=mid.namespace if self.namespacing else None)
            finally:
                self.restarting.discard(scope)

    async def _serve_version(
        self,
        mid: ModelId,
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
                config = await self._check_ensemble(mid, config)
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

    async def _check_ensemble(self, mid: ModelId, config: ModelConfig) -> ModelConfig:
        """Every step's model is loaded (loading it first when it never was), its inputs and
        outputs exist, and each ensemble tensor has one datatype along the graph. Returns the
        configuration to serve: decoupled exactly when a step's model is, whatever the
        ensemble's own ``model_transaction_policy`` says (Triton fills it in so). With
        namespacing, a step's model is the one of the ensemble's namespace, else the only
        one of its name (``namespaces.step_model``); the plan keeps the ensemble's namespace
        so that its steps' requests prefer it."""
        plan = config.ensemble
        assert plan is not None
        where = f"ensemble '{config.name}'"
        models = frozenset(plan.models())
        # Triton's dependency graph first: every step's model is in the repository (or
        # served already, e.g. loaded with a config override), found once
        repo = (await trio.to_thread.run_sync(self.scan_repositories) if self.has_cloud
                else self.scan_repositories())
        if self.namespacing:
            held = [*repo.identified(True), *self.present]
            missing = sorted(m for m in models if m != config.name and m not in self.loading
                             and step_model(m, mid.namespace,
                                            (x.namespace for x in held if x.name == m)) is None)
        else:
            missing = sorted(m for m in models if m != config.name and not self._serving(m)
                             and m not in self.loading
                             and (m not in repo.models or m in repo.duplicates))
        if missing:
            raise ConfigError(f"ensemble {mid} contains models that are not available "
                              f"or ambiguous: {', '.join(missing)}")
        self.ensembles_waiting[mid] = models
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
                elif not self._serving(model) or (self.namespacing and any(
                        x.name == model and not self._serving_id(x)
                        for x in repo.identified(True))):  # never loaded, unloaded, failed
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
            self.ensembles_waiting.pop(mid, None)
        namespace = mid.namespace if self.namespacing else None
        steps = []
        for step in plan.steps:
            try:
                steps.append(self.directory.resolve(step.model_name, step.version_str,
                                                    namespace).config)
            except NurseryError as exc:
                if step.model_version >= 0 and self._serving(step.model_name):
                    raise ConfigError(  # Triton's words, its period too
                        f"{where} depends on '{step.model_name}' whose required version "
                        f"{step.model_version} is not loaded.") from None
                try:
                    entry = self.directory.entry(step.model_name, namespace)
                except NurseryError:  # ambiguous: exc says so
                    entry = None
                failure = ""
                if entry is not None:
                    reasons = [s.reason for s in entry.versions.values() if s.reason]
                    failure = (entry.reason or (reasons[0] if reasons else ""))
                raise ConfigError(
                    f"{where} depends on '{step.model_name}' which has no loaded version"
                    + (f". Model '{step.model_name}' loading failed with error: {failure}"
                       if failure else f": {exc.message}")) from None
        decoupled = check_wiring(config, steps)
        if decoupled and config.proto.response_cache.enable:
            raise decoupled_cache_refusal(where, config.name)
        # what tensors need between batching and non-batching models (Triton's
        # ReshapeTensorDims), from the step models as they are loaded now
        # (an output's configured shape is its reshape where it has one, as in Triton; the
        # ensemble's own input and output reshapes apply to its requests and answers)
        config = replace(config, ensemble=replace(plan.shaped(
            config.max_batch_size > 0,
            {t.name: tuple(t.reshape if t.reshape is not None else t.dims)
             for t in config.outputs},
            [(m.max_batch_size > 0, {t.name: tuple(t.dims) for t in m.inputs}) for m in steps],
            input_reshape={t.name: (tuple(t.dims), tuple(t.reshape)) for t in config.inputs
                           if t.reshape is not None},
            output_reshape={t.name: (tuple(t.reshape), tuple(t.dims)) for t in config.outputs
                            if t.reshape is not None}), namespace=namespace))
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
                uses: set[str] = set()  # every namespace's ensemble of that name
                for waiting, models in self.ensembles_waiting.items():
                    if waiting.name == name:
                        uses |= models
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

    async def unload(self, name: str, dependents: bool = False,
                     namespace: str | None = None) -> NurseryError | None:
        """Unload every version of ``name`` (with namespacing: of every model of that name,
        or only ``namespace``'s), and the loaded ensembles that use it once no version of it
        is left. With ``dependents`` (Triton's ``unload_dependents``), then
        also the models an ensemble was made of that were loaded only along with an ensemble
        and that no ensemble still loaded uses, recursively."""
        ids = {m for m in (*self.present, *self.entries, *(m for m, _ in self.live))
               if m.name == name and (namespace is None or m.namespace == namespace)}
        versions = sorted((m, v) for (m, v) in self.live if m in ids)
        composing = set()
        for key in versions:
            plan = self.live[key].handle.config.ensemble
            if plan is not None:
                composing |= set(plan.models())
        for mid in ids:  # unloading what is not loaded succeeds, as in Triton
            self.loaded_from.pop(mid, None)
            self.overrides.pop(mid, None)
            self.folders.pop(mid, None)
            self.restarts.pop(mid, None)
        if ids & self.present:
            self.present -= ids
            self._publish()
        if not any(m.name == name for m in self.present):
            self.dependency_only.discard(name)
        async with trio.open_nursery() as nursery:
            for mid, version in versions:
                nursery.start_soon(self._unload_version, mid, version)
        if versions and not self.stopping and not any(m.name == name for m, _ in self.live):
            # Triton's dependency graph: an ensemble whose step's model has no loaded version
            # left is not valid, and goes too, until that model is back (_restore_orphans)
            users = sorted({m for (m, _), live in self.live.items()
                            if live.handle.config.ensemble is not None and m.name != name
                            and name in live.handle.config.ensemble.models()})
            for ensemble in users:
                log.error("Invalid argument: ensemble '%s' depends on '%s' which has no "
                          "loaded version.", ensemble.name, name)
                await self.unload(ensemble.name, namespace=ensemble.namespace
                                  if self.namespacing else None)
                self.orphaned.setdefault(ensemble, set()).add(name)
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

    def _forget_orphan(self, name: str) -> None:
        """An ensemble asked for by name is no longer waiting for its steps to come back."""
        for ensemble in [m for m in self.orphaned if m.name == name]:
            del self.orphaned[ensemble]

    async def _restore_orphans(self, name: str) -> None:
        """Load again the ensembles that ``name`` losing its last version unloaded, once each
        has all its missing steps back (Triton's graph re-checks them when a step returns)."""
        for ensemble, missing in list(self.orphaned.items()):
            missing.discard(name)
            if missing or self.orphaned.get(ensemble) is not missing:
                continue
            del self.orphaned[ensemble]
            async with self._lock(ensemble.name):
                error = await self.load(ensemble.name, namespace=ensemble.namespace
                                        if self.namespacing else None)
            if error is not None:
                log.error("failed to load '%s' again with '%s': %s", ensemble.name, name,
                          error.message)

    async def _unload_version(self, mid: ModelId, version: int) -> None:
        live = self.live.get((mid, version))
        if live is None:
            return
        self._set(mid, version, ModelState.UNLOADING, "", None)
        log.info("unloading: %s:%d", mid, version)
        await self._drain(live)
        if self.live.get((mid, version)) is live:
            del self.live[(mid, version)]
        self._set(mid, version, ModelState.UNAVAILABLE, "unloaded")
        log.info("successfully unloaded '%s' version %d", mid, version)

    async def unload_all(self) -> None:
        self.stopping = True
        for scope in self.restarting:
            scope.cancel()
        # ensembles first: their requests in flight still need the models they are made of
        ensembles = {m.name for (m, _), live in self.live.items()
                     if live.handle.config.ensemble is not None}
        for group in (ensembles, {m.name for (m, _) in self.live} - ensembles):
            async with trio.open_nursery() as nursery:
                for name in sorted(group):
                    nursery.start_soon(self.unload, name)


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


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
    namespacing: bool = False,
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
    --model-load-retry-count (a version that fails to load is tried again so often);
    ``namespacing``: its --model-namespacing (each repository a namespace of its own).
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
            namespacing=namespacing,
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
                        elif isinstance(command, RegisterRepository):
                            mailbox.answer(command.reply, manager.register(command), close=True)
                        elif isinstance(command, UnregisterRepository):
                            mailbox.answer(command.reply, manager.unregister(command),
                                           close=True)
                        else:
                            commands.start_soon(manager.serve_command, command)
                commands.cancel_scope.cancel()  # shutting down: loads still running stop

            # commands are taken while the startup models load: a model's initialize may
            # load another model (pb_utils.load_model), as under Triton
            commands.start_soon(intake)
            failed = await manager.load_many(startup_models)
            manager.log_status_table()
            if failed and exit_on_error:
                startup_failed = True
                commands.cancel_scope.cancel()
            else:
                task_status.started(failed)
        await manager.unload_all()
        manager.remove_temporary_folders()  # a failed start-up leaves none behind either
        if startup_failed:
            raise StartupError("failed to load all models")


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

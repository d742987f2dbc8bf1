"""Model handles and the table of live models the frontends read.

The ModelManager is the only writer: it publishes a new immutable :class:`ModelTable` into
the :class:`Directory` whenever a version changes state. Frontends (through the core) only
read the current table and hold :class:`ModelHandle` objects, which carry a scheduler's
intake channel and the model's frozen configuration.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import trio

from nursery.actors import mailbox
from nursery.config.model import ModelConfig
from nursery.config.namespaces import ModelId, find_identifier
from nursery.config.repository import RepositoryScan
from nursery.errors import InvalidArgument, NotFound, Unavailable
from nursery.messages import CancelWork, IndexEntry, InferWork, StatsQuery
from nursery.observability.stats import StatsSnapshot

log = logging.getLogger("nursery.readiness")


class ModelState(enum.Enum):
    UNKNOWN = "UNKNOWN"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True, eq=False)
class ModelHandle:
    """What a frontend needs to send requests to one model version."""

    name: str
    version: int
    config: ModelConfig
    intake: trio.MemorySendChannel[Any] = field(repr=False)  # the scheduler's inbox
    # whether every instance can serve now (False while a Python stub process is being
    # started again after it died); the version's readiness, as Triton 2.60+ reports it
    healthy: Callable[[], bool] = field(default=lambda: True, repr=False, compare=False)
    # the readiness endpoints' full check: healthy, and each instance's own readiness hook
    # (a Python model's is_ready(), called in its instance with a time limit): None when
    # ready, else why not; None here: healthy() alone
    unready: Callable[[], Awaitable[str | None]] | None = field(default=None, repr=False,
                                                                compare=False)

    async def not_ready_reason(self) -> str | None:
        """None when every instance is ready, else why one is not (Triton's words)."""
        if self.unready is None:
            return None if self.healthy() else "an instance is not healthy"
        return await self.unready()

    @property
    def version_str(self) -> str:
        return str(self.version)

    def submit(self, work: InferWork) -> None:
        """Queue a request, or raise UNAVAILABLE at once (the model is unloading). The intake
        never blocks: the scheduler takes every message at once and its policy bounds its
        queue, rejecting what does not fit."""
        if not mailbox.tell(self.intake, work):
            raise Unavailable(f"model '{self.name}' version {self.version} is unloading")

    def cancel(self, work: InferWork) -> None:
        """The requester gave up on ``work``: the scheduler drops it if still queued."""
        mailbox.tell(self.intake, CancelWork(work))

    def report(self, message: object) -> None:
        """A fact for the scheduler's statistics (e.g. a response-cache outcome)."""
        mailbox.tell(self.intake, message)

    async def query_stats(self) -> StatsSnapshot:
        try:
            return await mailbox.ask(self.intake, StatsQuery, gone="unloaded")
        except Unavailable:  # the version stopped meanwhile: nothing counted any more
            return StatsSnapshot()


@dataclass(frozen=True)
class VersionStatus:
    version: int
    state: ModelState
    reason: str = ""
    handle: ModelHandle | None = None
    load_secs: float = 0.0  # how long its load took (nv_model_load_duration_secs)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    versions: Mapping[int, VersionStatus]
    reason: str = ""  # a failure that happened before any version was known (bad config)
    config: ModelConfig | None = None
    namespace: str = ""  # its repository with --model-namespacing, else none
    # the configuration could not be read: as Triton's poll, the model is left out (not
    # found, not counted by readiness); listed in the index with the reason all the same
    left_out: bool = False
    latest: ModelHandle | None = field(init=False, default=None)  # highest READY version

    def __post_init__(self) -> None:
        ready = self.ready_versions()
        if ready:
            object.__setattr__(self, "latest", self.versions[ready[-1]].handle)

    def ready_versions(self) -> list[int]:
        return sorted(v for v, s in self.versions.items() if s.state is ModelState.READY)


@dataclass(frozen=True)
class ModelTable:
    """The models by identifier (``ModelId.key``: the name alone without namespacing).
    With ``namespacing``, ``by_name`` is Triton's global map: each name and the identifiers
    of the models of that name the manager knows (loaded, loading or failed; not unloaded),
    through which a request's name is resolved."""

    models: Mapping[str, ModelEntry] = field(default_factory=lambda: MappingProxyType({}))
    namespacing: bool = False
    by_name: Mapping[str, tuple[ModelId, ...]] = field(
        default_factory=lambda: MappingProxyType({}))

    def identify(self, name: str, namespace: str | None = None) -> str:
        """The key of the model a request for ``name`` means (``namespace``: the one to
        prefer, an ensemble step's); raises Triton's INVALID_ARG for a name no model or
        several models hold (with namespacing)."""
        if not self.namespacing:
            return name
        return find_identifier(name, self.by_name.get(name, ()), namespace).key


def parse_version(text: str) -> int:
    """A request's version string; "" means the server's choice (-1)."""
    if text == "":
        return -1
    try:
        value = int(text)
    except ValueError:
        value = -2
    if value < 0 or not text.isdigit():
        raise InvalidArgument(
            f"failed to get model version from specified version string '{text}' (details: "
            "not an integral number), version should be an integral value > 0"
        )
    return value


class Directory:
    """The current :class:`ModelTable`; replaced, never mutated, by the ModelManager."""

    def __init__(self) -> None:
        self.table = ModelTable()

    def publish(self, table: ModelTable) -> None:
        self.table = table

    def entry(self, name: str, namespace: str | None = None) -> ModelEntry | None:
        """The model ``name`` means (None when unknown; with namespacing, a name several
        models hold raises INVALID_ARG: ambiguous)."""
        table = self.table
        if table.namespacing and name not in table.by_name:
            return None
        return table.models.get(table.identify(name, namespace))

    def resolve(self, name: str, version: str, namespace: str | None = None) -> ModelHandle:
        """The handle serving ``name``/``version`` (Triton's errors when there is none).
        ``namespace``: the namespace to prefer (an ensemble step's: its ensemble's)."""
        table = self.table
        entry = table.models.get(table.identify(name, namespace))
        if entry is None or (entry.left_out and not entry.versions):
            # a model whose configuration could not be read never had a version: as in
            # Triton, whose poll leaves it out of the model lifecycle, it is not found
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if not version:
            if entry.latest is None:
                raise NotFound(f"Request for unknown model: '{name}' has no available versions")
            return entry.latest
        wanted = parse_version(version)
        status = entry.versions.get(wanted)
        if status is None:
            raise NotFound(f"Request for unknown model: '{name}' version {wanted} is not found")
        if status.state is not ModelState.READY:
            raise Unavailable(
                f"Request for unknown model: '{name}' version {wanted} is not at ready state"
            )
        assert status.handle is not None
        return status.handle

    def is_ready(self, name: str, version: str) -> bool:
        try:
            handle = self.resolve(name, version)
        except (NotFound, Unavailable, InvalidArgument):
            return False
        return handle.healthy()

    async def check_ready(self, name: str, version: str) -> bool:
        """:meth:`is_ready`, with the model's own readiness hooks asked (Triton's model
        readiness calls each instance's ``TRITONBACKEND_ModelInstanceReady``)."""
        try:
            handle = self.resolve(name, version)
        except (NotFound, Unavailable, InvalidArgument):
            return False
        reason = await handle.not_ready_reason()
        if reason is not None:  # Triton's line at --log-verbose 1
            log.debug("Model '%s' version %d is not ready: %s", handle.name, handle.version,
                      reason)
        return reason is None

    async def check_all_ready(self) -> bool:
        """:meth:`all_ready`, with every READY version's readiness hooks asked."""
        if not self.all_ready():
            return False
        for entry in self.table.models.values():
            for status in entry.versions.values():
                if status.handle is None:
                    continue
                reason = await status.handle.not_ready_reason()
                if reason is not None:
                    log.debug("Model '%s' version %d is in READY lifecycle state but failed "
                              "runtime readiness check during server readiness evaluation: %s",
                              status.handle.name, status.handle.version, reason)
                    return False
        return True

    def all_ready(self) -> bool:
        """Strict readiness: every model that has versions has them READY (or unloaded). A
        model whose configuration could not be read has none and does not count, as in
        Triton, whose readiness looks at the models its poll took in."""
        for entry in self.table.models.values():
            for status in entry.versions.values():
                if status.state is not ModelState.READY and status.reason != "unloaded":
                    return False
                if status.handle is not None and not status.handle.healthy():
                    return False
            if not entry.versions and entry.reason and not entry.left_out:
                return False  # its load failed before a version was known (none selected)
        return True


def repository_index(repo: RepositoryScan, entries: Mapping[ModelId, ModelEntry],
                     ready_only: bool, namespacing: bool = False) -> list[IndexEntry]:
    """Every model in the repositories (Triton lists repository folders), with each known
    version's state from ``entries``. With namespacing, every folder is a model of its own
    (one name may be listed once per repository), ordered by namespace, then name."""
    if namespacing:
        out: list[IndexEntry] = []
        for mid in sorted(repo.identified(True)):
            out.extend(index_rows(mid.name, entries.get(mid), ready_only))
        return out
    out = []
    for name in sorted({*repo.models, *repo.duplicates}):
        if name in repo.duplicates:
            if not ready_only:
                out.append(IndexEntry(name, None, ModelState.UNAVAILABLE.value,
                                      "model appears in two or more repositories"))
            continue
        out.extend(index_rows(name, entries.get(ModelId("", name)), ready_only))
    return out


def index_rows(name: str, entry: ModelEntry | None, ready_only: bool) -> list[IndexEntry]:
    """The repository index's rows of one model (and the start-up status table's): one per
    known version with its state, or one without a version (a state and reason only when its
    load failed before any version was known)."""
    if entry is None or (not entry.versions and not entry.reason):
        return [] if ready_only else [IndexEntry(name)]
    if not entry.versions:
        return [] if ready_only else [
            IndexEntry(name, None, ModelState.UNAVAILABLE.value, entry.reason)]
    return [IndexEntry(name, version, status.state.value, status.reason)
            for version, status in sorted(entry.versions.items())
            if not ready_only or status.state is ModelState.READY]

"""Models that come and go with demand (issue 28; beyond Triton, opt-in, explicit mode).

With ``--model-load-on-demand`` a request for a model of the repository that is not loaded
loads it and is then served: the first such request asks the ModelManager to load it,
requests that arrive meanwhile wait for that one load, and all of them wait at most
``--model-load-on-demand-timeout-secs``. A model that failed to load is not tried again on
demand for ``RETRY_AFTER`` seconds (its requests get the load's error at once).

With ``--model-load-budget`` (models, bytes of model files, or both) every demand load, and
every load through the repository API, is followed by unloading the least recently used idle
models until the loaded ones fit again (``scheduling/model_budget.py`` chooses; the manager
drains and unloads): never a model with requests in flight, never a ``--model-load-pin`` one,
never the model just asked for.

Not an actor of its own: the core calls it on the trio thread and it talks to the manager by
message. Its counts (loads on demand, unloads for the budget) are read by the metrics port.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import trio

from nursery.actors import mailbox
from nursery.actors.directory import Directory, ModelHandle, ModelState
from nursery.actors.model_client import ModelClient
from nursery.config.repository import fingerprint
from nursery.errors import NurseryError, Unavailable
from nursery.messages import LoadModel, ManagerCommand, UnloadModel
from nursery.scheduling.model_budget import Budget, LruBudget

log = logging.getLogger("nursery.demand")

RETRY_AFTER = 5.0  # seconds before a model that failed to load on demand is tried again
MAX_REMEMBERED_FAILURES = 1024  # names that failed (clients may make up names): bounded


class DemandLoader:
    def __init__(self, directory: Directory, manager: trio.MemorySendChannel[ManagerCommand],
                 client: ModelClient, *, on_demand: bool = False, timeout: float = 60.0,
                 budget: Budget | None = None, pinned: Iterable[str] = (),
                 retry_after: float = RETRY_AFTER) -> None:
        self.directory = directory
        self.manager = manager
        self.client = client
        self.on_demand = on_demand
        self.timeout = timeout
        self.retry_after = retry_after
        self.policy = LruBudget(budget or Budget())
        self.pinned = frozenset(pinned)
        self.loading: dict[str, trio.Event] = {}
        self.failed_at: dict[str, tuple[float, NurseryError]] = {}
        self.sizes: dict[tuple[str, Path], int] = {}  # bytes of a model's files, by folder
        self.demand_loads: Counter[str] = Counter()
        self.evictions: Counter[str] = Counter()

    @property
    def active(self) -> bool:
        return self.on_demand or bool(self.policy.budget)

    async def acquire(self, name: str, version: str = "") -> ModelHandle:
        """The handle a request for ``name`` goes to, loading the model first when it is not
        loaded and loading on demand is on."""
        try:
            handle = self.directory.resolve(name, version)
        except NurseryError as missing:
            if not self.on_demand or self._serving(name):
                raise
            await self._load(name, missing)
            handle = self.directory.resolve(name, version)
        self.policy.used(name)
        return handle

    def _serving(self, name: str) -> bool:
        entry = self.directory.entry(name)
        return entry is not None and any(
            s.state is ModelState.READY for s in entry.versions.values())

    async def _load(self, name: str, missing: NurseryError) -> None:
        """Load ``name`` (or wait for the load under way). ``missing``: the error its request
        got, raised again for a model that no repository holds (Triton's unknown-model
        answer)."""
        failed = self.failed_at.get(name)
        if failed is not None and trio.current_time() - failed[0] < self.retry_after:
            # failed a moment ago: not tried again for every request (a fresh error each
            # time, so that no traceback grows on a shared one)
            raise copy.copy(failed[1])
        event = self.loading.get(name)
        if event is not None:  # another request is loading it: wait for that load
            with trio.move_on_after(self.timeout):
                await event.wait()
            return
        event = self.loading[name] = trio.Event()
        error: NurseryError | None = None
        try:
            with trio.move_on_after(self.timeout) as scope:
                log.info("loading '%s' on demand", name)
                error = await mailbox.ask(self.manager, lambda reply: LoadModel(name, reply),
                                          gone="the server is shutting down")
        finally:
            del self.loading[name]
            event.set()
        if scope.cancelled_caught:
            raise Unavailable(f"model '{name}' did not load within "
                              f"{self.timeout:g} s (--model-load-on-demand-timeout-secs)")
        if error is not None:
            if error.message == f"failed to load '{name}', failed to poll from model repository":
                error = missing  # in no repository
            if len(self.failed_at) >= MAX_REMEMBERED_FAILURES:
                self.failed_at.clear()
            self.failed_at[name] = (trio.current_time(), error)
            raise error
        self.failed_at.pop(name, None)
        self.demand_loads[name] += 1
        await self.enforce(keep=name)

    async def enforce(self, keep: str | None = None) -> None:
        """Unload the least recently used idle models until the loaded ones fit the budget
        (after a load; ``keep``: the model just loaded)."""
        if not self.policy.budget:
            return
        table = self.directory.table.models
        ready = {entry.name: entry for entry in table.values()  # by name, in any namespace
                 if any(s.state is ModelState.READY for s in entry.versions.values())}
        for name in list(self.policy.resident):
            if name not in ready:
                self.policy.unloaded(name)
        for name, entry in ready.items():
            if entry.config is None:
                continue
            size = await self._size(name, entry.config.path)
            if name == keep:
                self.policy.loaded(name, size)
            elif name in self.policy.resident:
                self.policy.resident[name] = size
            else:
                self.policy.adopt(name, size)
        busy = {name for name, count in self.client.in_flight.items() if count}
        for victim in self.policy.victims(busy, self.pinned, keep):
            self.policy.unloaded(victim)
            self.evictions[victim] += 1
            log.info("unloading '%s': the least recently used idle model above "
                     "--model-load-budget", victim)
            send, _ = trio.open_memory_channel[Any](1)  # the answer is not awaited
            try:
                await self.manager.send(UnloadModel(victim, send))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return  # shutting down

    async def _size(self, name: str, path: Path) -> int:
        if not self.policy.budget.bytes:
            return 0
        size = self.sizes.get((name, path))
        if size is None:
            found = await trio.to_thread.run_sync(fingerprint, path)
            size = sum(f[1] for f in found.files)
            self.sizes = {k: v for k, v in self.sizes.items() if k[0] != name}
            self.sizes[(name, path)] = size
        return size

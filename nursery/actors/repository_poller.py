"""RepositoryPoller: in ``--model-control-mode=poll``, rescans the repositories on its own clock.

Every ``--repository-poll-secs`` it takes a snapshot (each model folder's files, sizes and
modification times; for a bucket, each object's size and ETag or generation from one listing,
nothing downloaded; read off the trio thread), diffs it against the previous one (pure,
``repository.diff``) and sends the ModelManager what changed: added and changed models are
loaded (a failed reload leaves the old version serving; a model that failed to load is tried
again every poll), removed models are unloaded. Without ``--model-namespacing``, a model whose
name comes to be in two repositories counts as removed (Triton serves neither copy) and as
added once one copy is left.

A repository that cannot be read (missing, say, with ``--exit-on-error=false``) is logged as
Triton logs it, when it becomes unreadable; its models count as unchanged until it can be read
again (a repository briefly unmounted does not unload what it serves).

With ``--model-namespacing`` each repository's model is a model of its own: the snapshot is
by identifier (namespace and name), and the manager is asked to load or unload the model of
one namespace only.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from nursery.actors.model_manager import LoadModel, UnloadModel
from nursery.config.namespaces import ModelId
from nursery.config.repository import ModelFingerprint, Root, diff, scan, snapshot
from nursery.runtime.supervision import Boundary, FaultCounter

log = logging.getLogger("nursery.poller")


async def _ask(manager: trio.MemorySendChannel[Any], make: Any, mid: ModelId,
               namespacing: bool) -> Any:
    send, receive = trio.open_memory_channel[Any](1)
    await manager.send(make(mid.name, send, namespace=mid.namespace if namespacing else None))
    async with receive:
        return await receive.receive()


def _take(repositories: tuple[Root, ...], last: dict[ModelId, ModelFingerprint] | None,
          unreadable: set[Root], namespacing: bool = False) -> dict[ModelId, ModelFingerprint]:
    """The repositories' snapshot (blocking: run it off the trio thread). While a repository
    cannot be read, the models of ``last`` that no readable repository holds are kept;
    ``unreadable`` is updated, and logged when it changes (the first snapshot, ``last`` None,
    logs nothing: the start-up has just said it)."""
    found = scan(repositories)
    if last is not None:
        for repo, reason in found.unreadable.items():
            if repo not in unreadable:
                log.error("%s", reason)
        for repo in unreadable - set(found.unreadable):
            log.info("model repository '%s' can be read again", repo)
    unreadable.clear()
    unreadable.update(found.unreadable)
    current = snapshot(found, namespacing)
    if last is not None and not namespacing:
        for name in sorted(found.duplicates):  # it is unloaded; Triton's words
            if ModelId("", name) in last:
                log.error("failed to poll model '%s': not unique across all model repositories",
                          name)
    if found.unreadable and last is not None:
        current = {**{n: f for n, f in last.items() if n not in current}, **current}
    return current


async def run(
    *,
    repositories: tuple[Root, ...],
    manager: trio.MemorySendChannel[Any],
    interval: float,
    faults: FaultCounter | None = None,
    namespacing: bool = False,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    faults = faults or FaultCounter()
    unreadable: set[Root] = set()
    async with manager:
        last: dict[ModelId, ModelFingerprint] = await trio.to_thread.run_sync(
            _take, repositories, None, unreadable, namespacing)
        failed: set[ModelId] = set()
        task_status.started()
        while True:
            await trio.sleep(interval)
            # one poll is the unit of failure: an unreadable folder costs this poll, and the
            # next one starts from the last good snapshot
            with Boundary(faults, "poller", log, "repository poll"):
                last = await _poll(repositories, manager, last, failed, unreadable,
                                   namespacing)


async def _poll(repositories: tuple[Root, ...], manager: trio.MemorySendChannel[Any],
                last: dict[ModelId, ModelFingerprint], failed: set[ModelId],
                unreadable: set[Root], namespacing: bool) -> dict[ModelId, ModelFingerprint]:
    current = await trio.to_thread.run_sync(_take, repositories, last, unreadable,
                                            namespacing)
    changes = diff(last, current)
    retry = sorted(failed - set(changes.removed) - set(changes.added) - set(changes.changed))
    if changes:
        log.info("repository changed: added %s, changed %s, removed %s",
                 [str(m) for m in changes.added], [str(m) for m in changes.changed],
                 [str(m) for m in changes.removed])
    for mid in (*changes.added, *changes.changed, *retry):
        error = await _ask(manager, LoadModel, mid, namespacing)
        if error is None:
            failed.discard(mid)
        else:  # tried again every poll, as Triton does, until it loads
            failed.add(mid)
            log.error("poll: failed to load '%s': %s", mid, error.message)
    for mid in changes.removed:
        failed.discard(mid)
        error = await _ask(manager, UnloadModel, mid, namespacing)
        if error is not None:
            log.error("poll: failed to unload '%s': %s", mid, error.message)
    return current

"""ResponseCache: the server-wide response cache as an actor (``--cache-config local,size=N``).

Lookups, inserts and statistics queries are messages on its inbox; it owns the byte-budgeted
LRU store (``cache_store.LruStore``) and its counters, and nobody else touches them. A hit
answers the stored response (read-only arrays, shared by every hit); a miss answers None and
the core inserts the answer once the model produced it. Models opt in with
``response_cache { enable: true }``; decoupled and sequence models never use it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from nursery.actors import mailbox
from nursery.messages import CacheInsert, CacheLookup, CacheStatsQuery
from nursery.runtime.supervision import FaultCounter
from nursery.scheduling.cache_store import CacheTotals, LruStore, entry_size

log = logging.getLogger("nursery.cache")


async def run(
    *,
    budget: int,
    inbox: trio.MemoryReceiveChannel[Any],
    faults: FaultCounter | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    faults = faults or FaultCounter()
    store = LruStore(budget)
    lookups = hits = misses = inserts = lookup_ns = insert_ns = 0
    log.info("response cache: local, %d bytes", budget)
    task_status.started()
    async with inbox:
        async for first in inbox:
            message = first
            while True:  # take every message already waiting before yielding again
                try:
                    if isinstance(message, CacheLookup):
                        t0 = time.monotonic_ns()
                        found = store.get(message.key)
                        lookups += 1
                        if found is None:
                            misses += 1
                        else:
                            hits += 1
                        lookup_ns += time.monotonic_ns() - t0
                        mailbox.answer(message.reply, found)
                    elif isinstance(message, CacheInsert):
                        t0 = time.monotonic_ns()
                        response = message.response  # already the cache's own read-only copy
                        if store.put(message.key, response, entry_size(message.key, response)):
                            inserts += 1
                        insert_ns += time.monotonic_ns() - t0
                    elif isinstance(message, CacheStatsQuery):
                        mailbox.answer(message.reply, CacheTotals(
                            entries=len(store), bytes_used=store.used, budget=store.budget,
                            lookups=lookups, hits=hits, misses=misses, evictions=store.evictions,
                            inserts=inserts, lookup_ns=lookup_ns, insert_ns=insert_ns))
                except Exception as exc:  # one command is the unit of failure
                    faults.record("cache", exc, log, "response cache command")
                    reply = getattr(message, "reply", None)
                    if reply is not None and isinstance(message, CacheLookup):
                        mailbox.answer(reply, None)  # a miss: the request runs the model
                try:
                    message = inbox.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break


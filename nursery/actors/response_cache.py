"""ResponseCache: the server-wide response cache as an actor (``--cache-config local,size=N``
or ``--cache-config redis,host=H --cache-config redis,port=P``).

Lookups, inserts and statistics queries are messages on its inbox; it owns the store and its
counters, and nobody else touches them. A hit answers the stored response (read-only arrays);
a miss answers None and the core inserts the answer once the model produced it. Models opt in
with ``response_cache { enable: true }``; decoupled and sequence models never use it.

The local store is the byte-budgeted LRU (``cache_store.LruStore``), served in the actor's
loop. The Redis store (:func:`run_redis`) keeps each answer as a hash in a Redis server
shared by every server that names it; its commands go over ``runtime/redis_client``'s pool,
each lookup and insert in a task of the actor's own nursery so that one slow round trip
holds up no other. A Redis that cannot be reached when the server starts stops the start
(Triton's "Failed to initialize RedisCache: ..."); one that fails later costs the requests
of that moment their cache, never their answer: a failed lookup is a miss and a failed
insert a log line, in Triton's words.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from nursery.actors import mailbox
from nursery.errors import StartupError
from nursery.messages import CacheInsert, CacheLookup, CacheStatsQuery
from nursery.runtime.redis_client import Pool, RedisError
from nursery.runtime.supervision import FaultCounter
from nursery.scheduling.cache_store import (
    CacheConfig,
    CacheTotals,
    LruStore,
    RedisOptions,
    entry_fields,
    entry_size,
    redis_key,
    response_from_fields,
)

log = logging.getLogger("nursery.cache")


class _Counts:
    """The cache's counters (Triton's ``nv_cache_*`` figures), whichever store it keeps."""

    def __init__(self) -> None:
        self.lookups = self.hits = self.misses = self.inserts = 0
        self.lookup_ns = self.insert_ns = 0

    def looked_up(self, hit: bool, ns: int) -> None:
        self.lookups += 1
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        self.lookup_ns += ns

    def inserted(self, stored: bool, ns: int) -> None:
        self.inserts += stored
        self.insert_ns += ns

    def totals(self, **store: int) -> CacheTotals:
        """With ``store``: the local store's entries, bytes, budget and evictions."""
        return CacheTotals(lookups=self.lookups, hits=self.hits, misses=self.misses,
                           inserts=self.inserts, lookup_ns=self.lookup_ns,
                           insert_ns=self.insert_ns, **store)


async def run(
    *,
    config: CacheConfig,
    inbox: trio.MemoryReceiveChannel[Any],
    faults: FaultCounter | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the inbox until every sender is gone."""
    if config.redis is not None:
        await run_redis(options=config.redis, inbox=inbox, faults=faults,
                        task_status=task_status)
    else:
        await run_local(budget=config.size, inbox=inbox, faults=faults,
                        task_status=task_status)


async def run_local(
    *,
    budget: int,
    inbox: trio.MemoryReceiveChannel[Any],
    faults: FaultCounter | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    faults = faults or FaultCounter()
    store = LruStore(budget)
    counts = _Counts()
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
                        counts.looked_up(found is not None, time.monotonic_ns() - t0)
                        mailbox.answer(message.reply, found)
                    elif isinstance(message, CacheInsert):
                        t0 = time.monotonic_ns()
                        response = message.response  # already the cache's own read-only copy
                        size = entry_size(message.key, response)
                        stored = store.put(message.key, response, size)
                        if not stored:  # Triton's line (L0_response_cache greps it)
                            log.error("Failed to insert key [%s] into response cache: Cache "
                                      "entry of %d bytes is larger than the whole cache (%d "
                                      "bytes)", message.key.hex(), size, store.budget)
                        counts.inserted(stored, time.monotonic_ns() - t0)
                    elif isinstance(message, CacheStatsQuery):
                        mailbox.answer(message.reply, counts.totals(
                            entries=len(store), bytes_used=store.used, budget=store.budget,
                            evictions=store.evictions))
                except Exception as exc:  # one command is the unit of failure
                    faults.record("cache", exc, log, "response cache command")
                    reply = getattr(message, "reply", None)
                    if reply is not None and isinstance(message, CacheLookup):
                        mailbox.answer(reply, None)  # a miss: the request runs the model
                try:
                    message = inbox.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break


async def run_redis(
    *,
    options: RedisOptions,
    inbox: trio.MemoryReceiveChannel[Any],
    faults: FaultCounter | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    faults = faults or FaultCounter()
    pool = Pool(options)
    try:
        await pool.start()
    except RedisError as exc:
        raise StartupError(f"Failed to initialize RedisCache: {exc}") from None
    if options.ignored:
        log.warning("response cache: redis ignores the setting(s) %s", ", ".join(options.ignored))
    counts = _Counts()
    log.info("response cache: redis at %s:%d (db %d, %d connection(s)%s)", options.host,
             options.port, options.db, options.pool_size, ", TLS" if options.tls_enabled else "")

    async def lookup(message: CacheLookup) -> None:
        found = None
        t0 = time.monotonic_ns()
        key = redis_key(message.key)
        try:
            reply = await pool.call(b"HGETALL", key)
            if reply:
                found = response_from_fields(dict(zip(reply[::2], reply[1::2], strict=True)))
        except (RedisError, ValueError, TypeError) as exc:  # a miss: the model answers
            log.error("Failed to retrieve key: %s. %s", key.decode(), exc)
        except Exception as exc:  # one lookup is the unit of failure
            faults.record("cache", exc, log, "response cache lookup")
        finally:
            counts.looked_up(found is not None, time.monotonic_ns() - t0)
            mailbox.answer(message.reply, found)

    async def insert(message: CacheInsert) -> None:
        t0 = time.monotonic_ns()
        key = redis_key(message.key)
        stored = False
        try:
            fields = entry_fields(message.response)
            await pool.call(b"HSET", key, *(x for pair in fields.items() for x in pair))
            stored = True
        except (RedisError, TypeError, ValueError) as exc:
            log.error("Failed to insert key [%s] into response cache: Failed to insert key: "
                      "%s. %s", key.decode(), key.decode(), exc)
        except Exception as exc:  # one insert is the unit of failure
            faults.record("cache", exc, log, "response cache insert")
        finally:
            counts.inserted(stored, time.monotonic_ns() - t0)

    task_status.started()
    try:
        async with inbox, trio.open_nursery() as commands:
            async for message in inbox:
                try:
                    if isinstance(message, CacheLookup):
                        commands.start_soon(lookup, message)
                    elif isinstance(message, CacheInsert):
                        commands.start_soon(insert, message)
                    elif isinstance(message, CacheStatsQuery):
                        mailbox.answer(message.reply, counts.totals())
                except Exception as exc:  # one command is the unit of failure
                    faults.record("cache", exc, log, "response cache command")
                    if isinstance(message, CacheLookup):
                        mailbox.answer(message.reply, None)
    finally:
        with trio.CancelScope(shield=True):
            await pool.aclose()

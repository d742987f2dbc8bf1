"""The ResponseCache and RateLimiter actors on trio's virtual clock."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from nursery.actors import rate_limiter, response_cache
from nursery.actors.rate_limiter import RateLimiterClient
from nursery.errors import ConfigError
from nursery.messages import CacheInsert, CacheLookup, CacheStatsQuery
from nursery.scheduling.cache_store import CacheTotals, frozen_copy
from nursery.scheduling.rate_limit_policy import RateLimitPolicy, ResourceNeed
from nursery.types import DataType, InferenceResponse, Tensor


async def _ask(inbox: trio.MemorySendChannel[Any], make: Any) -> Any:
    send, receive = trio.open_memory_channel[Any](1)
    inbox.send_nowait(make(send))
    with receive:
        return await receive.receive()


async def test_cache_actor_hits_misses_and_budget() -> None:
    send, inbox = trio.open_memory_channel[Any](math.inf)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(response_cache.run_local, budget=1000, inbox=inbox))
        out = np.arange(10, dtype=np.float32)
        response = InferenceResponse("m", "1", [Tensor("Y", DataType.FP32, (10,), out)])
        assert await _ask(send, lambda r: CacheLookup(b"k1", r)) is None
        send.send_nowait(CacheInsert(b"k1", frozen_copy(response)))
        out[0] = 99  # the cache keeps its own copy
        hit = await _ask(send, lambda r: CacheLookup(b"k1", r))
        assert hit.outputs[0].data[0] == 0 and not hit.outputs[0].data.flags.writeable
        big = InferenceResponse("m", "1", [Tensor("Y", DataType.UINT8, (2000,),
                                                  np.zeros(2000, np.uint8))])
        send.send_nowait(CacheInsert(b"big", big))  # larger than the budget: never stored
        for i in range(20):  # a flood of distinct entries: the budget holds
            send.send_nowait(CacheInsert(bytes([i]), response))
        totals: CacheTotals = await _ask(send, CacheStatsQuery)
        assert totals.bytes_used <= totals.budget == 1000
        assert totals.hits == 1 and totals.misses == 1 and totals.evictions > 0
        assert await _ask(send, lambda r: CacheLookup(b"big", r)) is None
        send.close()


async def test_rate_limiter_serialises_a_shared_resource(
        autojump_clock: trio.testing.MockClock) -> None:
    send, inbox = trio.open_memory_channel[Any](math.inf)
    running: list[str] = []
    overlaps = []
    done = {"a": 0, "b": 0}

    async def instance(client: RateLimiterClient, key: str) -> None:
        await client.register(key, 0, (ResourceNeed("R1", 1),), 1)
        for _ in range(5):
            await client.acquire(key)
            running.append(key)
            if len(running) > 1:
                overlaps.append(tuple(running))
            await trio.sleep(0.01)  # "compute"
            running.remove(key)
            done[key] += 1
            client.release(key)
        client.unregister(key)

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(rate_limiter.run,
                                    policy=RateLimitPolicy({("R1", None): 1}), inbox=inbox))
        client = RateLimiterClient(send)
        async with trio.open_nursery() as workers:
            workers.start_soon(instance, client, "a")
            workers.start_soon(instance, client, "b")
        assert overlaps == [] and done == {"a": 5, "b": 5}
        with pytest.raises(ConfigError, match="limited to 1"):
            await client.register("c", 0, (ResourceNeed("R1", 2),), 1)
        send.close()


async def test_abandoned_grant_is_given_back(autojump_clock: trio.testing.MockClock) -> None:
    send, inbox = trio.open_memory_channel[Any](math.inf)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(rate_limiter.run, policy=RateLimitPolicy(), inbox=inbox))
        client = RateLimiterClient(send)
        await client.register("a", 0, (ResourceNeed("R", 1),), 1)
        await client.register("b", 0, (ResourceNeed("R", 1),), 1)
        await client.acquire("a")
        with trio.move_on_after(1):
            await client.acquire("b")  # waits for "a", then gives up
        client.release("a")  # "b"'s grant finds nobody waiting and is released at once
        with trio.fail_after(1):
            await client.acquire("a")
        client.release("a")
        send.close()


async def test_workers_asking_ahead_get_turns_by_priority(
        autojump_clock: trio.testing.MockClock) -> None:
    """As an instance worker does: ask for the next batch's grant while the batch before runs
    (its release comes from the batch's end). With one copy of the resource and both always
    busy, priority 1 runs twice as often as priority 2 (L0_rate_limiter's cross-model test),
    and never two at once."""
    send, inbox = trio.open_memory_channel[Any](math.inf)
    turns: list[str] = []
    running: set[str] = set()

    async def batch(client: RateLimiterClient, key: str) -> None:
        assert not running, f"{key} granted while {running} runs"
        running.add(key)
        turns.append(key)
        await trio.sleep(0.1)
        running.discard(key)
        client.release(key)

    async def worker(client: RateLimiterClient, key: str, priority: int,
                     nursery: trio.Nursery) -> None:
        await client.register(key, 0, (ResourceNeed("R", 1),), priority)
        while True:
            await client.acquire(key)  # asked while its batch before may still run
            nursery.start_soon(batch, client, key)

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(rate_limiter.run, policy=RateLimitPolicy(), inbox=inbox))
        client = RateLimiterClient(send)
        async with trio.open_nursery() as workers:
            workers.start_soon(worker, client, "p1", 1, workers)
            workers.start_soon(worker, client, "p2", 2, workers)
            await trio.sleep(30.05)
            workers.cancel_scope.cancel()
        assert len(turns) == 301
        assert turns.count("p1") == pytest.approx(2 * turns.count("p2"), abs=2)
        send.close()


class _Keyed:
    """A fake worker's inbox as the scheduler holds a rate-limited instance's: its grants are
    the scheduler's to ask for (``limit_key``)."""

    def __init__(self, send: trio.MemorySendChannel[Any], key: str) -> None:
        self.send, self.limit_key = send, key

    def send_nowait(self, message: Any) -> None:
        self.send.send_nowait(message)

    async def aclose(self) -> None:
        await self.send.aclose()


async def test_a_rate_limited_batch_is_formed_when_its_grant_comes(
        autojump_clock: trio.testing.MockClock) -> None:
    """Two instances of one model that cannot run together (one copy of R, each needs it),
    dynamic batching with preferred sizes 1-4 (L0_rate_limiter's dynamic-batching case). The
    idle instance must not take a batch while it waits for the busy one's release: its batch
    is formed at its grant, from everything queued by then (Triton fills a batch until an
    instance is allocated to it). Before, it took the second request alone and ran a batch
    of 1 after the first; now every batch after the first is full. Nothing runs together."""
    from nursery.actors import scheduler
    from nursery.messages import CloseIntake, InferWork
    from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy
    from tests.fakes import ExecutionLog, fake_worker, make_work

    limiter_send, limiter_inbox = trio.open_memory_channel[Any](math.inf)
    log = ExecutionLog()
    async with trio.open_nursery() as nursery:
        policy = RateLimitPolicy()
        await nursery.start(partial(rate_limiter.run, policy=policy, inbox=limiter_inbox))
        client = RateLimiterClient(limiter_send)
        async with trio.open_nursery() as serving:
            intake, inbox = trio.open_memory_channel[Any](1000)
            keyed = []
            for i in range(2):
                await client.register(f"i{i}", 0, (ResourceNeed("R", 1),), 1)
                send, receive = trio.open_memory_channel[Any](1)
                keyed.append(_Keyed(send, f"i{i}"))
                await serving.start(partial(fake_worker, i, receive, intake.clone(), log, 1.0))
            config = BatchConfig(max_batch_size=4, preferred_batch_sizes=(1, 2, 3, 4))
            await serving.start(partial(scheduler.run, name="m",
                                        policy=DynamicBatchPolicy[InferWork](config),
                                        inbox=inbox, instances=keyed, limiter=client))
            receivers = []
            for i in range(13):  # one at once, then one every 0.1 s
                work, receive = make_work(i)
                intake.send_nowait(work)
                receivers.append(receive)
                await trio.sleep(0.1)
            for receive in receivers:
                await receive.receive()
            intake.send_nowait(CloseIntake())
            intake.close()
        spans = sorted((start, end) for _, _, start, end in log.batches)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False))
        sizes = [len(ids) for _, ids, start, _ in sorted(log.batches, key=lambda b: b[2])]
        assert sizes[0] == 1 and sizes[1:3] == [4, 4], sizes
        assert sum(sizes) == 13
        await trio.sleep(0.01)  # the last release reaches the limiter
        assert policy.holding() == {}  # every grant given back
        limiter_send.close()

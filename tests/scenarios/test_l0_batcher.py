"""Triton's qa/L0_batcher scenarios, re-expressed deterministically on trio's virtual clock.

The DynamicBatcher (the scheduler actor with DynamicBatchPolicy) runs with fake instances
whose compute time is a ``trio.sleep``; times and batch sizes are exact, not wall-clock bounds.
Setup as in Triton's tests unless a test says otherwise: max_batch_size 8, preferred [2, 6],
max_queue_delay 10 s, one instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from nursery.actors import scheduler
from nursery.errors import Unavailable
from nursery.messages import CloseIntake, ExecuteBatch, InferWork, StatsQuery
from nursery.observability.stats import StatsSnapshot
from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy, QueuePolicy
from tests.fakes import ExecutionLog, fake_worker, make_work

COMPUTE = 0.1
BASE = BatchConfig(max_batch_size=8, preferred_batch_sizes=(2, 6), max_queue_delay_us=10_000_000)


@dataclass
class Batcher:
    intake: trio.MemorySendChannel[Any]
    log: ExecutionLog
    t0: float

    def send(self, i: int, rows: int = 1, **kw: Any) -> trio.MemoryReceiveChannel[Any]:
        work, receive = make_work(i, rows, **kw)
        self.intake.send_nowait(work)
        return receive

    async def answer_time(self, receive: trio.MemoryReceiveChannel[Any]) -> tuple[Any, float]:
        answer = await receive.receive()
        return answer, trio.current_time() - self.t0

    async def stats(self) -> StatsSnapshot:
        send, receive = trio.open_memory_channel[StatsSnapshot](1)
        self.intake.send_nowait(StatsQuery(send))
        return await receive.receive()

    def batch_sizes(self) -> dict[int, int]:
        sizes: dict[int, int] = {}
        for _, ids, _, _ in self.log.batches:
            n = sum(self.rows[i] for i in ids)
            sizes[n] = sizes.get(n, 0) + 1
        return sizes

    rows: dict[str, int] = None  # type: ignore[assignment]


async def start(nursery: trio.Nursery, config: BatchConfig = BASE, instances: int = 1,
                compute: Any = COMPUTE) -> Batcher:
    intake, inbox = trio.open_memory_channel[Any](1000)
    log = ExecutionLog()
    channels = []
    for i in range(instances):
        send, receive = trio.open_memory_channel[ExecuteBatch](1)
        channels.append(send)
        await nursery.start(partial(fake_worker, i, receive, intake.clone(), log, compute))
    await nursery.start(partial(
        scheduler.run, name="m", policy=DynamicBatchPolicy[InferWork](config), inbox=inbox,
        instances=channels, preserve_ordering=config.preserve_ordering))
    await trio.testing.wait_all_tasks_blocked()
    return Batcher(intake, log, trio.current_time())


async def stop(b: Batcher) -> None:
    b.intake.send_nowait(CloseIntake())
    b.intake.close()


def sizes(stats: StatsSnapshot) -> dict[int, int]:
    return {size: infer.count for size, (_, infer, _) in stats.batch_stats.items()}


async def test_static_batch_preferred(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as n:
        b = await start(n)
        _, t = await b.answer_time(b.send(1, 2))
        assert t == pytest.approx(COMPUTE)  # a preferred size goes at once
        _, t = await b.answer_time(b.send(2, 6))
        assert t == pytest.approx(2 * COMPUTE)
        assert sizes(await b.stats()) == {2: 1, 6: 1}
        await stop(b)


@pytest.mark.parametrize("rows", [1, 3])
async def test_static_batch_not_preferred_waits_the_delay(
    autojump_clock: trio.testing.MockClock, rows: int
) -> None:
    async with trio.open_nursery() as n:
        b = await start(n)
        _, t = await b.answer_time(b.send(1, rows))
        assert t == pytest.approx(10 + COMPUTE)
        assert sizes(await b.stats()) == {rows: 1}
        await stop(b)


async def test_static_batch_gt_max_preferred(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as n:
        b = await start(n)
        _, t = await b.answer_time(b.send(1, 7))
        assert t == pytest.approx(COMPUTE)
        await stop(b)


async def test_multi_batch_not_preferred(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as n:
        b = await start(n)
        first = b.send(1, 1)
        await trio.sleep(1)
        second = b.send(2, 3)
        _, t1 = await b.answer_time(first)
        _, t2 = await b.answer_time(second)
        assert t1 == t2 == pytest.approx(10 + COMPUTE)  # the delay counts from the oldest
        assert sizes(await b.stats()) == {4: 1}
        await stop(b)


async def test_multi_batch_gt_max_preferred(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as n:
        b = await start(n)
        first = b.send(1, 3)
        await trio.sleep(1)
        second = b.send(2, 7)
        _, t1 = await b.answer_time(first)
        _, t2 = await b.answer_time(second)
        assert t1 == pytest.approx(1 + COMPUTE)  # 3 + 7 passes the largest preferred size
        assert t2 == pytest.approx(1 + 2 * COMPUTE)
        assert sizes(await b.stats()) == {3: 1, 7: 1}
        await stop(b)


async def test_multi_batch_sum_gt_max_preferred(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as n:
        b = await start(n)
        first = b.send(1, 3)
        await trio.sleep(1)
        second = b.send(2, 4)
        _, t1 = await b.answer_time(first)
        _, t2 = await b.answer_time(second)
        assert t1 == pytest.approx(1 + COMPUTE)
        assert t2 == pytest.approx(11 + COMPUTE)  # the bs 4 then waits its own delay
        assert sizes(await b.stats()) == {3: 1, 4: 1}
        await stop(b)


async def test_multi_batch_use_biggest_preferred(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as n:
        b = await start(n, instances=1)
        receivers = [b.send(i) for i in range(6)]  # all queued before the batcher looks
        for r in receivers:
            await r.receive()
        assert sizes(await b.stats()) == {6: 1}
        await stop(b)


@pytest.mark.parametrize(("count", "expected"), [(4, {4: 1}), (5, {4: 1, 1: 1}),
                                                 (7, {6: 1, 1: 1}), (3, {3: 1})])
async def test_preferred_batch_only_no_delay(autojump_clock: trio.testing.MockClock, count: int,
                                             expected: dict[int, int]) -> None:
    config = BatchConfig(max_batch_size=8, preferred_batch_sizes=(4, 6), max_queue_delay_us=0)
    async with trio.open_nursery() as n:
        b = await start(n, config)
        receivers = [b.send(i) for i in range(count)]
        for r in receivers:
            await r.receive()
        assert sizes(await b.stats()) == expected
        await stop(b)


async def test_different_shapes_are_not_batched(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as n:
        b = await start(n)
        first = b.send(1, 1, signature=((2,),))
        await trio.sleep(1)
        second = b.send(2, 1, signature=((3,),))
        _, t1 = await b.answer_time(first)
        _, t2 = await b.answer_time(second)
        assert t1 == pytest.approx(1 + COMPUTE)  # sent when the mismatching request arrived
        assert t2 == pytest.approx(11 + COMPUTE)  # which then waits its own delay
        assert sizes(await b.stats()) == {1: 2}
        await stop(b)


async def test_priority_levels(autojump_clock: trio.testing.MockClock) -> None:
    config = BatchConfig(max_batch_size=8, preferred_batch_sizes=(4, 8),
                         max_queue_delay_us=10_000_000, priority_levels=2,
                         default_priority_level=2)
    async with trio.open_nursery() as n:
        b = await start(n, config)
        low_a = b.send(1, 2)
        low_b = b.send(2, 1)
        await trio.sleep(1)
        high = b.send(3, 2, priority=1)
        _, t_high = await b.answer_time(high)
        _, t_a = await b.answer_time(low_a)
        _, t_b = await b.answer_time(low_b)
        assert t_high == t_a == pytest.approx(1 + COMPUTE)  # [prio 1 bs2 + default bs2] = 4
        assert t_b == pytest.approx(10 + COMPUTE)  # its delay counts from its arrival at 0
        await stop(b)


async def test_policy_delay(autojump_clock: trio.testing.MockClock) -> None:
    config = BatchConfig(max_batch_size=8, preferred_batch_sizes=(4, 8),
                         max_queue_delay_us=10_000_000,
                         default_queue_policy=QueuePolicy(reject_on_timeout=False,
                                                          default_timeout_us=100_000))
    async with trio.open_nursery() as n:
        b = await start(n, config)
        late = b.send(1, 1)
        await trio.sleep(0.2)
        a, c = b.send(2, 2), b.send(3, 2)
        _, ta = await b.answer_time(a)
        _, tc = await b.answer_time(c)
        _, tl = await b.answer_time(late)
        assert ta == tc == pytest.approx(0.2 + COMPUTE)  # the timed-out bs1 went behind them
        assert tl == pytest.approx(10 + COMPUTE)  # and waited out its delay from arrival
        await stop(b)


async def test_timeout_override(autojump_clock: trio.testing.MockClock) -> None:
    config = BatchConfig(max_batch_size=8, preferred_batch_sizes=(4,),
                         max_queue_delay_us=10_000_000,
                         default_queue_policy=QueuePolicy(default_timeout_us=1_000_000,
                                                          allow_timeout_override=True))
    async with trio.open_nursery() as n:
        b = await start(n, config)
        short = b.send(1, 1, timeout_us=100_000)
        long = b.send(2, 1, timeout_us=10_000_000)
        answer, t = await b.answer_time(short)
        assert isinstance(answer, Unavailable) and answer.message == "Request timeout expired"
        assert t == pytest.approx(0.1)
        answer, t = await b.answer_time(long)
        assert isinstance(answer, Unavailable)
        assert t == pytest.approx(1.0)  # a request can shorten the default, never extend it
        stats = await b.stats()
        assert stats.failures_by_reason == {"REJECTED": 2}
        await stop(b)


async def test_max_queue_size(autojump_clock: trio.testing.MockClock) -> None:
    config = BatchConfig(max_batch_size=8, preferred_batch_sizes=(8,), max_queue_delay_us=0,
                         default_queue_policy=QueuePolicy(max_queue_size=8))
    async with trio.open_nursery() as n:
        b = await start(n, config, compute=1.0)
        running = b.send(0, 8)
        await trio.testing.wait_all_tasks_blocked()  # bs 8 is executing
        receivers = [b.send(i + 1) for i in range(10)]
        answers = [await r.receive() for r in receivers]
        rejected = [a for a in answers if isinstance(a, Unavailable)]
        assert len(rejected) == 2
        assert all(a.message == "Exceeds maximum queue size" for a in rejected)
        await running.receive()
        await stop(b)


async def test_preserve_ordering(autojump_clock: trio.testing.MockClock) -> None:
    config = BatchConfig(max_batch_size=4, preferred_batch_sizes=(4,), max_queue_delay_us=0,
                         preserve_ordering=True)
    async with trio.open_nursery() as n:
        # instance 0 is slow, instance 1 fast: batches finish out of order
        b = await start(n, config, instances=2, compute=lambda i: 0.4 if i == 0 else 0.1)
        receivers = [b.send(i) for i in range(12)]
        times: dict[int, float] = {}

        async def wait(i: int, r: trio.MemoryReceiveChannel[Any]) -> None:
            _, times[i] = await b.answer_time(r)

        async with trio.open_nursery() as waiters:
            for i, r in enumerate(receivers):
                waiters.start_soon(wait, i, r)
        # the fast instance finished its batch (requests 4-7) at 0.1 s, but answers leave in
        # arrival order: after the slow instance's batch (0-3) at 0.4 s
        assert [times[i] for i in range(12)] == sorted(times[i] for i in range(12))
        assert times[4] == pytest.approx(0.4)
        assert sizes(await b.stats()) == {4: 3}
        assert {inst for inst, _, _, _ in b.log.batches} == {0, 1}
        await stop(b)


async def test_cancelled_request_leaves_the_queue(autojump_clock: trio.testing.MockClock) -> None:
    from nursery.messages import CancelWork

    async with trio.open_nursery() as n:
        b = await start(n)
        work, receive = make_work(1, 1)
        b.intake.send_nowait(work)
        await trio.sleep(1)
        receive.close()
        b.intake.send_nowait(CancelWork(work))
        await trio.sleep(20)
        assert b.log.batches == []  # it never ran
        stats = await b.stats()
        assert stats.failures_by_reason == {"CANCELED": 1} and stats.pending == 0
        await stop(b)

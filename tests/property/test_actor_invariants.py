"""The batching invariants against the running DynamicBatcher actor, on trio's virtual clock.

Random configurations and arrival patterns (batch sizes, shapes, priorities, timeouts, clients
that give up) drive the scheduler actor with fake instances whose compute is a ``trio.sleep``.
Afterwards: every request that was waited for got exactly one answer; abandoned requests never
ran; no batch is over max_batch_size or mixes shapes; an instance never ran two batches at
once; within a priority level, requests ran in arrival order (unless DELAYed); and nothing
waited past its delay while an instance was free.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery.actors import scheduler
from nursery.errors import NurseryError
from nursery.messages import CancelWork, CloseIntake, ExecuteBatch, InferWork
from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy
from tests.fakes import ExecutionLog, fake_worker, make_work
from tests.property.test_batch_invariants import configs

arrivals = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.0, 0.0005, 0.003, 0.02]),  # gap before this request
        st.integers(1, 4),  # rows
        st.sampled_from(["a", "a", "b"]),  # shape signature
        st.integers(0, 3),  # priority
        st.sampled_from([0, 0, 1_000, 30_000]),  # timeout_us
        st.sampled_from([None, None, None, 0.0, 0.002]),  # give up after (None = never)
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), instances=st.integers(1, 3),
       compute=st.sampled_from([0.001, 0.004, 0.03]), pattern=arrivals)
def test_dynamic_batcher_actor(config: BatchConfig, instances: int, compute: float,
                               pattern: list[tuple[Any, ...]]) -> None:
    max_batch = max(1, config.max_batch_size)
    log = ExecutionLog()
    answers: dict[int, list[Any]] = {}
    abandoned: set[int] = set()
    rows: dict[str, int] = {}
    meta: dict[str, tuple[int, str, float]] = {}  # id -> (level, signature, arrival)

    async def main() -> None:
        intake, inbox = trio.open_memory_channel[Any](10_000)
        async with trio.open_nursery() as nursery:
            channels = []
            for i in range(instances):
                send, receive = trio.open_memory_channel[ExecuteBatch](1)
                channels.append(send)
                await nursery.start(partial(fake_worker, i, receive, intake.clone(), log, compute))
            await nursery.start(partial(
                scheduler.run, name="m", policy=DynamicBatchPolicy[InferWork](config),
                inbox=inbox, instances=channels))

            async def client(i: int, work: InferWork, receive: Any, give_up: float | None) -> None:
                with trio.move_on_after(give_up if give_up is not None else 1e9) as scope:
                    answers[i] = [await receive.receive()]
                if scope.cancelled_caught:
                    receive.close()
                    intake.send_nowait(CancelWork(work))
                    abandoned.add(i)

            async with trio.open_nursery() as clients:
                for i, (gap, n, sig, prio, timeout, give_up) in enumerate(pattern):
                    await trio.sleep(gap)
                    bs = min(n, max_batch)
                    work, receive = make_work(i, bs, signature=sig, priority=prio,
                                              timeout_us=timeout)
                    rows[str(i)] = bs
                    meta[str(i)] = (config.level_of(prio), sig, trio.current_time())
                    intake.send_nowait(work)
                    clients.start_soon(client, i, work, receive, give_up)
            intake.send_nowait(CloseIntake())
            intake.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

    ran = [rid for _, ids, _, _ in log.batches for rid in ids]
    assert len(ran) == len(set(ran)), "a request ran twice"
    for i in range(len(pattern)):
        if i in abandoned:
            continue
        assert i in answers and len(answers[i]) == 1, f"request {i} not answered exactly once"
        answer = answers[i][0]
        if isinstance(answer, NurseryError):
            assert str(i) not in ran  # rejected requests never ran
        else:
            assert answer.id == str(i) and str(i) in ran
    for _, ids, _, _ in log.batches:
        assert sum(rows[r] for r in ids) <= max_batch, "batch over max_batch_size"
        assert len({meta[r][1] for r in ids}) == 1, "batch mixes shapes"
    for inst in range(instances):
        spans = sorted((s, e) for i, _, s, e in log.batches if i == inst)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), "overlap"
    delay_policies = {config.default_queue_policy, *config.level_policies.values()}
    if all(p.reject_on_timeout or not p.default_timeout_us for p in delay_policies):
        # no DELAY can reorder: within a level (and shape), requests run in arrival order
        started = {rid: start for _, ids, start, _ in log.batches for rid in ids}
        for level in {m[0] for m in meta.values()}:
            same = [r for r in sorted(started, key=int) if meta[r][0] == level]
            times = [started[r] for r in same]
            assert times == sorted(times), "FIFO within a priority level broken"

"""The scheduler actor on trio's virtual clock, with fake instance workers (no sockets)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.actors import scheduler
from nursery.actors.mailbox import OneShot
from nursery.errors import Unavailable
from nursery.messages import CloseIntake, ExecuteBatch, InferWork, UpdateInstances
from nursery.scheduling.fifo import FifoPolicy
from tests.fakes import ExecutionLog, fake_worker, make_work


async def _start(nursery: trio.Nursery, instances: int, log: ExecutionLog,
                 compute: float = 0.01) -> tuple[trio.MemorySendChannel[Any], trio.MemorySendChannel[Any]]:
    """Start a scheduler with ``instances`` fake workers; returns (intake, control)."""
    intake, inbox = trio.open_memory_channel[Any](1000)
    channels = []
    for i in range(instances):
        send, receive = trio.open_memory_channel[ExecuteBatch](1)
        channels.append(send)
        await nursery.start(partial(fake_worker, i, receive, intake.clone(), log, compute))
    await nursery.start(partial(scheduler.run, name="m", policy=FifoPolicy[InferWork](),
                                inbox=inbox, instances=channels))
    return intake, intake.clone()


async def test_every_request_answered_once_in_order(autojump_clock: trio.testing.MockClock) -> None:
    log = ExecutionLog()
    async with trio.open_nursery() as nursery:
        intake, control = await _start(nursery, 1, log)
        receivers = []
        for i in range(20):
            work, receive = make_work(i)
            intake.send_nowait(work)
            receivers.append(receive)
        for i, receive in enumerate(receivers):
            answer = await receive.receive()
            assert answer.id == str(i)
            with pytest.raises(trio.WouldBlock):
                receive.receive_nowait()  # exactly one answer
        assert [b[1][0] for b in log.batches] == [str(i) for i in range(20)]
        intake.close()
        control.send_nowait(CloseIntake())
        control.close()


async def test_work_spreads_over_instances(autojump_clock: trio.testing.MockClock) -> None:
    log = ExecutionLog()
    async with trio.open_nursery() as nursery:
        intake, control = await _start(nursery, 3, log, compute=1.0)
        receivers = []
        start = trio.current_time()
        for i in range(6):
            work, receive = make_work(i)
            intake.send_nowait(work)
            receivers.append(receive)
        for receive in receivers:
            await receive.receive()
        assert trio.current_time() - start == pytest.approx(2.0)  # 6 jobs, 3 instances, 1 s each
        assert {b[0] for b in log.batches} == {0, 1, 2}
        intake.close()
        control.send_nowait(CloseIntake())
        control.close()


async def test_abandoned_requests_spend_no_model_time(autojump_clock: trio.testing.MockClock) -> None:
    log = ExecutionLog()
    async with trio.open_nursery() as nursery:
        intake, control = await _start(nursery, 1, log, compute=1.0)
        kept = []
        for i in range(6):
            work, receive = make_work(i)
            intake.send_nowait(work)
            if i in (2, 3, 4):
                receive.close()  # the client went away while queued
            else:
                kept.append(receive)
        for receive in kept:
            await receive.receive()
        ran = [b[1][0] for b in log.batches]
        assert ran == ["0", "1", "5"]
        intake.close()
        control.send_nowait(CloseIntake())
        control.close()


async def test_close_intake_drains_then_stops(autojump_clock: trio.testing.MockClock) -> None:
    log = ExecutionLog()
    receivers = []
    async with trio.open_nursery() as nursery:
        intake, control = await _start(nursery, 2, log, compute=0.5)
        for i in range(7):
            work, receive = make_work(i)
            intake.send_nowait(work)
            receivers.append(receive)
        intake.close()
        control.send_nowait(CloseIntake())
        control.close()
    # the nursery ended on its own: scheduler and workers returned after the queue drained
    assert sorted(b[1][0] for b in log.batches) == [str(i) for i in range(7)]
    for receive in receivers:
        assert receive.receive_nowait().id is not None


async def test_requests_after_close_are_refused(autojump_clock: trio.testing.MockClock) -> None:
    log = ExecutionLog()
    async with trio.open_nursery() as nursery:
        intake, control = await _start(nursery, 1, log)
        control.send_nowait(CloseIntake())
        work, receive = make_work(1)
        intake.send_nowait(work)
        answer = await receive.receive()
        assert isinstance(answer, Unavailable)
        intake.close()
        control.close()
    assert log.batches == []


@settings(max_examples=60, deadline=None)
@given(
    instances=st.integers(1, 4),
    compute=st.sampled_from([0.001, 0.01, 0.1]),
    arrivals=st.lists(st.tuples(st.floats(0, 0.05), st.booleans()), min_size=1, max_size=30),
)
def test_actor_invariants(instances: int, compute: float, arrivals: list[tuple[float, bool]]) -> None:
    """Under any arrival pattern: every waiting request gets exactly one answer, abandoned ones
    never run, an instance never runs two batches at once, and with one instance the order of
    execution is the order of arrival."""
    log = ExecutionLog()
    answers: dict[int, list[Any]] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            intake, control = await _start(nursery, instances, log, compute)

            async def client(i: int, receive: trio.MemoryReceiveChannel[Any]) -> None:
                answers[i] = [await receive.receive()]
                while True:
                    try:
                        answers[i].append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break

            async with trio.open_nursery() as clients:
                for i, (delay, abandon) in enumerate(arrivals):
                    await trio.sleep(delay)
                    work, receive = make_work(i)
                    intake.send_nowait(work)
                    if abandon:
                        receive.close()
                    else:
                        clients.start_soon(client, i, receive)
            intake.close()
            control.send_nowait(CloseIntake())
            control.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    waited = {i for i, (_, abandon) in enumerate(arrivals) if not abandon}
    assert set(answers) == waited
    assert all(len(a) == 1 and a[0].id == str(i) for i, a in answers.items())
    ran = [int(b[1][0]) for b in log.batches]
    assert len(ran) == len(set(ran))
    assert set(ran) == waited  # abandoned before dispatch: never run
    for inst in range(instances):
        spans = sorted((s, e) for i, _, s, e in log.batches if i == inst)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    if instances == 1:
        assert ran == sorted(ran)


async def test_update_instances_adds_and_retires(autojump_clock: trio.testing.MockClock) -> None:
    """A reload that changes only the instance groups: the added instance takes work once it
    announced itself (even before the update reached the scheduler), the retired one finishes
    its batch, gets no new work and is closed; the reply names it."""
    log = ExecutionLog()
    async with trio.open_nursery() as nursery:
        intake, control = await _start(nursery, 2, log, compute=1.0)
        busy, busy_answer = make_work(0)
        intake.send_nowait(busy)  # instance 0 runs it for 1 s
        await trio.sleep(0.1)
        send, receive = trio.open_memory_channel[ExecuteBatch](1)
        await nursery.start(partial(fake_worker, 5, receive, intake.clone(), log, 1.0))
        reply = OneShot()
        control.send_nowait(UpdateInstances({5: send}, (0,), reply))
        assert await reply.receive() == (0,)
        await busy_answer.receive()  # the retired instance's running batch still answers
        receivers = []
        for i in range(1, 5):
            work, answer = make_work(i)
            intake.send_nowait(work)
            receivers.append(answer)
        for answer in receivers:
            await answer.receive()
        after = {b[0] for b in log.batches if b[1][0] != "0"}
        assert after == {1, 5}  # never the retired instance again
        intake.close()
        control.send_nowait(CloseIntake())
        control.close()

"""The sequence batcher's scenarios on the virtual clock, deterministic (Triton's
L0_sequence_batcher ideas): the backlog in arrival order, the idle timeout to the microsecond,
state released by unload, and a model's rows as the instance saw them."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from nursery import errors, messages
from nursery.actors import model_manager
from nursery.actors.directory import Directory
from nursery.backends.base import Backends
from nursery.core import Core
from nursery.errors import NurseryError
from tests.property.test_sequence_actor import CONFIG, AccumulatorFactory, _request

NOT_STARTED = ("inference request for sequence {} to model 'acc' must specify the START flag "
               "on the first request of the sequence")


@pytest.fixture
def factory() -> AccumulatorFactory:
    fake = AccumulatorFactory()
    return fake


@pytest.fixture
def clock(autojump_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    """The virtual clock, jumping only once every task has waited 0.2 real seconds: the
    instance workers compute on real threads, and a clock that jumped while a thread computes
    would leap to the next idle deadline and release a sequence nobody left idle."""
    autojump_clock.autojump_threshold = 0.2
    return autojump_clock


@asynccontextmanager
async def _serving(repo: Path, factory: Any, mbs: int = 1, idle_us: int = 100_000,
                   strategy: str = "direct { }") -> AsyncIterator[tuple[Core, Any]]:
    (repo / "acc" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "acc" / "config.pbtxt").write_text(CONFIG.format(
        mbs=mbs, instances=1, idle_us=idle_us, strategy=strategy))
    directory = Directory()
    async with trio.open_nursery() as nursery:
        commands, inbox = trio.open_memory_channel[Any](4)
        failed = await nursery.start(partial(
            model_manager.run, repositories=(repo,), directory=directory, inbox=inbox,
            backends=Backends({"fakeseq": factory}),
            startup_models=["acc"], exit_on_error=False, unload_timeout=5.0))
        assert failed == []
        async with commands:
            yield Core.over(directory), commands


async def _value(core: Core, value: float, sid: int, start: bool = False,
                 end: bool = False) -> float:
    response = await core.infer(_request(value, sid, start, end))
    return float(response.outputs[0].data[0, 0])


async def test_backlog_is_served_in_arrival_order(tmp_path: Path, factory: AccumulatorFactory,
                                                  clock: trio.testing.MockClock) -> None:
    """One slot: A holds it; B, C and D start while it is taken and wait in the backlog; each
    takes the slot when the previous sequence ends, in the order they arrived."""
    async with _serving(tmp_path, factory) as (core, _):
        assert await _value(core, 1, 1, start=True) == 1
        finished: list[int] = []

        async def sequence(sid: int) -> None:
            assert await _value(core, 10, sid, start=True) == 10
            assert await _value(core, 10, sid, end=True) == 20
            finished.append(sid)

        async with trio.open_nursery() as clients:
            for sid in (2, 3, 4):
                clients.start_soon(sequence, sid)
                await trio.sleep(0.001)
            await trio.sleep(0.01)
            assert finished == []  # all wait: the slot is A's
            assert await _value(core, 1, 1, end=True) == 2
        assert finished == [2, 3, 4]
        starts = [corrid for _, corrid, start, _ in factory.rows if start]
        assert starts == [1, 2, 3, 4]


async def test_idle_timeout_to_the_microsecond(tmp_path: Path, factory: AccumulatorFactory,
                                               clock: trio.testing.MockClock) -> None:
    async with _serving(tmp_path, factory, idle_us=100_000) as (core, _):
        assert await _value(core, 1, 7, start=True) == 1
        await trio.sleep(0.0999)  # just inside the idle time: still live
        assert await _value(core, 1, 7) == 2
        await trio.sleep(0.1001)  # just past it: released
        with pytest.raises(NurseryError) as err:
            await _value(core, 1, 7)
        assert err.value.message == NOT_STARTED.format(7)
        assert await _value(core, 5, 7, start=True) == 5  # a new sequence, fresh state


async def test_unload_releases_sequences(tmp_path: Path, factory: AccumulatorFactory,
                                         clock: trio.testing.MockClock) -> None:
    async with _serving(tmp_path, factory, mbs=2, idle_us=60_000_000) as (core, commands):
        assert await _value(core, 3, 1, start=True) == 3
        assert await _value(core, 4, 2, start=True) == 4
        send, receive = trio.open_memory_channel[Any](1)
        await commands.send(messages.UnloadModel("acc", send))
        assert await receive.receive() is None
        assert factory.closed == [0]
        send, receive = trio.open_memory_channel[Any](1)
        await commands.send(messages.LoadModel("acc", send))
        assert await receive.receive() is None
        with pytest.raises(NurseryError) as err:  # the old sequence is gone with its state
            await _value(core, 1, 1)
        assert err.value.message == NOT_STARTED.format(1)
        assert await _value(core, 1, 1, start=True) == 1


async def test_direct_pads_empty_slots(tmp_path: Path, factory: AccumulatorFactory,
                                       clock: trio.testing.MockClock) -> None:
    """Three slots; the sequence in slot 0 ends, the one in slot 2 goes on alone: its batch
    has a padding row for slots 0 and 1 with READY false."""
    async with _serving(tmp_path, factory, mbs=3) as (core, _):
        for sid in (1, 2, 3):
            assert await _value(core, 1, sid, start=True) == 1
        assert await _value(core, 1, 1, end=True) == 2
        assert await _value(core, 1, 3) == 2
        last = factory.rows[-3:]
        assert [(corrid, ready) for _, corrid, _, ready in last] == [(0, 0.0), (0, 0.0), (3, 1.0)]


async def _cancelled_stats(core: Core) -> int:
    [(_, _, snapshot)] = await core.model_statistics("acc")
    return snapshot.failures_by_reason.get("CANCELED", 0)


async def test_cancelling_a_queued_request_cancels_its_sequence(
        tmp_path: Path, factory: AccumulatorFactory, clock: trio.testing.MockClock) -> None:
    """Triton's L0_request_cancellation (sequence_direct): a sequence's START runs while three
    more of its requests wait; the client of the second gives up; it and the one after it are
    answered CANCELLED and never run (counted as CANCELED), the one before it runs, and the ID
    is forgotten (its next request must START)."""
    factory.gate = threading.Event()
    async with _serving(tmp_path, factory, idle_us=60_000_000) as (core, _):
        answers: dict[str, Any] = {}
        waiting = trio.CancelScope()

        async def send(key: str, value: float, start: bool = False) -> None:
            try:
                answers[key] = await _value(core, value, 1, start=start)
            except NurseryError as error:
                answers[key] = error

        async def gives_up() -> None:
            with waiting:
                await _value(core, 3, 1)

        async with trio.open_nursery() as clients:
            clients.start_soon(send, "start", 1, True)
            await trio.sleep(0.01)  # the START runs, held on the instance's thread
            clients.start_soon(send, "before", 2)
            await trio.sleep(0.001)
            clients.start_soon(gives_up)
            await trio.sleep(0.001)
            clients.start_soon(send, "after", 4)
            await trio.sleep(0.001)
            waiting.cancel()  # its client gives up while it waits in the queue
            await trio.sleep(0.01)
            assert answers["after"].kind is errors.ErrorKind.CANCELLED
            assert answers["after"].message == ""
            factory.gate.set()
        assert answers["start"] == 1 and answers["before"] == 3
        assert [corrid for _, corrid, _, ready in factory.rows if ready] == [1, 1]
        assert await _cancelled_stats(core) == 2
        with pytest.raises(NurseryError) as err:
            await _value(core, 1, 1)
        assert err.value.message == NOT_STARTED.format(1)
        assert await _value(core, 5, 1, start=True) == 5  # a new sequence, fresh state


async def test_cancelling_a_backlogged_request_cancels_the_whole_sequence(
        tmp_path: Path, factory: AccumulatorFactory, clock: trio.testing.MockClock) -> None:
    """Triton's L0_request_cancellation backlog case: one slot, held by sequence 1; sequence
    2 waits in the backlog with two requests; cancelling its first cancels both; when the
    slot frees, sequence 3 (behind it) takes it."""
    async with _serving(tmp_path, factory, idle_us=60_000_000) as (core, _):
        assert await _value(core, 1, 1, start=True) == 1
        answers: dict[str, Any] = {}
        waiting = trio.CancelScope()

        async def first() -> None:
            with waiting:
                await _value(core, 1, 2, start=True)

        async def send(key: str, sid: int, start: bool = False, end: bool = False) -> None:
            try:
                answers[key] = await _value(core, 7, sid, start=start, end=end)
            except NurseryError as error:
                answers[key] = error

        async with trio.open_nursery() as clients:
            clients.start_soon(first)
            await trio.sleep(0.001)
            clients.start_soon(send, "second", 2)
            await trio.sleep(0.001)
            clients.start_soon(send, "other", 3, True, True)
            await trio.sleep(0.01)
            assert answers == {}  # all three wait for the slot
            waiting.cancel()
            await trio.sleep(0.01)
            assert answers["second"].kind is errors.ErrorKind.CANCELLED
            assert await _value(core, 1, 1, end=True) == 2  # the slot frees
        assert answers["other"] == 7
        assert [corrid for _, corrid, start, _ in factory.rows if start] == [1, 3]
        assert await _cancelled_stats(core) == 2


async def test_a_backlogged_sequence_times_out_with_its_requests(
        tmp_path: Path, factory: AccumulatorFactory, clock: trio.testing.MockClock) -> None:
    """Triton's sequence batcher honours a request's timeout only in the backlog: sequence 2
    waits there with a 50 ms timeout and is rejected when it passes (UNAVAILABLE, counted as
    REJECTED); sequence 1, holding the slot, never times out; the ID is then forgotten."""
    async with _serving(tmp_path, factory, idle_us=60_000_000) as (core, _):
        first = _request(1, 1, start=True)
        first.timeout_us = 10_000
        assert float((await core.infer(first)).outputs[0].data[0, 0]) == 1
        await trio.sleep(1)  # far past its timeout: it holds a slot, so it lives on
        assert await _value(core, 1, 1) == 2
        waiting = _request(5, 2, start=True)
        waiting.timeout_us = 50_000
        start = trio.current_time()
        with pytest.raises(NurseryError) as err:
            await core.infer(waiting)
        assert err.value.kind is errors.ErrorKind.UNAVAILABLE
        assert err.value.message == "timeout of the corresponding sequence has been expired"
        assert trio.current_time() - start == pytest.approx(0.05)
        [(_, _, snapshot)] = await core.model_statistics("acc")
        assert snapshot.failures_by_reason.get("REJECTED", 0) == 1
        assert await _value(core, 1, 1, end=True) == 3
        with pytest.raises(NurseryError) as err:
            await _value(core, 1, 2)
        assert err.value.message == NOT_STARTED.format(2)

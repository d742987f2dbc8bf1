"""The sequence batcher's scenarios on the virtual clock, deterministic (Triton's
L0_sequence_batcher ideas): the backlog in arrival order, the idle timeout to the microsecond,
state released by unload, and a model's rows as the instance saw them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from nursery import messages
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

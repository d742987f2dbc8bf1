"""The one-shot reply slot keeps a capacity-1 memory channel's meanings (mailbox.OneShot),
and the inline policy (instance_worker.InlinePolicy) decides as documented."""

from __future__ import annotations

import time

import outcome
import pytest
import trio

from nursery.actors import mailbox
from nursery.actors.instance_worker import InlinePolicy, _timed
from nursery.actors.mailbox import OneShot
from nursery.messages import ExecuteBatch
from tests.fakes import make_work


async def test_answer_before_and_after_the_receiver_waits() -> None:
    early = OneShot()
    assert mailbox.answer(early, 1)
    assert await early.receive() == 1
    late = OneShot()
    async with trio.open_nursery() as n:
        got = []

        async def wait() -> None:
            got.append(await late.receive())

        n.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert mailbox.answer(late, 2)
    assert got == [2]


async def test_second_answer_and_gone_receiver_are_not_taken() -> None:
    slot = OneShot()
    assert mailbox.answer(slot, 1)
    assert not mailbox.answer(slot, 2)  # WouldBlock: it holds an answer
    with pytest.raises(trio.WouldBlock):
        slot.send_nowait(3)
    gone = OneShot()
    with gone:
        pass
    assert gone.statistics().open_receive_channels == 0
    with pytest.raises(trio.BrokenResourceError):
        gone.send_nowait(1)
    assert not mailbox.answer(gone, 1)


async def test_sender_close_ends_a_waiting_receiver() -> None:
    slot = OneShot()
    async with trio.open_nursery() as n:
        ended = []

        async def wait() -> None:
            with pytest.raises(trio.EndOfChannel):
                await slot.receive()
            ended.append(True)

        n.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        slot.close()
    assert ended == [True]
    with pytest.raises(trio.ClosedResourceError):
        slot.send_nowait(1)
    answered = OneShot()
    mailbox.answer(answered, 5, close=True)  # answered then closed: the answer still arrives
    assert await answered.receive() == 5


async def test_cancelled_receiver_leaves_the_slot_answerable_and_says_it_left() -> None:
    slot = OneShot()
    with trio.move_on_after(1):
        with slot:
            await slot.receive()
    assert slot.open_receive_channels == 0
    assert not mailbox.answer(slot, 1)  # nobody waits: dropped, not delivered to a dead task


async def test_ask_with_an_actor_that_closes_without_answering() -> None:
    inbox, actor = trio.open_memory_channel[OneShot](1)
    async with trio.open_nursery() as n:
        async def stop_without_answer() -> None:
            (await actor.receive()).close()

        n.start_soon(stop_without_answer)
        with pytest.raises(mailbox.Unavailable, match="gone away"):
            await mailbox.ask(inbox, lambda reply: reply, gone="gone away")


def _batch(rows: int, ordered: bool = False) -> ExecuteBatch:
    work, _ = make_work(0, rows)
    return ExecuteBatch((work,), ordered=ordered)


def test_inline_policy() -> None:
    batch = _batch(1)
    off = InlinePolicy(enabled=False)
    off.ran(1, 1)
    assert not off.take(batch)
    policy = InlinePolicy(enabled=True, below_ns=100_000, probe=4)
    assert not policy.take(batch)  # nothing measured yet: threaded
    for _ in range(20):
        policy.ran(10_000, 1)
    taken = [policy.take(batch) for _ in range(8)]
    assert taken.count(False) == 2  # one threaded probe in every four
    assert not policy.take(_batch(1, ordered=True))  # answers in order: never inline
    assert not any(policy.take(_batch(4)) for _ in range(3))  # bigger than any measured fast
    policy.ran(20_000, 4)
    assert policy.take(_batch(4)) or policy.take(_batch(4))
    policy.ran(500_000, 4)  # four rows turned out slow
    assert not any(policy.take(_batch(4)) for _ in range(3))
    for _ in range(20):
        policy.ran(1_000_000, 1)  # the model got slow
    assert not any(policy.take(batch) for _ in range(8))


def test_inline_policy_when_the_batch_is_all_its_model_has_in_flight() -> None:
    """A batch holding every request of its model in flight (``quiet``) runs inline up to
    ``quiet_below_ns``; with anything else in flight, only up to ``below_ns``."""
    batch = _batch(1)
    policy = InlinePolicy(enabled=True, below_ns=100_000, probe=1000, quiet_below_ns=300_000)
    assert not policy.take(batch, quiet=True)  # nothing measured yet: threaded
    for _ in range(30):
        policy.ran(150_000, 1)  # too slow for a busy loop, fine for a quiet one
    assert not policy.take(batch)
    assert policy.take(batch, quiet=True)
    assert not policy.take(_batch(2), quiet=True)  # bigger than any measured
    for _ in range(30):
        policy.ran(400_000, 1)  # the model got slow: threaded either way
    assert not policy.take(batch, quiet=True)
    assert not InlinePolicy(enabled=True).take(_batch(1, ordered=True), quiet=True)


def test_inline_policy_when_the_batch_is_all_the_server_has_in_flight() -> None:
    """A batch holding every request the whole server has in flight (``idle``) runs inline up
    to ``idle_below_ns``; a batch that is only its model's whole load, up to
    ``quiet_below_ns``."""
    batch = _batch(16)
    policy = InlinePolicy(enabled=True, below_ns=100_000, probe=1000, quiet_below_ns=300_000,
                          idle_below_ns=1_000_000)
    assert not policy.take(batch, quiet=True, idle=True)  # nothing measured yet: threaded
    for _ in range(30):
        policy.ran(600_000, 16)  # too slow for a quiet model, fine for an idle server
    assert not policy.take(batch)
    assert not policy.take(batch, quiet=True)
    assert policy.take(batch, quiet=True, idle=True)
    assert not policy.take(_batch(32), quiet=True, idle=True)  # bigger than any measured
    for _ in range(30):
        policy.ran(1_500_000, 16)  # the model got slow: threaded whatever else is in flight
    assert not policy.take(batch, quiet=True, idle=True)


def test_inline_bound_follows_the_measured_hand_offs() -> None:
    """The bound for a busy loop follows what a batch's trip to the thread costs beyond its
    time there (``hop_ns``), between ``below_ns`` and ``quiet_below_ns``."""
    batch = _batch(1)
    policy = InlinePolicy(enabled=True, below_ns=100_000, probe=1000, quiet_below_ns=300_000)
    for _ in range(30):
        policy.ran(150_000, 1)  # dearer than the default bound
    assert not policy.take(batch)

    def back(submitted: int, wall: int) -> None:
        answered: list[object] = []
        policy.timed(batch, lambda b, r: answered.append(r), [submitted, wall],
                     outcome.Value("answer"))
        assert answered == [outcome.Value("answer")]

    now = time.monotonic_ns()
    for _ in range(40):  # round trips of ~400 µs, of which the thread took 150 µs: hand-offs ~250
        back(now - 400_000, 150_000)
    assert 200_000 < policy.bound_ns <= 300_000
    assert policy.take(batch)  # 150 µs of work is cheaper than its hand-offs
    for _ in range(40):  # a batch behind another (submitted 0) tells nothing of the hand-offs
        back(0, 150_000)
    assert policy.bound_ns > 200_000
    for _ in range(40):  # long waits cap it at quiet_below_ns
        back(now - 50_000_000, 150_000)
    assert policy.bound_ns == 300_000
    for _ in range(60):  # cheap hand-offs: the bound comes down to below_ns
        back(time.monotonic_ns() - 160_000, 150_000)
    assert policy.bound_ns == 100_000
    assert not policy.take(batch)


def test_timed_records_the_wall_time() -> None:
    spent = [1, 0]
    assert _timed(spent, time.sleep, 0.02) is None
    assert spent[0] == 1 and spent[1] >= 20_000_000
    with pytest.raises(ZeroDivisionError):
        _timed(spent, lambda: 1 / 0)
    assert spent[1] < 20_000_000  # measured even when the call raises

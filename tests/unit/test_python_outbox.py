"""Coalesced responses (nursery/backends/python/outbox.py): what a thread's response senders
send inside ``coalesce_responses()`` reaches the trio thread in one wake (thread mode) or
crosses to the server in one message (a stub process), every request's answers in the order
sent, its final flag last; outside a block, and from other threads, every answer goes at
once, as before."""

from __future__ import annotations

import threading
from typing import Any

import trio
import trio.testing

from nursery.backends.python import pb_utils
from nursery.backends.python.ipc import Channel
from nursery.backends.python.outbox import Route, coalesce_responses
from nursery.backends.python.triton_python_backend_stub import PARTS_PER_MESSAGE, _Direct, _Reply
from nursery.messages import Part


class CountingToken:
    """The real trio token, with its ``run_sync_soon`` calls (wakes of the trio thread)
    counted."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token
        self.calls = 0

    def run_sync_soon(self, fn: Any, *args: Any) -> None:
        self.calls += 1
        self.token.run_sync_soon(fn, *args)


def _part(request: int, n: int, final: bool = False) -> Part:
    return Part(None, None, final) if final else Part(f"{request}:{n}", None, False)  # type: ignore[arg-type]


def test_a_block_reaches_the_trio_thread_in_one_wake_in_order() -> None:
    async def main() -> None:
        token = CountingToken(trio.lowlevel.current_trio_token())
        channels = [trio.open_memory_channel[Any](1000) for _ in range(8)]
        routes = [Route(token, send) for send, _ in channels]

        def model() -> None:
            with coalesce_responses():
                for n in range(5):  # five "steps" of answers for every request, interleaved
                    for r, route in enumerate(routes):
                        route(_part(r, n))
                    with coalesce_responses():  # a block inside a block: the outer one sends
                        routes[0](_part(0, 100 + n))
                for r, route in enumerate(routes):
                    route(_part(r, 0, final=True))
                assert token.calls == 0  # held until the block ends
            routes[3](_part(3, 999))  # outside a block: at once
            assert pb_utils.coalesce_responses is coalesce_responses

        await trio.to_thread.run_sync(model)
        await trio.testing.wait_all_tasks_blocked()
        assert token.calls == 2  # the block's 49 answers in one wake, then the lone one
        for r, (send, receive) in enumerate(channels):
            send.close()
            got = [part async for part in receive]
            want = [f"{r}:{n}" for n in range(5)]
            if r == 0:
                want = [x for n in range(5) for x in (f"0:{n}", f"0:{100 + n}")]
            body = [p.response for p in got if not p.final]
            finals = [i for i, p in enumerate(got) if p.final]
            assert body[:len(want)] == want and finals == [len(want)]
            if r == 3:
                assert got[-1].response == "3:999"

    trio.run(main)


def test_other_threads_are_not_held_by_a_block() -> None:
    async def main() -> None:
        token = CountingToken(trio.lowlevel.current_trio_token())
        send, receive = trio.open_memory_channel[Any](10)
        route = Route(token, send)
        inside = threading.Event()
        other_sent = threading.Event()

        def holder() -> None:
            with coalesce_responses():
                route(_part(0, 1))
                inside.set()
                other_sent.wait()

        def other() -> None:
            inside.wait()
            route(_part(0, 2))  # another thread: not part of the block
            other_sent.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, holder)
            nursery.start_soon(trio.to_thread.run_sync, other)
        await trio.testing.wait_all_tasks_blocked()
        assert token.calls == 2
        assert [receive.receive_nowait().response for _ in range(2)] == ["0:2", "0:1"]

    trio.run(main)


def test_a_stub_sends_a_block_as_one_message_in_order() -> None:
    ours, theirs = Channel.pair()
    server = Channel(theirs)
    with ours.sock, server.sock:
        routes = [Route(_Direct, _Reply(ours, 7, i)) for i in range(4)]
        with coalesce_responses():
            for n in range(3):
                for i, route in enumerate(routes):
                    route(_part(i, n))
            for i, route in enumerate(routes):
                route(_part(i, 0, final=True))
        routes[1](_part(1, 50))  # outside: the single-answer message, as before
        kind, parts = server.receive()
        assert kind == "parts" and len(parts) == 16
        for i in range(4):
            mine = [(b, p) for b, index, p in parts if index == i]
            assert [b for b, _ in mine] == [7] * 4
            assert [p.response for _, p in mine[:3]] == [f"{i}:{n}" for n in range(3)]
            assert [p.final for _, p in mine] == [False, False, False, True]
        assert server.receive()[:3] == ("part", 7, 1)
        # a block larger than one message's share goes as several, still in order
        with coalesce_responses():
            for n in range(PARTS_PER_MESSAGE + 10):
                routes[2](_part(2, n))
        first, second = server.receive(), server.receive()
        assert len(first[1]) == PARTS_PER_MESSAGE and len(second[1]) == 10
        assert [p.response for _, _, p in first[1] + second[1]] == [
            f"2:{n}" for n in range(PARTS_PER_MESSAGE + 10)]

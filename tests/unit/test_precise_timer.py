"""The scheduler's precise wake-up (``nursery/runtime/timer.py``): a timerfd that makes trio's
epoll return at a sub-millisecond deadline instead of the next whole millisecond."""

from __future__ import annotations

import sys

import pytest
import trio
import trio.testing

from nursery.runtime import timer as precise_timer


def test_a_virtual_clock_keeps_trios_own_timing() -> None:
    async def main() -> None:
        assert precise_timer.create() is None

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux only")
def test_an_armed_timer_wakes_its_server_task_and_can_be_re_armed() -> None:
    fired: list[float] = []

    async def main() -> None:
        waker = precise_timer.create()
        assert waker is not None
        async with trio.open_nursery() as tasks:
            tasks.start_soon(waker.serve)
            for _ in range(5):
                deadline = trio.current_time() + 0.0005
                waker.arm(deadline)
                waker.arm(deadline)  # the same deadline again: nothing to do
                await trio.sleep_until(deadline)
                fired.append(trio.current_time() - deadline)
            waker.arm(trio.current_time() + 10.0)  # armed far ahead: cancelled with the task
            tasks.cancel_scope.cancel()
        waker.close()

    trio.run(main)
    assert len(fired) == 5 and all(0 <= late < 1.0 for late in fired)

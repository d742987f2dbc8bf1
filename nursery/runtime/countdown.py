"""The shutdown's countdown, as Triton's frontends log it while they wait for what is left."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def count_down(exit_timeout: float, pending: Callable[[], int], idle: trio.Event,
                     say: Callable[[int, int], None]) -> None:
    """Each second while ``pending()`` is not 0 and the exit timeout lasts: ``say(seconds
    left, pending)`` (Triton's "Timeout N: Found C ..." line), then wait up to a second for
    ``idle``. Returns when nothing is pending or the timeout is spent."""
    left = int(exit_timeout)
    while (count := pending()) and left > 0:
        say(left, count)
        with trio.move_on_after(1):
            await idle.wait()
        left -= 1

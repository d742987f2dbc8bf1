"""The default scheduler's policy: no batching, first come first served, next free instance.

Free instances are used in the order they became free, so that work spreads over every
instance instead of piling onto the first.
"""

from __future__ import annotations

from collections import deque
from typing import Generic

from nursery.scheduling.decisions import Decision, Dispatch, Poll, W


class FifoPolicy(Generic[W]):
    def __init__(self) -> None:
        self._queue: deque[W] = deque()
        self._idle: deque[int] = deque()

    def arrive(self, item: W, now: float) -> None:
        self._queue.append(item)

    def instance_ready(self, instance: int, now: float) -> None:
        self._idle.append(instance)

    def poll(self, now: float) -> Poll[W]:
        decisions: list[Decision[W]] = []
        while self._queue and self._idle:
            decisions.append(Dispatch(self._idle.popleft(), (self._queue.popleft(),)))
        return Poll(decisions, None)

    def pending(self) -> int:
        return len(self._queue)

    def idle_instances(self) -> int:
        return len(self._idle)

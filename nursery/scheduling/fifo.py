"""The default scheduler's policy: no batching, first come first served, next free instance.

Each instance has ``slots`` places: with two, an instance's thread already holds its next
request while it computes the current one, so it never idles between requests (a thread hand
-off costs about 0.1 ms, as much as a small model's inference). A request always goes to an
instance with the most free places, so an idle instance is used before a busy one gets a
second request; among equals, the one that became free first goes first.
"""

from __future__ import annotations

from collections import deque
from typing import Generic

from nursery.scheduling.decisions import Decision, Dispatch, FreeInstances, Poll, Reject, W

QUEUE_FULL = "Exceeds maximum queue size"  # Triton's message


class FifoPolicy(FreeInstances, Generic[W]):
    def __init__(self, slots: int = 1, max_queue: int = 65536) -> None:
        self.slots = slots
        self.max_queue = max_queue
        self._queue: deque[W] = deque()
        self._free: dict[int, int] = {}  # instance -> free places (insertion = free order)
        self._rejected: list[W] = []

    def arrive(self, item: W, now: float) -> None:
        if len(self._queue) >= self.max_queue:
            self._rejected.append(item)  # a full queue rejects instead of growing
        else:
            self._queue.append(item)

    def instance_ready(self, instance: int, now: float, slots: int = 1) -> None:
        if instance in self._retired:
            return
        free = self._free.pop(instance, 0) + slots
        self._free[instance] = min(free, self.slots)

    def withdraw_ready(self, instance: int) -> bool:
        """Take back a free instance's places (its rate-limiter grant goes back unused);
        False when it has none."""
        return self._free.pop(instance, 0) > 0

    def poll(self, now: float) -> Poll[W]:
        decisions: list[Decision[W]] = []
        if self._rejected:
            decisions.append(Reject(tuple(self._rejected), QUEUE_FULL))
            self._rejected = []
        while self._queue and self._free:
            instance = max(self._free, key=self._free.__getitem__)  # first max = earliest
            left = self._free.pop(instance) - 1
            if left:
                self._free[instance] = left
            decisions.append(Dispatch(instance, (self._queue.popleft(),)))
        return Poll(decisions, None)

    def drain(self) -> list[W]:
        """Remove and return every request still held (queued or waiting to be rejected)."""
        items = [*self._rejected, *self._queue]
        self._rejected = []
        self._queue.clear()
        return items

    def pending(self) -> int:
        return len(self._queue)

    def idle_instances(self) -> int:
        return sum(1 for free in self._free.values() if free == self.slots)

    def free_slots(self) -> int:
        return sum(self._free.values())

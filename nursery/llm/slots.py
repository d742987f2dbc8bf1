"""Which waiting request takes which free slot: the decode loop's policy, pure and
synchronous (no threads, no clock), so hypothesis can drive it (tests/property).

Three modes, chosen by the model's ``batching_mode`` parameter:

- ``continuous`` (in-flight batching): at every step, waiting requests take free slots in
  arrival order; a finished or cancelled sequence frees its slot for the next step.
- ``static``: a batch is formed only when no sequence is running (up to ``slots`` of the
  waiting requests); later arrivals wait until the whole batch has finished.
- ``sequential``: one request at a time (``static`` with one slot).

A slot is the lowest free number, so the active slots stay packed at the low end (the
decoder's attention reads the span of active slots).

``plan_prefill`` is the other half of a step's policy (chunked prefill): how many prompt
tokens each admitted sequence runs in a step, under the per-step token budget.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

MODES = ("continuous", "static", "sequential")


def plan_prefill(budget: int, decoding: int, remaining: Sequence[int]) -> list[int]:
    """Chunked prefill: a step runs every decoding sequence's next token (``decoding`` of
    them) and at most ``budget - decoding`` prompt tokens, given to the prompts in
    ``remaining`` (each one's tokens not yet run, in admission order) first come, first
    served. While a prompt waits, at least one of its tokens runs in every step, so no budget
    starves it. Returns how many tokens of each prompt run now (a 0 runs nothing)."""
    if budget < 1:
        raise ValueError(f"the token budget must be at least 1, got {budget}")
    left = max(budget - decoding, 1 if any(remaining) else 0)
    plan = []
    for want in remaining:
        take = min(want, left)
        plan.append(take)
        left -= take
    return plan

K = TypeVar("K", bound=Hashable)


class SlotScheduler(Generic[K]):
    def __init__(self, slots: int, mode: str = "continuous") -> None:
        if mode not in MODES:
            raise ValueError(f"batching_mode must be one of {', '.join(MODES)}; got {mode!r}")
        if slots < 1:
            raise ValueError(f"the number of slots must be at least 1, got {slots}")
        self.mode = mode
        self.slots = 1 if mode == "sequential" else slots
        self.waiting: deque[K] = deque()
        self.active: dict[K, int] = {}
        self._free = list(range(self.slots))  # a heap: the lowest free slot first

    def submit(self, key: K) -> None:
        self.waiting.append(key)

    def admit(self) -> list[tuple[K, int]]:
        """The waiting requests that start now, each with its slot, in arrival order."""
        if self.mode != "continuous" and self.active:
            return []  # a static batch runs to its end before the next one forms
        admitted = []
        while self.waiting and self._free:
            key = self.waiting.popleft()
            slot = heapq.heappop(self._free)
            self.active[key] = slot
            admitted.append((key, slot))
        return admitted

    def finish(self, key: K) -> None:
        """A running sequence ended (done, cancelled or failed): its slot is free at once."""
        heapq.heappush(self._free, self.active.pop(key))

    def cancel(self, key: K) -> None:
        """A request leaves, waiting or running."""
        if key in self.active:
            self.finish(key)
        else:
            try:
                self.waiting.remove(key)
            except ValueError:
                pass

    @property
    def idle(self) -> bool:
        return not self.active and not self.waiting

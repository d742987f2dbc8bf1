"""A research example: earliest-deadline-first batching with per-request timeouts.

Triton serves each priority level first come, first served. This policy serves, within a
level, the request whose deadline is nearest: a request's deadline is its arrival plus its
own ``timeout`` parameter, else the level's ``default_timeout_microseconds``; requests with
neither come last, in arrival order. A batch starts at the request with the earliest deadline
and takes the next ones in deadline order that share its shapes, skipping others, up to
``max_batch_size`` rows and never past the largest preferred size.

A batch is sent at once when it reaches a preferred or the largest size, when the queue delay
is 0 or has passed for its oldest request, or when its most urgent request's deadline is less
than one queue delay away; otherwise the policy asks to be polled when the first of those
comes. Expiry follows the level's queue policy exactly as Triton's batcher does: with
REJECT, a request still queued at its timeout is rejected ("Request timeout expired"); with
DELAY it loses its deadline and goes last. A full level rejects new requests ("Exceeds maximum
queue size"). Select it with ``python -m nursery simulate --policy edf``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic

from nursery.scheduling.batch_policy import (
    QUEUE_FULL,
    TIMEOUT_EXPIRED,
    BatchConfig,
    BatchItem,
    self_described,
)
from nursery.scheduling.decisions import Decision, Dispatch, FreeInstances, Poll, W, rejections


@dataclass(slots=True, eq=False)
class _Entry(Generic[W]):
    item: W
    batch_size: int
    signature: Hashable
    level: int
    enqueued: float
    deadline: float  # ordering: nearest first (math.inf = none)
    expires: float  # the queue policy's timeout (math.inf = never)
    seq: int
    key: tuple[int, float, int] = field(init=False)
    queued: bool = True

    def __post_init__(self) -> None:
        self.key = (self.level, self.deadline, self.seq)


class EarliestDeadlinePolicy(FreeInstances, Generic[W]):
    def __init__(self, config: BatchConfig, *,
                 describe: Callable[[W], BatchItem] | None = None) -> None:
        self.config = config
        self._max_batch = max(1, config.max_batch_size)
        preferred = config.preferred_batch_sizes or (self._max_batch,)
        self._preferred = frozenset(preferred)
        self._max_preferred = max(preferred)
        self._delay = config.max_queue_delay_us / 1e6
        self._describe: Callable[[W], BatchItem] = describe or self_described
        self._queue: list[_Entry[W]] = []  # sorted by key
        self._keys: list[tuple[int, float, int]] = []
        self._per_level: dict[int, int] = {}
        self._expiries: list[tuple[float, int, _Entry[W]]] = []  # heap; stale ones skipped
        self._free: dict[int, None] = {}
        self._rejected: list[tuple[W, str]] = []
        self._seq = 0

    @classmethod
    def from_config(cls, batch: BatchConfig, instances: int) -> EarliestDeadlinePolicy[W]:
        return cls(batch)

    # -- events ------------------------------------------------------------------------------

    def arrive(self, item: W, now: float) -> None:
        d = self._describe(item)
        level = self.config.level_of(d.priority)
        policy = self.config.policy_for(level)
        if policy.max_queue_size and self._per_level.get(level, 0) >= policy.max_queue_size:
            self._rejected.append((item, QUEUE_FULL))
            return
        timeout = policy.default_timeout_us
        if policy.allow_timeout_override and 0 < d.timeout_us < timeout:
            timeout = d.timeout_us
        expires = now + timeout / 1e6 if timeout else math.inf
        wanted = d.timeout_us or policy.default_timeout_us
        deadline = now + wanted / 1e6 if wanted else math.inf
        self._seq += 1
        self._insert(_Entry(item, max(1, d.batch_size), d.signature, level, now,
                            min(deadline, expires), expires, self._seq))

    def instance_ready(self, instance: int, now: float, slots: int = 1) -> None:
        if instance not in self._retired:
            self._free[instance] = None

    def cancel(self, item: W) -> bool:
        for i, entry in enumerate(self._queue):
            if entry.item is item:
                self._pop(i)
                return True
        return False

    # -- decisions ---------------------------------------------------------------------------

    def poll(self, now: float) -> Poll[W]:
        decisions: list[Decision[W]] = []
        self._expire(now)
        if self._rejected:
            decisions.extend(rejections(self._rejected))
            self._rejected = []
        wake_at: float | None = None
        while self._queue and self._free:
            batch, wait_until = self._form(now)
            if batch is None:
                wake_at = wait_until
                break
            instance = next(iter(self._free))
            del self._free[instance]
            decisions.append(Dispatch(instance, batch))
        expiry = self._next_expiry()
        if expiry is not None:
            wake_at = expiry if wake_at is None else min(wake_at, expiry)
        return Poll(decisions, wake_at)

    def _form(self, now: float) -> tuple[tuple[W, ...] | None, float | None]:
        head = self._queue[0]
        chosen = [0]
        size = head.batch_size
        grows = False  # another request could still join
        for i in range(1, len(self._queue)):
            if size >= self._max_preferred:
                break
            entry = self._queue[i]
            if entry.signature != head.signature:
                continue
            if size + entry.batch_size > self._max_preferred:
                continue
            chosen.append(i)
            size += entry.batch_size
        else:
            grows = size < self._max_preferred
        oldest = min(self._queue[i].enqueued for i in chosen)
        send_at = min(oldest + self._delay, head.deadline - self._delay)
        if not grows or size in self._preferred or self._delay == 0 or now >= send_at:
            items = tuple([self._queue[i].item for i in chosen])
            for i in reversed(chosen):
                self._pop(i)
            return items, None
        return None, send_at

    def _next_expiry(self) -> float | None:
        heap = self._expiries
        while heap and (not heap[0][2].queued or heap[0][2].expires != heap[0][0]):
            heapq.heappop(heap)  # dispatched, cancelled or moved since
        return heap[0][0] if heap else None

    def _expire(self, now: float) -> None:
        while (expiry := self._next_expiry()) is not None and expiry <= now:
            _, _, entry = heapq.heappop(self._expiries)
            self._pop(bisect.bisect_left(self._keys, entry.key))
            if self.config.policy_for(entry.level).reject_on_timeout:
                self._rejected.append((entry.item, TIMEOUT_EXPIRED))
            else:  # DELAY: after the level's other requests, never expires again
                entry.deadline = entry.expires = math.inf
                self._seq += 1
                entry.seq = self._seq
                entry.key = (entry.level, math.inf, entry.seq)
                self._insert(entry)

    # -- the sorted queue --------------------------------------------------------------------

    def _insert(self, entry: _Entry[W]) -> None:
        i = bisect.bisect(self._keys, entry.key)
        self._keys.insert(i, entry.key)
        self._queue.insert(i, entry)
        entry.queued = True
        self._per_level[entry.level] = self._per_level.get(entry.level, 0) + 1
        if entry.expires != math.inf:
            heapq.heappush(self._expiries, (entry.expires, entry.seq, entry))

    def _pop(self, i: int) -> _Entry[W]:
        entry = self._queue.pop(i)
        del self._keys[i]
        entry.queued = False
        self._per_level[entry.level] -= 1
        return entry

    # -- introspection -----------------------------------------------------------------------

    def drain(self) -> list[W]:
        """Remove and return every request still held (queued or to be rejected)."""
        items = [item for item, _ in self._rejected] + [e.item for e in self._queue]
        for entry in self._queue:
            entry.queued = False
        self._queue.clear()
        self._keys.clear()
        self._expiries.clear()
        self._per_level.clear()
        self._rejected = []
        return items

    def pending(self) -> int:
        return len(self._queue) + len(self._rejected)

    def idle_instances(self) -> int:
        return len(self._free)

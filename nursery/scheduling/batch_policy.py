"""The dynamic batcher's policy: Triton's batch-forming and queue rules, pure and synchronous.

Requests wait in one queue per priority level (level 1 first; within a level, requests whose
timeout passed under a DELAY policy go after the others). When an instance is free, the policy
scans the queues in that order and grows a batch from the front, never skipping a request:

- it stops before a request that would pass ``max_batch_size`` or whose non-batch shapes
  (``signature``) differ from the first request's;
- it remembers the largest preferred size reached; once the next request would pass the largest
  preferred size, the batch is marked full;
- it sends at once a preferred size (while the oldest request in it has not waited
  ``max_queue_delay``), a full batch, a batch that cannot grow, or anything when the delay is
  0 or has passed for the oldest request; otherwise it asks to be polled again when the oldest
  request's delay ends (or the next timeout falls).

Timeouts (``default_timeout_microseconds``, shortened by a request's ``timeout`` when
``allow_timeout_override``) reject the request ("Request timeout expired") or, with DELAY, move
it behind the level's other requests. A level's queue holds at most ``max_queue_size``
requests; more are rejected ("Exceeds maximum queue size").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, cast

from nursery.scheduling.decisions import Decision, Dispatch, FreeInstances, Poll, W, rejections
from nursery.scheduling.start_delay import StartDelay

TIMEOUT_EXPIRED = "Request timeout expired"
QUEUE_FULL = "Exceeds maximum queue size"


class BatchItem(Protocol):
    """What the policy reads of a request (read-only: plain or frozen attributes serve)."""

    @property
    def batch_size(self) -> int: ...  # rows the request adds to a batch

    @property
    def signature(self) -> Hashable: ...  # requests batch together only when these are equal

    @property
    def priority(self) -> int: ...  # request priority (0 = the model's default level)

    @property
    def timeout_us(self) -> int: ...  # request's own queue timeout (0 = none)


def self_described(item: object) -> BatchItem:
    """The default ``describe``: the queued items are batch items themselves."""
    return cast(BatchItem, item)


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    reject_on_timeout: bool = True  # REJECT (True) or DELAY (False)
    default_timeout_us: int = 0  # 0 = requests never time out
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0 = unbounded


@dataclass(frozen=True)
class BatchConfig:
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()  # empty = (max_batch_size,), as Triton
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0  # 0 = one level
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    level_policies: dict[int, QueuePolicy] = field(default_factory=dict)

    def policy_for(self, level: int) -> QueuePolicy:
        return self.level_policies.get(level, self.default_queue_policy)

    def level_of(self, priority: int) -> int:
        """Triton's SetPriority: 0 or above the levels means the default level."""
        if self.priority_levels == 0:
            return 0
        if priority == 0 or priority > self.priority_levels:
            return self.default_priority_level
        return priority


@dataclass(slots=True, eq=False)
class _Entry(Generic[W]):
    item: W
    batch_size: int
    signature: Hashable
    enqueued: float
    deadline: float  # math.inf = no timeout


@dataclass(slots=True)
class _Level(Generic[W]):
    policy: QueuePolicy
    queue: deque[_Entry[W]] = field(default_factory=deque)
    delayed: deque[_Entry[W]] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class DynamicBatchPolicy(FreeInstances, Generic[W]):
    """Dispatches batches to free instances; one batch at a time per instance."""

    def __init__(self, config: BatchConfig, *,
                 describe: Callable[[W], BatchItem] | None = None,
                 start_delay: StartDelay | None = None) -> None:
        self.config = config
        # Triton's TRITONSERVER_DELAY_SCHEDULER hook: no batch until enough requests queued
        self._start_delay = start_delay
        max_batch = max(1, config.max_batch_size)
        self._max_batch = max_batch
        preferred = config.preferred_batch_sizes or (max_batch,)
        self._preferred = frozenset(preferred)
        self._max_preferred = max(preferred)
        self._delay = config.max_queue_delay_us / 1e6
        self._describe: Callable[[W], BatchItem] = describe or self_described
        self._levels: dict[int, _Level[W]] = {}
        self._free: dict[int, None] = {}  # free instances, in the order they became free
        self._rejected: list[tuple[W, str]] = []
        self._count = 0
        self._deadlines = 0  # queued entries with a finite deadline

    # -- events ------------------------------------------------------------------------------

    def arrive(self, item: W, now: float) -> None:
        d = self._describe(item)
        level_no = self.config.level_of(d.priority)
        level = self._levels.get(level_no)
        if level is None:
            level = self._levels[level_no] = _Level(self.config.policy_for(level_no))
            self._levels = dict(sorted(self._levels.items()))
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            self._rejected.append((item, QUEUE_FULL))
            return
        timeout = policy.default_timeout_us
        if policy.allow_timeout_override and 0 < d.timeout_us < timeout:
            timeout = d.timeout_us
        deadline = now + timeout / 1e6 if timeout else math.inf
        level.queue.append(_Entry(item, max(1, d.batch_size), d.signature, now, deadline))
        self._count += 1
        if timeout:
            self._deadlines += 1

    def instance_ready(self, instance: int, now: float, slots: int = 1) -> None:
        if instance not in self._retired:
            self._free[instance] = None

    def withdraw_ready(self, instance: int) -> bool:
        """Take back a free instance's readiness (its rate-limiter grant goes back unused);
        False when it is not free."""
        return self._free.pop(instance, False) is None

    def cancel(self, item: W) -> bool:
        """Remove a queued request (its client went away); False if it is not queued."""
        for level in self._levels.values():
            for q in (level.queue, level.delayed):
                for entry in q:
                    if entry.item is item:
                        q.remove(entry)
                        self._count -= 1
                        if entry.deadline != math.inf:
                            self._deadlines -= 1
                        return True
        return False

    def set_queue_delay(self, seconds: float) -> None:
        """Change the queue delay from now on (research policies adapt it; see
        ``nursery/scheduling/adaptive_delay.py``). Triton's batcher never calls it."""
        self._delay = max(0.0, seconds)

    # -- decisions ---------------------------------------------------------------------------

    def poll(self, now: float) -> Poll[W]:
        decisions: list[Decision[W]] = []
        if self._deadlines:
            self._expire(now)
        if self._rejected:
            decisions.extend(rejections(self._rejected))
            self._rejected = []
        wake_at: float | None = None
        if self._start_delay is not None and not self._start_delay.waiting(self._count):
            self._start_delay = None
        while self._count and self._free and self._start_delay is None:
            batch, wait_until = self._form(now)
            if batch is None:
                wake_at = wait_until
                break
            instance = next(iter(self._free))
            del self._free[instance]
            decisions.append(Dispatch(instance, batch))
        if self._deadlines:
            nearest = self._nearest_deadline()
            wake_at = nearest if wake_at is None else min(wake_at, nearest)
        return Poll(decisions, wake_at)

    def _order(self) -> Iterator[_Entry[W]]:
        for level in self._levels.values():
            yield from level.queue
            yield from level.delayed

    def _form(self, now: float) -> tuple[tuple[W, ...] | None, float | None]:
        pending: list[_Entry[W]] = []
        size = 0
        best = 0  # entries in the batch to send: the largest preferred size reached
        send_now = False
        first_signature: Hashable = None
        for entry in self._order():
            bs = entry.batch_size
            if pending:
                if size + bs > self._max_preferred and not best:
                    best = len(pending)  # passing the largest preferred size: the batch is full
                if size + bs > self._max_batch or entry.signature != first_signature:
                    send_now = True
                    break
            else:
                first_signature = entry.signature
            pending.append(entry)
            size += bs
            if size in self._preferred:
                best = len(pending)
        oldest = min(e.enqueued for e in pending)
        # compared as the wake-up time is computed, so that waking at it always sends
        delay_exceeded = self._delay > 0 and now >= oldest + self._delay
        if best and not delay_exceeded:
            take = best
        elif send_now or size >= self._max_preferred or delay_exceeded or self._delay == 0:
            take = len(pending)
        else:
            return None, oldest + self._delay
        self._remove_front(take)
        return tuple([e.item for e in pending[:take]]), None

    def _remove_front(self, count: int) -> None:
        """Drop the first ``count`` entries in scan order (they form the batch)."""
        for level_no in list(self._levels):
            level = self._levels[level_no]
            for q in (level.queue, level.delayed):
                while q and count:
                    entry = q.popleft()
                    count -= 1
                    self._count -= 1
                    if entry.deadline != math.inf:
                        self._deadlines -= 1
            if count == 0:
                return

    def _expire(self, now: float) -> None:
        for level in self._levels.values():
            if not any(e.deadline <= now for e in level.queue):
                continue
            kept: deque[_Entry[W]] = deque()
            for entry in level.queue:
                if entry.deadline <= now:
                    self._deadlines -= 1
                    if level.policy.reject_on_timeout:
                        self._rejected.append((entry.item, TIMEOUT_EXPIRED))
                        self._count -= 1
                    else:  # DELAY: behind the level's unexpired requests, never expires again
                        entry.deadline = math.inf
                        level.delayed.append(entry)
                else:
                    kept.append(entry)
            level.queue = kept

    def _nearest_deadline(self) -> float:
        return min((e.deadline for lv in self._levels.values() for e in lv.queue), default=math.inf)

    # -- introspection -----------------------------------------------------------------------

    def drain(self) -> list[W]:
        """Remove and return every request still held (queued, delayed or to be rejected)."""
        items = [item for item, _ in self._rejected]
        for level in self._levels.values():
            items += [e.item for q in (level.queue, level.delayed) for e in q]
            level.queue.clear()
            level.delayed.clear()
        self._rejected = []
        self._count = self._deadlines = 0
        return items

    def pending(self) -> int:
        return self._count + len(self._rejected)

    def idle_instances(self) -> int:
        return len(self._free)

    def queued_by_level(self) -> dict[int, int]:
        return {n: len(level) for n, level in self._levels.items() if len(level)}

"""The dynamic batcher's policy, proven by a hypothesis state machine.

Rules: requests arrive (batch size, shape signature, priority, timeout), instances come and
finish batches, clients cancel, the clock moves (the policy is always polled by the time it
asked for). After every poll the machine checks the house plan's batching invariants:

- a batch never exceeds max_batch_size and only holds requests with equal signatures;
- batches go only to free instances, one at a time;
- every batch is a prefix of the queue order: level 1 before level 2, FIFO within a level,
  DELAYed requests after the level's others (so FIFO within a priority, higher priority first);
- while an instance is free, nothing waits that could be sent: no waiting batch reaches a
  preferred size or the largest one, none is cut by size or shape, and its oldest request has
  waited less than max_queue_delay (with a delay of 0, nothing waits at all);
- timeouts reject exactly the expired requests of REJECT levels, never earlier, and DELAY
  moves them behind their level; a full level rejects new requests instead of growing;
- every request ends in exactly one of: dispatched, rejected, cancelled, or still queued.

The same rules hold for ``AdaptiveDelayPolicy`` (Triton's batch forming with a shorter delay),
so the machine runs against it too. The contract every policy meets, whatever its order, is
in ``tests/property/policy_invariants.py``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from nursery.scheduling.adaptive_delay import AdaptiveDelayPolicy
from nursery.scheduling.batch_policy import (
    QUEUE_FULL,
    TIMEOUT_EXPIRED,
    BatchConfig,
    DynamicBatchPolicy,
    QueuePolicy,
)
from nursery.scheduling.decisions import Dispatch, Reject


@dataclass(eq=False)
class Item:
    id: int
    batch_size: int
    signature: Hashable
    priority: int
    timeout_us: int


@dataclass
class Tracked:
    item: Item
    level: int
    enqueued: float
    deadline: float
    key: tuple[int, int, int]  # scan order: (level, delayed, sequence)


queue_policies = st.builds(
    QueuePolicy,
    reject_on_timeout=st.booleans(),
    default_timeout_us=st.sampled_from([0, 2_000, 20_000]),
    allow_timeout_override=st.booleans(),
    max_queue_size=st.sampled_from([0, 0, 2, 5]),
)


@st.composite
def configs(draw: st.DrawFn) -> BatchConfig:
    max_batch = draw(st.integers(1, 12))
    preferred = tuple(sorted(draw(st.sets(st.integers(1, max_batch), max_size=3))))
    levels = draw(st.sampled_from([0, 0, 1, 2, 3]))
    return BatchConfig(
        max_batch_size=max_batch,
        preferred_batch_sizes=preferred,
        max_queue_delay_us=draw(st.sampled_from([0, 1_000, 10_000])),
        priority_levels=levels,
        default_priority_level=draw(st.integers(1, levels)) if levels else 0,
        default_queue_policy=draw(queue_policies),
        level_policies=draw(st.dictionaries(st.integers(1, max(levels, 1)), queue_policies,
                                            max_size=levels)) if levels else {},
    )


class BatchMachine(RuleBasedStateMachine):
    make_policy = DynamicBatchPolicy

    @initialize(config=configs())
    def setup(self, config: BatchConfig) -> None:
        self.config = config
        self.policy: DynamicBatchPolicy[Item] = self.make_policy(config)
        self.now = 0.0
        self.wake_at: float | None = None
        self.next_id = 0
        self.seq = 0
        self.queued: dict[int, Tracked] = {}
        self.expect_full: set[int] = set()
        self.outcome: dict[int, str] = {}
        self.free: set[int] = set()
        self.busy: dict[int, tuple[Item, ...]] = {}
        self.instances = 0
        self.max_batch = max(1, config.max_batch_size)
        self.preferred = set(config.preferred_batch_sizes or (self.max_batch,))
        self.delay = config.max_queue_delay_us / 1e6

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: self.instances < 3)
    @rule()
    def add_instance(self) -> None:
        self.policy.instance_ready(self.instances, self.now)
        self.free.add(self.instances)
        self.instances += 1
        self._poll()

    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        bs = data.draw(st.integers(1, self.max_batch))
        item = Item(self.next_id, bs, data.draw(st.sampled_from(["a", "a", "b"])),
                    data.draw(st.integers(0, 4)), data.draw(st.sampled_from([0, 0, 500, 5_000])))
        self.next_id += 1
        level = self.config.level_of(item.priority)
        policy = self.config.policy_for(level)
        in_level = sum(1 for t in self.queued.values() if t.level == level)
        if policy.max_queue_size and in_level >= policy.max_queue_size:
            self.expect_full.add(item.id)
        else:
            timeout = policy.default_timeout_us
            if policy.allow_timeout_override and 0 < item.timeout_us < timeout:
                timeout = item.timeout_us
            deadline = self.now + timeout / 1e6 if timeout else math.inf
            self.seq += 1
            self.queued[item.id] = Tracked(item, level, self.now, deadline, (level, 0, self.seq))
        self.policy.arrive(item, self.now)
        self._poll()

    @precondition(lambda self: self.busy)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        instance = data.draw(st.sampled_from(sorted(self.busy)))
        del self.busy[instance]
        self.free.add(instance)
        self.policy.instance_ready(instance, self.now)
        self._poll()

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.queued)))
        tracked = self.queued.pop(item_id)
        assert self.policy.cancel(tracked.item)
        self.outcome[item_id] = "cancelled"
        self._poll()

    @rule(dt=st.sampled_from([0.0001, 0.0007, 0.002, 0.012, 0.05]))
    def advance(self, dt: float) -> None:
        target = self.now + dt
        while self.wake_at is not None and self.wake_at <= target:
            self.now = max(self.now, self.wake_at)
            self._poll()
        self.now = target
        self._poll()

    # -- checking ----------------------------------------------------------------------------

    def _expire_model(self) -> None:
        for tracked in sorted(self.queued.values(), key=lambda t: t.key):
            if tracked.deadline <= self.now:
                policy = self.config.policy_for(tracked.level)
                if not policy.reject_on_timeout:  # DELAY: behind the level, never again
                    self.seq += 1
                    tracked.key = (tracked.level, 1, self.seq)
                    tracked.deadline = math.inf

    def _poll(self) -> None:
        self._expire_model()
        result = self.policy.poll(self.now)
        for decision in result.decisions:
            if isinstance(decision, Reject):
                for item in decision.items:
                    assert item.id not in self.outcome, "answered twice"
                    if decision.reason == QUEUE_FULL:
                        assert item.id in self.expect_full, "rejected as full while not full"
                        self.expect_full.remove(item.id)
                    else:
                        assert decision.reason == TIMEOUT_EXPIRED
                        tracked = self.queued.pop(item.id)
                        assert tracked.deadline <= self.now, "rejected before its timeout"
                        assert self.config.policy_for(tracked.level).reject_on_timeout
                    self.outcome[item.id] = "rejected"
            else:
                assert isinstance(decision, Dispatch)
                assert decision.instance in self.free, "dispatched to a busy instance"
                self.free.remove(decision.instance)
                batch = decision.items
                assert batch, "empty batch"
                assert sum(i.batch_size for i in batch) <= self.max_batch, "batch too large"
                assert len({i.signature for i in batch}) == 1, "mixed shapes in one batch"
                keys = []
                for item in batch:
                    assert item.id not in self.outcome, "dispatched twice"
                    keys.append(self.queued.pop(item.id).key)
                    self.outcome[item.id] = "dispatched"
                assert keys == sorted(keys), "batch not in queue order"
                if self.queued:
                    assert max(keys) < min(t.key for t in self.queued.values()), (
                        "a request was skipped: batches must be a prefix of the queue order")
                self.busy[decision.instance] = batch
        assert not self.expect_full, "a full queue did not reject"
        for tracked in self.queued.values():
            reject = self.config.policy_for(tracked.level).reject_on_timeout
            assert not (reject and tracked.deadline <= self.now), "expired request still queued"
        self.wake_at = result.wake_at
        assert self.wake_at is None or self.wake_at > self.now, "asked to wake in the past"
        if self.free and self.queued:
            self._check_nothing_sendable()

    def _check_nothing_sendable(self) -> None:
        assert self.delay > 0, "with no queue delay, nothing may wait while an instance is free"
        order = sorted(self.queued.values(), key=lambda t: t.key)
        size = 0
        for i, tracked in enumerate(order):
            bs = tracked.item.batch_size
            if i and (size + bs > self.max_batch or tracked.item.signature != order[0].item.signature):
                raise AssertionError("a batch that cannot grow waits while an instance is free")
            size += bs
            assert size not in self.preferred, "a preferred batch size waits"
        assert size < max(self.preferred), "a full batch waits while an instance is free"
        oldest = min(t.enqueued for t in order)
        assert self.now < oldest + self.delay, "waited past max_queue_delay with a free instance"
        if self.wake_at is not None:
            assert self.wake_at <= oldest + self.delay + 1e-12

    @invariant()
    def exactly_once(self) -> None:
        if not hasattr(self, "config"):
            return
        for i in range(self.next_id):
            places = (i in self.queued) + (i in self.outcome) + (i in self.expect_full)
            assert places == 1, f"request {i} is in {places} places"
        for level in {t.level for t in self.queued.values()}:
            limit = self.config.policy_for(level).max_queue_size
            if limit:
                assert sum(1 for t in self.queued.values() if t.level == level) <= limit
        assert self.policy.pending() == len(self.queued)


TestBatchPolicy = BatchMachine.TestCase
TestBatchPolicy.settings = settings(max_examples=300, stateful_step_count=50, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


class AdaptiveBatchMachine(BatchMachine):
    make_policy = AdaptiveDelayPolicy

    def _poll(self) -> None:
        super()._poll()
        assert 0 <= self.policy.delay <= self.delay  # type: ignore[attr-defined]


TestAdaptiveDelayPolicy = AdaptiveBatchMachine.TestCase
TestAdaptiveDelayPolicy.settings = settings(max_examples=150, stateful_step_count=50,
                                            deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])

"""The scheduling contract every policy meets, as a hypothesis state machine for any policy.

``policy_machine(factory)`` returns a state machine that drives a policy built by
``factory(batch_config, instances)`` (the simulator's factory convention, see
``nursery/simulate/policies.py``) the way the scheduler actor does: requests arrive (batch
size, shape signature, priority, timeout), instances come and finish batches, clients cancel,
the clock moves and the policy is polled by the time it asked for. After every poll it checks:

- a batch goes only to an instance with a free slot (an instance announces ``slots`` places,
  the policy's ``slots`` attribute or 1, and gets one back per finished batch), is not empty,
  holds at most ``max_batch_size`` rows (for a batching model) of one shape signature;
- a request is dispatched or rejected at most once, only while it is queued (never after its
  cancellation), and never rejected for its timeout before the timeout passed;
- ``pending()`` counts exactly the requests queued; ``wake_at`` is None or in the future;
- with ``honours_timeouts``, no request of a REJECT level is still queued after its timeout;
- liveness, at the end of every example: once arrivals stop and every batch finishes, polling
  the policy at the times it asks for empties the queue (no request waits forever).

``tests/property/test_policy_invariants.py`` runs it for every built-in policy; a researcher
runs it for their own with ``NURSERY_POLICY=package.module:Name``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nursery.scheduling.batch_policy import TIMEOUT_EXPIRED, BatchConfig, QueuePolicy
from nursery.scheduling.decisions import Dispatch, Reject

Factory = Callable[[BatchConfig, int], Any]
MAX_INSTANCES = 3


@dataclass(eq=False)
class Item:
    """A request as a policy sees it (the fields of ``InferWork`` and ``SimRequest``)."""

    id: int
    batch_size: int
    signature: Hashable
    priority: int
    timeout_us: int
    sequence_id: Hashable = 0
    sequence_start: bool = False
    sequence_end: bool = False

    def abandoned(self) -> bool:
        return False


queue_policies = st.builds(
    QueuePolicy,
    reject_on_timeout=st.booleans(),
    default_timeout_us=st.sampled_from([0, 2_000, 20_000]),
    allow_timeout_override=st.booleans(),
    max_queue_size=st.sampled_from([0, 0, 2, 5]),
)


@st.composite
def configs(draw: st.DrawFn) -> BatchConfig:
    """Any valid ``dynamic_batching`` block (max_batch_size 0 = a model that does not batch)."""
    max_batch = draw(st.sampled_from([0, 1, 2, 4, 8, 12]))
    top = max(1, max_batch)
    preferred = tuple(sorted(draw(st.sets(st.integers(1, top), max_size=3))))
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


def expiry(config: BatchConfig, item: Item, arrived: float) -> tuple[float, bool]:
    """When a queued request times out under Triton's queue policy, and whether it is
    rejected then (REJECT) or only moved (DELAY)."""
    level = config.level_of(item.priority)
    policy = config.policy_for(level)
    timeout = policy.default_timeout_us
    if policy.allow_timeout_override and 0 < item.timeout_us < timeout:
        timeout = item.timeout_us
    return (arrived + timeout / 1e6 if timeout else math.inf), policy.reject_on_timeout


def policy_machine(factory: Factory, *, honours_timeouts: bool = False,
                   name: str = "Policy") -> type[RuleBasedStateMachine]:
    class PolicyMachine(RuleBasedStateMachine):
        @initialize(config=configs())
        def setup(self, config: BatchConfig) -> None:
            self.config = config
            self.policy = factory(config, MAX_INSTANCES)
            slots = getattr(self.policy, "slots", 1)
            self.slots = slots if isinstance(slots, int) and slots > 0 else 1
            self.now = 0.0
            self.wake_at: float | None = None
            self.next_id = 0
            self.arrived: dict[int, tuple[Item, float]] = {}  # queued: item, arrival time
            self.outcome: dict[int, str] = {}
            self.free: dict[int, int] = {}  # instance -> free slots
            self.running: dict[int, list[tuple[Item, ...]]] = {}  # instance -> batches held
            self.max_rows = config.max_batch_size if config.max_batch_size > 0 else None

        # -- rules ---------------------------------------------------------------------------

        @precondition(lambda self: len(self.free) < MAX_INSTANCES)
        @rule()
        def add_instance(self) -> None:
            i = len(self.free)
            self.free[i] = self.slots
            self.running[i] = []
            self.policy.instance_ready(i, self.now, self.slots)
            self._poll()

        @rule(data=st.data())
        def arrive(self, data: st.DataObject) -> None:
            top = max(1, self.config.max_batch_size)
            item = Item(self.next_id, data.draw(st.integers(1, top)),
                        data.draw(st.sampled_from(["a", "a", "b"])),
                        data.draw(st.integers(0, 4)),
                        data.draw(st.sampled_from([0, 0, 500, 5_000])))
            self.next_id += 1
            self.arrived[item.id] = (item, self.now)
            self.policy.arrive(item, self.now)
            self._poll()

        @precondition(lambda self: any(self.running.values()))
        @rule(data=st.data())
        def finish(self, data: st.DataObject) -> None:
            i = data.draw(st.sampled_from(sorted(k for k, v in self.running.items() if v)))
            self._finish(i)
            self._poll()

        @precondition(lambda self: self.arrived)
        @rule(data=st.data())
        def cancel(self, data: st.DataObject) -> None:
            cancel = getattr(self.policy, "cancel", None)
            if cancel is None:
                return
            item_id = data.draw(st.sampled_from(sorted(self.arrived)))
            item, _ = self.arrived.pop(item_id)
            assert cancel(item), "a queued request could not be cancelled"
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

        # -- checking ------------------------------------------------------------------------

        def _finish(self, i: int) -> None:
            self.running[i].pop(0)
            self.free[i] += 1
            self.policy.instance_ready(i, self.now, 1)

        def _poll(self) -> None:
            result = self.policy.poll(self.now)
            for decision in result.decisions:
                if isinstance(decision, Dispatch):
                    i = decision.instance
                    assert self.free.get(i, 0) > 0, f"dispatched to instance {i} with no free slot"
                    self.free[i] -= 1
                    batch = decision.items
                    assert batch, "empty batch"
                    if self.max_rows is not None:
                        rows = sum(item.batch_size for item in batch)
                        assert rows <= self.max_rows, "batch larger than max_batch_size"
                    assert len({item.signature for item in batch}) == 1, "mixed shapes"
                    for item in batch:
                        self._answer(item, "dispatched")
                    self.running[i].append(batch)
                elif isinstance(decision, Reject):
                    assert decision.items, "empty rejection"
                    for item in decision.items:
                        arrived = self.arrived.get(item.id)
                        self._answer(item, "rejected")
                        if decision.reason == TIMEOUT_EXPIRED:
                            assert arrived is not None
                            deadline, reject = expiry(self.config, item, arrived[1])
                            assert reject and deadline <= self.now, "rejected before its timeout"
            self.wake_at = result.wake_at
            assert self.wake_at is None or self.wake_at > self.now, "asked to wake in the past"
            if honours_timeouts:
                for item, arrived in self.arrived.values():
                    deadline, reject = expiry(self.config, item, arrived)
                    assert not (reject and deadline <= self.now), "expired request still queued"

        def _answer(self, item: Item, what: str) -> None:
            assert item.id not in self.outcome, f"request {item.id} answered twice"
            assert item.id in self.arrived, f"request {item.id} answered while not queued"
            del self.arrived[item.id]
            self.outcome[item.id] = what

        @invariant()
        def counts(self) -> None:
            if not hasattr(self, "config"):
                return
            assert len(self.arrived) + len(self.outcome) == self.next_id
            pending = getattr(self.policy, "pending", None)
            if pending is not None:
                assert pending() == len(self.arrived), "pending() is not the queued count"

        def teardown(self) -> None:
            if not hasattr(self, "config"):
                return
            if not self.free:
                self.add_instance()
            for _ in range(10_000):  # liveness: with free instances, everything leaves
                if not self.arrived:
                    return
                busy = [i for i, held in self.running.items() if held]
                if busy:
                    for i in busy:
                        while self.running[i]:
                            self._finish(i)
                    self._poll()
                elif self.wake_at is not None:
                    self.now = max(self.now, self.wake_at)
                    self._poll()
                else:
                    break
            raise AssertionError(f"{len(self.arrived)} request(s) wait forever with every "
                                 "instance free")

    PolicyMachine.__name__ = PolicyMachine.__qualname__ = f"{name}Machine"
    return PolicyMachine


def default_settings(max_examples: int = 100) -> settings:
    return settings(max_examples=max_examples, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

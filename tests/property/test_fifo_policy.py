"""The default scheduler's policy, proven by a hypothesis state machine."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nursery.scheduling.decisions import Dispatch
from nursery.scheduling.fifo import FifoPolicy


class FifoMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.policy: FifoPolicy[int] = FifoPolicy()
        self.now = 0.0
        self.next_item = 0
        self.instances = 0
        self.idle: set[int] = set()
        self.busy: set[int] = set()
        self.queued: list[int] = []
        self.dispatched: list[int] = []

    @rule()
    def add_instance(self) -> None:
        i = self.instances
        self.instances += 1
        self.idle.add(i)
        self.policy.instance_ready(i, self.now)

    @rule(n=st.integers(1, 4))
    def arrive(self, n: int) -> None:
        for _ in range(n):
            self.policy.arrive(self.next_item, self.now)
            self.queued.append(self.next_item)
            self.next_item += 1

    @precondition(lambda self: self.busy)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(sorted(self.busy)))
        self.busy.remove(i)
        self.idle.add(i)
        self.policy.instance_ready(i, self.now)

    @rule(dt=st.floats(0, 1))
    def poll(self, dt: float) -> None:
        self.now += dt
        result = self.policy.poll(self.now)
        assert result.wake_at is None  # FIFO never needs a timer
        for d in result.decisions:
            assert isinstance(d, Dispatch)
            assert d.instance in self.idle, "dispatched to a busy instance"
            assert len(d.items) == 1, "the default scheduler does not batch"
            self.idle.remove(d.instance)
            self.busy.add(d.instance)
            item = d.items[0]
            assert item == self.queued.pop(0), "not first-come first-served"
            assert item not in self.dispatched, "dispatched twice"
            self.dispatched.append(item)
        # after a poll nothing waits while an instance is free
        assert not (self.queued and self.idle)

    @invariant()
    def counts(self) -> None:
        assert self.policy.pending() == len(self.queued)
        assert self.policy.idle_instances() == len(self.idle)
        assert len(self.dispatched) + len(self.queued) == self.next_item


TestFifo = FifoMachine.TestCase
TestFifo.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)

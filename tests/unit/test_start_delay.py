"""Triton's TRITONSERVER_DELAY_SCHEDULER / TRITONSERVER_BACKLOG_DELAY_SCHEDULER hook: the
dynamic and sequence batchers form no batch until enough requests are queued, then batch as
always (nursery/scheduling/start_delay.py)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import pytest

from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy, QueuePolicy
from nursery.scheduling.decisions import Dispatch, Reject
from nursery.scheduling.sequence_policy import SequencePolicy
from nursery.scheduling.sequence_schedule import SequenceSchedule
from nursery.scheduling.start_delay import StartDelay, from_environment


@dataclass(eq=False)
class Item:
    batch_size: int = 1
    signature: Hashable = None
    priority: int = 0
    timeout_us: int = 0


@dataclass(eq=False)
class SeqItem:
    sequence_id: Hashable
    sequence_start: bool = False
    sequence_end: bool = False
    timeout_us: int = 0


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"TRITONSERVER_DELAY_SCHEDULER": "12"}, StartDelay(12, 0)),
    ({"TRITONSERVER_DELAY_SCHEDULER": "10", "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "3"},
     StartDelay(10, 3)),
    # the backlog count alone delays nothing: Triton looks at it only while delaying
    ({"TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "3"}, None),
    ({"TRITONSERVER_DELAY_SCHEDULER": "0"}, None),
    # read as C's atoi: leading digits, else 0
    ({"TRITONSERVER_DELAY_SCHEDULER": " 4x"}, StartDelay(4, 0)),
    ({"TRITONSERVER_DELAY_SCHEDULER": "many"}, None),
    ({"TRITONSERVER_DELAY_SCHEDULER": "-2"}, None),
])
def test_read_from_the_environment(env: dict[str, str], expected: StartDelay | None) -> None:
    assert from_environment(env, "m") == expected


def test_dynamic_batcher_waits_for_the_count_then_batches_as_always() -> None:
    config = BatchConfig(max_batch_size=8, preferred_batch_sizes=(2, 6),
                         max_queue_delay_us=10_000_000)
    policy = DynamicBatchPolicy[Item](config, start_delay=StartDelay(3))
    policy.instance_ready(0, 0.0)
    items = [Item() for _ in range(3)]
    policy.arrive(items[0], 0.0)
    policy.arrive(items[1], 0.0)
    # a preferred size (2) is queued, but the start is delayed until 3 requests are queued
    poll = policy.poll(0.0)
    assert poll.decisions == [] and poll.wake_at is None
    policy.arrive(items[2], 0.1)
    [batch] = policy.poll(0.1).decisions
    # released: the batcher's own rule, a preferred size of 2
    assert isinstance(batch, Dispatch) and batch.items == tuple(items[:2])
    # the delay is over for good: one request is sent after its queue delay as usual
    policy.instance_ready(0, 0.2)
    assert policy.poll(0.2).wake_at == pytest.approx(10.1)
    [batch] = policy.poll(10.2).decisions
    assert isinstance(batch, Dispatch) and batch.items == (items[2],)


def test_dynamic_batcher_still_rejects_while_delayed() -> None:
    config = BatchConfig(max_batch_size=4, default_queue_policy=QueuePolicy(max_queue_size=1))
    policy = DynamicBatchPolicy[Item](config, start_delay=StartDelay(5))
    policy.instance_ready(0, 0.0)
    first, second = Item(), Item()
    policy.arrive(first, 0.0)
    policy.arrive(second, 0.0)
    [reject] = policy.poll(0.0).decisions
    assert isinstance(reject, Reject) and reject.items == (second,)


def _sequence_policy(delay: StartDelay, slots: int = 2,
                     instances: int = 1) -> SequencePolicy[SeqItem]:
    schedule = SequenceSchedule(strategy="direct", slots_per_instance=slots,
                                max_batch_size=slots, idle_us=10_000_000)
    policy = SequencePolicy[SeqItem](schedule, instances, model="m", start_delay=delay)
    for i in range(instances):
        policy.instance_ready(i, 0.0)
    return policy


def test_sequence_batcher_counts_requests_queued_in_slots_over_all_instances() -> None:
    policy = _sequence_policy(StartDelay(4), slots=1, instances=2)
    a = [SeqItem(1, True), SeqItem(1)]
    b = [SeqItem(2, True), SeqItem(2)]
    for item in (a[0], b[0], a[1]):
        policy.arrive(item, 0.0)
    assert policy.poll(0.0).decisions == []  # 3 of 4 queued
    policy.arrive(b[1], 0.0)
    batches = policy.poll(0.0).decisions
    assert sorted((d.instance, d.items) for d in batches if isinstance(d, Dispatch)) == [
        (0, (a[0],)), (1, (b[0],))]


def test_sequence_batcher_waits_for_the_backlog_too() -> None:
    """With TRITONSERVER_BACKLOG_DELAY_SCHEDULER the batcher also waits for requests of
    sequences in the backlog (every slot taken)."""
    policy = _sequence_policy(StartDelay(2, 2), slots=2)
    slot = [SeqItem(1, True), SeqItem(2, True)]
    backlog = [SeqItem(3, True), SeqItem(3, False, True)]
    for item in (*slot, backlog[0]):
        policy.arrive(item, 0.0)
    assert policy.poll(0.0).decisions == []  # 2 in slots, 1 in the backlog
    policy.arrive(backlog[1], 0.0)
    [batch] = policy.poll(0.0).decisions
    assert isinstance(batch, Dispatch) and batch.items == tuple(slot)


def test_sequence_batcher_refuses_bad_requests_while_delayed() -> None:
    policy = _sequence_policy(StartDelay(5))
    stray = SeqItem(9)  # no START for an unknown ID
    policy.arrive(stray, 0.0)
    [reject] = policy.poll(0.0).decisions
    assert isinstance(reject, Reject) and reject.items == (stray,)

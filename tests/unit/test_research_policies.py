"""The two worked-example policies do what their docs say (their contract is proven in
tests/property/test_policy_invariants.py, the adaptive one also against Triton's rules)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from nursery.scheduling.adaptive_delay import AdaptiveDelayPolicy
from nursery.scheduling.batch_policy import TIMEOUT_EXPIRED, BatchConfig, QueuePolicy
from nursery.scheduling.decisions import Dispatch, Reject
from nursery.scheduling.edf import EarliestDeadlinePolicy


@dataclass(eq=False)
class R:
    name: str
    timeout_us: int = 0
    batch_size: int = 1
    signature: object = None
    priority: int = 0


def _sent(poll: object) -> list[list[str]]:
    return [[r.name for r in d.items] for d in poll.decisions  # type: ignore[attr-defined]
            if isinstance(d, Dispatch)]


def test_edf_serves_the_nearest_deadline_first() -> None:
    policy = EarliestDeadlinePolicy[R](BatchConfig(max_batch_size=2))
    policy.instance_ready(0, 0.0)
    policy.arrive(R("late"), 0.0)  # no deadline: last
    policy.arrive(R("soon", timeout_us=1_000), 0.0)
    policy.arrive(R("later", timeout_us=50_000), 0.0)
    assert _sent(policy.poll(0.0)) == [["soon", "later"]]
    policy.instance_ready(0, 0.01)
    assert _sent(policy.poll(0.01)) == [["late"]]


def test_edf_skips_other_shapes_and_sends_when_a_deadline_nears() -> None:
    policy = EarliestDeadlinePolicy[R](BatchConfig(max_batch_size=4, max_queue_delay_us=10_000))
    policy.instance_ready(0, 0.0)
    policy.arrive(R("a1", timeout_us=30_000, signature="a"), 0.0)
    policy.arrive(R("b1", timeout_us=31_000, signature="b"), 0.0)
    policy.arrive(R("a2", timeout_us=32_000, signature="a"), 0.0)
    poll = policy.poll(0.0)
    assert _sent(poll) == [] and poll.wake_at == pytest.approx(0.010)  # the queue delay
    policy = EarliestDeadlinePolicy[R](BatchConfig(max_batch_size=4, max_queue_delay_us=10_000))
    policy.instance_ready(0, 0.0)
    policy.arrive(R("a1", timeout_us=15_000, signature="a"), 0.0)
    policy.arrive(R("b1", signature="b"), 0.0)
    policy.arrive(R("a2", signature="a"), 0.0)
    poll = policy.poll(0.0)
    assert poll.wake_at == pytest.approx(0.005)  # one queue delay before a1's deadline
    assert _sent(policy.poll(0.005)) == [["a1", "a2"]]  # b1 skipped: another shape


def test_edf_expiry_follows_the_queue_policy() -> None:
    reject = EarliestDeadlinePolicy[R](BatchConfig(
        max_batch_size=1, default_queue_policy=QueuePolicy(default_timeout_us=1_000)))
    reject.arrive(R("x"), 0.0)
    assert reject.poll(0.0).wake_at == pytest.approx(0.001)
    decisions = reject.poll(0.001).decisions
    assert [(type(d), d.reason) for d in decisions] == [(Reject, TIMEOUT_EXPIRED)]
    delay = EarliestDeadlinePolicy[R](BatchConfig(
        max_batch_size=1, default_queue_policy=QueuePolicy(False, 1_000, True)))
    delay.arrive(R("old"), 0.0)
    delay.arrive(R("new", timeout_us=500), 0.0008)
    assert delay.poll(0.0011).decisions == []  # old expired: it moves last, never rejected
    delay.instance_ready(0, 0.0011)
    assert _sent(delay.poll(0.0011)) == [["new"]]
    assert delay.poll(0.0011).wake_at is None  # old never expires again


def test_adaptive_delay_follows_the_arrival_rate() -> None:
    config = BatchConfig(max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_us=2_000)
    policy = AdaptiveDelayPolicy[R](config, window=8)
    for i in range(8):  # 100 per second: under one arrival in 2 ms, waiting is wasted
        policy.arrive(R(f"slow{i}"), i * 0.01)
    assert policy.rate() == pytest.approx(100) and policy.delay == 0
    for i in range(8):  # 2000 per second: 3 more rows come in 1.5 ms
        policy.arrive(R(f"fast{i}"), 1.0 + i * 0.0005)
    assert policy.rate() == pytest.approx(2000) and policy.delay == pytest.approx(0.0015)
    for i in range(8):  # 500 per second: the time to fill passes the configured delay
        policy.arrive(R(f"mid{i}"), 2.0 + i * 0.002)
    assert policy.delay == pytest.approx(0.002)
    policy.arrive(R("burst"), 2.014)  # simultaneous arrivals: an infinite rate, no waiting
    for _ in range(7):
        policy.arrive(R("burst"), 2.014)
    assert math.isinf(policy.rate()) and policy.delay == 0

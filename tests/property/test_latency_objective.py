"""The latency-objective batcher (``nursery/scheduling/latency_objective.py``), proven.

Three layers: the scheduling contract every policy meets (``policy_invariants.py``); a state
machine of this policy's own promises, checked after every poll; and the running scheduler
actor on trio's virtual clock under overload, beside the dynamic batcher on the same arrivals.

The promises, for requests of one priority level and shape: they are dispatched in arrival
order, except that a request that would miss its deadline in the batch being sent steps aside;
no request is dispatched once its deadline has passed, and none is held past it (no
starvation: every request is answered by its deadline); a request the model predicts will
miss even alone is dispatched only when no timely request waits; a request is shed at arrival
only when the model's best case (the rows ahead of it packed into full batches on the
instances as they come free) misses its deadline, and never while the model knows nothing or
when it would start at once on a free instance; every request is answered exactly once.
"""

from __future__ import annotations

import heapq
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nursery.actors import scheduler
from nursery.errors import ErrorKind, NurseryError, Overloaded
from nursery.messages import CloseIntake, ExecuteBatch, InferWork
from nursery.scheduling.batch_policy import QUEUE_FULL, BatchConfig, DynamicBatchPolicy
from nursery.scheduling.decisions import Dispatch, Reject
from nursery.scheduling.latency_objective import (
    ExecutionModel,
    LatencyObjectivePolicy,
    Objective,
    objective_from_parameters,
)
from tests.fakes import ExecutionLog, fake_worker, make_work
from tests.property.policy_invariants import Item, configs, default_settings, policy_machine

OBJECTIVES = [0.002, 0.01, 0.05]


def _factory(objective: float) -> Any:
    return lambda batch, instances: LatencyObjectivePolicy(batch, Objective(objective))


# the contract of every policy, for each objective
for _objective in OBJECTIVES:
    _test = policy_machine(_factory(_objective), name=f"Latency{int(_objective * 1e3)}ms").TestCase
    _test.settings = default_settings(40)
    globals()[f"TestLatencyObjective{int(_objective * 1e3)}msContract"] = _test
del _test


class LatencyMachine(RuleBasedStateMachine):
    """Drives the policy as the actor does and checks its own promises after every poll."""

    @initialize(config=configs(), objective=st.sampled_from(OBJECTIVES),
                instances=st.integers(1, 3))
    def setup(self, config: BatchConfig, objective: float, instances: int) -> None:
        self.config = config
        self.objective = objective
        self.policy: LatencyObjectivePolicy[Item] = LatencyObjectivePolicy(
            config, Objective(objective), model="m")
        self.max_rows = max(1, config.max_batch_size)
        self.now = 0.0
        self.wake_at: float | None = None
        self.next_id = 0
        self.queued: dict[int, tuple[Item, float, float]] = {}  # id -> item, arrival, deadline
        self.outcome: dict[int, str] = {}
        self.free: set[int] = set()
        self.running: dict[int, tuple[float, int, tuple[Item, ...]]] = {}
        for i in range(instances):
            self.free.add(i)
            self.policy.instance_ready(i, self.now)

    # -- rules -------------------------------------------------------------------------------

    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        rows = data.draw(st.integers(1, self.max_rows)) if self.config.max_batch_size else 1
        item = Item(self.next_id, rows, data.draw(st.sampled_from(["a", "a", "b"])),
                    data.draw(st.integers(0, 3)),
                    data.draw(st.sampled_from([0, 0, 0, 1_000, 20_000])))
        self.next_id += 1
        budget = self.objective
        if item.timeout_us:
            budget = min(budget, item.timeout_us / 1e6)
        best_case = self._best_case(item)
        self.queued[item.id] = (item, self.now, self.now + budget)
        self.policy.arrive(item, self.now)
        self._poll(arrived=(item, best_case))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), took=st.sampled_from([0.0, 0.0005, 0.003, 0.02]))
    def finish(self, data: st.DataObject, took: float) -> None:
        i = data.draw(st.sampled_from(sorted(self.running)))
        self._advance(self.now + took)
        if i in self.running:
            del self.running[i]
            self.free.add(i)
            self.policy.instance_ready(i, self.now)
            self._poll()

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.queued)))
        item = self.queued.pop(item_id)[0]
        assert self.policy.cancel(item)
        self.outcome[item_id] = "cancelled"
        self._poll()

    @rule(dt=st.sampled_from([0.0001, 0.001, 0.004, 0.03]))
    def advance(self, dt: float) -> None:
        self._advance(self.now + dt)

    # -- checking ----------------------------------------------------------------------------

    def _advance(self, target: float) -> None:
        while self.wake_at is not None and self.wake_at <= target:
            self.now = max(self.now, self.wake_at)
            self._poll()
        self.now = target
        self._poll()

    def _best_case(self, item: Item) -> float | None:
        """The spec of shedding at arrival, computed from what the machine saw: when ``item``
        would finish if the rows ahead of it went in full batches (None: no prediction)."""
        model = self.policy.model
        level = self.config.level_of(item.priority)
        ahead = [q for q, _, _ in self.queued.values()
                 if self.config.level_of(q.priority) <= level]
        if not model.known or (not ahead and self.free):
            return None
        free_at = [self.now] * len(self.free) + [
            max(self.now, start + model.predict(rows)) for start, rows, _ in self.running.values()]
        heapq.heapify(free_at)
        rows = sum(self._rows(q) for q in ahead) + self._rows(item)
        finish = self.now
        while rows > 0:
            chunk = min(rows, self.max_rows)
            rows -= chunk
            finish = heapq.heappop(free_at) + model.predict(chunk)
            heapq.heappush(free_at, finish)
        return finish

    def _rows(self, item: Item) -> int:
        return item.batch_size if self.config.max_batch_size else 1

    def _poll(self, arrived: tuple[Item, float | None] | None = None) -> None:
        before = dict(self.queued)
        result = self.policy.poll(self.now)
        model = self.policy.model
        dispatched: list[tuple[Item, int]] = []  # item, rows of its batch
        for decision in result.decisions:
            if isinstance(decision, Dispatch):
                i = decision.instance
                assert i in self.free, "dispatched to a busy instance"
                self.free.discard(i)
                rows = sum(self._rows(item) for item in decision.items)
                assert rows <= self.max_rows and len({x.signature for x in decision.items}) == 1
                self.running[i] = (self.now, rows, decision.items)
                for item in decision.items:
                    _, _, deadline = self._answer(item, "dispatched")
                    assert deadline > self.now, "dispatched after its deadline"
                    dispatched.append((item, rows))
            else:
                assert isinstance(decision, Reject)
                for item in decision.items:
                    arrival, deadline = self.queued[item.id][1:]
                    self._answer(item, "shed")
                    if decision.reason == QUEUE_FULL:
                        continue
                    assert decision.kind is ErrorKind.UNAVAILABLE
                    assert decision.retry_after is not None and decision.retry_after >= 0
                    assert "latency objective" in decision.reason, decision.reason
                    if arrived is not None and item is arrived[0]:
                        best_case = arrived[1]  # shed at arrival: only on a predicted miss
                        assert best_case is not None and best_case > deadline, (
                            "shed although the model predicts it would make its deadline")
                    else:  # shed in the queue: only once its deadline has passed
                        assert deadline <= self.now, "shed from the queue before its deadline"
        # ordering within a level and shape: an earlier request left queued while a later one
        # went would have missed its deadline in that batch
        for item, rows in dispatched:
            arrival = before[item.id][1]
            for other, other_arrival, other_deadline in self.queued.values():
                if (other_arrival < arrival and other.signature == item.signature
                        and self.config.level_of(other.priority)
                        == self.config.level_of(item.priority)):
                    # (a batch that held it has at least its own rows)
                    held = max(rows, self._rows(other))
                    assert other_deadline < self.now + model.predict(held), (
                        f"request {other.id} skipped although it would have made its deadline "
                        f"(went: {item} in a batch of {rows} rows, deadline "
                        f"{before[item.id][2]}; skipped: {other}, deadline {other_deadline}; "
                        f"now {self.now})")
        # the doomed (predicted to miss even alone) go only when no timely request waits
        doomed_went = any(self.now + model.predict(self._rows(item)) > before[item.id][2]
                          for item, _ in dispatched)
        if doomed_went:
            waiting = [(q, d) for q, _, d in self.queued.values()
                       if self.now + model.predict(self._rows(q)) <= d]
            assert not waiting, (
                "a request predicted late was dispatched while a timely one waits "
                f"(went: {[(i, before[i.id][2]) for i, _ in dispatched]}; waiting: {waiting}; "
                f"now {self.now}, free {sorted(self.free)})")
        # no starvation: nobody is held past its deadline
        assert all(d > self.now for _, _, d in self.queued.values()), "held past its deadline"
        self.wake_at = result.wake_at
        assert self.wake_at is None or self.wake_at > self.now

    def _answer(self, item: Item, what: str) -> tuple[Item, float, float]:
        assert item.id not in self.outcome, f"request {item.id} answered twice"
        entry = self.queued.pop(item.id)
        self.outcome[item.id] = what
        return entry

    @invariant()
    def nothing_lost(self) -> None:
        if hasattr(self, "policy"):
            assert len(self.queued) + len(self.outcome) == self.next_id
            assert self.policy.pending() == len(self.queued)

    def teardown(self) -> None:
        if not hasattr(self, "policy"):
            return
        for _ in range(10_000):  # once arrivals stop, every request leaves
            if not self.queued:
                return
            if self.running:
                for i in list(self.running):
                    del self.running[i]
                    self.free.add(i)
                    self.policy.instance_ready(i, self.now)
                self._poll()
            elif self.wake_at is not None:
                self._advance(self.wake_at)
            else:
                break
        raise AssertionError(f"{len(self.queued)} request(s) never answered")


TestLatencyObjectivePromises = LatencyMachine.TestCase
TestLatencyObjectivePromises.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


# -- the execution model ---------------------------------------------------------------------

@given(a=st.floats(0, 0.01), b=st.floats(0, 0.001),
       sizes=st.lists(st.integers(1, 64), min_size=2, max_size=80))
def test_execution_model_recovers_an_exact_line(a: float, b: float, sizes: list[int]) -> None:
    assume(len(set(sizes[-64:])) >= 2)  # one size alone fixes no slope: a constant is fitted
    model = ExecutionModel(99.0)
    for n in sizes:
        model.observe(n, a + b * n)
    for n in (1, 8, 64):
        assert model.predict(n) == pytest.approx(a + b * n, abs=1e-9)


def test_execution_model_adds_the_percentile_of_its_residuals() -> None:
    samples = [0.015] + [0.010] * 9  # one slow batch in ten: mean 10.5 ms
    p90, p100 = ExecutionModel(90.0), ExecutionModel(100.0)
    for seconds in samples:
        p90.observe(4, seconds)
        p100.observe(4, seconds)
    # the p90 residual is a fast batch's (below the mean: no margin), the p100 the slow one's
    assert p90.predict(4) == pytest.approx(0.0105, abs=1e-9)
    assert p100.predict(4) == pytest.approx(0.015, abs=1e-9)


def test_nothing_is_shed_before_the_model_knows() -> None:
    policy: LatencyObjectivePolicy[Item] = LatencyObjectivePolicy(BatchConfig(4), Objective(0.001))
    policy.instance_ready(0, 0.0)
    items = [Item(i, 1, "a", 0, 0) for i in range(20)]
    for item in items:
        policy.arrive(item, 0.0)
    poll = policy.poll(0.0)
    assert [d.items for d in poll.decisions if isinstance(d, Dispatch)] == [tuple(items[:4])]
    assert not [d for d in poll.decisions if isinstance(d, Reject)]


def test_shedding_message_says_what_to_do() -> None:
    policy: LatencyObjectivePolicy[Item] = LatencyObjectivePolicy(
        BatchConfig(2), Objective(0.010), model="mlp")
    policy.instance_ready(0, 0.0)
    first = Item(0, 1, "a", 0, 0)
    policy.arrive(first, 0.0)
    policy.poll(0.0)
    policy.instance_ready(0, 0.008)  # a batch of one took 8 ms
    queued = [Item(i, 1, "a", 0, 0) for i in (1, 2, 3)]
    for item in queued:
        policy.arrive(item, 0.008)
    poll = policy.poll(0.008)
    rejects = [d for d in poll.decisions if isinstance(d, Reject)]
    assert rejects, "two batches of 8 ms ahead miss a 10 ms objective"
    reject = rejects[0]
    assert reject.reason.startswith("model 'mlp' sheds this request:")
    assert "latency objective of 10 ms (p99)" in reject.reason
    assert "nursery.latency_objective_ms" in reject.reason
    assert reject.retry_after is not None and reject.retry_after > 0


def _learned_policy(max_batch: int) -> LatencyObjectivePolicy[Item]:
    """A policy whose model knows a batch of ``r`` rows takes 10 ms + 1 ms * r exactly, with
    one free instance at t = 1 s and an objective of 1 s."""
    policy: LatencyObjectivePolicy[Item] = LatencyObjectivePolicy(
        BatchConfig(max_batch), Objective(1.0))
    for rows in (1, 2, 4, 8):
        policy.model.observe(rows, 0.010 + 0.001 * rows)
    policy.instance_ready(0, 1.0)
    return policy


def _dispatched(poll: Any) -> list[int]:
    return [item.id for d in poll.decisions if isinstance(d, Dispatch) for item in d.items]


def test_a_timely_request_that_does_not_fit_is_not_passed_over() -> None:
    # 2 + 3 rows pass the 4-row batch; the 2 rows after the 3 would fill it, but the 3-row
    # request makes its deadline and came first: the batch ends before it
    policy = _learned_policy(4)
    for item in (Item(0, 2, "a", 0, 0), Item(1, 3, "a", 0, 0), Item(2, 2, "a", 0, 0)):
        policy.arrive(item, 1.0)
    assert _dispatched(policy.poll(1.0)) == [0]


def test_a_request_too_late_for_the_full_batch_goes_in_one_it_makes() -> None:
    # 8 rows due in 18.5 ms: a 12-row batch (22 ms) is too late for it, an 8-row one (18 ms)
    # is not. Before, the batch shrank to the 4 rows of the two later requests, which then
    # went ahead of it.
    policy = _learned_policy(12)
    policy.arrive(Item(0, 8, "a", 0, 18_500), 1.0)
    policy.arrive(Item(1, 2, "a", 0, 0), 1.0)
    policy.arrive(Item(2, 2, "a", 0, 0), 1.0)
    assert _dispatched(policy.poll(1.0)) == [0]


def test_a_request_timeout_tightens_its_objective() -> None:
    policy: LatencyObjectivePolicy[Item] = LatencyObjectivePolicy(BatchConfig(1), Objective(1.0))
    policy.instance_ready(0, 0.0)
    policy.arrive(Item(0, 1, "a", 0, 0), 0.0)
    policy.poll(0.0)
    policy.instance_ready(0, 0.010)  # 10 ms per batch
    policy.arrive(Item(1, 1, "a", 0, 0), 0.010)  # runs at once
    policy.poll(0.010)
    policy.arrive(Item(2, 1, "a", 0, 5_000), 0.010)  # 5 ms timeout: 10 ms ahead of it
    policy.arrive(Item(3, 1, "a", 0, 0), 0.010)  # the objective's 1 s: fine
    poll = policy.poll(0.010)
    shed = [item.id for d in poll.decisions if isinstance(d, Reject) for item in d.items]
    assert shed == [2]
    assert "5 ms (the request's timeout)" in next(
        d.reason for d in poll.decisions if isinstance(d, Reject))


@pytest.mark.parametrize(("parameters", "message"), [
    ({"nursery.batcher": "fast"}, "the only batcher of nursery's is 'latency_objective'"),
    ({"nursery.batcher": "latency_objective"}, "needs parameter 'nursery.latency_objective_ms'"),
    ({"nursery.batcher": "latency_objective", "nursery.latency_objective_ms": "soon"},
     "not a number of milliseconds"),
    ({"nursery.batcher": "latency_objective", "nursery.latency_objective_ms": "0"},
     "must be a positive number"),
    ({"nursery.batcher": "latency_objective", "nursery.latency_objective_ms": "5",
      "nursery.latency_objective_percentile": "101"}, "at most 100"),
    ({"nursery.latency_objective_ms": "5"}, "needs parameter 'nursery.batcher'"),
])
def test_bad_parameters_say_what_to_write(parameters: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        objective_from_parameters(parameters)


def test_parameters_select_the_objective() -> None:
    assert objective_from_parameters({}) is None
    assert objective_from_parameters({"other": "x"}) is None
    assert objective_from_parameters({
        "nursery.batcher": "latency_objective", "nursery.latency_objective_ms": "50",
        "nursery.latency_objective_percentile": "95"}) == Objective(0.05, 95.0)


# -- the running actor on the virtual clock ---------------------------------------------------

def _run_actor(policy: Any, gaps: list[float], compute: float, instances: int,
               timeouts: list[int]) -> tuple[dict[int, Any], dict[int, float], ExecutionLog]:
    log = ExecutionLog()
    answers: dict[int, Any] = {}
    latency: dict[int, float] = {}

    async def main() -> None:
        intake, inbox = trio.open_memory_channel[Any](100_000)
        async with trio.open_nursery() as nursery:
            channels = []
            for i in range(instances):
                send, receive = trio.open_memory_channel[ExecuteBatch](1)
                channels.append(send)
                await nursery.start(partial(fake_worker, i, receive, intake.clone(), log, compute))
            await nursery.start(partial(scheduler.run, name="m", policy=policy, inbox=inbox,
                                        instances=channels))

            async def client(i: int, receive: Any) -> None:
                start = trio.current_time()
                answers[i] = await receive.receive()
                latency[i] = trio.current_time() - start

            async with trio.open_nursery() as clients:
                for i, gap in enumerate(gaps):
                    await trio.sleep(gap)
                    work, receive = make_work(i, 1, signature="a", timeout_us=timeouts[i])
                    intake.send_nowait(work)
                    clients.start_soon(client, i, receive)
            intake.send_nowait(CloseIntake())
            intake.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return answers, latency, log


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate_factor=st.sampled_from([0.5, 2.0, 4.0]), instances=st.integers(1, 2),
       max_batch=st.sampled_from([1, 4, 8]), objective=st.sampled_from([0.02, 0.05]),
       seed=st.integers(0, 2**16), timeouts=st.lists(st.sampled_from([0, 0, 0, 15_000]),
                                                     min_size=120, max_size=120))
def test_actor_holds_the_objective_on_the_virtual_clock(
        rate_factor: float, instances: int, max_batch: int, objective: float, seed: int,
        timeouts: list[int]) -> None:
    """Poisson arrivals at a multiple of the capacity: every request is answered exactly once,
    by a result or UNAVAILABLE with a retry hint; no batch starts after a request's deadline;
    once the model has learned (after the first batch), every result is within the deadline."""
    import random
    compute = 0.01  # each batch, whatever its size (the fake instance's cost)
    capacity = instances * max_batch / compute
    rng = random.Random(seed)
    gaps = [rng.expovariate(rate_factor * capacity) for _ in timeouts]
    policy: LatencyObjectivePolicy[InferWork] = LatencyObjectivePolicy(
        BatchConfig(max_batch), Objective(objective), model="m")
    answers, latency, log = _run_actor(policy, gaps, compute, instances, timeouts)
    assert sorted(answers) == list(range(len(gaps)))
    started = {rid: start for _, ids, start, _ in log.batches for rid in ids}
    arrived = {i: sum(gaps[: i + 1]) for i in range(len(gaps))}
    first_done = min(end for _, _, _, end in log.batches)
    for i, answer in answers.items():
        budget = min(objective, timeouts[i] / 1e6) if timeouts[i] else objective
        if isinstance(answer, NurseryError):
            assert isinstance(answer, Overloaded) and answer.kind is ErrorKind.UNAVAILABLE
            assert str(i) not in started and "latency objective" in answer.message
        else:
            assert started[str(i)] < arrived[i] + budget + 1e-9, "a batch started late"
            if arrived[i] > first_done:  # the model knows the cost: results are on time
                assert latency[i] <= budget + 1e-9, f"request {i} answered late"


def test_actor_goodput_beats_the_dynamic_batcher_at_twice_the_capacity() -> None:
    """The same 400 arrivals at twice what one instance of batches of 4 can take: the
    dynamic batcher queues them all and answers most late; the latency batcher sheds the
    excess and answers what it takes within the objective."""
    import random
    rng = random.Random(7)
    gaps = [rng.expovariate(2 * 4 / 0.01) for _ in range(400)]
    timeouts = [0] * len(gaps)
    objective = 0.05

    def good(policy: Any) -> int:
        answers, latency, _ = _run_actor(policy, gaps, 0.01, 1, timeouts)
        return sum(1 for i, a in answers.items()
                   if not isinstance(a, NurseryError) and latency[i] <= objective)

    dynamic = good(DynamicBatchPolicy[InferWork](BatchConfig(4)))
    latency_batcher = good(LatencyObjectivePolicy[InferWork](BatchConfig(4), Objective(objective)))
    assert latency_batcher >= 1.5 * dynamic, (latency_batcher, dynamic)

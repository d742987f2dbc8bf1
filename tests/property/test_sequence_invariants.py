"""The sequence batcher's policy, proven by a hypothesis state machine.

Rules: requests arrive for a small pool of correlation IDs (uint64 and string) with any mix
of START/END flags (so sequences start, continue, end, restart, and requests come for IDs
that are not live), instances finish their batches, and the clock moves (sometimes past the
idle timeout). After every poll a reference model checks:

- a live sequence never changes instance or slot, and two live sequences never share a slot
  (a slot gets a new sequence only after its END ran or it was released);
- the requests of one sequence run in the order sent, each exactly once, one per batch;
- START always sees fresh state: a simulated worker keeps each slot's running sum exactly as
  the instance worker keeps state (reset on START, dropped on END and on release), and every
  row sees the sum of its own sequence's values only;
- END or the idle timeout frees the slot: a release happens only for a sequence that has had
  nothing queued or running for the idle time, and no such sequence keeps its slot;
- a request for an ID that is not live and does not START is rejected with Triton's message,
  every other request runs; every request gets exactly one outcome (checked at teardown after
  draining everything);
- new sequences wait in a backlog when every slot is taken and take freed slots in arrival
  order;
- batches go only to free instances, hold at most max_batch_size rows, and (direct) each row
  is its slot, padding rows marking the empty ones; with no queue delay, a free instance never
  leaves a queued request of its slots waiting;
- cancelling a queued request cancels its sequence, as Triton: in a slot, it and every later
  request are answered CANCELLED and never run (the earlier ones still do), and the slot is
  freed (its state released only if something of it ran) once nothing of it is queued or
  running; in the backlog, the whole sequence is cancelled; the ID must START again;
- a request's own timeout counts only while its sequence waits in the backlog (Triton's
  reaper): once the earliest such deadline passes, every request of that backlogged sequence
  is rejected ("timeout of the corresponding sequence has been expired") and the ID is
  forgotten; a sequence that got a slot never times out.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nursery.errors import ErrorKind
from nursery.scheduling.decisions import Cancel, Dispatch, Reject, Release
from nursery.scheduling.sequence_policy import (
    BACKLOG_TIMEOUT,
    SequencePolicy,
    SlotRow,
    not_started_message,
)
from nursery.scheduling.sequence_schedule import SequenceSchedule

IDS: list[Hashable] = [1, 2, 3, 2**64 - 1, "a", "b", "c"]


@dataclass(eq=False)
class Gen:
    """One sequence: an ID from its START to its END (or its release)."""

    cid: Hashable
    sent: list[int] = field(default_factory=list)  # values sent, in order
    ran: int = 0  # requests dispatched so far
    place: tuple[int, int] | None = None  # learned from its first dispatched row
    ended: bool = False  # its END arrived
    over: bool = False  # its END ran or it was released
    last: float = 0.0  # last arrival or completion
    running: bool = False
    cancelled: bool = False
    expires: float = float("inf")  # while backlogged: the earliest request deadline


@dataclass(eq=False)
class Req:
    sequence_id: Hashable
    sequence_start: bool
    sequence_end: bool
    value: int
    gen: Gen | None
    index: int = -1
    outcome: str = ""
    timeout_us: int = 0
    shape: int = 0  # the signature: requests of different shapes never share a batch


@st.composite
def schedules(draw: st.DrawFn) -> SequenceSchedule:
    strategy = draw(st.sampled_from(["direct", "oldest"]))
    max_batch = draw(st.integers(1, 4))
    slots = max_batch if strategy == "direct" else draw(st.integers(1, 4))
    preferred = tuple(sorted(draw(st.sets(st.integers(1, max_batch), max_size=2))))
    return SequenceSchedule(
        strategy=strategy, slots_per_instance=slots, max_batch_size=max_batch,
        idle_us=draw(st.sampled_from([5_000, 50_000])),
        preferred_batch_sizes=preferred if strategy == "oldest" else (),
        max_queue_delay_us=draw(st.sampled_from([0, 0, 1_000])),
    )


class SequenceMachine(RuleBasedStateMachine):
    @initialize(schedule=schedules(), instances=st.integers(1, 3))
    def setup(self, schedule: SequenceSchedule, instances: int) -> None:
        self.schedule = schedule
        self.instances = instances
        self.policy = SequencePolicy[Req](schedule, instances, model="m",
                                          signature=lambda req: req.shape)
        self.now = 0.0
        self.idle = schedule.idle_us / 1e6
        self.live: dict[Hashable, Gen] = {}  # IDs whose END has not arrived and not released
        self.requests: list[Req] = []
        self.free: set[int] = set(range(instances))
        self.busy: dict[int, list[Gen]] = {}
        self.holder: dict[tuple[int, int], Gen] = {}  # place -> sequence (from dispatches)
        self.state: dict[tuple[int, int], int] = {}  # the simulated worker's slot state
        self.holding: list[Gen] = []  # sequences with a slot (the policy's view, predicted)
        self.backlog: list[Gen] = []
        self.capacity = instances * schedule.slots_per_instance
        self.to_cancel: set[int] = set()  # id() of requests a Cancel decision must answer
        for i in range(instances):
            self.policy.instance_ready(i, self.now)
        self._poll()

    # -- rules -------------------------------------------------------------------------------

    @rule(cid=st.sampled_from(IDS), start=st.booleans(), end=st.booleans(),
          value=st.integers(1, 1000), timeout_us=st.sampled_from([0, 0, 0, 3_000]),
          shape=st.sampled_from([0, 0, 0, 1]))
    def send(self, cid: Hashable, start: bool, end: bool, value: int, timeout_us: int,
             shape: int) -> None:
        gen = self.live.get(cid)
        if gen is None and start:
            gen = Gen(cid)
            if len(self.holding) < self.capacity:
                self.holding.append(gen)
            else:
                self.backlog.append(gen)
                event("a sequence waited in the backlog")
        if gen is not None:
            gen.sent.append(value)
            gen.last = self.now
            if end:
                gen.ended = True
                self.live.pop(cid, None)
            else:
                self.live[cid] = gen
        if gen is not None and gen in self.backlog and timeout_us:
            gen.expires = min(gen.expires, self.now + timeout_us / 1e6)
        req = Req(cid, start, end, value, gen, len(gen.sent) - 1 if gen else -1,
                  timeout_us=timeout_us, shape=shape)
        self.requests.append(req)
        self.policy.arrive(req, self.now)
        self._poll()

    @precondition(lambda self: bool(self.busy))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        instance = data.draw(st.sampled_from(sorted(self.busy)))
        for gen in self.busy.pop(instance):
            gen.running = False
            gen.last = self.now
        self.free.add(instance)
        self.policy.instance_ready(instance, self.now)
        self._poll()

    @precondition(lambda self: any(r.gen is not None and not r.outcome
                                   and id(r) not in self.to_cancel and r.index >= r.gen.ran
                                   for r in self.requests))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        queued = [r for r in self.requests if r.gen is not None and not r.outcome
                  and id(r) not in self.to_cancel and r.index >= r.gen.ran]
        req = data.draw(st.sampled_from(queued))
        gen = req.gen
        assert gen is not None
        assert self.policy.cancel(req), "a queued request could not be cancelled"
        req.outcome = "cancelled"
        backlogged = gen in self.backlog
        first = 0 if backlogged else req.index
        event("backlogged sequence cancelled" if backlogged else "sequence cancelled in a slot")
        for other in self.requests:
            if (other.gen is gen and other.index >= first and other is not req
                    and other.outcome != "cancelled"):  # not by an earlier cancel
                assert not other.outcome
                self.to_cancel.add(id(other))
        del gen.sent[first:]
        gen.cancelled = True
        if self.live.get(gen.cid) is gen:
            del self.live[gen.cid]
        if backlogged:
            self.backlog.remove(gen)
            gen.over = True
        elif gen.place is None and not gen.sent:  # nothing of it ran: freed, no release
            self._over(gen, None)
        self._poll()
        assert not self.to_cancel, "the rest of a cancelled sequence was not answered"

    @rule(dt=st.sampled_from([0.0002, 0.001, 0.004, 0.06]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._poll()

    # -- the reference model -----------------------------------------------------------------

    def _poll(self) -> None:
        poll = self.policy.poll(self.now)
        if poll.wake_at is not None:
            assert poll.wake_at > self.now, "asked to be woken in the past"
        for decision in poll.decisions:
            if isinstance(decision, Reject) and decision.reason == BACKLOG_TIMEOUT:
                assert decision.kind is None  # the scheduler's UNAVAILABLE
                gens = {id(r.gen): r.gen for r in decision.items}
                for gen in gens.values():
                    assert gen is not None and gen in self.backlog, "timed out outside the backlog"
                    assert self.now >= gen.expires, "timed out early"
                    mine = [r for r in decision.items if r.gen is gen]
                    assert [r.index for r in mine] == list(range(len(gen.sent))), \
                        "a timed-out sequence's requests were not all rejected, in order"
                    event("backlogged sequence timed out")
                    self.backlog.remove(gen)
                    gen.over = True
                    if self.live.get(gen.cid) is gen:
                        del self.live[gen.cid]
                for req in decision.items:
                    assert not req.outcome
                    req.outcome = "timed out"
            elif isinstance(decision, Reject):
                assert decision.kind is ErrorKind.INVALID_ARG
                for req in decision.items:
                    assert req.gen is None, "a request of a live sequence was rejected"
                    assert decision.reason == not_started_message(req.sequence_id, "m")
                    assert not req.outcome
                    req.outcome = "rejected"
            elif isinstance(decision, Cancel):
                for req in decision.items:
                    assert id(req) in self.to_cancel, "cancelled a request of another sequence"
                    self.to_cancel.discard(id(req))
                    assert not req.outcome
                    req.outcome = "cancelled"
            elif isinstance(decision, Release):
                for slot in decision.slots:
                    place = (decision.instance, slot)
                    gen = self.holder.get(place)
                    assert gen is not None, "released a slot nobody held"
                    assert self._idle_expired(gen) or self._cancel_done(gen), \
                        "released a sequence that was not idle"
                    event("idle sequence released")
                    assert not gen.over
                    self._over(gen, place)
                    if self.live.get(gen.cid) is gen:
                        del self.live[gen.cid]
            else:
                assert isinstance(decision, Dispatch)
                self._dispatch(decision)
        if self.schedule.max_queue_delay_us == 0:
            for instance in self.free:
                assert not self._queued_on(instance), "a free instance left requests waiting"

    def _queued_on(self, instance: int) -> bool:
        return any(g.ran < len(g.sent) for g in self.holding
                   if g.place is not None and g.place[0] == instance)

    def _idle_expired(self, gen: Gen) -> bool:
        return (gen.ran == len(gen.sent) and not gen.running
                and self.now >= gen.last + self.idle)

    def _cancel_done(self, gen: Gen) -> bool:
        return gen.cancelled and gen.ran == len(gen.sent) and not gen.running

    def _over(self, gen: Gen, place: tuple[int, int] | None) -> None:
        gen.over = True
        if place is not None:
            self.holder.pop(place, None)
            self.state.pop(place, None)
        self.holding.remove(gen)
        if self.backlog:
            self.holding.append(self.backlog.pop(0))

    def _dispatch(self, decision: Dispatch[Req]) -> None:
        instance = decision.instance
        assert instance in self.free, "a batch went to a busy instance"
        self.free.discard(instance)
        rows = decision.rows
        assert rows is not None and all(isinstance(r, SlotRow) for r in rows)
        assert 1 <= len(rows) <= max(1, self.schedule.max_batch_size)
        assert sorted(r.item for r in rows if r.ready) == list(range(len(decision.items)))
        assert len({r.shape for r in decision.items}) == 1, "shapes mixed in one batch"
        if self.schedule.strategy == "direct":
            assert [r.slot for r in rows] == list(range(len(rows))), "direct rows are slots"
            if len({r.shape for r in self.requests if r.gen is not None and not r.outcome}) == 1:
                assert rows[-1].ready, "a trailing padding row with nothing of another shape"
        else:
            assert all(r.ready for r in rows)
        event(f"batch of {len(decision.items)}")
        ran: list[Gen] = []
        for row in rows:
            place = (instance, row.slot)
            assert 0 <= row.slot < self.schedule.slots_per_instance
            if not row.ready:
                event("padding row")
                continue
            req = decision.items[row.item]
            gen = req.gen
            assert gen is not None and not req.outcome
            req.outcome = "ran"
            assert gen not in ran, "two requests of one sequence in one batch"
            ran.append(gen)
            assert req.index == gen.ran, "requests of a sequence ran out of order"
            assert (row.start, row.end, row.corrid) == (req.sequence_start, req.sequence_end,
                                                        req.sequence_id)
            gen.ran += 1
            if gen.place is None:
                assert place not in self.holder, "two live sequences share a slot"
                assert req.sequence_start, "a sequence's first request had no START"
                gen.place = place
                self.holder[place] = gen
            assert gen.place == place, "a live sequence changed slot"
            # the simulated worker: state reset on START, kept per slot
            total = (0 if row.start or place not in self.state else self.state[place])
            total += req.value
            self.state[place] = total
            sent = gen.sent[: req.index + 1]
            restart = max(i for i in range(req.index + 1)
                          if i == 0 or self._was_start(gen, i))
            assert total == sum(sent[restart:]), "a row saw state that is not its own"
            if row.end:
                self._over(gen, place)
        for gen in ran:
            gen.running = True
        self.busy[instance] = ran

    def _was_start(self, gen: Gen, index: int) -> bool:
        return any(r.gen is gen and r.index == index and r.sequence_start for r in self.requests)

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def backlog_in_arrival_order(self) -> None:
        if not hasattr(self, "policy"):
            return
        assert self.policy.backlog() == [g.cid for g in self.backlog]
        assert len(self.policy.occupied()) == len(self.holding)

    @invariant()
    def idle_sequences_do_not_keep_slots(self) -> None:
        if not hasattr(self, "policy"):
            return
        for gen in self.holding:
            assert not self._idle_expired(gen), "an idle sequence kept its slot"
            assert not self._cancel_done(gen), "a cancelled sequence kept its slot"
        for gen in self.backlog:
            assert self.now < gen.expires, "a timed-out sequence stayed in the backlog"

    def teardown(self) -> None:
        if not hasattr(self, "policy"):
            return
        # drain: finish every batch and move the clock until nothing is left
        for _ in range(10_000):
            if not self.busy and self.policy.pending() == 0:
                break
            for instance in sorted(self.busy):
                for gen in self.busy.pop(instance):
                    gen.running = False
                    gen.last = self.now
                self.free.add(instance)
                self.policy.instance_ready(instance, self.now)
            poll = self.policy.poll(self.now)
            self._replay(poll)
            self.now = max(self.now + 1e-4, poll.wake_at or 0.0)
        assert self.policy.pending() == 0
        for req in self.requests:
            assert req.outcome in ("ran", "rejected", "cancelled", "timed out"), \
                "a request got no outcome"
            assert (req.outcome == "rejected") == (req.gen is None)

    def _replay(self, poll: object) -> None:
        for decision in poll.decisions:  # type: ignore[attr-defined]
            if isinstance(decision, Dispatch):
                self._dispatch(decision)
            elif isinstance(decision, Release):
                for slot in decision.slots:
                    place = (decision.instance, slot)
                    gen = self.holder.get(place)
                    if gen is not None:
                        self._over(gen, place)
            elif isinstance(decision, Reject):
                for req in decision.items:
                    req.outcome = ("timed out" if decision.reason == BACKLOG_TIMEOUT
                                   else "rejected")
                    if req.gen in self.backlog:  # timed out: it never takes a slot
                        self.backlog.remove(req.gen)
            elif isinstance(decision, Cancel):
                for req in decision.items:
                    req.outcome = "cancelled"


SequenceMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestSequencePolicy = SequenceMachine.TestCase


def _direct_policy(utilization: float) -> SequencePolicy[Req]:
    schedule = SequenceSchedule(strategy="direct", slots_per_instance=4, max_batch_size=4,
                                idle_us=10_000_000, max_queue_delay_us=1_000,
                                min_slot_utilization=utilization)
    policy = SequencePolicy[Req](schedule, 1, model="m")
    policy.instance_ready(0, 0.0)
    return policy


def test_direct_delay_waits_for_the_minimum_slot_utilization() -> None:
    """Triton's direct batcher: with a queue delay and a minimum slot utilization, a batch
    waits until ready rows / max_batch_size reaches it, or the oldest waited the delay."""
    policy = _direct_policy(0.5)
    policy.arrive(Req(1, True, False, 1, None), 0.0)
    poll = policy.poll(0.0)
    assert poll.decisions == [] and poll.wake_at == 0.001  # 1/4 < 0.5: wait
    policy.arrive(Req(2, True, False, 1, None), 0.0002)
    [batch] = policy.poll(0.0002).decisions  # 2/4 reaches 0.5: at once
    assert isinstance(batch, Dispatch) and len(batch.items) == 2
    policy.instance_ready(0, 0.0003)
    policy.arrive(Req(1, False, False, 1, None), 0.0003)
    assert policy.poll(0.0003).decisions == []
    [batch] = policy.poll(0.0014).decisions  # the delay passed: one row goes alone
    assert isinstance(batch, Dispatch) and len(batch.items) == 1


def test_direct_delay_without_a_minimum_utilization_never_waits() -> None:
    policy = _direct_policy(0.0)
    policy.arrive(Req(1, True, False, 1, None), 0.0)
    [batch] = policy.poll(0.0).decisions
    assert isinstance(batch, Dispatch) and len(batch.items) == 1


def test_direct_pads_the_slot_of_a_differing_shape() -> None:
    """Triton's direct batcher: the lowest slot's head sets the shapes; a head that differs
    waits, its slot a padding row (the null request), and runs in the next batch."""
    schedule = SequenceSchedule(strategy="direct", slots_per_instance=3, max_batch_size=3)
    policy = SequencePolicy[Req](schedule, 1, model="m", signature=lambda req: req.shape)
    policy.instance_ready(0, 0.0)
    a, b, c = (Req(cid, True, False, 1, None, shape=shape)
               for cid, shape in ((1, 5), (2, 6), (3, 5)))
    for req in (a, b, c):
        policy.arrive(req, 0.0)
    [batch] = policy.poll(0.0).decisions
    assert isinstance(batch, Dispatch) and batch.items == (a, c)
    assert [(r.slot, r.ready) for r in batch.rows or ()] == [(0, True), (1, False), (2, True)]
    policy.instance_ready(0, 0.001)
    [batch] = policy.poll(0.001).decisions
    assert isinstance(batch, Dispatch) and batch.items == (b,)
    assert [(r.slot, r.ready) for r in batch.rows or ()] == [(0, False), (1, True)]


def test_oldest_stops_a_batch_at_a_differing_shape() -> None:
    """Triton's oldest strategy batches candidates through a dynamic batcher: the batch grows
    from the oldest head and is sent as soon as the next head's shapes differ."""
    schedule = SequenceSchedule(strategy="oldest", slots_per_instance=3, max_batch_size=3,
                                preferred_batch_sizes=(3,), max_queue_delay_us=1_000_000)
    policy = SequencePolicy[Req](schedule, 1, model="m", signature=lambda req: req.shape)
    policy.instance_ready(0, 0.0)
    a, b, c = (Req(cid, True, False, 1, None, shape=shape)
               for cid, shape in ((1, 5), (2, 5), (3, 6)))
    for t, req in enumerate((a, b, c)):
        policy.arrive(req, t * 1e-4)
    [batch] = policy.poll(0.001).decisions  # cannot grow to 3: sent before the delay ends
    assert isinstance(batch, Dispatch) and batch.items == (a, b)
    policy.instance_ready(0, 0.002)
    poll = policy.poll(0.002)
    assert poll.decisions == [] and poll.wake_at is not None  # alone: waits for the delay


def test_a_retired_instance_keeps_its_sequences_until_they_end() -> None:
    """A reload that changes only the instance groups (Triton's sequence batcher Update): a
    retired instance takes no new sequence, keeps the ones in its slots until their END, and
    is then no longer held; a new sequence goes to the added instance, and a backlogged one
    takes an added instance's slot at once."""
    schedule = SequenceSchedule(strategy="direct", slots_per_instance=1, max_batch_size=1,
                                idle_us=10_000_000)
    policy = SequencePolicy[Req](schedule, 1, model="m")
    policy.instance_ready(0, 0.0)
    policy.arrive(Req(1, True, False, 1, None), 0.0)
    [first] = policy.poll(0.0).decisions
    assert isinstance(first, Dispatch) and first.instance == 0
    policy.instance_ready(0, 0.1)
    policy.arrive(Req(2, True, False, 1, None), 0.1)  # every slot taken: backlog
    assert policy.backlog() == [2]
    policy.retire_instance(0)
    policy.add_instance(1)
    assert policy.backlog() == [] and policy.place_of(2) == (1, 0)
    assert policy.holds(0)
    policy.instance_ready(1, 0.2)
    policy.arrive(Req(1, False, True, 1, None), 0.2)  # sequence 1 ends where it lives
    batches = [d for d in policy.poll(0.2).decisions if isinstance(d, Dispatch)]
    assert sorted(b.instance for b in batches) == [0, 1]
    assert not policy.holds(0)  # its last sequence is over: it may go
    policy.instance_ready(0, 0.3)
    policy.instance_ready(1, 0.3)
    policy.arrive(Req(3, True, False, 1, None), 0.3)  # no slot: never the retired one
    policy.poll(0.3)
    assert policy.place_of(3) is None and policy.backlog() == [3]


def test_iterative_requeue_keeps_the_slot_and_completion_ends_the_sequence() -> None:
    """Iterative sequences (Triton's IterativeSequencer): a rescheduled request runs again in
    its sequence's slot; once a request completes without being rescheduled, the sequence
    ends and its slot (state released) goes to the next sequence."""
    schedule = SequenceSchedule(strategy="direct", slots_per_instance=1, max_batch_size=1,
                                idle_us=10_000_000, iterative=True)
    policy = SequencePolicy[Req](schedule, 1, model="m")
    policy.instance_ready(0, 0.0)
    first = Req(7, True, False, 1, None)
    policy.arrive(first, 0.0)
    policy.arrive(Req(8, True, False, 1, None), 0.0)  # waits in the backlog
    [run] = policy.poll(0.0).decisions
    assert isinstance(run, Dispatch) and run.items == (first,)
    policy.instance_ready(0, 0.1)
    policy.requeue(first, 0.1)  # the model rescheduled it
    [again] = policy.poll(0.1).decisions
    assert isinstance(again, Dispatch) and again.items == (first,)
    assert again.rows is not None and again.rows[0].start is False  # its state is kept
    policy.instance_ready(0, 0.2)
    policy.end_sequence(7)  # it completed
    decisions = policy.poll(0.2).decisions
    assert [type(d) for d in decisions] == [Release, Dispatch]  # state dropped, then 8 runs
    assert policy.place_of(8) == (0, 0)


def test_an_iterative_sequence_held_past_the_idle_time_is_reaped_while_it_runs() -> None:
    """Triton's reaper counts an iterative sequence idle from its last request's arrival,
    even while that request runs (L0_iterative_sequence's test_reschedule_error): the model
    holding it past ``max_sequence_idle_microseconds`` loses the sequence, its slot goes to
    the next one, and the rescheduled request is refused as one without START. A sequence
    that is not iterative keeps its slot while its request runs."""
    for iterative in (True, False):
        schedule = SequenceSchedule(strategy="direct", slots_per_instance=1, max_batch_size=1,
                                    idle_us=200_000, iterative=iterative)
        policy = SequencePolicy[Req](schedule, 1, model="m")
        policy.instance_ready(0, 0.0)
        first = Req(7, True, False, 1, None)
        policy.arrive(first, 0.0)
        [run] = policy.poll(0.0).decisions
        assert isinstance(run, Dispatch) and run.items == (first,)
        late = policy.poll(0.3)  # still running at 0.3 s, past the 0.2 s idle time
        if not iterative:
            assert late.decisions == [] and late.wake_at is None
            assert policy.place_of(7) == (0, 0)
            continue
        assert [type(d) for d in late.decisions] == [Release]  # the slot's state goes
        assert policy.place_of(7) is None
        policy.instance_ready(0, 0.5)
        policy.requeue(first, 0.5)  # the model rescheduled it after 0.5 s
        [refused] = policy.poll(0.5).decisions
        assert isinstance(refused, Reject) and refused.items == (first,)
        assert refused.reason == ("inference request for sequence 7 to model 'm' must specify "
                                  "the START flag on the first request of the sequence")
        assert refused.kind is ErrorKind.INVALID_ARG


def test_a_running_iterative_sequence_sets_a_wake_up_at_its_idle_deadline() -> None:
    schedule = SequenceSchedule(strategy="direct", slots_per_instance=1, max_batch_size=1,
                                idle_us=200_000, iterative=True)
    policy = SequencePolicy[Req](schedule, 1, model="m")
    policy.instance_ready(0, 0.0)
    policy.arrive(Req(7, True, False, 1, None), 0.0)
    result = policy.poll(0.0)
    assert [type(d) for d in result.decisions] == [Dispatch]
    assert result.wake_at == 0.2  # the actor comes back to reap it on the clock

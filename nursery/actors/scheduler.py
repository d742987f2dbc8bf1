"""Scheduler actor: moves messages between requesters, a policy and the instance workers.

The same actor runs every scheduling policy: the default scheduler is this actor with
``FifoPolicy``; the DynamicBatcher is this actor with ``DynamicBatchPolicy``. The policy
(pure, see ``nursery/scheduling``) decides; the actor only does what it says: it feeds arrivals,
cancellations and ``InstanceReady`` notices to the policy, sends ``ExecuteBatch`` to the chosen
instance, answers rejections, and sleeps until its next message or the policy's next deadline.
Requests whose requester stopped waiting are dropped before they reach an instance.

It also keeps the version's statistics (from the workers' batch reports and its own
rejections) and, with ``preserve_ordering``, releases answers in arrival order.

On ``CloseIntake`` it finishes the queue, then closes the instances' inboxes, which ends them;
when every sender of its own inbox is gone, it returns.

A request arrives, for the policy, when the core queued it (``InferWork.enqueued_ns``), as in
Triton, whose frontend threads put a request into the scheduler's queue themselves: not when
this task got round to reading it. The task shares the trio thread with the frontends, and a
burst of requests (a batch's answers bring its clients back together) is read and decoded
before the scheduler runs again; timed from that moment, the batching delay would start only
once the whole burst was in, and add the burst's reading time to every batch's wait. On a
test's virtual clock, where the core's stamp is not in the clock's time, the task's time is
used.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from nursery.actors import mailbox
from nursery.errors import Cancelled, InternalError, NurseryError, Overloaded, Unavailable
from nursery.messages import (
    CacheOutcome,
    CancelWork,
    CloseIntake,
    DecoupledResponse,
    ExecuteBatch,
    InferWork,
    InstanceReady,
    ReleaseSlots,
    StatsQuery,
    UpdateInstances,
)
from nursery.observability.stats import StatsAccumulator
from nursery.runtime import timer as precise_timer
from nursery.runtime.supervision import describe
from nursery.scheduling.batch_policy import DynamicBatchPolicy
from nursery.scheduling.decisions import Cancel, Dispatch, Reject, Release, SchedulingPolicy
from nursery.scheduling.sequence_policy import SequencePolicy

log = logging.getLogger("nursery.scheduler")

RejectError = Callable[[str], NurseryError]


class _Ordering:
    """Releases answers in the order requests were dispatched (preserve_ordering)."""

    def __init__(self) -> None:
        self._next_seq = itertools.count()
        self.seq: dict[int, int] = {}  # id(work) -> sequence number
        self._release = 0
        self._held: list[tuple[int, int, InferWork, Any]] = []

    def number(self, work: InferWork) -> None:
        self.seq[id(work)] = next(self._next_seq)

    def finish(self, work: InferWork, answer: Any) -> None:
        seq = self.seq.pop(id(work))
        heapq.heappush(self._held, (seq, id(work), work, answer))
        while self._held and self._held[0][0] == self._release:
            _, _, w, a = heapq.heappop(self._held)
            _answer(w, a)
            self._release += 1

    def flush(self) -> None:
        """Release every answer held, in order, without waiting for the ones missing."""
        while self._held:
            _, _, w, a = heapq.heappop(self._held)
            _answer(w, a)


class _Grants:
    """Rate-limiter grants the scheduler holds for the instances whose batches need one
    (``--rate-limit execution_count``, resources listed, under the dynamic batcher or the
    default scheduler). Such an instance is ready for the policy only while it holds a grant,
    so its batch is formed when it may run, from everything queued by then, as Triton keeps
    filling a batch until an instance is allocated to run it; a batch formed earlier would
    wait for the grant at the size it had. A busy instance's next grant is asked for before
    its batch's resources are released, so the release cannot hand the turn to another model
    only because it reached the limiter first (priorities hold). A grant that comes when
    nothing is queued any more goes back at once: an idle instance never holds resources."""

    def __init__(self, limiter: Any) -> None:
        self.limiter = limiter
        self.keys: dict[int, Any] = {}  # gated instance -> its key with the rate limiter
        self.parked: set[int] = set()  # idle, no grant, none asked for
        self.asking: dict[int, _GrantReply] = {}  # a grant asked for, and its reply slot
        self.holding: set[int] = set()  # granted, ready for the policy, no batch yet
        self.arrived: list[int] = []  # grants come, not yet taken by the scheduler's loop
        self.nudge: trio.CancelScope | None = None  # the loop's wait, cut short by a grant

    def add(self, instance: int, worker: Any) -> None:
        key = getattr(worker, "limit_key", None)
        if key is not None:
            self.keys[instance] = key

    def ask(self, instance: int) -> None:
        """Ask now: the request is in the limiter's inbox before anything sent after it (a
        release), and its answer lands in :meth:`granted` (no task waits for it)."""
        if instance in self.asking or instance in self.holding:
            return
        self.parked.discard(instance)
        reply = _GrantReply(self, instance)
        if self.limiter.request(self.keys[instance], reply):
            self.asking[instance] = reply
        else:  # the limiter has stopped (the server is going down): no batch for it
            self.parked.add(instance)

    def granted(self, instance: int) -> None:
        self.asking.pop(instance, None)
        self.arrived.append(instance)
        if self.nudge is not None:
            self.nudge.cancel()

    def release(self, instance: int) -> None:
        self.limiter.release(self.keys[instance])

    def finished(self, instance: int, wanted: bool, was_busy: bool) -> None:
        """The instance is idle (started, or its batch ended): asks for its next turn when
        requests wait, before it gives back the resources it held."""
        if wanted:
            self.ask(instance)
        elif instance not in self.asking:
            self.parked.add(instance)
        if was_busy:
            self.release(instance)

    def take(self, policy: SchedulingPolicy[Any], now: float,
             usable: Callable[[int], bool]) -> None:
        """The grants that came: each makes its instance ready, or goes back unused."""
        for instance in self.arrived:
            if usable(instance) and policy.pending() > 0:
                self.holding.add(instance)
                policy.instance_ready(instance, now, 1)
            else:
                self.release(instance)
                if usable(instance):
                    self.parked.add(instance)
        self.arrived.clear()
        if self.parked and policy.pending() > 0:
            for instance in [i for i in self.parked if usable(i)]:
                self.ask(instance)

    def settle(self, policy: Any) -> None:
        """After the policy's decisions: a granted instance that got no batch while nothing
        is queued gives its grant back."""
        if policy.pending() == 0:
            for instance in [i for i in self.holding if policy.withdraw_ready(i)]:
                self.holding.discard(instance)
                self.release(instance)
                self.parked.add(instance)

    def retire(self, instance: int) -> None:
        self.parked.discard(instance)
        if instance in self.holding:
            self.holding.discard(instance)
            self.release(instance)

    def release_all(self) -> None:
        """The scheduler ends: every grant it holds goes back, and one still asked for is
        refused when it comes (the limiter then gives it back)."""
        for reply in self.asking.values():
            reply.open_receive_channels = 0
        self.asking.clear()
        for instance in {*self.holding, *self.arrived}:
            self.release(instance)
        self.holding.clear()
        self.arrived.clear()


class _GrantReply:
    """The reply slot of one grant asked for: the limiter answers it as a reply channel
    (``send_nowait``, through ``mailbox.answer``), which calls the scheduler's
    :meth:`_Grants.granted` at once, in the limiter's turn; refused
    (``BrokenResourceError``) once the scheduler has ended, and the limiter then gives the
    grant back."""

    __slots__ = ("grants", "instance", "open_receive_channels")

    def __init__(self, grants: _Grants, instance: int) -> None:
        self.grants = grants
        self.instance = instance
        self.open_receive_channels = 1

    def send_nowait(self, value: Any) -> None:
        if not self.open_receive_channels:
            raise trio.BrokenResourceError
        self.open_receive_channels = 0
        self.grants.granted(self.instance)


def _arrival(work: InferWork, now: float) -> float:
    """When ``work`` was queued, in trio's time (``now`` less how long ago the core queued it,
    by the monotonic clock its stamp is on)."""
    age = (time.monotonic_ns() - work.enqueued_ns) / 1e9
    return now - age if age > 0 else now


class WorkerInbox(Protocol):
    """Where the scheduler puts an instance's batches: the worker's
    :class:`~nursery.actors.instance_worker.WorkerIntake` (or, in tests, a memory channel)."""

    def send_nowait(self, message: ExecuteBatch | ReleaseSlots, /) -> None: ...

    async def aclose(self) -> None: ...


async def run(
    *,
    name: str,
    policy: SchedulingPolicy[InferWork],
    inbox: trio.MemoryReceiveChannel[Any],
    instances: Sequence[WorkerInbox],
    preserve_ordering: bool = False,
    reject_error: RejectError = Unavailable,
    summaries: bool = False,
    first_response: tuple[float, ...] = (),
    limiter: Any = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``limiter``: the rate limiter's client, when this scheduler holds the grants of its
    instances that list resources (``_Grants``; their workers then run each batch at once)."""
    closing = False
    workers: dict[int, WorkerInbox] = dict(enumerate(instances))  # by placement index
    # the batches sent to each instance and not finished, as their request counts: all but
    # the running (first) one still wait, and count as pending as Triton counts its queue
    outstanding: dict[int, collections.deque[int]] = {i: collections.deque() for i in workers}
    retired: set[int] = set()  # leaving: closed once idle and no longer held by the policy
    # iterative_sequence: a request without a correlation ID starts a sequence of its own
    iterative = policy if isinstance(policy, SequencePolicy) and policy.schedule.iterative \
        else None
    sequence_ids = itertools.count(1)
    early: dict[int, int] = {}  # InstanceReady of an instance added but not yet announced
    stats = StatsAccumulator(summaries, first_response)
    ordering = _Ordering() if preserve_ordering else None
    cancel = getattr(policy, "cancel", None)
    waker = precise_timer.create()  # the policy's sub-millisecond deadlines, on time
    # requests arrive when the core queued them (see the module's docstring); not on a
    # test's virtual clock
    stamped = type(trio.lowlevel.current_clock()).__name__ == "SystemClock"
    failure: BaseException | None = None
    message: Any = None
    if isinstance(policy, DynamicBatchPolicy):  # Triton's verbose line, which tools look for
        log.debug("Starting dynamic-batcher thread for %s at default nice (a task on the "
                  "server's trio thread here)...", name)
    task_status.started()
    async with inbox, trio.open_nursery() as timer_tasks:
        if waker is not None:
            timer_tasks.start_soon(waker.serve)
        grants = _Grants(limiter) if limiter is not None else None
        if grants is not None:
            for i, inbox_of in workers.items():
                grants.add(i, inbox_of)

        def usable(i: int) -> bool:
            return i in workers and i not in retired and not closing

        try:
            while True:
                message = None  # the message being handled, if a failure comes
                now = trio.current_time()
                if grants is not None and grants.keys:
                    grants.take(policy, now, usable)
                poll = policy.poll(now)
                dropped = False
                for decision in poll.decisions:
                    if isinstance(decision, Dispatch) and decision.rows is not None:
                        # a sequence's requests always run: its state depends on each
                        workers[decision.instance].send_nowait(
                            ExecuteBatch(decision.items, rows=decision.rows))
                        outstanding[decision.instance].append(len(decision.items))
                    elif isinstance(decision, Release):
                        worker = workers.get(decision.instance)
                        if worker is not None:
                            worker.send_nowait(ReleaseSlots(decision.slots))
                    elif isinstance(decision, Dispatch):
                        live = tuple([w for w in decision.items if not w.abandoned()])
                        if len(live) != len(decision.items):
                            stats.record_failure("CANCELED", len(decision.items) - len(live))
                        if not live:  # nobody waits for these: the place stays free
                            policy.instance_ready(decision.instance, now)
                            dropped = True
                            continue
                        if grants is not None:
                            grants.holding.discard(decision.instance)  # its grant runs it
                        if ordering is not None:
                            for w in live:
                                ordering.number(w)
                        workers[decision.instance].send_nowait(
                            ExecuteBatch(live, ordering is not None))
                        outstanding[decision.instance].append(len(live))
                    elif isinstance(decision, Cancel):
                        for w in decision.items:
                            _answer(w, Cancelled(""))
                        stats.record_failure("CANCELED", len(decision.items))
                    elif isinstance(decision, Reject):
                        if decision.retry_after is not None:
                            error: NurseryError = Overloaded(decision.reason,
                                                             decision.retry_after)
                        elif decision.kind is None:
                            error = reject_error(decision.reason)
                        else:
                            error = NurseryError(decision.reason, decision.kind)
                        for w in decision.items:
                            _answer(w, error)
                        stats.record_failure("REJECTED", len(decision.items))
                if grants is not None and grants.holding:
                    grants.settle(policy)
                if dropped:
                    continue  # the freed place may take the next request at once
                for i in [i for i in retired if not outstanding[i] and not policy.holds(i)]:
                    retired.discard(i)
                    del outstanding[i]
                    await workers.pop(i).aclose()  # the worker finalizes its instance and ends
                if closing and workers and policy.pending() == 0 and not any(
                        outstanding.values()):
                    for channel in workers.values():
                        await channel.aclose()  # ends the workers, which close their senders
                    workers = {}
                try:
                    if poll.wake_at is None and grants is None:
                        message = await inbox.receive()
                    else:
                        message = None
                        if poll.wake_at is not None and waker is not None:
                            waker.arm(poll.wake_at)
                        with trio.CancelScope(deadline=(math.inf if poll.wake_at is None
                                                        else poll.wake_at)) as wait:
                            if grants is not None:
                                grants.nudge = wait  # a grant that comes ends the wait
                                if grants.arrived:
                                    wait.cancel()
                            message = await inbox.receive()
                        if grants is not None:
                            grants.nudge = None
                        if message is None:
                            continue  # the policy's deadline, or a grant: poll again
                except trio.EndOfChannel:
                    return
                now = trio.current_time()
                while True:  # take everything already waiting before deciding again
                    if isinstance(message, InferWork):
                        if closing or not workers:
                            _answer(message, Unavailable(f"model '{name}' is unloading"))
                        else:
                            if iterative is not None and not message.request.sequence_id:
                                message.request.sequence_id = next(sequence_ids)
                                message.request.sequence_start = True
                            policy.arrive(message, _arrival(message, now) if stamped else now)
                    elif isinstance(message, InstanceReady) and message.instance not in outstanding:
                        # an added instance announced itself before its update came
                        early[message.instance] = early.get(message.instance, 0) + message.slots
                    elif isinstance(message, InstanceReady):
                        i = message.instance
                        done = outstanding[i]
                        was_busy = bool(done)
                        for _ in range(min(message.slots, len(done))):
                            done.popleft()
                        if message.report is not None:
                            stats.record_batch(message.report)
                        if ordering is not None:
                            for work, answer in message.held:
                                ordering.finish(work, answer)
                        if grants is not None and i in grants.keys:
                            grants.finished(i, usable(i) and policy.pending() > 0, was_busy)
                        else:
                            policy.instance_ready(i, now, message.slots)
                        if iterative is not None:
                            for corrid in message.ended:
                                iterative.end_sequence(corrid)
                            for work in message.rescheduled:
                                work.request.sequence_start = work.request.sequence_end = False
                                iterative.requeue(work, now)
                    elif isinstance(message, CancelWork):
                        if cancel is not None and cancel(message.work):
                            stats.record_failure("CANCELED")
                            _answer(message.work, Cancelled(""))
                    elif isinstance(message, StatsQuery):
                        waiting = sum(sum(q) - q[0] for q in outstanding.values() if q)
                        _answer(message,  # type: ignore[arg-type]
                                stats.snapshot(policy.pending() + waiting))
                    elif isinstance(message, CloseIntake):
                        closing = True
                    elif isinstance(message, UpdateInstances):
                        for i, worker in message.added.items():
                            workers[i] = worker
                            outstanding[i] = collections.deque()
                            policy.add_instance(i)
                            if grants is not None:
                                grants.add(i, worker)
                            if i in early and grants is not None and i in grants.keys:
                                early.pop(i)
                                grants.finished(i, usable(i) and policy.pending() > 0,
                                                False)
                            elif i in early:
                                policy.instance_ready(i, now, early.pop(i))
                        for i in message.retired:
                            if i in workers:
                                retired.add(i)
                                policy.retire_instance(i)
                                if grants is not None and i in grants.keys:
                                    grants.retire(i)
                        mailbox.answer(message.reply, tuple(
                            i for i in message.retired if i in retired and not policy.holds(i)))
                    elif isinstance(message, CacheOutcome):
                        stats.record_cache(message.hit, message.cache_ns, message.request_ns)
                    elif isinstance(message, DecoupledResponse):
                        stats.record_response(message.index, message.kind, message.ns,
                                              message.first_response_ns, message.buckets)
                    try:
                        message = inbox.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
        except BaseException as exc:
            failure = exc
            if isinstance(message, (InferWork, StatsQuery)):
                _answer(message, InternalError(f"model '{name}': the scheduler failed while "
                                               "taking this request"))
            raise
        finally:
            timer_tasks.cancel_scope.cancel()
            if grants is not None:
                grants.release_all()  # asked-for grants: the limiter gives those back itself
            if waker is not None:
                waker.close()
            if ordering is not None:
                ordering.flush()
            _answer_held(name, policy, inbox, stats, failure)
            with trio.CancelScope(shield=True):
                for channel in workers.values():
                    await channel.aclose()


def _answer_held(name: str, policy: SchedulingPolicy[InferWork],
                 inbox: trio.MemoryReceiveChannel[Any], stats: StatsAccumulator,
                 failure: BaseException | None) -> None:
    """The actor is stopping: every request it still holds, queued in the policy or waiting in
    the inbox, gets an answer (none is left waiting forever), and answers that workers sent
    back for ordered release go out as they are."""
    if failure is None or isinstance(failure, trio.Cancelled) or (
            isinstance(failure, BaseExceptionGroup)
            and failure.split(trio.Cancelled)[1] is None):
        error: NurseryError = Unavailable(f"model '{name}' is unloading")
    else:
        error = InternalError(f"model '{name}': the scheduler failed: {describe(failure)}")
    held: list[InferWork | StatsQuery] = list(policy.drain())
    while True:
        try:
            message = inbox.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            break
        if isinstance(message, (InferWork, StatsQuery)):
            held.append(message)
        elif isinstance(message, InstanceReady):
            for work, answer in message.held:
                _answer(work, answer)
    inbox.close()  # from here on a sender learns at once that nobody will take its message
    for item in held:
        _answer(item, error if isinstance(item, InferWork) else stats.snapshot(0))


def _answer(work: Any, answer: Any) -> None:
    if answer is not None:  # None: the backend answered this request itself (decoupled)
        mailbox.answer(work.reply, answer)


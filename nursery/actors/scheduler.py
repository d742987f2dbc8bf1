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
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
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
        try:
            while True:
                message = None  # the message being handled, if a failure comes
                now = trio.current_time()
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
                        live = tuple(w for w in decision.items if not w.abandoned())
                        if len(live) != len(decision.items):
                            stats.record_failure("CANCELED", len(decision.items) - len(live))
                        if not live:  # nobody waits for these: the place stays free
                            policy.instance_ready(decision.instance, now)
                            dropped = True
                            continue
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
                    if poll.wake_at is None:
                        message = await inbox.receive()
                    else:
                        message = None
                        if waker is not None:
                            waker.arm(poll.wake_at)
                        with trio.move_on_at(poll.wake_at):
                            message = await inbox.receive()
                        if message is None:
                            continue  # the policy's deadline: poll again
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
                        for _ in range(min(message.slots, len(done))):
                            done.popleft()
                        if message.report is not None:
                            stats.record_batch(message.report)
                        if ordering is not None:
                            for work, answer in message.held:
                                ordering.finish(work, answer)
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
                            if i in early:
                                policy.instance_ready(i, now, early.pop(i))
                        for i in message.retired:
                            if i in workers:
                                retired.add(i)
                                policy.retire_instance(i)
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


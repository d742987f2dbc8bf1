"""The discrete-event loop: a real policy, simulated instances, a virtual clock.

It calls the policy exactly as the scheduler actor (``nursery/actors/scheduler.py``) does:

1. each instance announces itself at time 0 with ``instance_ready(i, 0, slots)`` (the
   instance worker sends ``InstanceReady(index, slots)`` once loaded);
2. the loop polls the policy, performs its decisions (``Dispatch``: the batch goes to that
   instance; ``Reject``: its requests end rejected, "Request timeout expired" counting as
   timed out; other decisions, such as the sequence batcher's slot releases, need nothing
   here), then sleeps until the next event or the policy's ``wake_at``, whichever is first;
3. on waking it takes every event of that instant before polling again (the actor drains its
   inbox before deciding): arrivals become ``arrive(request, now)``, finished batches become
   ``instance_ready(i, now, 1)``; a ``wake_at`` with no event just polls.

An instance runs the batches it is given one after another, each for ``cost(rows)`` seconds,
where rows are the dispatched requests' batch sizes summed (or the ``rows`` a sequence
batcher's ``Dispatch`` carries, padding included); with ``slots`` above 1 the next batch waits
on the instance as it does on the instance thread. A policy may not dispatch to an instance
without a free slot: the engine stops with :class:`SimulationError`, as it does when a policy
keeps asking to be polled in the past.

The frontends have two parts. ``frontend`` is the CPU time one request costs the server's
trio thread, which every request shares (decoding before the scheduler sees it, encoding
after its batch): a single FIFO server, half of it on the way in (the policy's ``arrive``
comes when decoding ends) and half on the way out, so that requests that overlap wait for
each other as they do on the real thread. ``overhead`` is everything else outside the
instance that does not queue (network, the client): a constant per request, or a function of
the request (e.g. drawn from a measured distribution), added to the answer time. An overhead
with ``uses_idle = True`` (:class:`nursery.simulate.cost.IdleOverhead`) is also given the
request's *idle gap*: how long the server had been idle when it arrived (0 when any earlier
request was still in the server, that is, arrived and not yet answered; the client's overhead
does not count), so that a model can charge a request that wakes an idle server more than one
that finds it busy (sleeping threads, spinning thread pools gone to sleep, cold caches).
Such a model's ``split(request, idle)`` gives two shares: one spent on the frontend thread
before decoding (waking the server: requests behind it wait) and one outside the server.
``frontend_wake`` is work the frontend thread does for a request that finds it idle and none
for one that finds it busy (a busy thread shares its system calls and wake-ups between the
requests it holds): the frontend's cost per request falls as the load rises.
With ``inherit_idle`` a request that arrives while the one that woke the server is still
in it (not yet answered) is given that request's idle gap instead of 0: the server is not
awake (its caches warm, its threads spinning) until it has answered once, so two requests
that arrive close together after a quiet spell are both slow, the second behind the first.
``frontend_batch`` is the frontend thread's work per batch, whatever its size (the scheduler
handing the batch to the instance, waking on its completion, telling the scheduler the instance
is free again): half of it is spent before the batch can start on its instance, half after it
ends, and only then are its answers encoded and the instance offered to the policy again, so
that the instance's cycle includes the thread's hand-offs (and the batches grow with them).
``contention`` stretches a request's overhead by ``1 + contention * k``, ``k`` the requests
in the server when it arrived: on a machine with few cores the server's threads and the
client's compete, and overlapping requests slow each other down. Only the share outside the
server is stretched (a stretched frontend share would feed back into ``k``).

With ``timer_queues`` the policy's timer (``wake_at``) fires no earlier than the frontend
thread is free: the scheduler runs on that thread, behind the work queued before the deadline
(a single FIFO queue, as the frontend is modelled; trio interleaves the tasks' steps, so the
real delay lies between none and this).

What it leaves out: the requester abandoning a request (simulated clients always wait) and
``preserve_ordering`` (answers are not held back).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nursery.scheduling.batch_policy import TIMEOUT_EXPIRED
from nursery.scheduling.decisions import Dispatch, Reject
from nursery.simulate.arrivals import SimRequest

# at one instant: instances free, finished batches to collect, answers to encode, arrivals,
# decoded requests
_READY, _COLLECT, _RESPOND, _ARRIVE, _ENQUEUE = 0, 1, 2, 3, 4
MAX_STALLS = 10_000  # polls in a row at one instant with no progress before giving up


class SimulationError(Exception):
    """The policy broke the scheduling contract (see ``SchedulingPolicy``)."""


@dataclass(slots=True)
class Outcome:
    """How one request ended."""

    request: SimRequest
    status: str = "queued"  # completed | rejected | timed_out | queued (never answered)
    reason: str = ""
    dispatched: float = math.nan
    started: float = math.nan  # compute start on its instance
    finished: float = math.nan  # answer time, overhead included
    idle: float = 0.0  # how long the server had been idle when it arrived
    outside: float = 0.0  # an idle overhead's share spent outside the server (drawn on arrival)
    concurrent: int = 0  # requests in the server when it arrived
    instance: int = -1
    batch: int = -1  # index into SimResult.batches


@dataclass(frozen=True, slots=True)
class BatchRecord:
    instance: int
    rows: int
    requests: int
    dispatched: float
    started: float
    finished: float


@dataclass
class SimResult:
    outcomes: list[Outcome]
    batches: list[BatchRecord]
    end_time: float
    polls: int = 0
    instances: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


def simulate(
    policy: Any,
    requests: Sequence[SimRequest],
    cost: Callable[[int], float],
    *,
    instances: int = 1,
    slots: int = 1,
    overhead: float | Callable[[SimRequest], float] = 0.0,
    frontend: float = 0.0,
    frontend_wake: float = 0.0,
    frontend_batch: float = 0.0,
    contention: float = 0.0,
    inherit_idle: bool = False,
    timer_queues: bool = False,
    closed_loop: Callable[[SimRequest, float], SimRequest | None] | None = None,
) -> SimResult:
    """Run ``requests`` (by arrival time) through ``policy`` on ``instances`` instances.
    ``frontend``: seconds of the server's (single) frontend thread per request;
    ``frontend_wake``: more seconds of it for a request that finds the thread idle;
    ``frontend_batch``: seconds of it per batch, half before the batch starts, half after;
    ``contention``: a request's overhead is stretched by ``1 + contention * k`` when it
    arrives with ``k`` requests in the server; ``inherit_idle``: a request that arrives while
    the request that woke the server is still in it finds the server as idle as that one did
    (the server is not awake until it has answered once); ``timer_queues``: the policy's
    timer fires only once the frontend thread has done the work queued before it;
    ``closed_loop``: called with each answered request and the time its client has the answer,
    returns that client's next request (its arrival set) or None: a closed loop of clients
    (perf_analyzer's ``--concurrency-range``) when ``requests`` holds each client's first."""
    if instances < 1 or slots < 1:
        raise ValueError("a simulation needs at least one instance with one slot")
    uses_idle = getattr(overhead, "uses_idle", False)
    split = getattr(overhead, "split", None) if uses_idle else None
    base: Callable[[Outcome], float]
    if split is not None:  # drawn on arrival, when the idle gap is known
        base = lambda out: out.outside  # noqa: E731
    elif uses_idle:
        # a uses_idle model (never a float) is also given the idle gap; the annotation has
        # only the one-argument form
        base = lambda out: overhead(out.request, out.idle)  # type: ignore[operator, call-arg]  # noqa: E731
    else:
        draw = overhead if callable(overhead) else (lambda _request, c=float(overhead): c)
        base = lambda out: draw(out.request)  # noqa: E731

    def extra(out: Outcome) -> float:
        return base(out) * (1.0 + contention * out.concurrent)
    outcomes = {id(r): Outcome(r) for r in requests}
    batches: list[BatchRecord] = []
    events: list[tuple[float, int, int, Any]] = []
    order = 0
    for r in sorted(requests, key=lambda r: (r.arrival, r.id)):
        events.append((r.arrival, _ARRIVE, order, r))
        order += 1
    heapq.heapify(events)
    injected = itertools.count(1 << 60)  # the closed loop's arrivals, after every other tie
    free = [0] * instances  # slots the policy was told about and has not used
    busy_until = [0.0] * instances  # when each instance finishes the work it holds
    half = frontend / 2.0
    batch_half = frontend_batch / 2.0
    frontend_free = 0.0  # when the frontend thread finishes the work it holds
    pending = 0  # requests arrived whose server-side answer time is not known yet
    answered_until = 0.0  # the latest server-side answer time known
    waking: Outcome | None = None  # the request that woke the server (inherit_idle)
    woken = math.inf  # when it was answered (server side), once known

    def answer(out: Outcome, at: float) -> None:
        """``out`` leaves the server at ``at``; the client has it after its overhead."""
        nonlocal pending, answered_until, woken
        pending -= 1
        answered_until = max(answered_until, at)
        out.finished = at + extra(out)
        if out is waking:
            woken = at
        if closed_loop is not None:
            follow = closed_loop(out.request, out.finished)
            if follow is not None:
                outcomes[id(follow)] = Outcome(follow)
                heapq.heappush(events, (follow.arrival, _ARRIVE, next(injected), follow))

    def finish(i: int, members: list[Outcome], at: float, order: int) -> int:
        """Batch ``members`` of instance ``i`` is out at ``at``: the answers go to the
        frontend thread to encode (or out), the instance back to the policy."""
        for out in members:
            if half:  # the answer waits for the frontend thread to encode it
                heapq.heappush(events, (at, _RESPOND, order, out))
                order += 1
            else:
                answer(out, at)
        heapq.heappush(events, (at, _READY, order, i))
        return order + 1

    now = 0.0
    for i in range(instances):
        free[i] = slots
        policy.instance_ready(i, now, slots)
    wake_at: float | None = None
    polls = stalls = done = 0
    last_progress = (-1, -1)
    while True:
        poll = policy.poll(now)
        polls += 1
        for decision in poll.decisions:
            if isinstance(decision, Dispatch):
                i = decision.instance
                if not 0 <= i < instances or free[i] <= 0:
                    raise SimulationError(
                        f"at t={now:.6f}s the policy dispatched to instance {i}, which has no "
                        "free slot")
                if not decision.items:
                    raise SimulationError(f"at t={now:.6f}s the policy dispatched an empty batch")
                free[i] -= 1
                rows_field = getattr(decision, "rows", None)
                rows = (len(rows_field) if rows_field is not None
                        else sum(max(1, getattr(w, "batch_size", 1)) for w in decision.items))
                handed = now
                if batch_half:  # the frontend thread hands the batch over first
                    frontend_free = handed = max(now, frontend_free) + batch_half
                start = max(handed, busy_until[i])
                end = start + cost(rows)
                busy_until[i] = end
                batches.append(BatchRecord(i, rows, len(decision.items), now, start, end))
                done += len(decision.items)
                members = []
                for w in decision.items:
                    out = _outcome(outcomes, w, now)
                    out.status, out.dispatched, out.started = "completed", now, start
                    out.instance, out.batch = i, len(batches) - 1
                    members.append(out)
                if batch_half:  # the frontend thread collects it before anything else
                    heapq.heappush(events, (end, _COLLECT, order, (i, members)))
                    order += 1
                else:
                    order = finish(i, members, end, order)
            elif isinstance(decision, Reject):
                done += len(decision.items)
                for w in decision.items:
                    out = _outcome(outcomes, w, now)
                    out.status = "timed_out" if decision.reason == TIMEOUT_EXPIRED else "rejected"
                    out.reason = decision.reason
                    answer(out, now)
        wake_at = poll.wake_at
        if not events and (wake_at is None or wake_at == math.inf):
            break
        next_time = events[0][0] if events else math.inf
        if wake_at is not None and timer_queues:  # the scheduler runs once the thread is free
            wake_at = max(wake_at, frontend_free)
        if wake_at is not None and wake_at < next_time:  # the policy's timer, no message
            progress = (len(batches), done)
            stalls = stalls + 1 if progress == last_progress else 0
            last_progress = progress
            if stalls > MAX_STALLS:
                raise SimulationError(
                    f"at t={now:.6f}s the policy has asked to be polled {MAX_STALLS} times "
                    f"(last at {wake_at:.6f}s) without deciding anything")
            now = max(now, wake_at)  # a time in the past: the actor's move_on_at fires at once
            continue
        stalls = 0
        now = next_time
        while events and events[0][0] == now:  # every message of this instant, then decide
            _, kind, _, payload = heapq.heappop(events)
            inside = 0.0
            if kind == _ARRIVE:
                out = outcomes[id(payload)]
                if not pending and now >= answered_until:
                    out.idle = now - answered_until
                    waking, woken = (out if inherit_idle and out.idle > 0 else None), math.inf
                elif waking is not None and now < woken:  # still waking: as idle as it was
                    out.idle = waking.idle
                out.concurrent = pending
                pending += 1
                if split is not None:
                    inside, out.outside = split(out.request, out.idle)
            if kind == _ARRIVE and frontend_wake and frontend_free <= now:
                inside += frontend_wake  # the thread was asleep: waking it is its work too
            if kind == _ARRIVE and (half or inside):  # decoded on the frontend thread first
                frontend_free = max(now, frontend_free) + half + inside
                heapq.heappush(events, (frontend_free, _ENQUEUE, order, payload))
                order += 1
            elif kind in (_ARRIVE, _ENQUEUE):
                policy.arrive(payload, now)
            elif kind == _COLLECT:
                frontend_free = max(now, frontend_free) + batch_half
                instance, members = payload
                order = finish(instance, members, frontend_free, order)
            elif kind == _RESPOND:
                frontend_free = max(now, frontend_free) + half
                answer(payload, frontend_free)
            else:
                free[payload] += 1
                policy.instance_ready(payload, now, 1)
    end = max([now] + [o.finished for o in outcomes.values() if not math.isnan(o.finished)])
    return SimResult(list(outcomes.values()), batches, end, polls, instances)


def _outcome(outcomes: dict[int, Outcome], item: Any, now: float) -> Outcome:
    out = outcomes.get(id(item))
    if out is None:
        raise SimulationError(f"at t={now:.6f}s the policy answered a request it was never given")
    if out.status != "queued":
        raise SimulationError(f"at t={now:.6f}s the policy answered request {out.request.id} "
                              f"twice (it was already {out.status})")
    return out

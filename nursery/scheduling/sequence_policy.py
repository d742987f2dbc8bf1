"""The sequence batcher's policy: which slot a sequence takes, and which rows each batch holds.

Pure and synchronous, like the dynamic batcher's policy. Every instance owns a fixed number of
sequence slots (``direct``: ``max_batch_size``, one batch row per slot; ``oldest``:
``max_candidate_sequences``). A sequence keeps its (instance, slot) from its START until its
END request is dispatched or it stays idle for ``max_sequence_idle_microseconds``; then the
slot goes to the oldest sequence waiting in the backlog (sequences that started while every
slot was taken), or back to the free slots. Free slots are handed out lowest slot number
first, across instances, so sequences spread over instances before they share one.

Each dispatched request carries a :class:`SlotRow` (slot, START/END flags, correlation ID),
from which the instance worker builds the control tensors and finds the slot's state:

- ``direct``: a batch has one row per slot up to the highest slot with a request; slots with
  nothing queued are padding rows (READY false), so a row always maps to its slot. With both
  ``max_queue_delay_microseconds`` and ``minimum_slot_utilization`` set (Triton waits only
  then), a batch waits until its ready rows reach that fraction of ``max_batch_size`` or its
  oldest request has waited the delay;
- ``oldest``: a batch takes the head request of the candidates whose head waited longest, up
  to ``max_batch_size`` rows, growing towards the largest preferred size for at most
  ``max_queue_delay_microseconds``.

Requests share a batch only when the shapes Triton requires equal agree (``signature``: the
variable-dimension inputs that do not allow ragged batches, and shape tensors): ``direct``
takes the lowest slot's head as the reference and makes the slot of a head that differs a
padding row this time (Triton's null request); ``oldest`` stops growing the batch at the first
head that differs and sends it.

Requests of one sequence run in the order they arrived and never two at once: a sequence has
at most one request in each batch and an instance runs one batch at a time. Triton's errors:
a request that does not start a sequence and whose correlation ID is neither live nor in the
backlog is rejected (INVALID_ARG). A request's own timeout counts only while its sequence
waits in the backlog: when the earliest deadline of a backlogged sequence's requests passes,
all its requests are rejected (UNAVAILABLE, "timeout of the corresponding sequence has been
expired") and the ID is forgotten, as Triton's reaper does; a sequence holding a slot never
times out.

Cancelling a queued request (:meth:`SequencePolicy.cancel`, its client went away) cancels its
sequence, as Triton's sequence batcher does (``qa/L0_request_cancellation``): in a slot, the
request and every later one of the sequence are answered CANCELLED (the ones before it still
run, as Triton's batcher meets the cancelled request only at the head of the slot's queue),
and the slot is freed, its state dropped, as soon as nothing of the sequence is queued or
running; in the backlog, the whole sequence is cancelled. Either way the correlation ID is
forgotten: its next request must START again.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, Protocol, cast

from nursery.errors import ErrorKind
from nursery.scheduling.decisions import (
    Cancel,
    Decision,
    Dispatch,
    Poll,
    Reject,
    Release,
    W,
    rejections,
)
from nursery.scheduling.sequence_schedule import SequenceSchedule
from nursery.scheduling.start_delay import StartDelay


class SequenceItem(Protocol):
    """What the policy reads of a request (read-only: plain or frozen attributes serve)."""

    @property
    def sequence_id(self) -> Hashable: ...  # int (uint64) or str correlation ID; never 0 / ""

    @property
    def sequence_start(self) -> bool: ...

    @property
    def sequence_end(self) -> bool: ...

    @property
    def timeout_us(self) -> int: ...  # the request's own timeout (0 = none)


def self_described(item: object) -> SequenceItem:
    """The default ``describe``: the queued items are sequence items themselves."""
    return cast(SequenceItem, item)


@dataclass(frozen=True, slots=True)
class SlotRow:
    """One row of a sequence batch: which slot it feeds and the flags the controls carry."""

    slot: int
    item: int  # index into the Dispatch's items; -1 = padding (the slot is not ready)
    start: bool = False
    end: bool = False
    corrid: Hashable = 0

    @property
    def ready(self) -> bool:
        return self.item >= 0


BACKLOG_TIMEOUT = "timeout of the corresponding sequence has been expired"


def not_started_message(corrid: Hashable, model: str) -> str:
    return (f"inference request for sequence {corrid} to model '{model}' must specify the "
            "START flag on the first request of the sequence")


@dataclass(slots=True, eq=False)
class _Request(Generic[W]):
    item: W
    start: bool
    end: bool
    arrived: float


@dataclass(slots=True, eq=False)
class _Sequence(Generic[W]):
    corrid: Hashable
    queue: deque[_Request[W]] = field(default_factory=deque)
    place: tuple[int, int] | None = None  # (instance, slot) once it has one
    last: float = 0.0  # last arrival or completion: the idle clock starts here
    running: bool = False  # a request of it is in a batch that has not finished
    dispatched: bool = False  # a request of it ran: its slot may hold state
    expires: float = math.inf  # backlogged: when its requests' earliest timeout falls
    cancelled: bool = False  # a request of it was cancelled: it ends once nothing runs


class SequencePolicy(Generic[W]):
    """Slots, backlog, idle reaping and batch forming for one model version."""

    def __init__(self, schedule: SequenceSchedule, instances: int, *, model: str = "",
                 describe: Callable[[W], SequenceItem] | None = None,
                 signature: Callable[[W], Hashable] | None = None,
                 start_delay: StartDelay | None = None) -> None:
        self.schedule = schedule
        # Triton's TRITONSERVER_DELAY_SCHEDULER hook: no batch until enough requests queued
        self._start_delay = start_delay
        # requests share a batch only when these are equal (the shapes of the inputs Triton
        # requires equal: variable dims, shape tensors); None: always
        self._signature: Callable[[W], Hashable] = signature or (lambda item: None)
        self.model = model
        self.instances = instances
        self._describe: Callable[[W], SequenceItem] = describe or self_described
        self._rows = max(1, schedule.max_batch_size)
        preferred = schedule.preferred_batch_sizes or (self._rows,)
        self._preferred = frozenset(preferred)
        self._max_preferred = min(max(preferred), self._rows)
        self._delay = schedule.max_queue_delay_us / 1e6
        self._idle = schedule.idle_us / 1e6
        self._free_slots: list[tuple[int, int]] = [  # heap of (slot, instance)
            (s, i) for s in range(schedule.slots_per_instance) for i in range(instances)]
        heapq.heapify(self._free_slots)
        self._slots: dict[tuple[int, int], _Sequence[W]] = {}  # (instance, slot) -> holder
        self._by_id: dict[Hashable, _Sequence[W]] = {}  # live IDs whose END has not arrived
        self._backlog: deque[_Sequence[W]] = deque()
        self._free: dict[int, None] = {}  # instances that can take a batch, in order
        self._running: dict[int, list[_Sequence[W]]] = {}  # instance -> sequences in its batch
        self._rejected: list[tuple[W, str]] = []
        self._cancelled: list[W] = []  # the rest of cancelled sequences, to answer
        self._released: dict[int, list[int]] = {}  # instance -> slots whose state to drop
        self._retired: set[int] = set()  # leaving: their slots take no new sequence
        self._count = 0  # queued requests

    # -- events ------------------------------------------------------------------------------

    def arrive(self, item: W, now: float) -> None:
        d = self._describe(item)
        corrid = d.sequence_id
        seq = self._by_id.get(corrid)
        if seq is None:
            if not d.sequence_start:
                self._rejected.append((item, not_started_message(corrid, self.model)))
                return
            seq = _Sequence(corrid)
            if self._free_slots:
                slot, instance = heapq.heappop(self._free_slots)
                self._take(seq, (instance, slot))
            else:
                self._backlog.append(seq)
        # a START for a live ID continues in its slot (Triton: the previous sequence is ended
        # early); the START row resets the slot's state
        if d.sequence_end:
            self._by_id.pop(corrid, None)  # a later request with this ID is a new sequence
        elif corrid not in self._by_id:
            self._by_id[corrid] = seq
        seq.queue.append(_Request(item, d.sequence_start, d.sequence_end, now))
        seq.last = now
        self._count += 1
        if seq.place is None and d.timeout_us:  # Triton times out backlogged sequences only
            seq.expires = min(seq.expires, now + d.timeout_us / 1e6)

    def cancel(self, item: W) -> bool:
        """The requester of ``item`` gave up: if it is queued, it and the rest of its sequence
        are cancelled (the others come back in a :class:`Cancel` decision); False if it is not
        queued (running, done or unknown)."""
        corrid = self._describe(item).sequence_id
        for seq in (*self._slots.values(), *self._backlog):
            if seq.corrid != corrid:
                continue
            at = next((k for k, r in enumerate(seq.queue) if r.item is item), None)
            if at is None:
                continue
            if seq.place is None:  # backlogged: the whole sequence goes
                at = 0
                self._backlog.remove(seq)
            dropped = [seq.queue.pop().item for _ in range(len(seq.queue) - at)]
            self._count -= len(dropped)
            self._cancelled.extend(reversed([d for d in dropped if d is not item]))
            seq.cancelled = True
            if self._by_id.get(corrid) is seq:
                del self._by_id[corrid]
            return True
        return False

    def instance_ready(self, instance: int, now: float, slots: int = 1) -> None:
        for seq in self._running.pop(instance, ()):
            seq.running = False
            seq.last = now
        self._free[instance] = None

    def add_instance(self, instance: int) -> None:
        """A new instance's slots: the backlog's oldest sequences take them first."""
        self.instances += 1
        for slot in range(self.schedule.slots_per_instance):
            if self._backlog:
                self._take(self._backlog.popleft(), (instance, slot))
            else:
                heapq.heappush(self._free_slots, (slot, instance))

    def requeue(self, item: W, now: float) -> None:
        """Iterative sequences: the model rescheduled ``item``; it runs again in its
        sequence's slot, after what the sequence has queued (neither START nor END now)."""
        corrid = self._describe(item).sequence_id
        seq = self._by_id.get(corrid)
        if seq is None:  # its sequence is gone (cancelled, reaped): as a request without START
            self._rejected.append((item, not_started_message(corrid, self.model)))
            return
        seq.queue.append(_Request(item, False, False, now))
        seq.last = now
        self._count += 1

    def end_sequence(self, corrid: Hashable) -> None:
        """Iterative sequences: a request completed without being rescheduled, which ends
        its sequence (Triton enqueues a cancelled END for it): the slot is freed, its state
        dropped, once nothing of the sequence is queued or running."""
        seq = self._by_id.pop(corrid, None)
        if seq is not None:
            seq.cancelled = True

    def retire_instance(self, instance: int) -> None:
        """No new sequence takes a slot of ``instance``; the sequences in its slots go on
        there until they end (Triton's sequence batcher keeps a removed instance for them)."""
        self._retired.add(instance)
        self._free_slots = [(s, i) for s, i in self._free_slots if i != instance]
        heapq.heapify(self._free_slots)

    def holds(self, instance: int) -> bool:
        return any(i == instance for i, _ in self._slots)

    # -- decisions ---------------------------------------------------------------------------

    def poll(self, now: float) -> Poll[W]:
        decisions: list[Decision[W]] = []
        if self._rejected:
            decisions.extend(rejections(self._rejected, ErrorKind.INVALID_ARG))
            self._rejected = []
        if self._cancelled:
            decisions.append(Cancel(tuple(self._cancelled)))
            self._cancelled = []
        expired, wake_at = self._expire(now)
        if expired:
            decisions.append(Reject(tuple(expired), BACKLOG_TIMEOUT))
        reaped = self._reap(now)
        if reaped is not None:
            wake_at = reaped if wake_at is None else min(wake_at, reaped)
        batches: list[Dispatch[W]] = []
        if self._start_delay is not None and self._start_delay.waiting(
                sum(len(seq.queue) for seq in self._slots.values()),
                sum(len(seq.queue) for seq in self._backlog)):
            free: list[int] = []  # batches wait; the next arrival polls again
        else:
            self._start_delay = None
            free = list(self._free)
        for instance in free:
            batch, wait_until = self._form(instance, now)
            if batch is not None:
                del self._free[instance]
                batches.append(batch)
            elif wait_until is not None:
                wake_at = wait_until if wake_at is None else min(wake_at, wait_until)
        if self.schedule.iterative and batches:  # their idle clocks run while they run
            for batch in batches:
                for seq in self._running[batch.instance]:
                    if seq.place is not None:
                        deadline = seq.last + self._idle
                        wake_at = deadline if wake_at is None else min(wake_at, deadline)
        if self._released:  # before the batches: a worker drops state, then reuses the slot
            decisions.extend(Release(i, tuple(s)) for i, s in self._released.items())
            self._released = {}
        decisions.extend(batches)
        return Poll(decisions, wake_at)

    def _expire(self, now: float) -> tuple[list[W], float | None]:
        """Backlogged sequences whose earliest request timeout passed leave the backlog, every
        request of them rejected (UNAVAILABLE, Triton's reaper); the next such deadline."""
        expired: list[W] = []
        nearest = math.inf
        for seq in list(self._backlog):
            if seq.expires == math.inf:
                continue
            if now >= seq.expires:
                self._backlog.remove(seq)
                expired += [r.item for r in seq.queue]
                self._count -= len(seq.queue)
                seq.queue.clear()
                if self._by_id.get(seq.corrid) is seq:
                    del self._by_id[seq.corrid]
            else:
                nearest = min(nearest, seq.expires)
        return expired, (None if nearest == math.inf else nearest)

    def _reap(self, now: float) -> float | None:
        """Free the slots of sequences idle for too long, or cancelled and done; the nearest
        idle deadline."""
        nearest = math.inf
        iterative = self.schedule.iterative
        for place, seq in list(self._slots.items()):
            # an iterative sequence's clock runs from its last request's arrival (or
            # rescheduling), while that request runs too, as Triton's reaper counts: a model
            # that holds a request past the idle time loses its sequence, and the request,
            # rescheduled, is refused as one without START
            if seq.queue or (seq.running and not iterative):
                continue
            if seq.cancelled:
                self._vacate(place, release=seq.dispatched)  # no state if nothing ran
                continue
            deadline = seq.last + self._idle
            if now >= deadline:
                if self._by_id.get(seq.corrid) is seq:
                    del self._by_id[seq.corrid]
                self._vacate(place)
            else:
                nearest = min(nearest, deadline)
        return None if nearest == math.inf else nearest

    def _form(self, instance: int, now: float) -> tuple[Dispatch[W] | None, float | None]:
        waiting = sorted((slot, seq) for (i, slot), seq in self._slots.items()
                         if i == instance and seq.queue)
        if not waiting:
            return None, None
        oldest = min(seq.queue[0].arrived for _, seq in waiting)
        signature = self._signature
        if self.schedule.strategy == "oldest":
            # Triton's dynamic batcher over the candidates, oldest head first: the batch
            # grows until a head whose shapes differ, and then cannot grow
            waiting.sort(key=lambda pair: pair[1].queue[0].arrived)
            first = signature(waiting[0][1].queue[0].item)
            chosen = []
            for pair in waiting[: self._rows]:
                if signature(pair[1].queue[0].item) != first:
                    break
                chosen.append(pair)
            n = len(chosen)
            stopped = n < min(len(waiting), self._rows)
            expired = self._delay == 0 or now >= oldest + self._delay
            if not (expired or stopped or n in self._preferred or n >= self._max_preferred):
                return None, oldest + self._delay
        else:
            # Triton's direct batcher waits only with both a delay and a minimum slot
            # utilization, until the ready rows reach it or the oldest waited the delay
            utilization = self.schedule.min_slot_utilization
            if (self._delay > 0 and utilization > 0 and now < oldest + self._delay
                    and len(waiting) / self._rows < utilization):
                return None, oldest + self._delay
            # a head whose shapes differ from the lowest slot's waits for a later batch;
            # its slot is a padding row this time, as Triton's null request
            first = signature(waiting[0][1].queue[0].item)
            chosen = [pair for pair in waiting if signature(pair[1].queue[0].item) == first]
        items: list[W] = []
        rows: list[SlotRow] = []
        by_slot = dict(chosen)
        order = (range(waiting[-1][0] + 1) if self.schedule.strategy == "direct"
                 else [slot for slot, _ in chosen])
        ran: list[_Sequence[W]] = []
        for slot in order:
            seq = by_slot.get(slot)
            if seq is None:
                rows.append(SlotRow(slot, -1))  # padding: READY false
                continue
            request = seq.queue.popleft()
            self._count -= 1
            rows.append(SlotRow(slot, len(items), request.start, request.end, seq.corrid))
            items.append(request.item)
            seq.running = seq.dispatched = True
            ran.append(seq)
            if request.end:  # the worker drops the state after this batch
                self._vacate((instance, slot), release=False)
        self._running[instance] = ran
        return Dispatch(instance, tuple(items), tuple(rows)), None

    # -- slots -------------------------------------------------------------------------------

    def _take(self, seq: _Sequence[W], place: tuple[int, int]) -> None:
        seq.place = place
        self._slots[place] = seq

    def _vacate(self, place: tuple[int, int], release: bool = True) -> None:
        """The slot's sequence is over: its state goes, and the backlog's oldest takes it."""
        seq = self._slots.pop(place)
        seq.place = None
        instance, slot = place
        if release:
            self._released.setdefault(instance, []).append(slot)
        if instance in self._retired:
            return  # the slot leaves with its instance
        if self._backlog:
            self._take(self._backlog.popleft(), place)
        else:
            heapq.heappush(self._free_slots, (slot, instance))

    # -- introspection -----------------------------------------------------------------------

    def drain(self) -> list[W]:
        """Remove and return every request still held (queued in a slot or the backlog, or
        to be rejected); the sequences are forgotten."""
        items = [item for item, _ in self._rejected] + self._cancelled
        seqs = {id(s): s for s in (*self._slots.values(), *self._backlog, *self._by_id.values())}
        for seq in seqs.values():
            items += [r.item for r in seq.queue]
            seq.queue.clear()
        self._rejected = []
        self._cancelled = []
        self._count = 0
        return items

    def pending(self) -> int:
        return self._count + len(self._rejected) + len(self._cancelled)

    def idle_instances(self) -> int:
        return len(self._free)

    def place_of(self, corrid: Hashable) -> tuple[int, int] | None:
        """The (instance, slot) of the live sequence with this ID (None: none, or backlog)."""
        seq = self._by_id.get(corrid)
        return None if seq is None else seq.place

    def occupied(self) -> dict[tuple[int, int], Hashable]:
        return {place: seq.corrid for place, seq in self._slots.items()}

    def backlog(self) -> list[Hashable]:
        return [seq.corrid for seq in self._backlog]

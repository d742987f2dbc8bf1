"""A batcher that keeps a latency objective: learn the cost, size the batches, shed early.

Triton's dynamic batcher queues every request it can hold and lets the ones that cannot make
their deadline miss it, costing the instance time that timely requests needed (Triton issues
#7512, #7369, #8870). This policy holds a model to a latency objective instead (say 50 ms at
p99, from the moment the scheduler takes a request to the end of its batch):

- **It learns the execution time per batch size online.** Every finished batch gives a sample
  (rows, seconds from dispatch to the instance being free again: the hand-offs included); a
  straight line ``a + b * rows`` is fitted by least squares to the last ``window`` samples
  (BentoML's adaptive dispatcher fits the same line to its recent batches), and the
  residuals' ``percentile`` is added as a margin, so the prediction is of the objective's
  percentile, not the mean.
- **It sheds at arrival** a request the model predicts will miss its deadline: it predicts the
  request's finish by packing the rows queued ahead of it (its priority level and those above)
  into full batches on the instances as they come free. The packing is the best case, so a
  request is shed only when even that misses. The answer is UNAVAILABLE with a message that
  says by how much and when to retry (``Reject.retry_after``; the HTTP frontend adds
  ``Retry-After`` and, where the request asked with the parameter
  ``nursery.overload_status: 429``, answers 429 instead of 503). While it knows nothing
  (no batch finished yet), or when the request would start at once on an idle instance, it
  sheds nothing: a model that only over-predicts keeps learning.
- **A request's deadline** is its arrival plus the objective, or plus its own ``timeout``
  parameter when that is shorter.
- **It sizes each batch and its wait from the model.** Within a priority level requests go in
  arrival order. A batch grows from the first request that can still make its deadline,
  through the next ones of the same shapes, while every request in it still would (and up to
  ``max_batch_size`` rows). It waits for company only when requests are arriving faster than
  the fixed cost ``a`` a separate batch would pay, never past ``a`` (or
  ``max_queue_delay_microseconds`` when configured) for its oldest request, and never past
  the moment the batch with one more row would still make the tightest deadline in it.
- **A request that can no longer make its deadline** (the model predicts a miss even alone, on
  a free instance now) steps aside: it is dispatched only when no timely request waits, in
  arrival order. Once its deadline has passed it is shed: it is never dispatched late.

``max_queue_size`` of a level still bounds its queue ("Exceeds maximum queue size"); the
queue policies' timeouts are replaced by the deadlines. Preferred batch sizes are not used.

Select it per model in ``config.pbtxt`` (parameters are free-form in Triton, so the file stays
valid for Triton, which ignores them)::

    parameters { key: "nursery.batcher" value: { string_value: "latency_objective" } }
    parameters { key: "nursery.latency_objective_ms" value: { string_value: "50" } }
    parameters { key: "nursery.latency_objective_percentile" value: { string_value: "99" } }

or in the simulator with ``python -m nursery simulate --policy latency
--latency-objective-ms 50``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic

from nursery.errors import ErrorKind
from nursery.scheduling.batch_policy import QUEUE_FULL, BatchConfig, BatchItem, self_described
from nursery.scheduling.decisions import Decision, Dispatch, FreeInstances, Poll, Reject, W

BATCHER_KEY = "nursery.batcher"
BATCHER_NAME = "latency_objective"
OBJECTIVE_KEY = "nursery.latency_objective_ms"
PERCENTILE_KEY = "nursery.latency_objective_percentile"
WINDOW = 64  # batches the execution model remembers
SLACK = 1e-6  # seconds a wait keeps short of the last moment (float rounding at the boundary)


@dataclass(frozen=True, slots=True)
class Objective:
    """The latency a model is held to: ``latency_s`` at ``percentile``."""

    latency_s: float
    percentile: float = 99.0

    def describe(self) -> str:
        return f"{self.latency_s * 1e3:g} ms (p{self.percentile:g})"


def objective_from_parameters(parameters: Mapping[str, str]) -> Objective | None:
    """The objective a model's ``parameters`` select, None when they select no batcher of
    nursery's; ``ValueError`` with the key and what to write when they are wrong."""
    batcher = parameters.get(BATCHER_KEY)
    if batcher is None:
        for key in (OBJECTIVE_KEY, PERCENTILE_KEY):
            if key in parameters:
                raise ValueError(f"parameter '{key}' needs parameter '{BATCHER_KEY}' set to "
                                 f"'{BATCHER_NAME}'")
        return None
    if batcher.strip() != BATCHER_NAME:
        raise ValueError(f"parameter '{BATCHER_KEY}' is '{batcher}': the only batcher of "
                         f"nursery's is '{BATCHER_NAME}' (leave the key out for Triton's "
                         "schedulers)")
    text = parameters.get(OBJECTIVE_KEY)
    if text is None:
        raise ValueError(f"'{BATCHER_KEY}: {BATCHER_NAME}' needs parameter '{OBJECTIVE_KEY}', "
                         "the objective in milliseconds (e.g. \"50\")")
    try:
        latency_ms = float(text)
    except ValueError:
        raise ValueError(f"parameter '{OBJECTIVE_KEY}' is '{text}', not a number of "
                         "milliseconds") from None
    if not math.isfinite(latency_ms) or latency_ms <= 0:
        raise ValueError(f"parameter '{OBJECTIVE_KEY}' must be a positive number of "
                         f"milliseconds, got '{text}'")
    percentile = 99.0
    text = parameters.get(PERCENTILE_KEY)
    if text is not None:
        try:
            percentile = float(text)
        except ValueError:
            percentile = math.nan
        if not 0 < percentile <= 100:
            raise ValueError(f"parameter '{PERCENTILE_KEY}' must be a percentile above 0 and "
                             f"at most 100, got '{text}'")
    return Objective(latency_ms / 1e3, percentile)


class ExecutionModel:
    """Execution time per batch size, fitted online: ``a + b * rows`` by least squares over
    the last ``window`` batches, plus the residuals' ``percentile`` as a margin."""

    def __init__(self, percentile: float = 99.0, window: int = WINDOW) -> None:
        self.percentile = percentile
        self._samples: deque[tuple[int, float]] = deque(maxlen=max(2, window))
        self.intercept = 0.0  # a: seconds every batch pays
        self.slope = 0.0  # b: seconds per row
        self.margin = 0.0  # the residuals' percentile (>= 0)

    @property
    def known(self) -> bool:
        return bool(self._samples)

    def observe(self, rows: int, seconds: float) -> None:
        self._samples.append((max(1, rows), max(0.0, seconds)))
        self._fit()

    def predict(self, rows: int) -> float:
        """Seconds a batch of ``rows`` takes, at the percentile (0 while nothing is known)."""
        if not self._samples:
            return 0.0
        return self.intercept + self.slope * max(1, rows) + self.margin

    def _fit(self) -> None:
        xs = [r for r, _ in self._samples]
        ys = [s for _, s in self._samples]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0
        slope = max(0.0, slope)
        intercept = my - slope * mx
        if intercept < 0:  # a batch never costs less than nothing: a line through 0
            intercept = 0.0
            slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
        residuals = sorted(y - (intercept + slope * x) for x, y in zip(xs, ys, strict=True))
        rank = max(1, math.ceil(self.percentile / 100 * n))
        self.intercept, self.slope = intercept, slope
        self.margin = max(0.0, residuals[min(rank, n) - 1])


@dataclass(slots=True, eq=False)
class _Entry(Generic[W]):
    item: W
    rows: int
    signature: Hashable
    level: int
    arrived: float
    deadline: float
    budget: float  # seconds from arrival to deadline


@dataclass(slots=True)
class _Level(Generic[W]):
    max_queue_size: int
    queue: deque[_Entry[W]] = field(default_factory=deque)


class LatencyObjectivePolicy(FreeInstances, Generic[W]):
    """Holds a model to an :class:`Objective`; one batch at a time per instance."""

    slots = 1

    def __init__(self, config: BatchConfig, objective: Objective, *, model: str = "",
                 describe: Callable[[W], BatchItem] | None = None,
                 window: int = WINDOW) -> None:
        self.config = config
        self.objective = objective
        self.model = ExecutionModel(objective.percentile, window)
        self._name = model
        self._max_rows = max(1, config.max_batch_size)
        self._batching = config.max_batch_size > 0
        self._delay_cap = config.max_queue_delay_us / 1e6
        self._describe: Callable[[W], BatchItem] = describe or self_described
        self._levels: dict[int, _Level[W]] = {}
        self._free: dict[int, None] = {}
        self._running: dict[int, tuple[float, int]] = {}  # instance -> (dispatched, rows)
        self._shed: list[Reject[W]] = []
        self._count = 0
        self._last_arrival: float | None = None
        self._gap: float | None = None  # mean seconds between arrivals (moving average)
        self.shed_count = 0  # requests shed so far (at arrival or in the queue)

    @classmethod
    def from_config(cls, batch: BatchConfig, instances: int, *,
                    objective: Objective | None = None) -> LatencyObjectivePolicy[W]:
        if objective is None:
            raise ValueError("the latency-objective batcher needs an objective "
                             f"('{OBJECTIVE_KEY}' in config.pbtxt, or --latency-objective-ms)")
        return cls(batch, objective)

    # -- events ------------------------------------------------------------------------------

    def arrive(self, item: W, now: float) -> None:
        d = self._describe(item)
        rows = max(1, d.batch_size) if self._batching else 1
        if self._last_arrival is not None:
            gap = max(0.0, now - self._last_arrival)
            self._gap = gap if self._gap is None else 0.8 * self._gap + 0.2 * gap
        self._last_arrival = now
        level_no = self.config.level_of(d.priority)
        level = self._levels.get(level_no)
        if level is None:
            level = self._levels[level_no] = _Level(
                self.config.policy_for(level_no).max_queue_size)
            self._levels = dict(sorted(self._levels.items()))
        if level.max_queue_size and len(level.queue) >= level.max_queue_size:
            self._shed.append(Reject((item,), QUEUE_FULL))
            return
        budget = self.objective.latency_s
        if d.timeout_us > 0:
            budget = min(budget, d.timeout_us / 1e6)
        entry = _Entry(item, rows, d.signature, level_no, now, now + budget, budget)
        finish, ahead = self._predicted_finish(entry, now)
        if finish is not None and finish > entry.deadline:
            late = finish - entry.deadline
            self._shed_entry(entry, (
                f"model '{self._name}' sheds this request: with {ahead} request(s) queued "
                f"ahead it would be answered in about {(finish - now) * 1e3:.1f} ms, past its "
                f"latency objective of {self._describe_budget(budget)}; retry in "
                f"{late:.3f} s, or send less load, add model instances or raise "
                f"{OBJECTIVE_KEY}"), late)
            return
        level.queue.append(entry)
        self._count += 1

    def instance_ready(self, instance: int, now: float, slots: int = 1) -> None:
        ran = self._running.pop(instance, None)
        if ran is not None:
            self.model.observe(ran[1], now - ran[0])
        if instance not in self._retired:
            self._free[instance] = None

    def cancel(self, item: W) -> bool:
        for level in self._levels.values():
            for entry in level.queue:
                if entry.item is item:
                    level.queue.remove(entry)
                    self._count -= 1
                    return True
        return False

    # -- decisions ---------------------------------------------------------------------------

    def poll(self, now: float) -> Poll[W]:
        self._expire(now)
        decisions: list[Decision[W]] = list(self._shed)
        self._shed = []
        wake_at: float | None = None
        while self._count and self._free:
            batch, wait_until = self._form(now)
            if batch is None:
                wake_at = wait_until
                break
            instance = next(iter(self._free))
            del self._free[instance]
            self._running[instance] = (now, sum(e.rows for e in batch))
            decisions.append(Dispatch(instance, tuple([e.item for e in batch])))
        if self._count:
            nearest = min(e.deadline for e in self._entries())
            wake_at = nearest if wake_at is None else min(wake_at, nearest)
        return Poll(decisions, wake_at)

    def timely(self, entry_rows: int, deadline: float, now: float) -> bool:
        """Whether a request of ``entry_rows`` rows, started alone now, makes ``deadline``."""
        return now + self.model.predict(entry_rows) <= deadline + 1e-9

    def _form(self, now: float) -> tuple[list[_Entry[W]] | None, float | None]:
        entries = list(self._entries())
        timely = [e for e in entries if self.timely(e.rows, e.deadline, now)]
        candidates = timely or entries  # the doomed go only when no timely request waits
        signature = candidates[0].signature
        same = [e for e in candidates if e.signature == signature]
        batch = self._fill(same, now) if timely else self._front(same)
        rows = sum(e.rows for e in batch)
        if timely and len(batch) == len(same) and rows < self._max_rows and (
                len(self._free) == 1):
            tightest = min(e.deadline for e in batch)
            wait_until = self._wait_until(batch, rows, tightest, now)
            if wait_until is not None:
                return None, wait_until
        for entry in batch:
            self._levels[entry.level].queue.remove(entry)
        self._count -= len(batch)
        return batch, None

    def _front(self, entries: list[_Entry[W]]) -> list[_Entry[W]]:
        """The first entries, in order, up to ``max_batch_size`` rows."""
        batch = [entries[0]]
        rows = entries[0].rows
        for entry in entries[1:]:
            if rows + entry.rows > self._max_rows:
                break
            batch.append(entry)
            rows += entry.rows
        return batch

    def _fill(self, entries: list[_Entry[W]], now: float) -> list[_Entry[W]]:
        """The largest batch (up to ``max_batch_size`` rows) that every request in it makes
        in time, taken in arrival order from ``entries`` (each timely alone, the oldest first).

        For a size ``target`` the batch ends at ``now + predict(target)``: a request that
        would miss that steps aside (a full batch may cost the oldest its deadline but saves
        the rest: the throughput the shedding at arrival counts on); a request that would
        make it but no longer fits ends the batch, so nobody who makes it is passed over for
        a later one. When the batch comes out smaller than ``target``, the next size tried is
        the largest below it at which something changes: the rows taken, or a request that
        stepped aside making its deadline again. At ``entries[0]``'s own rows it is taken
        (it is timely alone), so a batch is always found; every request older than a member
        and left out would miss its deadline in a batch of that size."""
        target = min(self._max_rows, sum(e.rows for e in entries))
        while True:
            finish = now + self.model.predict(target)
            batch: list[_Entry[W]] = []
            rows = 0
            next_target = 0
            for entry in entries:
                if entry.deadline + 1e-9 < finish:  # late in this batch: steps aside
                    next_target = max(next_target, self._rows_within(entry.deadline, now,
                                                                     target))
                    continue
                if rows + entry.rows > target:
                    break  # makes it, does not fit: nobody later goes before it
                batch.append(entry)
                rows += entry.rows
                if rows == target:
                    return batch
            target = min(target - 1, max(rows, next_target))
            if target < entries[0].rows:  # cannot happen (see above); never loop on it
                return [entries[0]]

    def _rows_within(self, deadline: float, now: float, below: int) -> int:
        """The most rows (fewer than ``below``, at least 1) of a batch started now that ends by
        ``deadline``; 1 when even one row would not."""
        low, high = 1, below - 1
        while low < high:
            mid = (low + high + 1) // 2
            if now + self.model.predict(mid) <= deadline + 1e-9:
                low = mid
            else:
                high = mid - 1
        return low

    def _wait_until(self, batch: list[_Entry[W]], rows: int, tightest: float,
                    now: float) -> float | None:
        """When to send a batch that could grow, or None to send it now: wait only while
        requests come faster than the fixed cost a batch pays, for at most that cost."""
        if not self.model.known or self._gap is None:
            return None
        cap = self._delay_cap or self.model.intercept
        if cap <= 0 or self._gap >= cap:
            return None
        oldest = min(e.arrived for e in batch)
        until = min(oldest + cap, tightest - self.model.predict(rows + 1) - SLACK)
        return until if until > now else None

    def _expire(self, now: float) -> None:
        """Shed every queued request whose deadline has passed: it is never dispatched late."""
        for level in self._levels.values():
            if not any(e.deadline <= now for e in level.queue):
                continue
            kept: deque[_Entry[W]] = deque()
            for entry in level.queue:
                if entry.deadline <= now:
                    self._count -= 1
                    retry = self._backlog(now)
                    self._shed_entry(entry, (
                        f"model '{self._name}' sheds this request: it waited "
                        f"{(now - entry.arrived) * 1e3:.1f} ms in the queue and can no longer "
                        f"be answered within its latency objective of "
                        f"{self._describe_budget(entry.budget)}; retry in {retry:.3f} s, or "
                        f"send less load, add model instances or raise {OBJECTIVE_KEY}"), retry)
                else:
                    kept.append(entry)
            level.queue = kept

    # -- the prediction ----------------------------------------------------------------------

    def _predicted_finish(self, entry: _Entry[W], now: float) -> tuple[float | None, int]:
        """When ``entry`` would be answered in the best case, and how many requests are ahead
        of it; None while the model knows nothing or when it would start at once."""
        ahead = [e for e in self._entries() if e.level <= entry.level]
        known = set(self._free) | set(self._running)
        if not self.model.known or not known or (not ahead and self._free):
            return None, len(ahead)
        free_at = [now if i in self._free else
                   max(now, self._running[i][0] + self.model.predict(self._running[i][1]))
                   for i in sorted(known)]
        heapq.heapify(free_at)
        rows = sum(e.rows for e in ahead) + entry.rows
        finish = now
        while rows > 0:
            chunk = min(rows, self._max_rows)
            rows -= chunk
            start = heapq.heappop(free_at)
            finish = start + self.model.predict(chunk)
            heapq.heappush(free_at, finish)
        return finish, len(ahead)

    def _backlog(self, now: float) -> float:
        """Seconds until the instances are through the queued rows (best case)."""
        instances = max(1, len(self._free) + len(self._running))
        rows = sum(e.rows for e in self._entries())
        batches = math.ceil(rows / self._max_rows)
        return batches * self.model.predict(self._max_rows) / instances

    def _shed_entry(self, entry: _Entry[W], message: str, retry_after: float) -> None:
        self.shed_count += 1
        self._shed.append(Reject((entry.item,), message, ErrorKind.UNAVAILABLE,
                                 retry_after=max(0.0, retry_after)))

    def _describe_budget(self, budget: float) -> str:
        if budget < self.objective.latency_s:
            return f"{budget * 1e3:g} ms (the request's timeout)"
        return self.objective.describe()

    def _entries(self) -> Iterator[_Entry[W]]:
        for level in self._levels.values():
            yield from level.queue

    # -- introspection -----------------------------------------------------------------------

    def drain(self) -> list[W]:
        items = [item for reject in self._shed for item in reject.items]
        items += [e.item for e in self._entries()]
        for level in self._levels.values():
            level.queue.clear()
        self._shed = []
        self._count = 0
        return items

    def pending(self) -> int:
        return self._count + sum(len(r.items) for r in self._shed)

    def idle_instances(self) -> int:
        return len(self._free)

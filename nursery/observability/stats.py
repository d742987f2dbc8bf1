"""Per-version statistics: what Triton's statistics extension and metrics report.

Instance workers describe each batch they ran in a :class:`BatchReport` (sent with their
``InstanceReady``); the scheduler, which also sees rejections and cancellations, folds reports
into its :class:`StatsAccumulator` and answers ``StatsQuery`` with a frozen
:class:`StatsSnapshot`. Nobody reads another actor's counters.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# The latency families a summary can follow (Triton's ``--metrics-config
# summary_latencies=true``), each sampled per request, in microseconds.
SUMMARY_FAMILIES = ("request", "queue", "compute_input", "compute_infer", "compute_output",
                    "cache_hit", "cache_miss")
SUMMARY_MAX_AGE_S = 60.0  # prometheus-cpp's default sliding window
SUMMARY_MAX_SAMPLES = 8192  # per family and version: a bound on memory under heavy load


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """One summary family of one version: the samples of the last minute (µs), and the
    cumulative sum (µs) and count since the version loaded."""

    window: tuple[float, ...] = ()
    sum_us: float = 0.0
    count: int = 0

    def quantile(self, q: float) -> float:
        if not self.window:
            return float("nan")  # as prometheus-cpp reports a summary with no samples
        ordered = sorted(self.window)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True, slots=True)
class FirstResponseHistogram:
    """Cumulative counts per upper bound (ms, ascending; +Inf is ``count``), sum and count."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum_ms: float  # whole ms when counted here (int)
    count: int


RESPONSE_KINDS = ("compute_infer", "compute_output", "success", "fail", "empty_response",
                  "cancel")


class _Window:
    __slots__ = ("samples", "sum_us", "count")

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque(maxlen=SUMMARY_MAX_SAMPLES)
        self.sum_us = 0.0
        self.count = 0

    def add(self, now: float, us: float) -> None:
        self.samples.append((now, us))
        self.sum_us += us
        self.count += 1

    def summary(self, now: float) -> LatencySummary:
        cutoff = now - SUMMARY_MAX_AGE_S
        while self.samples and self.samples[0][0] < cutoff:
            self.samples.popleft()
        return LatencySummary(tuple([us for _, us in self.samples]), self.sum_us, self.count)


@dataclass(frozen=True, slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> Duration:
        return Duration(self.count + count, self.ns + ns)


class _Tally:
    """A mutable :class:`Duration` for the accumulator (no allocation per batch); ``add``
    returns itself, so ``x = x.add(...)`` reads the same for both."""

    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> _Tally:
        self.count += count
        self.ns += ns
        return self

    def frozen(self) -> Duration:
        return Duration(self.count, self.ns)


@dataclass(frozen=True, slots=True)
class BatchReport:
    """One model execution, as its instance worker saw it."""

    batch_size: int  # rows of the batch's requests (the inference count)
    requests: int
    succeeded: bool
    queue_ns: int  # summed over the batch's requests: accepted -> compute start
    request_ns: int  # summed over the batch's requests: accepted -> answered
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    finished_ms: int  # wall clock, ms since the epoch
    # per request, for latency summaries: when each was accepted, and when the batch started
    # and ended computing (time.monotonic_ns)
    enqueued_ns: tuple[int, ...] = ()
    started_ns: int = 0
    ended_ns: int = 0
    # rows executed, the key of the batch statistics: a direct sequence batch's padding rows
    # (Triton's null requests) count here as in Triton, not in the inference count; 0: as
    # batch_size
    rows: int = 0


@dataclass(frozen=True)
class StatsSnapshot:
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    # batch size -> (compute_input, compute_infer, compute_output)
    batch_stats: Mapping[int, tuple[Duration, Duration, Duration]] = field(
        default_factory=lambda: MappingProxyType({}))
    failures_by_reason: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    pending: int = 0  # requests queued and not executing, at the time of the snapshot
    cache_hit: Duration = Duration()
    cache_miss: Duration = Duration()
    # decoupled models: response index -> kind (success, fail, empty_response, compute_infer,
    # compute_output, cancel) -> duration; and the first-response histogram (ms)
    responses: Mapping[int, Mapping[str, Duration]] = field(
        default_factory=lambda: MappingProxyType({}))
    first_response: FirstResponseHistogram | None = None
    # family (SUMMARY_FAMILIES) -> samples, when summaries are on
    summaries: Mapping[str, LatencySummary] = field(
        default_factory=lambda: MappingProxyType({}))


class StatsAccumulator:
    """Mutable counters, owned by one scheduler actor. ``summaries``: keep the last minute of
    per-request latency samples too (``--metrics-config summary_latencies=true``).
    ``first_response``: the first-response histogram's bounds (ms) of a model that is not
    decoupled, whose one answer is its first response, counted as its batch ends (a decoupled
    model's responses are counted by :meth:`record_response`)."""

    def __init__(self, summaries: bool = False,
                 first_response: tuple[float, ...] = ()) -> None:
        self.first_response = first_response
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.success = _Tally()
        self.fail = _Tally()
        self.queue = _Tally()
        self.compute_input = _Tally()
        self.compute_infer = _Tally()
        self.compute_output = _Tally()
        self.batch: dict[int, tuple[_Tally, _Tally, _Tally]] = {}
        self.failures: dict[str, int] = {}
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self.responses: dict[int, dict[str, Duration]] = {}
        self.first_bounds: tuple[float, ...] = ()
        self.first_counts: list[int] = []
        self.first_sum_ms = 0  # whole ms
        self.first_count = 0
        self.windows: dict[str, _Window] | None = (
            {k: _Window() for k in SUMMARY_FAMILIES} if summaries else None)

    def _sample(self, report: BatchReport) -> None:
        assert self.windows is not None
        now = time.monotonic()
        w = self.windows
        started, ended = report.started_ns, report.ended_ns
        for e in report.enqueued_ns:
            w["request"].add(now, (ended - e) / 1000)
            w["queue"].add(now, (started - e) / 1000)
            w["compute_input"].add(now, report.compute_input_ns / 1000)
            w["compute_infer"].add(now, report.compute_infer_ns / 1000)
            w["compute_output"].add(now, report.compute_output_ns / 1000)

    def record_batch(self, report: BatchReport) -> None:
        self.execution_count += 1
        self.last_inference_ms = max(self.last_inference_ms, report.finished_ms)
        n = report.requests
        if not report.succeeded:
            self.fail = self.fail.add(report.request_ns, n)
            self.failures["BACKEND"] = self.failures.get("BACKEND", 0) + n
            return
        self.inference_count += report.batch_size
        if self.windows is not None and report.enqueued_ns:
            self._sample(report)
        if self.first_response:
            for enqueued in report.enqueued_ns:
                self._first((report.ended_ns - enqueued) // 1_000_000, self.first_response)
        self.success.add(report.request_ns, n)
        self.queue.add(report.queue_ns, n)
        self.compute_input.add(report.compute_input_ns * n, n)
        self.compute_infer.add(report.compute_infer_ns * n, n)
        self.compute_output.add(report.compute_output_ns * n, n)
        rows = report.rows or report.batch_size
        per_size = self.batch.get(rows)
        if per_size is None:
            per_size = self.batch[rows] = (_Tally(), _Tally(), _Tally())
        per_size[0].add(report.compute_input_ns)
        per_size[1].add(report.compute_infer_ns)
        per_size[2].add(report.compute_output_ns)

    def record_cache(self, hit: bool, cache_ns: int, request_ns: int) -> None:
        """A response-cache outcome. A hit is a successful request that never reached a worker
        (success and queue count it, the compute stages do not); a miss adds its lookup and
        insert time, the request itself is counted by its batch."""
        if self.windows is not None:
            self.windows["cache_hit" if hit else "cache_miss"].add(time.monotonic(),
                                                                   cache_ns / 1000)
        if hit:
            self.cache_hit = self.cache_hit.add(cache_ns)
            self.success = self.success.add(request_ns)
            self.queue = self.queue.add(0)
            self.last_inference_ms = max(self.last_inference_ms, time.time_ns() // 1_000_000)
            if self.windows is not None:
                now = time.monotonic()
                self.windows["request"].add(now, request_ns / 1000)
                self.windows["queue"].add(now, 0.0)
        else:
            self.cache_miss = self.cache_miss.add(cache_ns)

    def record_response(self, index: int, kind: str, ns: int, first_response_ns: int,
                        buckets: tuple[float, ...]) -> None:
        """A decoupled model's response (Triton's ``response_stats``; a success also counts as
        compute_infer, the whole interval being the model's)."""
        stats = self.responses.setdefault(index, {})
        stats[kind] = stats.get(kind, Duration()).add(ns)
        if kind == "success":
            stats["compute_infer"] = stats.get("compute_infer", Duration()).add(ns)
            stats["compute_output"] = stats.get("compute_output", Duration()).add(0)
        if index == 0:
            self._first(first_response_ns // 1_000_000, buckets)

    def record_first_response(self, ns: int, buckets: tuple[float, ...]) -> None:
        """A request's first response, ``ns`` after it was accepted (a decoupled ensemble's)."""
        if buckets:
            self._first(ns // 1_000_000, buckets)

    def _first(self, ms: int, buckets: tuple[float, ...]) -> None:
        """One first response ``ms`` after its request: whole milliseconds, as Triton
        observes them (an integer division of nanoseconds; its qa reads the sum as an int)."""
        if buckets != self.first_bounds:
            self.first_bounds = buckets
            self.first_counts = [0] * len(buckets)
        for i, bound in enumerate(buckets):
            if ms <= bound:
                self.first_counts[i] += 1
        self.first_sum_ms += ms
        self.first_count += 1

    def record_failure(self, reason: str, requests: int = 1, ns: int = 0) -> None:
        """Requests answered with an error before running: REJECTED, CANCELED, OTHER."""
        self.fail = self.fail.add(ns, requests)
        self.failures[reason] = self.failures.get(reason, 0) + requests

    def snapshot(self, pending: int = 0) -> StatsSnapshot:
        return StatsSnapshot(
            last_inference_ms=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            success=self.success.frozen(),
            fail=self.fail.frozen(),
            queue=self.queue.frozen(),
            compute_input=self.compute_input.frozen(),
            compute_infer=self.compute_infer.frozen(),
            compute_output=self.compute_output.frozen(),
            batch_stats=MappingProxyType({size: (a.frozen(), b.frozen(), c.frozen())
                                          for size, (a, b, c) in self.batch.items()}),
            failures_by_reason=MappingProxyType(dict(self.failures)),
            pending=pending,
            cache_hit=self.cache_hit,
            cache_miss=self.cache_miss,
            responses=MappingProxyType(
                {i: MappingProxyType(dict(k)) for i, k in self.responses.items()}),
            first_response=FirstResponseHistogram(
                self.first_bounds, tuple(self.first_counts), self.first_sum_ms,
                self.first_count) if self.first_count else None,
            summaries=MappingProxyType(
                {k: w.summary(time.monotonic()) for k, w in self.windows.items()}
                if self.windows is not None else {}),
        )

"""Prometheus text exposition with Triton's metric names, types, help texts and labels (pure).

The text is written here rather than by prometheus-client's registry because the client adds
a ``_total`` suffix to every counter it exposes, while Triton's counters (and the dashboards
and alerts written against them) have none. The tests parse the output with prometheus-client.
Per-model families carry ``model`` and ``version`` labels (``reason`` too for failures), in
sorted order as Triton's prometheus-cpp writes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nursery.observability.stats import StatsSnapshot
from nursery.observability.system import SystemSample
from nursery.scheduling.cache_store import CacheTotals

Entry = tuple[str, str, StatsSnapshot]

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

_MODEL_FAMILIES = (
    # name, type, help, value(snapshot)
    ("nv_inference_request_success", "counter",
     "Number of successful inference requests, all batch sizes", lambda s: s.success.count),
    ("nv_inference_count", "counter",
     "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "counter",
     "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: (s.success.ns + s.fail.ns) // 1000),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached "
     "requests)", lambda s: s.compute_output.ns // 1000),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model.",
     lambda s: s.pending),
)


_DURATION_FAMILIES = frozenset({
    "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us"})

_SUMMARY_FAMILIES = (
    # family, help, StatsSnapshot.summaries key
    ("nv_inference_request_summary_us", "Summary of inference request duration in "
     "microseconds (includes cached requests)", "request"),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds "
     "(includes cached requests)", "queue"),
    ("nv_inference_compute_input_summary_us", "Summary of compute input duration in "
     "microseconds (does not include cached requests)", "compute_input"),
    ("nv_inference_compute_infer_summary_us", "Summary of compute inference duration in "
     "microseconds (does not include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_summary_us", "Summary of inference compute output duration "
     "in microseconds (does not include cached requests)", "compute_output"),
)

DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)  # Triton's defaults


@dataclass(frozen=True)
class MetricsOptions:
    """What ``--allow-cpu-metrics``, ``--allow-gpu-metrics`` and ``--metrics-config`` chose."""

    cpu: bool = True
    gpu: bool = True
    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[float, ...] = DEFAULT_QUANTILES

    @classmethod
    def from_config(cls, pairs: Iterable[tuple[str, str]], *, cpu: bool = True,
                    gpu: bool = True) -> MetricsOptions:
        values: dict[str, object] = {"cpu": cpu, "gpu": gpu}
        for key, value in pairs:
            if key in ("counter_latencies", "summary_latencies", "histogram_latencies"):
                values[key] = value == "true"
            elif key == "summary_quantiles":
                quantiles = []
                for pair in value.split(","):
                    q, sep, _error = pair.partition(":")
                    try:
                        if sep:
                            quantiles.append(float(q))
                    except ValueError:
                        continue
                if quantiles:
                    values["summary_quantiles"] = tuple(quantiles)
        return cls(**values)  # type: ignore[arg-type]


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    """Plain decimals (perf_analyzer's scraper rejects exponents)."""
    if value != value:  # NaN
        return "NaN"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


# the units of nursery_internal_errors_total, shown at 0 until one fails
FAULT_UNITS = ("grpc", "http", "manager", "metrics", "model")


def _family(lines: list[str], name: str, kind: str, help_text: str,
            samples: Iterable[tuple[str, float]]) -> None:
    rows = list(samples)
    if not rows:
        return
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in rows:
        lines.append(f"{name}{labels} {_number(value)}")


_CACHE_MODEL_FAMILIES = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model",
     lambda s: s.cache_hit.count),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model",
     lambda s: s.cache_miss.count),
    ("nv_cache_hit_duration_per_model",
     "Total cache hit duration per model, in microseconds", lambda s: s.cache_hit.ns // 1000),
    ("nv_cache_miss_duration_per_model",
     "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda s: s.cache_miss.ns // 1000),
)

_CACHE_FAMILIES = (
    ("nv_cache_num_entries", "Number of responses stored in response cache",
     lambda t: t.entries),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", lambda t: t.lookups),
    ("nv_cache_num_hits", "Number of cache hits in response cache", lambda t: t.hits),
    ("nv_cache_num_misses", "Number of cache misses in response cache", lambda t: t.misses),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache",
     lambda t: t.evictions),
    ("nv_cache_lookup_duration",
     "Total cache lookup duration (hit and miss), in microseconds",
     lambda t: t.lookup_ns // 1000),
    ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
     lambda t: t.insert_ns // 1000),
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]", lambda t: round(t.utilization, 6)),
)


def render(entries: list[Entry], system: SystemSample, options: MetricsOptions,
           cached: frozenset[tuple[str, str]] = frozenset(),
           cache_totals: CacheTotals | None = None,
           decoupled: Mapping[tuple[str, str], tuple[float, ...]] | None = None,
           faults: Mapping[str, int] | None = None) -> str:
    """The exposition text. ``cached``: (model, version) pairs that use the response cache
    (they get the per-model cache families, and no request summary, as in Triton);
    ``cache_totals``: the cache actor's figures when a cache is configured; ``decoupled``:
    (model, version) of decoupled models -> their first-response histogram bounds (ms);
    ``faults``: the failures each kind of supervision boundary caught (nursery's own family)."""
    lines: list[str] = []
    for name, kind, help_text, value in _MODEL_FAMILIES:
        if name in _DURATION_FAMILIES and not options.counter_latencies:
            continue
        _family(lines, name, kind, help_text,
                ((_labels(model=m, version=v), value(s)) for m, v, s in entries))
        if name == "nv_inference_request_success":
            _family(lines, "nv_inference_request_failure", "counter",
                    "Number of failed inference requests, all batch sizes",
                    ((_labels(model=m, reason=r, version=v), s.failures_by_reason.get(r, 0))
                     for m, v, s in entries for r in FAILURE_REASONS))
    cached_entries = [(m, v, s) for m, v, s in entries if (m, v) in cached]
    for name, help_text, value in _CACHE_MODEL_FAMILIES:
        _family(lines, name, "counter", help_text,
                ((_labels(model=m, version=v), value(s)) for m, v, s in cached_entries))
    if options.summary_latencies:
        for family, help_text, key in _SUMMARY_FAMILIES:
            rows: list[tuple[str, float]] = []
            totals: list[str] = []
            for m, v, s in entries:
                summary = s.summaries.get(key)
                if summary is None or (key == "request" and (m, v) in cached):
                    continue
                for q in options.summary_quantiles:
                    value = summary.quantile(q)
                    rows.append((_labels(model=m, quantile=_number(q), version=v),
                                 value if value != value else round(value, 3)))
                labels = _labels(model=m, version=v)
                totals.append(f"{family}_count{labels} {summary.count}")
                totals.append(f"{family}_sum{labels} {_number(round(summary.sum_us, 3))}")
            if rows:
                _family(lines, family, "summary", help_text, rows)
                lines.extend(totals)
    if options.histogram_latencies and decoupled:
        _first_response_histogram(lines, entries, decoupled)
    if cache_totals is not None:
        for name, help_text, value in _CACHE_FAMILIES:
            _family(lines, name, "gauge", help_text, [("", value(cache_totals))])
    if faults is not None:
        counts = {unit: 0 for unit in FAULT_UNITS} | dict(faults)
        _family(lines, "nursery_internal_errors_total", "counter",
                "Unexpected failures that a supervision boundary caught, by the kind of unit "
                "they cost (a request or connection of a port, a repository command, a model "
                "version); the server kept serving",
                ((_labels(unit=u), n) for u, n in sorted(counts.items())))
    if options.cpu and system.cpu_utilization is not None:
        _family(lines, "nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]",
                [("", round(system.cpu_utilization, 6))])
    if options.cpu and system.memory_total is not None:
        _family(lines, "nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes",
                [("", system.memory_total)])
        _family(lines, "nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes",
                [("", system.memory_used or 0)])
    if options.gpu and system.gpus:
        for name, help_text, attr in (
            ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "utilization"),
            ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "memory_total"),
            ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "memory_used"),
            ("nv_gpu_power_usage", "GPU power usage in watts", "power_watts"),
            ("nv_gpu_power_limit", "GPU power management limit in watts", "power_limit_watts"),
        ):
            _family(lines, name, "gauge", help_text,
                    ((_labels(gpu_uuid=g.uuid), getattr(g, attr)) for g in system.gpus))
        _family(lines, "nv_energy_consumption", "counter",
                "GPU energy consumption in joules since the Triton Server started",
                ((_labels(gpu_uuid=g.uuid), g.energy_joules) for g in system.gpus))
    return "\n".join(lines) + "\n"


def _first_response_histogram(lines: list[str], entries: list[Entry],
                              decoupled: Mapping[tuple[str, str], tuple[float, ...]]) -> None:
    """``nv_inference_first_response_histogram_ms``: decoupled models only, as in Triton."""
    name = "nv_inference_first_response_histogram_ms"
    rows: list[str] = []
    for m, v, s in entries:
        bounds = decoupled.get((m, v))
        if bounds is None:
            continue
        h = s.first_response
        counts = dict(zip(h.bounds, h.counts, strict=True)) if h is not None else {}
        total = h.count if h is not None else 0
        for bound in bounds:
            rows.append(f"{name}_bucket{_labels(le=_number(bound), model=m, version=v)} "
                        f"{counts.get(bound, 0)}")
        rows.append(f"{name}_bucket{_labels(le='+Inf', model=m, version=v)} {total}")
        rows.append(f"{name}_sum{_labels(model=m, version=v)} "
                    f"{_number(round(h.sum_ms, 3)) if h is not None else 0}")
        rows.append(f"{name}_count{_labels(model=m, version=v)} {total}")
    if rows:
        lines.append(f"# HELP {name} Duration from request to first response in milliseconds")
        lines.append(f"# TYPE {name} histogram")
        lines.extend(rows)

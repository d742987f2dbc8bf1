"""Triton's metric families as a prometheus-client collector over statistics snapshots (pure).

:class:`TritonCollector` is a :class:`prometheus_client.registry.Collector`: each ``collect()``
turns the figures of one scrape (:class:`Scrape`: the schedulers' :class:`StatsSnapshot`, the
latest CPU/GPU sample, the cache's totals, the supervision boundaries' fault counts) into metric
families with Triton's names, types, help texts and labels. :class:`MetricsEndpoint` holds one
server's private :class:`~prometheus_client.CollectorRegistry` with that collector (no global
registry, no process or platform collectors) and renders it with
:func:`nursery.observability.exposition.generate_text`.

Triton's counters have no ``_total`` suffix, so they are built as ``Metric(name, help,
"counter")`` with samples of the family's own name rather than as ``CounterMetricFamily``
(which renames them); gauges, summaries and the histogram use their family classes. Per-model
families carry ``model`` and ``version`` labels (``reason`` too for failures); the writer sorts
label names as Triton's prometheus-cpp writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import (
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

from nursery.observability.custom_metrics import KIND_NAMES, FamilySnapshot
from nursery.observability.exposition import generate_text, number
from nursery.observability.stats import StatsSnapshot
from nursery.observability.system import SystemSample
from nursery.scheduling.cache_store import CacheTotals

Entry = tuple[str, str, StatsSnapshot]

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

_MODEL_FAMILIES: tuple[tuple[str, str, str, Callable[[StatsSnapshot], float]], ...] = (
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
    # models that use the response cache only
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in "
     "microseconds.", "cache_hit"),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in "
     "microseconds.", "cache_miss"),
)
_CACHE_SUMMARIES = frozenset({"cache_hit", "cache_miss"})

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


# the units of nursery_internal_errors_total, shown at 0 until one fails
FAULT_UNITS = ("grpc", "http", "manager", "metrics", "model", "openai")

_CACHE_MODEL_FAMILIES: tuple[tuple[str, str, Callable[[StatsSnapshot], float]], ...] = (
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

_CACHE_FAMILIES: tuple[tuple[str, str, Callable[[CacheTotals], float]], ...] = (
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


_GPU_FAMILIES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "memory_total"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "memory_used"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "power_watts"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "power_limit_watts"),
)

_MODEL_LABELS = ("model", "version")


@dataclass(frozen=True)
class Scrape:
    """What one scrape reads. ``entries``: (model, version, snapshot) of every ready version;
    ``cached``: (model, version) pairs that use the response cache (they get the per-model
    cache families, and no request summary, as in Triton); ``cache_totals``: the cache
    actor's figures when a cache is configured; ``histograms``: (model, version) -> its
    first-response histogram bounds (ms), every version's when histograms are on;
    ``faults``: the failures each kind of supervision boundary caught (nursery's own family;
    None leaves it out)."""

    entries: Sequence[Entry] = ()
    system: SystemSample = field(default_factory=SystemSample)
    cached: frozenset[tuple[str, str]] = frozenset()
    cache_totals: CacheTotals | None = None
    histograms: Mapping[tuple[str, str], tuple[float, ...]] | None = None
    faults: Mapping[str, int] | None = None
    custom: Sequence[FamilySnapshot] = ()  # the families models defined (pb_utils.MetricFamily)
    # (model, version) -> seconds its load took, for every ready version
    load_durations: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # --model-load-on-demand / --model-load-budget: model -> loads on demand, unloads
    demand_loads: Mapping[str, int] = field(default_factory=dict)
    evictions: Mapping[str, int] = field(default_factory=dict)
    # --model-namespacing: the model of an entry (its identifier, `<namespace>::<name>`) ->
    # (namespace, name); its series are labelled model=<name> and namespace=<namespace>, as
    # Triton labels a model of a namespace
    namespaces: Mapping[str, tuple[str, str]] = field(default_factory=dict)


def _custom_families(families: Sequence[FamilySnapshot]) -> Iterator[Metric]:
    """Model-defined families, with the model's own names, descriptions and labels."""
    for f in families:
        family = Metric(f.name, f.description, KIND_NAMES[f.kind])
        for labels, value in f.series:
            family.add_sample(f.name, dict(labels), value)
        for labels, bounds, cumulative, total, count in f.histograms:
            for bound, seen in zip(bounds, cumulative, strict=True):
                family.add_sample(f"{f.name}_bucket", {**dict(labels), "le": number(bound)},
                                  seen)
            family.add_sample(f"{f.name}_bucket", {**dict(labels), "le": "+Inf"}, count)
            family.add_sample(f"{f.name}_sum", dict(labels), total)
            family.add_sample(f"{f.name}_count", dict(labels), count)
        yield family


def _counter(name: str, help_text: str) -> Metric:
    """A counter family whose samples carry the family's own name: Triton's counters have no
    ``_total`` suffix, which ``CounterMetricFamily`` would add to every sample."""
    return Metric(name, help_text, "counter")


class TritonCollector:
    """A prometheus-client ``Collector``: Triton's families over :attr:`scrape`, the figures
    of the scrape being rendered. Families without a sample are left out, as Triton leaves
    out a family nothing reports into."""

    def __init__(self, options: MetricsOptions) -> None:
        self.options = options
        self.scrape = Scrape()

    def collect(self) -> Iterator[Metric]:
        scrape, options = self.scrape, self.options
        families: Iterable[Metric | None] = (
            *_model_families(scrape.entries, options),
            *_cache_model_families(scrape.entries, scrape.cached),
            *(_summary_families(scrape.entries, scrape.cached, options.summary_quantiles)
              if options.summary_latencies else ()),
            (_first_response_histogram(scrape.entries, scrape.histograms)
             if options.histogram_latencies and scrape.histograms else None),
            *_cache_families(scrape.cache_totals),
            _fault_family(scrape.faults),
            *_load_families(scrape),
            *(_cpu_families(scrape.system) if options.cpu else ()),
            *(_gpu_families(scrape.system) if options.gpu and scrape.system.gpus else ()),
            *_custom_families(scrape.custom),
        )
        for family in families:
            if family is not None and family.samples:
                if scrape.namespaces:
                    family.samples = [_namespaced(s, scrape.namespaces) for s in family.samples]
                yield family


def _namespaced(sample: Sample, namespaces: Mapping[str, tuple[str, str]]) -> Sample:
    """A sample of a model of a namespace labelled as Triton labels it: its name, and its
    namespace (labels in name order, as Triton's)."""
    found = namespaces.get(sample.labels.get("model", ""))
    if found is None:
        return sample
    labels = {**sample.labels, "model": found[1], "namespace": found[0]}
    return sample._replace(labels=dict(sorted(labels.items())))


class MetricsEndpoint:
    """One server's metrics: a private registry holding its :class:`TritonCollector`."""

    def __init__(self, options: MetricsOptions) -> None:
        self.collector = TritonCollector(options)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

    def render(self, scrape: Scrape) -> bytes:
        """The exposition of ``scrape`` (synchronous: no other scrape can slip in between
        handing the figures to the collector and the registry collecting them)."""
        self.collector.scrape = scrape
        try:
            return generate_text(self.registry)
        finally:
            self.collector.scrape = Scrape()


def render(entries: list[Entry], system: SystemSample, options: MetricsOptions,
           cached: frozenset[tuple[str, str]] = frozenset(),
           cache_totals: CacheTotals | None = None,
           histograms: Mapping[tuple[str, str], tuple[float, ...]] | None = None,
           faults: Mapping[str, int] | None = None) -> str:
    """The exposition text of one scrape through a registry of its own (see :class:`Scrape`
    for the arguments)."""
    return MetricsEndpoint(options).render(
        Scrape(entries, system, cached, cache_totals, histograms, faults)).decode()


def _model_families(entries: Sequence[Entry], options: MetricsOptions) -> Iterator[Metric]:
    for name, kind, help_text, value in _MODEL_FAMILIES:
        if name in _DURATION_FAMILIES and not options.counter_latencies:
            continue
        if kind == "gauge":
            gauge = GaugeMetricFamily(name, help_text, labels=_MODEL_LABELS)
            for m, v, s in entries:
                gauge.add_metric((m, v), value(s))
            yield gauge
            continue
        family = _counter(name, help_text)
        for m, v, s in entries:
            family.add_sample(name, {"model": m, "version": v}, value(s))
        yield family
        if name == "nv_inference_request_success":
            failure = _counter("nv_inference_request_failure",
                               "Number of failed inference requests, all batch sizes")
            for m, v, s in entries:
                for reason in FAILURE_REASONS:
                    failure.add_sample(failure.name,
                                       {"model": m, "reason": reason, "version": v},
                                       s.failures_by_reason.get(reason, 0))
            yield failure


def _cache_model_families(entries: Sequence[Entry],
                          cached: frozenset[tuple[str, str]]) -> Iterator[Metric]:
    cached_entries = [(m, v, s) for m, v, s in entries if (m, v) in cached]
    for name, help_text, value in _CACHE_MODEL_FAMILIES:
        family = _counter(name, help_text)
        for m, v, s in cached_entries:
            family.add_sample(name, {"model": m, "version": v}, value(s))
        yield family


def _summary_families(entries: Sequence[Entry], cached: frozenset[tuple[str, str]],
                      quantiles: tuple[float, ...]) -> Iterator[Metric]:
    """The latency summaries (``summary_latencies=true``): each version's quantiles over the
    last minute, then each version's count and sum."""
    bounds = [number(q) for q in quantiles]
    for name, help_text, key in _SUMMARY_FAMILIES:
        family = SummaryMetricFamily(name, help_text, labels=_MODEL_LABELS)
        totals = []
        for m, v, s in entries:
            summary = s.summaries.get(key)
            if summary is None or (key == "request" and (m, v) in cached) or (
                    key in _CACHE_SUMMARIES and (m, v) not in cached):
                continue
            for q, bound in zip(quantiles, bounds, strict=True):
                value = summary.quantile(q)
                family.add_sample(name, {"model": m, "quantile": bound, "version": v},
                                  value if value != value else round(value, 3))
            totals.append(((m, v), summary.count, round(summary.sum_us, 3)))
        for labels, count, sum_us in totals:
            family.add_metric(labels, count, sum_us)
        yield family


def _first_response_histogram(
        entries: Sequence[Entry],
        histograms: Mapping[tuple[str, str], tuple[float, ...]]) -> Metric:
    """``nv_inference_first_response_histogram_ms``: every model's, as Triton's since it
    extended the histogram to non-decoupled models (its L0_metrics expects one for a model
    that has answered nothing yet); the bounds are the model's (``histogram_options``), a
    bound the version has not counted into yet shows 0."""
    name = "nv_inference_first_response_histogram_ms"
    family = HistogramMetricFamily(
        name, "Duration from request to first response in milliseconds", labels=_MODEL_LABELS)
    for m, v, s in entries:
        bounds = histograms.get((m, v))
        if bounds is None:
            continue
        h = s.first_response
        counts = dict(zip(h.bounds, h.counts, strict=True)) if h is not None else {}
        total = h.count if h is not None else 0
        for bound in bounds:
            # `le` last, as prometheus-cpp writes it (Triton's qa greps the whole series)
            family.add_sample(f"{name}_bucket", {"model": m, "version": v, "le": number(bound)},
                              counts.get(bound, 0))
        family.add_sample(f"{name}_bucket", {"model": m, "version": v, "le": "+Inf"}, total)
        family.add_sample(f"{name}_sum", {"model": m, "version": v},
                          round(h.sum_ms, 3) if h is not None else 0)
        family.add_sample(f"{name}_count", {"model": m, "version": v}, total)
    return family


def _cache_families(totals: CacheTotals | None) -> Iterator[Metric]:
    if totals is None:
        return
    for name, help_text, value in _CACHE_FAMILIES:
        yield GaugeMetricFamily(name, help_text, value=value(totals))


def _fault_family(faults: Mapping[str, int] | None) -> Metric | None:
    if faults is None:
        return None
    name = "nursery_internal_errors_total"  # nursery's own: a conventional counter name
    family = _counter(name, "Unexpected failures that a supervision boundary caught, by the "
                      "kind of unit they cost (a request or connection of a port, a repository "
                      "command, a model version); the server kept serving")
    counts = {unit: 0 for unit in FAULT_UNITS} | dict(faults)
    for unit, n in sorted(counts.items()):
        family.add_sample(name, {"unit": unit}, n)
    return family


def _load_families(scrape: Scrape) -> Iterator[Metric]:
    """Triton's load-time gauge, and nursery's counts of loads on demand and of unloads for
    the load budget."""
    gauge = GaugeMetricFamily("nv_model_load_duration_secs", "Model load time in seconds",
                              labels=_MODEL_LABELS)
    for (model, version), secs in sorted(scrape.load_durations.items()):
        gauge.add_metric([model, version], secs)
    yield gauge
    for name, help_text, counts in (
            ("nursery_model_demand_loads", "Loads of a model caused by a request for it "
             "(--model-load-on-demand)", scrape.demand_loads),
            ("nursery_model_budget_unloads", "Unloads of a least recently used idle model "
             "to stay within --model-load-budget", scrape.evictions)):
        family = _counter(name, help_text)
        for model, count in sorted(counts.items()):
            family.add_sample(name, {"model": model}, count)
        yield family


def _cpu_families(system: SystemSample) -> Iterator[Metric]:
    if system.cpu_utilization is not None:
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]",
                                value=round(system.cpu_utilization, 6))
    if system.memory_total is not None:
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes",
                                value=system.memory_total)
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes",
                                value=system.memory_used or 0)


def _gpu_families(system: SystemSample) -> Iterator[Metric]:
    for name, help_text, attr in _GPU_FAMILIES:
        gauge = GaugeMetricFamily(name, help_text, labels=("gpu_uuid",))
        for g in system.gpus:
            gauge.add_metric((g.uuid,), getattr(g, attr))
        yield gauge
    energy = _counter("nv_energy_consumption",
                      "GPU energy consumption in joules since the Triton Server started")
    for g in system.gpus:
        energy.add_sample(energy.name, {"gpu_uuid": g.uuid}, g.energy_joules)
    yield energy

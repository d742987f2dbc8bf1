"""The metrics port's exposition, byte for byte: fixed statistics snapshots rendered under each
combination of flags are compared with golden files (``tests/unit/golden/metrics_*.txt``).

The golden files were written by the hand-written exposition (commit 0cc1f3b) before the port
moved to prometheus-client collectors, so they pin what Triton's clients and scrapers see:
names (no ``_total`` on Triton's counters), HELP and TYPE lines, label order and escaping, and
plain decimal numbers (perf_analyzer's regular expression reads no exponent).

``NURSERY_REGEN_GOLDEN=1`` rewrites the files from the current code (review the diff).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType

import pytest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, SummaryMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from nursery.observability import exposition, metrics
from nursery.observability.stats import (
    Duration,
    FirstResponseHistogram,
    LatencySummary,
    StatsSnapshot,
)
from nursery.observability.system import GpuSample, SystemSample
from nursery.scheduling.cache_store import CacheTotals

GOLDEN = Path(__file__).parent / "golden"


def _summaries(base: float, *, empty: bool = False) -> MappingProxyType[str, LatencySummary]:
    if empty:
        return MappingProxyType({k: LatencySummary() for k in
                                 ("request", "queue", "compute_input", "compute_infer",
                                  "compute_output")})
    window = tuple(base * (i + 1) + 0.1234 for i in range(10))
    return MappingProxyType({
        "request": LatencySummary(window, sum(window) + 1_234_567.891, 10),
        "queue": LatencySummary(tuple(w / 10 for w in window), 98.7654, 10),
        "compute_input": LatencySummary((1.0,), 1.0, 1),
        "compute_infer": LatencySummary(window, 2_000_000.5, 10),
        "compute_output": LatencySummary((0.0004,), 0.0004, 1),
        # a model's cache lookups (shown for models that use the cache only)
        "cache_hit": LatencySummary((2.5, 7.5), 10.0, 2),
        "cache_miss": LatencySummary((12.25,), 12.25, 1),
    })


def _snapshot(scale: int, *, summaries: MappingProxyType[str, LatencySummary] | None = None,
              first: FirstResponseHistogram | None = None) -> StatsSnapshot:
    return StatsSnapshot(
        last_inference_ms=1_700_000_000_000,
        inference_count=12 * scale,
        execution_count=5 * scale,
        success=Duration(10 * scale, 12_345_678_901 * scale),
        fail=Duration(3, 4_567_999),
        queue=Duration(10 * scale, 1_999 * scale),
        compute_input=Duration(10 * scale, 999),
        compute_infer=Duration(10 * scale, 7_000_000_001 * scale),
        compute_output=Duration(10 * scale, 1_000_500),
        failures_by_reason=MappingProxyType({"BACKEND": 1, "REJECTED": 2 * scale}),
        pending=3 * scale,
        cache_hit=Duration(4 * scale, 2_500_999),
        cache_miss=Duration(6, 9_000_001),
        first_response=first,
        summaries=summaries if summaries is not None else MappingProxyType({}),
    )


def _entries(with_summaries: bool) -> list[metrics.Entry]:
    first = FirstResponseHistogram((1.0, 2.5, 10.0), (1, 3, 7), 45.6789, 9)
    return [
        ("simple", "1", _snapshot(1, summaries=_summaries(10.0) if with_summaries else None)),
        ("simple", "2", _snapshot(1_000_000)),
        ("cached", "3", _snapshot(2, summaries=_summaries(3.5) if with_summaries else None)),
        ("stream", "1", _snapshot(3, summaries=_summaries(0.0, empty=True)
                                  if with_summaries else None, first=first)),
        ("stream_idle", "1", StatsSnapshot()),
        ('we"ird\\name\n', "7", StatsSnapshot(inference_count=1)),
    ]


SYSTEM = SystemSample(
    cpu_utilization=0.123456789, memory_total=67_345_678_912, memory_used=12_345_678_912,
    gpus=(GpuSample("GPU-aaaa-0001", 0.42, 85_899_345_920, 1_234_567_890, 71.25, 300.0,
                    12_345_678.5),
          GpuSample("GPU-bbbb-0002", 0.0, 42_949_672_960, 0, 0.5, 250.0, 0.0)))
CACHED = frozenset({("cached", "3")})
HISTOGRAMS = MappingProxyType({("stream", "1"): (1.0, 2.5, 10.0, 100.0),
                              ("stream_idle", "1"): (5.0,)})
TOTALS = CacheTotals(entries=17, bytes_used=1_234, budget=4_096, lookups=1_000_001, hits=400_000,
                     misses=600_001, evictions=3, inserts=600_001, lookup_ns=123_456_789_000,
                     insert_ns=999)
FAULTS = MappingProxyType({"http": 2, "model": 1})

CASES = {
    # everything on: every family Triton serves, and nursery's own
    "full": dict(
        entries=True, summaries=True, system=SYSTEM, cached=CACHED, totals=TOTALS,
        histograms=HISTOGRAMS, faults=FAULTS,
        options=metrics.MetricsOptions(summary_latencies=True, histogram_latencies=True,
                                       summary_quantiles=(0.5, 0.9, 0.99, 0.999))),
    # the defaults of a server without a cache, before the first CPU reading
    "defaults": dict(
        entries=True, summaries=False, system=SystemSample(), cached=frozenset(), totals=None,
        histograms=None, faults=MappingProxyType({}), options=metrics.MetricsOptions()),
    # --allow-cpu-metrics=false --allow-gpu-metrics=false --metrics-config
    # counter_latencies=false (histograms asked for, none to show)
    "flags_off": dict(
        entries=True, summaries=False, system=SYSTEM, cached=CACHED, totals=TOTALS,
        histograms=MappingProxyType({}), faults=None,
        options=metrics.MetricsOptions.from_config(
            [("counter_latencies", "false"), ("histogram_latencies", "true")],
            cpu=False, gpu=False)),
    # summaries with the default quantiles, a cache without per-model use, CPU only
    "summaries_cpu": dict(
        entries=True, summaries=True, system=SystemSample(0.5, 1_000_000, 999_999),
        cached=frozenset(), totals=CacheTotals(), histograms=None, faults=None,
        options=metrics.MetricsOptions.from_config([("summary_latencies", "true")], gpu=False)),
    # no model loaded
    "empty": dict(
        entries=False, summaries=False, system=SystemSample(), cached=frozenset(), totals=None,
        histograms=None, faults=None, options=metrics.MetricsOptions()),
}


def _render(case: dict[str, object]) -> str:
    entries = _entries(bool(case["summaries"])) if case["entries"] else []
    return metrics.render(entries, case["system"], case["options"],  # type: ignore[arg-type]
                          case["cached"], case["totals"], case["histograms"],  # type: ignore[arg-type]
                          case["faults"])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(CASES))
def test_exposition_matches_golden(name: str) -> None:
    text = _render(CASES[name])
    path = GOLDEN / f"metrics_{name}.txt"
    if os.environ.get("NURSERY_REGEN_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(text.encode())
    assert text == path.read_bytes().decode()


@pytest.mark.parametrize("name", sorted(CASES))
def test_exposition_parses_and_has_no_exponent(name: str) -> None:
    text = _render(CASES[name])
    families = list(text_string_to_metric_families(text))
    assert len({f.name for f in families}) == len(families)  # one block per family
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert "e+" not in line.rsplit(" ", 1)[1], line


def test_collector_yields_prometheus_client_families() -> None:
    collector = metrics.TritonCollector(CASES["full"]["options"])  # type: ignore[arg-type]
    collector.scrape = metrics.Scrape(_entries(True), SYSTEM, CACHED, TOTALS, HISTOGRAMS, FAULTS)
    families = {f.name: f for f in collector.collect()}
    assert isinstance(families["nv_inference_pending_request_count"], GaugeMetricFamily)
    assert isinstance(families["nv_inference_queue_summary_us"], SummaryMetricFamily)
    assert isinstance(families["nv_inference_first_response_histogram_ms"],
                      HistogramMetricFamily)
    # the cache summaries: the model that uses the cache only
    hits = families["nv_cache_hit_summary_per_model"]
    assert isinstance(hits, SummaryMetricFamily)
    assert {s.labels["model"] for s in hits.samples} == {"cached"}
    # Triton's counters keep their names: no _total, no _created samples
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_energy_consumption",
                 "nv_cache_num_hits_per_model", "nursery_internal_errors_total"):
        assert families[name].type == "counter"
        assert {s.name for s in families[name].samples} == {name}
    success = families["nv_inference_request_success"].samples[0]
    assert success.labels == {"model": "simple", "version": "1"} and success.value == 10
    assert all(f.samples for f in families.values())


def test_each_endpoint_has_a_private_registry() -> None:
    from prometheus_client import REGISTRY

    options = metrics.MetricsOptions()
    one, two = metrics.MetricsEndpoint(options), metrics.MetricsEndpoint(options)
    assert one.registry is not two.registry and one.registry is not REGISTRY
    scrape = metrics.Scrape([("m", "1", StatsSnapshot())], SystemSample(0.5, 10, 5))
    text = one.render(scrape).decode()
    # only Triton's and nursery's families: no process_* / python_* default collectors
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names and all(n.startswith(("nv_", "nursery_")) for n in names)
    assert not any(f.name.startswith("nv_") for f in REGISTRY.collect())
    # the figures are not kept past the scrape
    assert one.collector.scrape == metrics.Scrape() and two.render(metrics.Scrape()) == b"\n"


def test_numbers_are_plain_decimals() -> None:
    number = exposition.number
    assert [number(v) for v in (0, 7, 12.0, 85_899_345_920, 85_899_345_920.0, 1e20, 0.1234567,
                                2.5, 1 / 3, float("nan"), float("inf"), -float("inf"))] == [
        "0", "7", "12", "85899345920", "85899345920", "100000000000000000000", "0.123457",
        "2.5", "0.333333", "NaN", "+Inf", "-Inf"]

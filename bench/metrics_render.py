#!/usr/bin/env python3
"""What rendering the metrics port's exposition costs: the hand-written text renderer nursery
had (``nursery/observability/metrics.py`` at commit 0cc1f3b, loaded from git) against the
prometheus-client collector that replaced it (``MetricsEndpoint.render``: the server's private
registry, ``TritonCollector.collect`` and ``exposition.generate_text``).

    python bench/metrics_render.py [--models 1,20,200] [--rounds 15] [--seconds 0.2]

For each number of loaded model versions and two flag sets (``defaults``: the counters, CPU and
one GPU; ``all``: summaries of 100 samples per family, first-response histograms, a response
cache and its per-model families too) it first checks that both give the same bytes, then
times them in interleaved rounds (before, after, after, before, ...; each round renders for
about ``--seconds``) and prints the median time per scrape and the spread (min-max over the
rounds), and the ratio of the medians. The statistics are fixed snapshots: the actors' query
round trip, which the HTTP handler adds on a real scrape, is not in these figures. The metrics
port is not on the inference path; this says what a Prometheus scrape costs the server's
event loop. In-process, about a minute with the defaults.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from types import MappingProxyType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's nursery

from nursery.observability import metrics  # noqa: E402
from nursery.observability.stats import (  # noqa: E402
    SUMMARY_FAMILIES,
    Duration,
    FirstResponseHistogram,
    LatencySummary,
    StatsSnapshot,
)
from nursery.observability.system import GpuSample, SystemSample  # noqa: E402
from nursery.scheduling.cache_store import CacheTotals  # noqa: E402

BEFORE_COMMIT = "0cc1f3b"


def load_before(commit: str) -> types.ModuleType:
    """The hand-written renderer as it was at ``commit``, as a module of its own."""
    source = subprocess.run(["git", "show", f"{commit}:nursery/observability/metrics.py"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("metrics_before")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{commit}:nursery/observability/metrics.py", "exec"), module.__dict__)
    return module


def _snapshot(i: int, *, summaries: bool, decoupled: bool) -> StatsSnapshot:
    window = tuple(100.0 + (i * 37 + k * 11) % 400 + 0.25 for k in range(100))
    return StatsSnapshot(
        last_inference_ms=1_700_000_000_000 + i,
        inference_count=12_345 + i, execution_count=3_456 + i,
        success=Duration(12_000 + i, 987_654_321_000 + i), fail=Duration(3, 4_567_999),
        queue=Duration(12_000 + i, 1_999_000 + i), compute_input=Duration(12_000, 99_999),
        compute_infer=Duration(12_000, 7_000_000_001), compute_output=Duration(12_000, 1_000_500),
        failures_by_reason=MappingProxyType({"BACKEND": 1, "REJECTED": i}),
        pending=i % 5, cache_hit=Duration(400 + i, 2_500_999), cache_miss=Duration(600, 9_000_001),
        first_response=(FirstResponseHistogram((1.0, 5.0, 10.0, 50.0, 100.0),
                                               (10, 50, 90, 99, 100), 1234.5678, 100)
                        if decoupled else None),
        summaries=MappingProxyType(
            {k: LatencySummary(window, sum(window) * 10, 1_000) for k in SUMMARY_FAMILIES}
            if summaries else {}),
    )


def scrape(models: int, flags: str) -> tuple[metrics.MetricsOptions, metrics.Scrape]:
    everything = flags == "all"
    entries = [(f"model_{i:03d}", "1",
                _snapshot(i, summaries=everything, decoupled=everything and i % 4 == 0))
               for i in range(models)]
    system = SystemSample(0.4321, 67_345_678_912, 12_345_678_912,
                          (GpuSample("GPU-8f6a1b2c-0001", 0.42, 85_899_345_920, 1_234_567_890,
                                     71.25, 300.0, 12_345_678.5),))
    options = metrics.MetricsOptions(summary_latencies=everything,
                                     histogram_latencies=everything)
    return options, metrics.Scrape(
        entries, system,
        cached=frozenset((m, v) for m, v, _ in entries[::2]) if everything else frozenset(),
        cache_totals=CacheTotals(17, 1_234, 4_096, 1_000_001, 400_000, 600_001, 3, 600_001,
                                 123_456_789_000, 999) if everything else None,
        decoupled=MappingProxyType({(m, v): (1.0, 5.0, 10.0, 50.0, 100.0)
                                    for m, v, s in entries if s.first_response is not None}),
        faults=MappingProxyType({"http": 2}))


def renderers(before: types.ModuleType, options: metrics.MetricsOptions,
              data: metrics.Scrape) -> tuple[Callable[[], bytes], Callable[[], bytes]]:
    """(before, after): each renders ``data`` into the bytes the metrics port sends."""
    endpoint = metrics.MetricsEndpoint(options)  # once per server
    before_options = before.MetricsOptions(**options.__dict__)

    def before_fn() -> bytes:
        return before.render(list(data.entries), data.system, before_options,  # type: ignore[no-any-return]
                             data.cached, data.cache_totals, data.decoupled,
                             data.faults).encode()

    def after_fn() -> bytes:
        return endpoint.render(data)

    return before_fn, after_fn


def _per_call_us(fn: Callable[[], bytes], seconds: float) -> float:
    gc.collect()
    n, started = 0, time.perf_counter()
    deadline = started + seconds
    while True:
        fn()
        n += 1
        now = time.perf_counter()
        if now >= deadline:
            return (now - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="1,20,200")
    parser.add_argument("--flags", default="defaults,all")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--before", default=BEFORE_COMMIT, help="commit of the old renderer")
    args = parser.parse_args()
    before = load_before(args.before)
    print(f"python {sys.version.split()[0]}, prometheus-client {version('prometheus-client')}, "
          f"{args.rounds} interleaved rounds of ~{args.seconds} s per implementation\n")
    print("| models | flags | bytes | before µs/scrape (min-max) | after µs/scrape (min-max) "
          "| after / before |")
    print("|---:|---|---:|---:|---:|---:|")
    for flags in args.flags.split(","):
        for models in (int(m) for m in args.models.split(",")):
            options, data = scrape(models, flags)
            before_fn, after_fn = renderers(before, options, data)
            text = after_fn()
            assert text == before_fn(), f"outputs differ: {models} models, {flags}"
            times: dict[str, list[float]] = {"before": [], "after": []}
            for r in range(args.rounds):
                order = ("before", "after") if r % 2 == 0 else ("after", "before")
                for name in order:
                    fn = before_fn if name == "before" else after_fn
                    times[name].append(_per_call_us(fn, args.seconds))
            b, a = statistics.median(times["before"]), statistics.median(times["after"])
            print(f"| {models} | {flags} | {len(text):,} | {b:,.0f} ({min(times['before']):,.0f}"
                  f"-{max(times['before']):,.0f}) | {a:,.0f} ({min(times['after']):,.0f}-"
                  f"{max(times['after']):,.0f}) | {a / b:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

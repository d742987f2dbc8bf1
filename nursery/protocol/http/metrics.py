"""The metrics endpoint: ``GET /metrics`` on ``--metrics-port`` (8002), as Triton serves it.

Served by the same lean HTTP/1.1 server as the HTTP port (its own listener, in the server's
root nursery). Each scrape asks every ready model version's scheduler for a statistics
snapshot (the actors' own figures) and reads the latest CPU/GPU sample; the server's private
prometheus-client registry turns them into Prometheus' exposition format with Triton's names
(``nursery/observability/metrics.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nursery.core import Core
from nursery.observability import metrics
from nursery.observability.exposition import CONTENT_TYPE
from nursery.observability.system import SystemSampler

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


# one scrape's exposition text (the metrics port's, and the Vertex AI frontend's redirect)
MetricsText = Callable[[], Awaitable[bytes]]


def metrics_text(core: Core, sampler: SystemSampler,
                 options: metrics.MetricsOptions) -> MetricsText:
    endpoint = metrics.MetricsEndpoint(options)

    async def text() -> bytes:
        versions = await core.version_statistics()
        entries = [(key, h.version_str, snap) for key, _, h, snap in versions]
        namespaces = {key: (entry.namespace, entry.name)
                      for key, entry, _, _ in versions if entry.namespace}
        cached: set[tuple[str, str]] = set()
        histograms: dict[tuple[str, str], tuple[float, ...]] = {}
        for key, _, handle, _ in versions:
            config, v = handle.config, handle.version_str
            if core.cache is not None and config.uses_response_cache:
                cached.add((key, v))
            if options.histogram_latencies:
                histograms[(key, v)] = config.first_response_buckets
        totals = await core.cache_totals()  # None without a cache
        demand = core.demand
        return endpoint.render(metrics.Scrape(
            entries, sampler.latest, frozenset(cached), totals, histograms,
            core.faults.snapshot(), core.client.custom_metrics.snapshot(),
            core.load_durations(), dict(demand.demand_loads) if demand else {},
            dict(demand.evictions) if demand else {}, namespaces))

    return text


def build_metrics_app(core: Core, sampler: SystemSampler,
                      options: metrics.MetricsOptions) -> ASGIApp:
    text = metrics_text(core, sampler, options)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            status, body, ctype = 404, b"Not Found", b"text/plain"
        elif scope["method"] not in ("GET", "HEAD"):
            status, body, ctype = 405, b"Method Not Allowed", b"text/plain"
        else:
            body = await text()
            status, ctype = 200, CONTENT_TYPE
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": body})

    return app

"""Metrics that models define (``pb_utils.MetricFamily``), kept by the server and served on
the metrics port beside Triton's own families. One registry per server; model threads (and,
through their channel, stub processes) update it, so every operation takes its lock."""

from __future__ import annotations

import bisect
import math
import re
import threading
from dataclasses import dataclass, field

from nursery.errors import AlreadyExists, InvalidArgument, NotFound

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2  # pb_utils.MetricFamily's kinds, as Triton numbers them
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

Labels = tuple[tuple[str, str], ...]


@dataclass
class _Series:
    value: float = 0.0
    buckets: tuple[float, ...] = ()  # histogram upper bounds (ascending; +Inf implied)
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0


@dataclass
class _Family:
    description: str
    kind: int
    series: dict[Labels, _Series] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FamilySnapshot:
    name: str
    description: str
    kind: int
    # (labels, value) for counters and gauges; (labels, bounds, cumulative counts, sum, count)
    # for histograms
    series: tuple[tuple[Labels, float], ...] = ()
    histograms: tuple[tuple[Labels, tuple[float, ...], tuple[int, ...], float, int], ...] = ()


def labels_of(labels: dict[str, str] | None) -> Labels:
    return tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))


class CustomMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}

    def family(self, name: str, description: str, kind: int) -> None:
        """Register a family. The same name again with the same kind is the same family (its
        first description stays, as in Triton's Prometheus registry); with another kind it is
        refused."""
        if kind not in KIND_NAMES:
            raise InvalidArgument(f"metric family '{name}': unknown kind {kind}")
        if not _NAME.match(name):
            raise InvalidArgument(f"metric family name '{name}' is not a valid Prometheus name")
        with self._lock:
            found = self._families.get(name)
            if found is None:
                self._families[name] = _Family(description, kind)
            elif found.kind != kind:
                raise AlreadyExists(
                    f"metric family '{name}' already exists with a different kind "
                    f"({KIND_NAMES[found.kind]})")

    def metric(self, name: str, labels: Labels, buckets: tuple[float, ...] | None) -> None:
        with self._lock:
            family = self._family(name)
            if family.kind == HISTOGRAM:
                if buckets is None:
                    raise InvalidArgument(f"metric family '{name}': a histogram metric needs "
                                          "'buckets'")
                bounds = tuple(float(b) for b in buckets)
                if any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
                    raise InvalidArgument(f"metric family '{name}': bucket boundaries must be "
                                          "strictly increasing")
                series = family.series.get(labels)
                if series is None:
                    family.series[labels] = _Series(buckets=bounds,
                                                    counts=[0] * (len(bounds) + 1))
                elif series.buckets != bounds:
                    raise AlreadyExists(f"metric family '{name}': this metric exists with "
                                        "other buckets")
            else:
                if buckets is not None:
                    raise InvalidArgument(f"metric family '{name}': only histogram metrics "
                                          "take buckets")
                family.series.setdefault(labels, _Series())

    def update(self, name: str, labels: Labels, op: str, value: float = 0.0) -> float:
        """``increment``, ``set``, ``observe`` or ``value`` on one metric; the value after."""
        with self._lock:
            family = self._family(name)
            series = family.series.get(labels)
            if series is None:
                raise NotFound(f"metric family '{name}' has no metric with labels "
                               f"{dict(labels)}")
            kind = KIND_NAMES[family.kind]
            if op == "value":
                if family.kind == HISTOGRAM:
                    raise InvalidArgument("a histogram metric has no single value")
                return series.value
            if op == "increment" and family.kind in (COUNTER, GAUGE):
                if family.kind == COUNTER and (value < 0 or math.isnan(value)):
                    raise InvalidArgument("a counter metric can only increase: increment by "
                                          f"{value} refused")
                series.value += value
            elif op == "set" and family.kind == GAUGE:
                series.value = value
            elif op == "observe" and family.kind == HISTOGRAM:
                series.counts[bisect.bisect_left(series.buckets, value)] += 1
                series.total += value
                series.count += 1
            else:
                raise InvalidArgument(f"'{op}' is not supported for a {kind} metric")
            return series.value

    def _family(self, name: str) -> _Family:
        family = self._families.get(name)
        if family is None:
            raise NotFound(f"metric family '{name}' is not registered")
        return family

    def snapshot(self) -> list[FamilySnapshot]:
        out = []
        with self._lock:
            for name, family in sorted(self._families.items()):
                if family.kind == HISTOGRAM:
                    histograms = []
                    for labels, s in sorted(family.series.items()):
                        cumulative, running = [], 0
                        for c in s.counts[:-1]:
                            running += c
                            cumulative.append(running)
                        histograms.append((labels, s.buckets, tuple(cumulative), s.total,
                                           s.count))
                    out.append(FamilySnapshot(name, family.description, family.kind,
                                              histograms=tuple(histograms)))
                else:
                    out.append(FamilySnapshot(name, family.description, family.kind, tuple(
                        (labels, s.value) for labels, s in sorted(family.series.items()))))
        return out

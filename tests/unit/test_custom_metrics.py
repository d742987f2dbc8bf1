"""The registry behind pb_utils.MetricFamily: what each kind allows, and its snapshot."""

from __future__ import annotations

import pytest

from nursery.errors import AlreadyExists, InvalidArgument, NotFound
from nursery.observability.custom_metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    CustomMetrics,
    labels_of,
)

L = labels_of({"model": "m"})


def test_each_kind_allows_its_own_operations() -> None:
    m = CustomMetrics()
    m.family("c", "a counter", COUNTER)
    m.family("g", "a gauge", GAUGE)
    m.family("h", "a histogram", HISTOGRAM)
    m.metric("c", L, None)
    m.metric("g", L, None)
    m.metric("h", L, (1.0, 10.0))
    assert m.update("c", L, "increment", 2) == 2
    with pytest.raises(InvalidArgument, match="can only increase"):
        m.update("c", L, "increment", -1)
    with pytest.raises(InvalidArgument, match="'set' is not supported for a counter"):
        m.update("c", L, "set", 1)
    assert m.update("g", L, "increment", -3) == -3 and m.update("g", L, "set", 9) == 9
    with pytest.raises(InvalidArgument, match="'observe' is not supported for a gauge"):
        m.update("g", L, "observe", 1)
    for value in (0.5, 1.0, 5.0, 20.0):
        m.update("h", L, "observe", value)
    with pytest.raises(InvalidArgument, match="no single value"):
        m.update("h", L, "value")
    (c, g, h) = sorted(m.snapshot(), key=lambda f: f.name)
    assert c.series == ((L, 2.0),) and g.series == ((L, 9.0),)
    assert h.histograms == ((L, (1.0, 10.0), (2, 3), 26.5, 4),)  # <= each bound


def test_families_and_metrics_are_checked() -> None:
    m = CustomMetrics()
    m.family("c", "a counter", COUNTER)
    m.family("c", "a counter", COUNTER)  # the same again: the same family
    m.family("c", "another description", COUNTER)  # the same family; its first description
    assert m.snapshot()[0].description == "a counter"  # stays, as in Triton's registry
    with pytest.raises(AlreadyExists, match="with a different kind"):
        m.family("c", "a counter", GAUGE)
    with pytest.raises(InvalidArgument, match="not a valid Prometheus name"):
        m.family("bad name", "x", GAUGE)
    with pytest.raises(InvalidArgument, match="unknown kind"):
        m.family("k", "x", 7)
    m.family("h", "a histogram", HISTOGRAM)
    with pytest.raises(InvalidArgument, match="needs 'buckets'"):
        m.metric("h", L, None)
    for unsorted in ((2.5, 0.1, 1.0), (1.0, 1.0, 2.0)):  # Triton: strictly increasing bounds
        with pytest.raises(InvalidArgument, match="strictly increasing"):
            m.metric("h", L, unsorted)
    m.metric("h", labels_of({"no": "buckets"}), ())  # no bounds: only +Inf
    with pytest.raises(InvalidArgument, match="only histogram metrics take buckets"):
        m.metric("c", L, (1.0,))
    with pytest.raises(NotFound):
        m.update("c", labels_of({"other": "labels"}), "increment", 1)
    with pytest.raises(NotFound):
        m.update("missing", L, "increment", 1)

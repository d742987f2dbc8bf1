"""User-defined metrics of the ``tritonserver`` API (``MetricFamily``, ``Metric``): one
registry for the process, as Triton's metrics are process-wide, shown by every server this
package starts (its ``metrics()`` and the ``tritonfrontend.Metrics`` port) beside Triton's
own families."""

from __future__ import annotations

import enum

from nursery.errors import NurseryError
from nursery.observability.custom_metrics import CustomMetrics, labels_of
from tritonserver._errors import InvalidArgumentError, triton_error

REGISTRY = CustomMetrics()


class MetricKind(enum.IntEnum):
    """TRITONSERVER_MetricKind."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class MetricFamily:
    """A family of metrics: its kind, name and description (a name registered again with
    the same kind is the same family)."""

    def __init__(self, kind: MetricKind, name: str, description: str) -> None:
        try:
            REGISTRY.family(name, description, int(kind))
        except NurseryError as exc:
            raise triton_error(exc) from None
        self.kind = MetricKind(kind)
        self.name = name
        self.description = description


class Metric:
    """One metric of a family, told apart by its labels."""

    def __init__(self, family: MetricFamily, labels: dict[str, str] | None = None,
                 buckets: list[float] | None = None) -> None:
        if not isinstance(family, MetricFamily):
            raise InvalidArgumentError("family must be a tritonserver.MetricFamily")
        self.family = family
        self._labels = labels_of(labels)
        self._do("metric", tuple(buckets) if buckets is not None else None)

    def _do(self, what: str, *args: object) -> float:
        try:
            if what == "metric":
                REGISTRY.metric(self.family.name, self._labels, *args)  # type: ignore[arg-type]
                return 0.0
            return REGISTRY.update(self.family.name, self._labels, what, *args)  # type: ignore[arg-type]
        except NurseryError as exc:
            raise triton_error(exc) from None

    @property
    def kind(self) -> MetricKind:
        return self.family.kind

    @property
    def value(self) -> float:
        return self._do("value")

    def increment(self, value: float) -> None:
        self._do("increment", float(value))

    def set_value(self, value: float) -> None:
        self._do("set", float(value))

    def observe(self, value: float) -> None:
        self._do("observe", float(value))

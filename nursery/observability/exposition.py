"""Prometheus' text format (version 0.0.4) of a prometheus-client registry, in Triton's dialect.

prometheus-client's own ``generate_latest`` cannot write what Triton's scrapers read:

* for every family of type ``counter`` it writes ``<name>_total`` on the HELP and TYPE lines,
  while Triton's counters (``nv_inference_request_success``, ``nv_inference_count``, ...) and
  the dashboards and alerts written against them have no such suffix;
* it writes every value as a Python float, switching to an exponent from 10^6 on
  (``8.589934592e+10`` bytes of GPU memory): perf_analyzer's ``--collect-metrics`` reads
  ``nv_gpu_*`` values with a regular expression of digits and one dot, and would take that
  for 8.

So this writer walks the same ``registry.collect()`` families (any
:class:`prometheus_client.registry.Collector`'s) and writes each as it is: the family's name on
HELP and TYPE, each sample's own name, label names sorted (``le`` and ``quantile`` last, as
prometheus-cpp writes them), and
numbers as plain decimals: integers without a fraction, others with at most six decimals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from prometheus_client.metrics_core import Metric

CONTENT_TYPE = b"text/plain; charset=utf-8; version=0.0.4"

_TYPES = {"unknown": "untyped"}  # OpenMetrics' name for it -> the text format's


class _Registry(Protocol):
    def collect(self) -> Iterable[Metric]: ...


def generate_text(registry: _Registry) -> bytes:
    """Every family the registry's collectors yield, in their order, as exposition text."""
    lines: list[str] = []
    written: dict[tuple[tuple[str, str], ...], str] = {}  # label sets recur in every family
    for family in registry.collect():
        lines.append(f"# HELP {family.name} {_escape_help(family.documentation)}")
        lines.append(f"# TYPE {family.name} {_TYPES.get(family.type, family.type)}")
        for sample in family.samples:
            key = tuple(sample.labels.items())
            labels = written.get(key)
            if labels is None:
                labels = written[key] = _labels(key)
            lines.append(f"{sample.name}{labels} {number(sample.value)}")
    return ("\n".join(lines) + "\n").encode()


_LAST = {"le": 1, "quantile": 1}  # a bucket's or quantile's own label: after the series'


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    """Label names sorted, a histogram bucket's ``le`` and a summary's ``quantile`` last, as
    prometheus-cpp writes them (Triton's qa greps whole series: L0_metrics)."""
    if not labels:
        return ""
    ordered = sorted(labels, key=lambda kv: (_LAST.get(kv[0], 0), kv[0]))
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in ordered) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(value: float) -> str:
    """A sample value or a ``le``/``quantile`` bound as plain decimals (no exponent)."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer():
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")

"""Figures of a simulated run, and writing them as JSON, CSV and an optional PNG plot.

Latency is a request's time from arrival to answer (the engine's per-request ``overhead``
included); queue time is arrival to the start of its batch's compute (Triton's queue
duration). Percentiles are nearest-rank: p-th percentile = the ceil(p/100 * n)-th smallest.
Throughput counts completed requests per second from the first arrival to the last answer.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nursery.simulate.engine import SimResult

PERCENTILES = (50, 90, 95, 99)


def percentile(sorted_values: Sequence[float], p: float) -> float:
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _dist_ms(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    out = {f"p{p}": percentile(values, p) * 1e3 for p in PERCENTILES}
    out["max"] = values[-1] * 1e3 if values else math.nan
    out["mean"] = sum(values) / len(values) * 1e3 if values else math.nan
    return out


def summarize(result: SimResult, *, objective_s: float | None = None,
              **labels: Any) -> dict[str, Any]:
    """The run's figures; with ``objective_s`` also ``goodput``: requests answered within it
    per second (over the same span as the throughput)."""
    outcomes = result.outcomes
    status = Counter(o.status for o in outcomes)
    done = [o for o in outcomes if o.status == "completed"]
    first = min((o.request.arrival for o in outcomes), default=0.0)
    last = max((o.finished for o in done), default=first)
    span = last - first
    busy = sum(b.finished - b.started for b in result.batches)
    instances = result.instances
    histogram = Counter(b.rows for b in result.batches)
    return {
        **labels,
        "requests": len(outcomes),
        "completed": status["completed"],
        "rejected": status["rejected"],
        "timed_out": status["timed_out"],
        "unanswered": status["queued"],
        "duration_s": span,
        "throughput": len(done) / span if span > 0 else math.nan,
        "latency_ms": _dist_ms([o.finished - o.request.arrival for o in done]),
        "queue_ms": _dist_ms([o.started - o.request.arrival for o in done]),
        "compute_ms": _dist_ms([result.batches[o.batch].finished - o.started for o in done]),
        "batches": len(result.batches),
        "mean_batch_rows": (sum(b.rows for b in result.batches) / len(result.batches)
                            if result.batches else math.nan),
        "batch_size_histogram": {str(k): histogram[k] for k in sorted(histogram)},
        "utilization": busy / (instances * span) if span > 0 and instances else math.nan,
        **({} if objective_s is None else {
            "objective_ms": objective_s * 1e3,
            "goodput": (sum(1 for o in done if o.finished - o.request.arrival <= objective_s)
                        / span if span > 0 else math.nan)}),
    }


def flatten(summary: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: nested figures as ``latency_ms_p99``; the histogram as ``rows:count;...``."""
    row: dict[str, Any] = {}
    for key, value in summary.items():
        if key == "batch_size_histogram":
            row[key] = ";".join(f"{k}:{v}" for k, v in value.items())
        elif isinstance(value, dict):
            row.update({f"{key}_{k}": v for k, v in value.items()})
        else:
            row[key] = value
    return row


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, summaries: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    path.write_text(json.dumps(_clean({**meta, "runs": summaries}), indent=2) + "\n")


def write_csv(path: Path, summaries: list[dict[str, Any]]) -> None:
    rows = [flatten(s) for s in summaries]
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)


def format_table(summaries: list[dict[str, Any]]) -> str:
    width = max([len(str(s.get("policy", ""))) for s in summaries] + [8]) + 2
    good = any("goodput" in s for s in summaries)
    head = (f"{'policy':<{width}}{'rate':>9}{'thru/s':>10}{'p50 ms':>10}{'p90 ms':>10}"
            f"{'p99 ms':>10}{'max ms':>10}{'queue ms':>10}{'batch':>7}{'rej':>7}{'t/o':>7}"
            + (f"{'good/s':>10}" if good else ""))
    lines = [head]
    for s in summaries:
        lat = s["latency_ms"]
        rate = s.get("rate")
        lines.append(
            f"{str(s.get('policy', '')):<{width}}"
            f"{(f'{rate:.0f}' if isinstance(rate, (int, float)) else '-'):>9}"
            f"{s['throughput']:>10.1f}{lat['p50']:>10.3f}{lat['p90']:>10.3f}{lat['p99']:>10.3f}"
            f"{lat['max']:>10.3f}{s['queue_ms']['p50']:>10.3f}{s['mean_batch_rows']:>7.2f}"
            f"{s['rejected']:>7}{s['timed_out']:>7}"
            + (f"{s.get('goodput', math.nan):>10.1f}" if good else ""))
    return "\n".join(lines)


def plot(path: Path, summaries: list[dict[str, Any]]) -> str | None:
    """Latency (p50 and p99) against throughput, one line per policy. Returns why not, or
    None once written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ("matplotlib is not installed, so no plot was drawn (pip install matplotlib; "
                "the JSON and CSV files hold the same figures)")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in dict.fromkeys(s.get("policy", "") for s in summaries):
        runs = sorted((s for s in summaries if s.get("policy", "") == policy),
                      key=lambda s: s["throughput"])
        x = [s["throughput"] for s in runs]
        for p, style in (("p50", "-o"), ("p99", "--s")):
            ax.plot(x, [s["latency_ms"][p] for s in runs], style, label=f"{policy} {p}")
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None

"""Statistics snapshots in the statistics extension's shapes (HTTP JSON and gRPC), pure."""

from __future__ import annotations

from typing import Any

from nursery.observability.stats import RESPONSE_KINDS, Duration, StatsSnapshot
from nursery.schema import inference as pb

_ZERO = Duration()

Entry = tuple[str, str, StatsSnapshot]  # model, version, snapshot

def _d(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def to_json(entries: list[Entry]) -> dict[str, Any]:
    stats = []
    for name, version, s in entries:
        stats.append({
            "name": name,
            "version": version,
            "last_inference": s.last_inference_ms,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "inference_stats": {
                "success": _d(s.success), "fail": _d(s.fail), "queue": _d(s.queue),
                "compute_input": _d(s.compute_input), "compute_infer": _d(s.compute_infer),
                "compute_output": _d(s.compute_output), "cache_hit": _d(s.cache_hit),
                "cache_miss": _d(s.cache_miss),
            },
            "response_stats": {
                str(i): {k: _d(kinds.get(k, _ZERO)) for k in RESPONSE_KINDS}
                for i, kinds in sorted(s.responses.items())
            },
            "batch_stats": [
                {"batch_size": size, "compute_input": _d(a), "compute_infer": _d(b),
                 "compute_output": _d(c)}
                for size, (a, b, c) in sorted(s.batch_stats.items())
            ],
            "memory_usage": [],
        })
    return {"model_stats": stats}


def _p(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def to_proto(entries: list[Entry]) -> pb.ModelStatisticsResponse:
    stats = []
    for name, version, s in entries:
        stats.append(pb.ModelStatistics(
            name=name, version=version, last_inference=s.last_inference_ms,
            inference_count=s.inference_count, execution_count=s.execution_count,
            inference_stats=pb.InferStatistics(
                success=_p(s.success), fail=_p(s.fail), queue=_p(s.queue),
                compute_input=_p(s.compute_input), compute_infer=_p(s.compute_infer),
                compute_output=_p(s.compute_output), cache_hit=_p(s.cache_hit),
                cache_miss=_p(s.cache_miss)),
            response_stats={
                str(i): pb.InferResponseStatistics(**{k: _p(kinds.get(k, _ZERO))
                                                      for k in RESPONSE_KINDS})
                for i, kinds in sorted(s.responses.items())
            },
            batch_stats=[pb.InferBatchStatistics(batch_size=size, compute_input=_p(a),
                                                 compute_infer=_p(b), compute_output=_p(c))
                         for size, (a, b, c) in sorted(s.batch_stats.items())],
        ))
    return pb.ModelStatisticsResponse(model_stats=stats)

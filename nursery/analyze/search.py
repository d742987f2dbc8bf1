"""Every candidate on the virtual clock, at every load, ranked against the goal.

A load is what perf_analyzer would send: ``concurrency`` C (a closed loop of C clients, each
sending its next request when it has the answer), ``rate`` R (Poisson arrivals) or a recorded
``trace`` (the server's ``--arrival-log``). A prediction is the simulator's figures for one
candidate at one load, with the calibration's cost table, frontend work and outside overhead.

The goal is a latency budget at a percentile (``--latency-budget-ms`` on p99 or p50) or, with
none, the most throughput. A candidate meets a budget when, at every load, its latency at the
percentile is within it and it sheds at most ``max_shed`` of the requests (the
latency-objective batcher sheds by design; the dynamic batcher never). Among those that meet
it, the best answers the most requests within the budget per second (goodput), summed over
the loads (scores within 1% of the best count as equal); then the fewest instances; then the
lowest latency. With no budget, throughput
takes goodput's place. When none meets the budget, the closest is the one whose worst load is
least over it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nursery.analyze.space import Candidate
from nursery.config.model import ModelConfig
from nursery.scheduling.latency_objective import Objective
from nursery.simulate import arrivals, cost, policies, report
from nursery.simulate.arrivals import SimRequest
from nursery.simulate.engine import simulate


@dataclass(frozen=True)
class Load:
    kind: str  # concurrency | rate | trace
    value: float = math.nan  # clients or requests/s (nan for a trace)

    def label(self) -> str:
        if self.kind == "concurrency":
            return f"concurrency {self.value:g}"
        if self.kind == "rate":
            return f"{self.value:g}/s"
        return "trace"


@dataclass(frozen=True)
class Goal:
    budget_s: float | None  # None: the most throughput
    percentile: float = 99.0
    max_shed: float = 0.01  # fraction of requests a candidate may shed and still meet it

    def describe(self) -> str:
        if self.budget_s is None:
            return "the most throughput"
        return f"p{self.percentile:g} latency within {self.budget_s * 1e3:g} ms"

    def objective(self) -> Objective | None:
        return None if self.budget_s is None else Objective(self.budget_s, self.percentile)


@dataclass(frozen=True)
class Calibration:
    """What profiling measured: the model's cost per batch size and the server around it."""

    cost: cost.CostTable
    frontend_s: float = 0.0  # the server's frontend thread, per request
    frontend_batch_s: float = 0.0  # and per batch
    overhead: str = "0"  # outside the server, per request: percentiles (cost.parse_overhead)

    def to_json(self) -> dict[str, Any]:
        return {"cost_s": self.cost.to_json(), "frontend_s": self.frontend_s,
                "frontend_batch_s": self.frontend_batch_s, "overhead": self.overhead}


@dataclass
class Prediction:
    load: Load
    throughput: float
    goodput: float
    p50_ms: float
    p99_ms: float
    at_percentile_ms: float
    shed: float  # fraction of the requests shed or timed out
    mean_batch: float


@dataclass
class Scored:
    candidate: Candidate
    predictions: list[Prediction]
    meets: bool = False
    score: float = 0.0
    over: float = math.inf  # worst load's latency / budget (1 or less: within)
    measured: list[dict[str, Any]] = field(default_factory=list)

    def worst_ms(self) -> float:
        return max(p.at_percentile_ms for p in self.predictions)


def requests_for(load: Load, count: int, seed: int,
                 trace: list[SimRequest] | None) -> list[SimRequest]:
    if load.kind == "rate":
        return arrivals.poisson(load.value, count=count, seed=seed)
    if load.kind == "trace":
        if not trace:
            raise ValueError("a trace load needs the recorded arrivals")
        return [SimRequest(r.id, r.arrival, r.batch_size, r.priority, r.timeout_us)
                for r in trace]
    return [SimRequest(i, i * 1e-6) for i in range(int(load.value))]


def _closed_loop(clients: int, count: int) -> Callable[[SimRequest, float], SimRequest | None]:
    made = [clients]

    def follow(request: SimRequest, answered: float) -> SimRequest | None:
        if made[0] >= count:
            return None
        made[0] += 1
        return SimRequest(made[0] - 1, answered)
    return follow


def predict(candidate: Candidate, model: ModelConfig, calibration: Calibration, load: Load,
            goal: Goal, *, count: int = 1500, seed: int = 0,
            trace: list[SimRequest] | None = None) -> Prediction:
    batch = candidate.batch_config(model)
    policy, slots = policies.build(candidate.policy, batch, candidate.instances,
                                   objective=goal.objective())
    requests = requests_for(load, count, seed, trace)
    result = simulate(
        policy, requests, calibration.cost, instances=candidate.instances, slots=slots,
        overhead=cost.parse_overhead(calibration.overhead, seed),
        frontend=calibration.frontend_s, frontend_batch=calibration.frontend_batch_s,
        closed_loop=(_closed_loop(int(load.value), count) if load.kind == "concurrency"
                     else None))
    budget = goal.budget_s if goal.budget_s is not None else math.inf
    s = report.summarize(result, objective_s=budget)
    latencies = sorted(o.finished - o.request.arrival for o in result.outcomes
                       if o.status == "completed")
    total = max(1, s["requests"])
    return Prediction(
        load=load, throughput=s["throughput"], goodput=s["goodput"],
        p50_ms=s["latency_ms"]["p50"], p99_ms=s["latency_ms"]["p99"],
        at_percentile_ms=(report.percentile(latencies, goal.percentile) * 1e3 if latencies
                          else math.inf),
        shed=(s["rejected"] + s["timed_out"]) / total, mean_batch=s["mean_batch_rows"])


def score(candidate: Candidate, predictions: list[Prediction], goal: Goal) -> Scored:
    scored = Scored(candidate, predictions)
    if goal.budget_s is None:
        scored.meets = all(p.shed <= goal.max_shed for p in predictions)
        scored.score = sum(p.throughput for p in predictions)
        scored.over = 0.0 if scored.meets else 1.0 + max(p.shed for p in predictions)
        return scored
    worst = 0.0
    for p in predictions:
        ratio = p.at_percentile_ms / (goal.budget_s * 1e3)
        if p.shed > goal.max_shed:
            ratio = max(ratio, 1.0 + p.shed)
        worst = max(worst, ratio)
    scored.over = worst
    scored.meets = worst <= 1.0
    scored.score = sum(p.goodput for p in predictions)
    return scored


TIE = 0.01  # scores within 1% of the best are equal: simulated noise, not a difference


def rank(scored: list[Scored]) -> list[Scored]:
    """Best first: those meeting the goal, the ones within 1% of the best score by fewer
    instances and then lower latency, the others by score; then the rest, closest first."""
    top = max((s.score for s in scored if s.meets), default=0.0)

    def key(s: Scored) -> tuple[Any, ...]:
        if s.meets and s.score >= (1 - TIE) * top:
            return (0, s.candidate.instances, s.worst_ms(), -s.score, s.candidate)
        if s.meets:
            return (1, -s.score, s.candidate.instances, s.worst_ms(), s.candidate)
        return (2, s.over, -s.score, s.candidate.instances, s.candidate)
    return sorted(scored, key=key)


def search(candidates: list[Candidate], model: ModelConfig, calibration: Calibration,
           loads: list[Load], goal: Goal, *, count: int = 1500, seed: int = 0,
           trace: list[SimRequest] | None = None) -> list[Scored]:
    out = []
    for candidate in candidates:
        predictions = [predict(candidate, model, calibration, load, goal, count=count,
                               seed=seed, trace=trace) for load in loads]
        out.append(score(candidate, predictions, goal))
    return rank(out)

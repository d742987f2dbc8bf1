"""``python -m nursery simulate``: compare scheduling policies on simulated traffic."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.errors import NurseryError
from nursery.scheduling.batch_policy import BatchConfig
from nursery.scheduling.latency_objective import Objective
from nursery.simulate import arrivals, cost, policies, report
from nursery.simulate.engine import SimulationError, simulate

EXAMPLES = """examples:
  # Triton's dynamic batcher against FIFO on the mlp model, cost measured from the real model
  python -m nursery simulate --model mlp --profile --policy fifo --policy dynamic \\
      --max-queue-delay-us 500 --rate 200,400,800 --duration 5 --json out.json --csv out.csv
  # a cost table, a recorded trace, a policy of your own
  python -m nursery simulate --max-batch-size 8 --cost 1:1ms,8:3ms \\
      --arrivals trace --trace arrivals.jsonl --policy mypkg.mymodule:MyPolicy
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nursery simulate", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the server's scheduling policies on a virtual clock: simulated "
        "arrivals, a cost model of the backend, the model's config.pbtxt scheduling settings. "
        "Deterministic for a seed. See docs/research.md.")
    g = p.add_argument_group("model")
    g.add_argument("--model-repository", default="model_repository", metavar="DIR",
                   help="repository holding --model (default ./model_repository)")
    g.add_argument("--model", metavar="NAME", help="read the scheduling settings "
                   "(dynamic_batching, max_batch_size, instance count) from this model's "
                   "config.pbtxt, with the server's config loader")
    g.add_argument("--instances", type=int, metavar="N",
                   help="model instances (default: the model's instance_group count, else 1)")
    g.add_argument("--max-batch-size", type=int, metavar="N", help="override max_batch_size")
    g.add_argument("--preferred-batch-sizes", metavar="A,B", help="override "
                   "dynamic_batching.preferred_batch_size ('' for none)")
    g.add_argument("--max-queue-delay-us", type=int, metavar="US",
                   help="override dynamic_batching.max_queue_delay_microseconds")
    g.add_argument("--default-timeout-us", type=int, metavar="US", help="override "
                   "default_queue_policy.default_timeout_microseconds (REJECT on expiry)")
    g.add_argument("--allow-timeout-override", action="store_true",
                   help="set default_queue_policy.allow_timeout_override")
    g = p.add_argument_group("policy")
    g.add_argument("--policy", action="append", metavar="NAME",
                   help="server (default), fifo, dynamic, adaptive, edf, latency, sequence, or "
                   "an import path "
                   "package.module:Name; repeat to compare policies on the same arrivals")
    g.add_argument("--latency-objective-ms", type=float, metavar="MS",
                   help="the objective of --policy latency (default: the model's "
                   "nursery.latency_objective_ms); the table then adds goodput: answers "
                   "within it per second")
    g.add_argument("--latency-percentile", type=float, default=None, metavar="P",
                   help="the percentile of that objective (default: the model's, else 99)")
    g = p.add_argument_group("arrivals")
    g.add_argument("--arrivals", choices=["poisson", "constant", "burst", "sequences", "trace"],
                   default="poisson", help="arrival process (default poisson)")
    g.add_argument("--rate", default="100", metavar="R[,R...]",
                   help="requests per second; several (comma-separated) make a sweep")
    g.add_argument("--duration", type=float, metavar="S",
                   help="seconds of arrivals (default 10 unless --count)")
    g.add_argument("--count", type=int, metavar="N", help="number of requests instead")
    g.add_argument("--burst-size", type=int, default=8, metavar="N",
                   help="requests per burst (--arrivals burst; the burst period is "
                   "burst-size / rate)")
    g.add_argument("--sequence-length", type=int, default=4, metavar="N",
                   help="requests per sequence (--arrivals sequences; START first, END last)")
    g.add_argument("--sequence-gap", default="10ms", metavar="TIME",
                   help="mean time between a sequence's requests (--arrivals sequences)")
    g.add_argument("--trace", metavar="FILE", help="recorded arrivals (--arrivals trace): "
                   "the server's --arrival-log file, or CSV with the same fields")
    g.add_argument("--trace-model", metavar="NAME",
                   help="replay only this model's arrivals from the trace")
    g.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="rows per generated request (default 1)")
    g.add_argument("--priority", type=int, default=0, help="priority of generated requests")
    g.add_argument("--timeout-us", type=int, default=0,
                   help="timeout parameter of generated requests (0 = none)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g = p.add_argument_group("cost model")
    g.add_argument("--cost", metavar="TABLE", help="batch rows -> execution time, e.g. "
                   "1:0.4ms,8:1.1ms,64:6ms (interpolated), a constant such as 2ms, or a JSON "
                   "file written by --save-cost")
    g.add_argument("--profile", action="store_true", help="measure the cost of --model "
                   "through its real backend, in this process, before simulating")
    g.add_argument("--profile-sizes", metavar="A,B", help="batch sizes to profile "
                   "(default 1,2,4,... up to max_batch_size)")
    g.add_argument("--profile-runs", type=int, default=20, metavar="N",
                   help="timed runs per size (median; default 20)")
    g.add_argument("--save-cost", metavar="FILE", help="write the cost table as JSON")
    g.add_argument("--overhead", default="0", metavar="TIME",
                   help="per-request time outside the instance (frontend, network, client), "
                   "added to every latency: a constant such as 0.3ms, or percentiles such as "
                   "50:1.6ms,90:1.9ms,99:2.5ms sampled per request, or an idle model "
                   "'warm=PERCENTILES;cold=PERCENTILES;tau=TIME': a request that finds the "
                   "server idle for g seconds draws from cold with probability "
                   "1 - exp(-g/tau), else from warm; ';parts=N' splits the server into N "
                   "sleepers, ';wake=frontend|tail' spends the waking (and the warm tail) on "
                   "the frontend thread, where requests behind it wait (default 0)")
    g.add_argument("--frontend", default="0", metavar="TIME",
                   help="CPU time one request costs the server's frontend thread (decode and "
                   "encode), shared by all requests: a single queue, so overlapping requests "
                   "wait for each other, e.g. 0.6ms; with an idle overhead's wake=tail, less "
                   "the warm tail's mean, which that model charges the thread itself "
                   "(IdleOverhead.warm_frontend_mean; bench/sim_fidelity.py prints it lowered) "
                   "(default 0)")
    g.add_argument("--frontend-wake", default="0", metavar="TIME",
                   help="more frontend work for a request that finds the frontend thread "
                   "idle (a busy thread shares wake-ups and system calls; default 0)")
    g.add_argument("--frontend-batch", default="0", metavar="TIME",
                   help="frontend work per batch, whatever its size: half hands the batch to "
                   "its instance, half collects it after, before its answers are encoded and "
                   "the instance is offered again (default 0)")
    g.add_argument("--timer-queues", action="store_true",
                   help="the policy's timer fires only once the frontend thread has done the "
                   "work queued before it (the scheduler runs on that thread)")
    g.add_argument("--contention", type=float, default=0.0, metavar="C",
                   help="stretch a request's overhead outside the server by 1 + C*k, k the "
                   "requests in the server when it arrived (cores shared with the client; "
                   "default 0)")
    g.add_argument("--inherit-idle", action="store_true",
                   help="with an idle overhead: a request that arrives while the one that woke "
                   "the server is still in it is as cold as that one (the server is awake only "
                   "once it has answered)")
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    g.add_argument("--csv", metavar="FILE", help="write one CSV row per run")
    g.add_argument("--plot", metavar="FILE.png",
                   help="latency-throughput plot over the rates (needs matplotlib)")
    g.add_argument("--quiet", action="store_true", help="print no table")
    return p


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _batch_config(args: argparse.Namespace, model: Any) -> BatchConfig:
    if model is not None and model.batching is not None:
        batch = model.batching
    else:
        max_batch = model.max_batch_size if model is not None else (args.max_batch_size or 0)
        batch = BatchConfig(max_batch_size=max_batch)  # dynamic_batching {}: Triton's defaults
    changes: dict[str, Any] = {}
    if args.max_batch_size is not None:
        changes["max_batch_size"] = args.max_batch_size
    if args.preferred_batch_sizes is not None:
        changes["preferred_batch_sizes"] = _ints(args.preferred_batch_sizes)
    if args.max_queue_delay_us is not None:
        changes["max_queue_delay_us"] = args.max_queue_delay_us
    if args.default_timeout_us is not None or args.allow_timeout_override:
        changes["default_queue_policy"] = dataclasses.replace(
            batch.default_queue_policy,
            default_timeout_us=(args.default_timeout_us if args.default_timeout_us is not None
                                else batch.default_queue_policy.default_timeout_us),
            allow_timeout_override=(args.allow_timeout_override
                                    or batch.default_queue_policy.allow_timeout_override))
    batch = dataclasses.replace(batch, **changes)
    max_batch = max(1, batch.max_batch_size)
    bad = [s for s in batch.preferred_batch_sizes if not 1 <= s <= max_batch]
    if bad:
        raise ValueError(f"preferred batch sizes {bad} must be between 1 and the max batch "
                         f"size {max_batch}")
    return batch


def _requests(args: argparse.Namespace, rate: float) -> list[arrivals.SimRequest]:
    shape = arrivals.RequestShape(args.batch_size, args.priority, args.timeout_us,
                                  args.model or "")
    amount: dict[str, Any] = ({"count": args.count} if args.count is not None
                              else {"duration": args.duration or 10.0})
    if args.arrivals == "poisson":
        return arrivals.poisson(rate, seed=args.seed, shape=shape, **amount)
    if args.arrivals == "constant":
        return arrivals.constant(rate, shape=shape, **amount)
    if args.arrivals == "burst":
        return arrivals.bursts(args.burst_size, args.burst_size / rate, seed=args.seed,
                               shape=shape, **amount)
    if args.arrivals == "sequences":
        return arrivals.sequences(rate, length=args.sequence_length,
                                  gap=cost.parse_duration(args.sequence_gap), seed=args.seed,
                                  shape=shape, **amount)
    if not args.trace:
        raise ValueError("--arrivals trace needs --trace FILE")
    return arrivals.read_trace(args.trace, model=args.trace_model)


def run(args: argparse.Namespace) -> int:
    model = None
    if args.model:
        model, _ = read_model_config(Path(args.model_repository) / args.model, args.model,
                                     backends=get_factory)
    elif args.max_batch_size is None:
        raise ValueError("give --model NAME (its config.pbtxt) or --max-batch-size N")
    batch = _batch_config(args, model)
    instances = args.instances or (len(model.placements()) if model is not None else 1)
    if instances < 1:
        raise ValueError("--instances must be at least 1")
    if args.profile:
        if not args.model:
            raise ValueError("--profile measures a model of the repository: give --model NAME")
        sizes = _ints(args.profile_sizes) if args.profile_sizes else None
        table = cost.profile(Path(args.model_repository) / args.model, args.model, sizes=sizes,
                             runs=args.profile_runs, seed=args.seed)
        print("profiled cost (rows: ms): " + ", ".join(
            f"{r}: {s * 1e3:.3f}" for r, s in table.points), file=sys.stderr)
    elif args.cost:
        table = cost.CostTable.parse(args.cost)
    else:
        raise ValueError("give a cost model: --cost TABLE or --profile")
    if args.save_cost:
        Path(args.save_cost).write_text(json.dumps({"cost": table.to_json()}, indent=2) + "\n")
    cost.parse_overhead(args.overhead)  # checked before any run
    if args.contention < 0 or min(cost.parse_duration(args.frontend_wake),
                                  cost.parse_duration(args.frontend_batch)) < 0:
        raise ValueError("--contention, --frontend-wake and --frontend-batch must not be "
                         "negative")
    rates = [float(r) for r in str(args.rate).split(",") if r.strip()]
    if args.arrivals == "trace":
        rates = [float("nan")]
    elif not rates or any(r <= 0 for r in rates):
        raise ValueError("--rate must be one or more positive numbers")
    specs = args.policy or ["server"]
    objective = _objective(args, model)
    summaries = []
    for rate in rates:
        requests = _requests(args, rate)
        for spec in specs:
            policy, slots = policies.build(spec, batch, instances, model=model,
                                           objective=objective)
            overhead = cost.parse_overhead(args.overhead, args.seed)  # same draws every run
            result = simulate(policy, requests, table, instances=instances, slots=slots,
                              overhead=overhead, frontend=cost.parse_duration(args.frontend),
                              frontend_wake=cost.parse_duration(args.frontend_wake),
                              frontend_batch=cost.parse_duration(args.frontend_batch),
                              contention=args.contention, inherit_idle=args.inherit_idle,
                              timer_queues=args.timer_queues)
            summaries.append(report.summarize(
                result, policy=spec, arrivals=args.arrivals,
                rate=None if rate != rate else rate, seed=args.seed, instances=instances,
                objective_s=objective.latency_s if objective is not None else None))
    meta = {"model": args.model, "batch_config": _jsonable(dataclasses.asdict(batch)),
            "cost_s": table.to_json(), "overhead": args.overhead, "frontend": args.frontend,
            "frontend_wake": args.frontend_wake, "frontend_batch": args.frontend_batch,
            "contention": args.contention,
            "inherit_idle": args.inherit_idle, "timer_queues": args.timer_queues}
    if not args.quiet:
        print(report.format_table(summaries))
    if args.json:
        report.write_json(Path(args.json), summaries, meta)
    if args.csv:
        report.write_csv(Path(args.csv), summaries)
    if args.plot:
        why_not = report.plot(Path(args.plot), summaries)
        if why_not:
            print(f"note: {why_not}", file=sys.stderr)
    return 0


def _objective(args: argparse.Namespace, model: Any) -> Objective | None:
    """The latency objective of this run: the flags', else the model's config, else none."""
    base = getattr(model, "objective", None)
    percentile = args.latency_percentile
    if percentile is not None and not 0 < percentile <= 100:
        raise ValueError("--latency-percentile must be above 0 and at most 100")
    if args.latency_objective_ms is not None:
        if not args.latency_objective_ms > 0:
            raise ValueError("--latency-objective-ms must be a positive number of milliseconds")
        return Objective(args.latency_objective_ms / 1e3,
                         percentile or (base.percentile if base else 99.0))
    if base is not None and percentile is not None:
        return Objective(base.latency_s, percentile)
    return base  # type: ignore[no-any-return]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (ValueError, OSError, NurseryError, SimulationError) as exc:
        print(f"error: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 1

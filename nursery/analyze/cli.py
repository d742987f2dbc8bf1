"""``python -m nursery analyze``: profile, search on the simulator, verify, recommend."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nursery.analyze import profiler, report, search, space
from nursery.analyze.profiler import ProfileError
from nursery.analyze.search import Calibration, Goal, Load, Scored
from nursery.backends.base import get_factory
from nursery.config.model import ModelConfig, read_model_config
from nursery.errors import NurseryError
from nursery.simulate import arrivals, cost
from nursery.simulate.arrivals import SimRequest
from nursery.simulate.engine import SimulationError

EXAMPLES = """examples:
  # the best configuration of the MLP for p99 within 20 ms at 200, 800 and 1600 requests/s
  python -m nursery analyze --model mlp --request-rate 200,800,1600 --latency-budget-ms 20

  # the most throughput at concurrency 1, 4 and 16, a smaller grid, one verification
  python -m nursery analyze --model add_sub --concurrency 1,4,16 --instances 1,2 --verify 1

  # production traffic recorded by the server (serve --arrival-log arrivals.jsonl)
  python -m nursery analyze --model mlp --arrival-log arrivals.jsonl --latency-budget-ms 10
"""


class UsageError(Exception):
    """Bad input: the message says what to change; nothing was written."""


def _numbers(text: str, kind: type, what: str) -> list[Any]:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what}: '{text}' is not a comma-separated list of numbers") from None
    if not values:
        raise UsageError(f"{what}: give at least one value")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nursery analyze", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Find a model's best scheduling configuration: profile it once on a "
        "server of its own, search hundreds of configurations on the simulator, verify the "
        "best few with perf_analyzer, and write the winner beside config.pbtxt "
        "(config.pbtxt.recommended) with a report. See docs/analyze.md.")
    p.add_argument("--model-repository", default="model_repository", metavar="DIR")
    p.add_argument("--model", required=True, metavar="NAME")
    one = p.add_argument_group("load (one of)").add_mutually_exclusive_group(required=True)
    one.add_argument("--concurrency", metavar="C[,C...]", help="closed-loop clients, as "
                   "perf_analyzer --concurrency-range")
    one.add_argument("--request-rate", metavar="R[,R...]", help="Poisson arrivals per second, "
                   "as perf_analyzer --request-rate-range --request-distribution poisson")
    one.add_argument("--arrival-log", metavar="FILE", help="arrivals recorded by "
                   "`python -m nursery serve --arrival-log FILE` (JSON lines or CSV)")
    g = p.add_argument_group("goal")
    g.add_argument("--latency-budget-ms", type=float, metavar="MS",
                   help="the latency every load must stay within at --percentile (default: "
                   "none, the most throughput)")
    g.add_argument("--percentile", type=float, default=99.0, choices=[50.0, 90.0, 95.0, 99.0],
                   help="the budget's percentile (default 99)")
    g.add_argument("--max-shed", type=float, default=0.01, metavar="FRACTION",
                   help="share of requests a configuration may shed and still meet the "
                   "budget (the latency-objective batcher sheds by design; default 0.01)")
    g = p.add_argument_group("search space")
    g.add_argument("--instances", default="1,2", metavar="N[,N...]")
    g.add_argument("--max-batch-sizes", metavar="N[,N...]",
                   help="default: powers of two up to the model's max_batch_size")
    g.add_argument("--delays-us", default="0,100,500,1000,2000,5000", metavar="US[,US...]",
                   help="dynamic batcher max_queue_delay_microseconds values")
    g.add_argument("--policies", default="fifo,dynamic,latency", metavar="P[,P...]",
                   help="schedulers to try: fifo, dynamic, latency (latency needs a budget)")
    g.add_argument("--sim-requests", type=int, default=1500, metavar="N",
                   help="simulated requests per candidate and load (default 1500)")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("profiling and verification")
    g.add_argument("--perf-analyzer", metavar="PATH", help="perf_analyzer (default: "
                   "$NURSERY_PERF_ANALYZER, .tools/perf_analyzer/perf_analyzer, PATH)")
    g.add_argument("--profile-sizes", metavar="N[,N...]",
                   help="batch sizes to profile (default 1, 2, 4, ... up to max_batch_size, "
                   "at most six)")
    g.add_argument("--profile-runs", type=int, default=10, metavar="N",
                   help="requests per profiled size (default 10)")
    g.add_argument("--calibration", metavar="FILE", help="reuse the profile.json of an "
                   "earlier run instead of profiling (no server for that step)")
    g.add_argument("--window-ms", type=int, default=2000, metavar="MS",
                   help="perf_analyzer measurement window (three per measurement; "
                   "default 2000)")
    g.add_argument("--verify", type=int, default=3, metavar="N",
                   help="candidates to measure on the real server (default 3; 0: none)")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", metavar="DIR",
                   help="where the report goes (default ./analyze-<model>)")
    return p


def _loads(args: argparse.Namespace) -> tuple[list[Load], list[SimRequest] | None]:
    if args.concurrency is not None:
        values = _numbers(args.concurrency, int, "--concurrency")
        if any(v < 1 for v in values):
            raise UsageError("--concurrency: every value must be at least 1")
        return [Load("concurrency", v) for v in values], None
    if args.request_rate is not None:
        values = _numbers(args.request_rate, float, "--request-rate")
        if any(not v > 0 or not math.isfinite(v) for v in values):
            raise UsageError("--request-rate: every rate must be a positive number")
        return [Load("rate", v) for v in values], None
    try:
        trace = arrivals.read_trace(args.arrival_log, model=args.model)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--arrival-log {args.arrival_log}: cannot be read as an arrival "
                         f"log: {exc}") from None
    if len(trace) < 2:
        raise UsageError(f"--arrival-log {args.arrival_log}: holds {len(trace)} arrival(s) "
                         f"of model '{args.model}'; at least two are needed")
    return [Load("trace")], trace


def _goal(args: argparse.Namespace) -> Goal:
    budget = args.latency_budget_ms
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise UsageError(f"--latency-budget-ms must be a positive number of milliseconds, "
                         f"got {budget:g}")
    if not 0 <= args.max_shed < 1:
        raise UsageError("--max-shed must be a fraction from 0 to below 1")
    return Goal(budget / 1e3 if budget is not None else None, args.percentile, args.max_shed)


def _profile_sizes(args: argparse.Namespace, model: ModelConfig) -> list[int]:
    top = max(1, model.max_batch_size)
    if args.profile_sizes:
        sizes = _numbers(args.profile_sizes, int, "--profile-sizes")
        if any(not 1 <= s <= top for s in sizes):
            raise UsageError(f"--profile-sizes must lie between 1 and max_batch_size {top}")
        return sorted(set(sizes))
    sizes = sorted({top, *(1 << k for k in range(16) if (1 << k) <= top)})
    while len(sizes) > 6:  # keep the ends, thin the middle
        sizes.pop(len(sizes) // 2)
    return sizes


def _read_calibration(path: str) -> tuple[Calibration, tuple[float, float] | None]:
    try:
        data = json.loads(Path(path).read_text())
        cal = data["calibration"]
        table = cost.CostTable(tuple(sorted((int(k), float(v))
                                            for k, v in cal["cost_s"].items())))
        line = tuple(data["line"]) if data.get("line") else None
        return (Calibration(table, float(cal["frontend_s"]), float(cal["frontend_batch_s"]),
                            str(cal["overhead"])), line)  # type: ignore[return-value]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--calibration {path}: not a profile.json of nursery analyze: "
                         f"{exc}") from None


def _verify(args: argparse.Namespace, pa: Path, model_path: Path, model: ModelConfig,
            original: str, chosen: list[Scored], loads: list[Load], goal: Goal,
            trace: list[SimRequest] | None, out: Path) -> None:
    names = {f"{model.name}__v{i}": s for i, s in enumerate(chosen, 1)}
    intervals = None
    if trace is not None:
        intervals = out / "intervals.txt"
        gaps = [max(1, round((b.arrival - a.arrival) * 1e6)) for a, b in zip(trace, trace[1:],
                                                                              strict=False)]
        intervals.write_text("\n".join(str(g) for g in gaps) + "\n")
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        repo = profiler.scratch_repo(Path(tmp), model_path, {
            name: space.config_text(original, s.candidate, goal.objective(), name=name)
            for name, s in names.items()})
        server = profiler.ServerProcess(repo, out / "verify-server.log")
        try:
            for name, s in names.items():
                for k, load in enumerate(loads):
                    s.measured.append(profiler.perf_analyzer(
                        pa, server, name, model, load, args.window_ms,
                        out / f"verify-{name}-{k}.csv", intervals))
        finally:
            server.stop()


def _measured_meets(s: Scored, goal: Goal) -> bool:
    if not s.measured or any("error" in m for m in s.measured):
        return False
    if goal.budget_s is None:
        return True
    key = f"p{goal.percentile:g}_ms"
    return all(m.get(key, m["p99_ms"]) <= goal.budget_s * 1e3 for m in s.measured)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    goal = _goal(args)
    loads, trace = _loads(args)
    repo = Path(args.model_repository)
    model_path = repo / args.model
    config_path = model_path / "config.pbtxt"
    if not config_path.is_file():
        raise UsageError(f"no model '{args.model}' in {repo} (no {config_path})")
    model, _ = read_model_config(model_path, args.model, backends=get_factory)
    if model.scheduler in ("sequence", "ensemble"):
        raise UsageError(f"model '{args.model}' uses {model.scheduler} scheduling: analyze "
                         "searches stateless models' schedulers only")
    original = config_path.read_text()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if goal.budget_s is None and "latency" in policies:
        policies.remove("latency")  # a latency objective needs a budget
    try:
        candidates = space.grid(
            model, instances=_numbers(args.instances, int, "--instances"),
            max_batch_sizes=(_numbers(args.max_batch_sizes, int, "--max-batch-sizes")
                             if args.max_batch_sizes else None),
            delays_us=_numbers(args.delays_us, int, "--delays-us"), objective=goal.objective(),
            policies=policies)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not candidates:
        raise UsageError("the search space is empty: widen --policies / --instances")
    pa = None
    if args.calibration is None or args.verify > 0:
        pa = profiler.find_perf_analyzer(args.perf_analyzer)
    out = Path(args.output_dir or f"analyze-{args.model}")
    if out.resolve() == model_path.resolve():
        raise UsageError("--output-dir must not be the model's own folder")
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    # 1. profile
    t = time.monotonic()
    if args.calibration is not None:
        calibration, line = _read_calibration(args.calibration)
        runs: dict[str, Any] = {}
    else:
        assert pa is not None
        profiled = profiler.profile(
            pa, model_path, model, original, sizes=_profile_sizes(args, model),
            runs=args.profile_runs, window_ms=args.window_ms, work=out,
            config_for=lambda name: space.config_text(
                original, space.Candidate("dynamic" if model.max_batch_size else "fifo", 1,
                                          model.max_batch_size), None, name=name))
        calibration, line, runs = profiled.calibration, profiled.line, profiled.runs
    report.write_json(out / "profile.json", {"calibration": calibration.to_json(),
                                             "line": line, "runs": runs})
    timings["profile"] = time.monotonic() - t
    print(f"profiled: {', '.join(f'{r} rows {s * 1e3:.3f} ms' for r, s in calibration.cost.points)}"
          f"; frontend {calibration.frontend_s * 1e3:.3f} ms/request + "
          f"{calibration.frontend_batch_s * 1e3:.3f} ms/batch; outside {calibration.overhead}",
          file=sys.stderr)

    # 2. search on the simulator
    t = time.monotonic()
    ranked = search.search(candidates, model, calibration, loads, goal,
                           count=args.sim_requests, seed=args.seed, trace=trace)
    timings["search"] = time.monotonic() - t
    print(f"searched {len(ranked)} candidates x {len(loads)} loads in {timings['search']:.1f} s",
          file=sys.stderr)
    meeting = [s for s in ranked if s.meets]

    # 3. verify the best few
    t = time.monotonic()
    verified = (meeting or ranked)[: max(0, args.verify)]
    notes: list[str] = []
    if verified:
        assert pa is not None
        _verify(args, pa, model_path, model, original, verified, loads, goal, trace, out)
    timings["verify"] = time.monotonic() - t
    chosen: Scored | None = meeting[0] if meeting else None
    if verified and meeting:
        confirmed = [s for s in verified if s.meets and _measured_meets(s, goal)]
        if confirmed:
            def measured_score(s: Scored) -> float:
                return sum(m["throughput"] for m in s.measured)
            if goal.budget_s is None:
                confirmed.sort(key=measured_score, reverse=True)
            chosen = confirmed[0]
            if chosen is not meeting[0]:
                notes.append(f"The simulator's first choice ({meeting[0].candidate.label()}) "
                             "did not hold on the real server; the chosen one did.")
        else:
            notes.append("No verified candidate met the goal as measured (see the "
                         "verification table); the choice is the simulator's.")

    # 4. write
    closest = ranked[0]
    if chosen is None:
        p = max(closest.predictions, key=lambda p: p.at_percentile_ms)
        notes.insert(0, f"**No configuration meets {goal.describe()}.** The closest: "
                     f"{closest.candidate.label()}, p{goal.percentile:g} "
                     f"{p.at_percentile_ms:.2f} ms at {p.load.label()}"
                     + (f", shedding {p.shed:.0%}" if p.shed else "") + ".")
    timings["total"] = time.monotonic() - started
    report.candidates_csv(out / "candidates.csv", ranked)
    report.plot_svg(out / "plot.svg", ranked, chosen or closest, goal)
    text = report.markdown(args.model, goal, loads, calibration, line, ranked, chosen,
                           verified, notes, timings=timings)
    (out / "report.md").write_text(text)
    report.write_json(out / "analysis.json", {
        "model": args.model, "goal": dataclasses.asdict(goal),
        "loads": [dataclasses.asdict(load) for load in loads],
        "chosen": chosen.candidate.label() if chosen else None,
        "closest": closest.candidate.label(), "timings_s": timings,
        "verified": [{"candidate": s.candidate.label(), "measured": s.measured,
                      "predicted": [dataclasses.asdict(p) for p in s.predictions]}
                     for s in verified]})
    if chosen is None:  # the closest, for a look: in the report folder only
        (out / "config.pbtxt.closest").write_text(
            space.config_text(original, closest.candidate, goal.objective()))
        print(f"error: no configuration meets {goal.describe()}; the closest is "
              f"{closest.candidate.label()} (report: {out / 'report.md'}); nothing was written "
              f"beside {config_path}", file=sys.stderr)
        return 3
    recommended = space.config_text(original, chosen.candidate, goal.objective())
    (out / "config.pbtxt").write_text(recommended)
    target = report.write_recommended(model_path, recommended)
    print(f"chosen: {chosen.candidate.label()}\nwrote {target} and {out / 'report.md'} "
          f"({timings['total']:.0f} s)")
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError, NurseryError, SimulationError) as exc:
        print(f"error: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 1

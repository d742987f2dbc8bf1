"""Goodput of the latency-objective batcher beside Triton's dynamic batcher, under a Poisson load
ramp that overloads the model (issue 31).

One server, three copies of one model: ``slo_dynamic`` (``dynamic_batching`` with a queue
delay), ``slo_timeout`` (the same with Triton's queue policy rejecting what waited longer than
the objective: the best Triton offers) and ``slo_latency`` (``nursery.batcher:
latency_objective`` with the objective). The model is a Python model whose batch takes
``--base-ms + --per-row-ms * rows`` of sleep (a GPU model's shape: the time is the device's,
not the CPU's, so the 2-core machine's client and server are not what saturates),
``max_batch_size`` ``--max-batch``, one instance: its capacity is ``max_batch / (base +
per_row * max_batch)`` requests/s.

For each load of the ramp (``--loads``, multiples of that capacity) and each model, in turn,
an open-loop Poisson client of its own (asyncio, raw HTTP/1.1 on a pool of keep-alive
connections, latency counted from each request's scheduled time, so a slow server cannot slow
the arrivals) sends ``--seconds`` of requests. perf_analyzer is not used: it stops on the
first error answer, and shedding is the point. Per load and model: offered and answered rates,
answers within the objective per second (goodput), shed answers (503), p50/p99 of the answers.
The verdict: goodput at 2x overload at least 1.5x the dynamic batcher's, and no worse (within
5%) below capacity.

``--simulate`` prints the simulator's prediction of the same comparison instead (the same cost
line, the same policies on the virtual clock; seconds, no server). ``--smoke`` runs one short
load per model to check the pieces. Results: ``bench/results/slo-batcher-<date>/``
(``summary.md``, ``results.csv``).

    python bench/slo_batcher.py --simulate          # the prediction, in seconds
    python bench/slo_batcher.py --smoke             # the pieces, ~20 s
    python bench/slo_batcher.py                     # the measurement (~10 minutes)

"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sim_fidelity import Server  # noqa: E402
from nursery.scheduling.batch_policy import BatchConfig, QueuePolicy  # noqa: E402
from nursery.scheduling.latency_objective import Objective  # noqa: E402
from nursery.simulate import arrivals, cost, policies, report  # noqa: E402
from nursery.simulate.engine import simulate  # noqa: E402

MODEL = """import time

import triton_python_backend_utils as pb_utils

BASE, PER_ROW = {base!r}, {per_row!r}


class TritonPythonModel:
    def execute(self, requests):
        rows = sum(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().shape[0]
                   for r in requests)
        time.sleep(BASE + PER_ROW * rows)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{scheduling}
"""


def make_repo(tmp: Path, args: argparse.Namespace) -> Path:
    repo = tmp / "repo"
    schedulings = {
        "slo_dynamic": f"dynamic_batching {{ max_queue_delay_microseconds: {args.delay_us} }}",
        "slo_timeout": (
            f"dynamic_batching {{ max_queue_delay_microseconds: {args.delay_us} "
            "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: "
            f"{int(args.objective_ms * 1e3)} }} }}"),
        "slo_latency": (
            'parameters { key: "nursery.batcher" value: { string_value: "latency_objective" } }\n'
            'parameters { key: "nursery.latency_objective_ms" value: { string_value: '
            f'"{args.objective_ms:g}" }} }}'),
    }
    for name, scheduling in schedulings.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(
            name=name, max_batch=args.max_batch, scheduling=scheduling))
        (repo / name / "1" / "model.py").write_text(MODEL.format(
            base=args.base_ms / 1e3, per_row=args.per_row_ms / 1e3))
    return repo


def capacity(args: argparse.Namespace) -> float:
    return args.max_batch / ((args.base_ms + args.per_row_ms * args.max_batch) / 1e3)


# -- the open-loop Poisson client --------------------------------------------------------------

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32",
                               "data": [1.0]}]}).encode()


async def _one(pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], port: int,
               model: str, scheduled: float, out: list[tuple[int, float]]) -> None:
    if pool:
        reader, writer = pool.pop()
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n").encode()
    try:
        writer.write(head + BODY)
        await writer.drain()
        status_line = await reader.readline()
        length = 0
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)
        status = int(status_line.split()[1])
        out.append((status, time.monotonic() - scheduled))
        pool.append((reader, writer))
    except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
        out.append((0, time.monotonic() - scheduled))
        writer.close()


async def _load(port: int, model: str, rate: float, seconds: float,
                seed: int) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    out: list[tuple[int, float]] = []
    tasks = []
    start = time.monotonic() + 0.05
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            break
        delay = start + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_one(pool, port, model, start + t, out)))
    await asyncio.gather(*tasks)
    for _, writer in pool:
        writer.close()
    return out


def figures(results: list[tuple[int, float]], seconds: float, objective_s: float) -> dict[str, Any]:
    ok = sorted(lat for status, lat in results if status == 200)
    shed = sum(1 for status, _ in results if status in (503, 429))
    other = len(results) - len(ok) - shed

    def pct(p: float) -> float:
        return report.percentile(ok, p) * 1e3 if ok else float("nan")
    return {"offered": len(results) / seconds, "answered": len(ok) / seconds,
            "goodput": sum(1 for lat in ok if lat <= objective_s) / seconds,
            "shed": shed, "errors": other, "p50_ms": pct(50), "p99_ms": pct(99)}


# -- the simulator's prediction ----------------------------------------------------------------

def simulated(args: argparse.Namespace) -> list[dict[str, Any]]:
    table = cost.CostTable.parse(f"1:{args.base_ms + args.per_row_ms}ms,"
                                 f"{args.max_batch}:{args.base_ms + args.per_row_ms * args.max_batch}ms")
    objective = Objective(args.objective_ms / 1e3)
    rows = []
    for load in args.loads:
        rate = load * capacity(args)
        requests = arrivals.poisson(rate, duration=args.sim_seconds, seed=args.seed)
        timeout = QueuePolicy(default_timeout_us=int(args.objective_ms * 1e3))
        for name, spec, batch in (
                ("dynamic", "dynamic", BatchConfig(args.max_batch,
                                                   max_queue_delay_us=args.delay_us)),
                ("timeout", "dynamic", BatchConfig(args.max_batch, max_queue_delay_us=args.delay_us,
                                                   default_queue_policy=timeout)),
                ("latency", "latency", BatchConfig(args.max_batch))):
            policy, slots = policies.build(spec, batch, 1, objective=objective)
            s = report.summarize(simulate(policy, requests, table, slots=slots,
                                          overhead=args.overhead_ms / 1e3),
                                 objective_s=objective.latency_s)
            span = args.sim_seconds
            rows.append({"load": load, "rate": rate, "policy": name,
                         "offered": len(requests) / span, "answered": s["completed"] / span,
                         "goodput": s["goodput"] * s["duration_s"] / span,
                         "shed": s["rejected"] + s["timed_out"], "errors": 0,
                         "p50_ms": s["latency_ms"]["p50"], "p99_ms": s["latency_ms"]["p99"]})
    return rows


# -- the report --------------------------------------------------------------------------------

def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| load | rate/s | batcher | offered/s | answered/s | goodput/s | shed | errors "
             "| p50 ms | p99 ms |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['load']:g}x | {r['rate']:.0f} | {r['policy']} | {r['offered']:.1f} "
                     f"| {r['answered']:.1f} | {r['goodput']:.1f} | {r['shed']} | {r['errors']} "
                     f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    by = {(r["load"], r["policy"]): r for r in rows}
    for load in sorted({r["load"] for r in rows}):
        dyn, lat = by.get((load, "dynamic")), by.get((load, "latency"))
        if dyn is None or lat is None:
            continue
        ratio = lat["goodput"] / dyn["goodput"] if dyn["goodput"] > 0 else float("inf")
        timeout = by.get((load, "timeout"))
        beside = ""
        if timeout is not None and timeout["goodput"] > 0:
            beside = f" (against the dynamic batcher with a queue timeout: " \
                     f"{lat['goodput'] / timeout['goodput']:.2f})"
        if load >= 2:
            ok = ratio >= 1.5
            rule = ">= 1.5x"
        elif load < 1:
            ok = ratio >= 0.95
            rule = "no worse (>= 0.95x)"
        else:
            ok, rule = True, "(no target at capacity)"
        out.append(f"- {load:g}x: goodput ratio latency/dynamic {ratio:.2f} {rule}: "
                   f"{'met' if ok else 'NOT met'}{beside}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", default="0.5,0.8,1.0,1.5,2.0,3.0",
                   type=lambda s: [float(x) for x in s.split(",")],
                   help="offered load as multiples of the model's capacity")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds per load and model")
    p.add_argument("--objective-ms", type=float, default=100.0)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--base-ms", type=float, default=20.0, help="a batch's fixed time")
    p.add_argument("--per-row-ms", type=float, default=1.0, help="a batch's time per row")
    p.add_argument("--delay-us", type=int, default=2000,
                   help="the dynamic batcher's max_queue_delay_microseconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--simulate", action="store_true",
                   help="print the simulator's prediction only (no server)")
    p.add_argument("--sim-seconds", type=float, default=60.0)
    p.add_argument("--overhead-ms", type=float, default=1.0,
                   help="per-request time outside the instance, for the prediction")
    p.add_argument("--smoke", action="store_true", help="one 2 s load at 2x per model")
    p.add_argument("--out", type=Path, help="results directory (default "
                   "bench/results/slo-batcher-<date>)")
    args = p.parse_args()
    print(f"capacity: {capacity(args):.0f} requests/s "
          f"({args.max_batch} rows per {args.base_ms + args.per_row_ms * args.max_batch:g} ms)")
    if args.simulate:
        rows = simulated(args)
        print(table(rows))
        print("\n".join(verdict(rows)))
        return 0
    if args.smoke:
        args.loads, args.seconds = [2.0], 2.0
    out = args.out or ROOT / "bench" / "results" / time.strftime("slo-batcher-%Y%m%d-%H%M")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp), args)
        server = Server(repo, out / "server.log")
        try:
            for load in args.loads:
                rate = load * capacity(args)
                for policy, model in (("dynamic", "slo_dynamic"), ("timeout", "slo_timeout"),
                                      ("latency", "slo_latency")):
                    results = asyncio.run(_load(server.http, model, rate, args.seconds,
                                                args.seed))
                    row = {"load": load, "rate": rate, "policy": policy,
                           **figures(results, args.seconds, args.objective_ms / 1e3)}
                    rows.append(row)
                    print(table([row]).splitlines()[-1], flush=True)
                    time.sleep(1.0)  # let the queue drain before the next load
        finally:
            server.stop()
    prediction = simulated(args)
    text = ["# Latency-objective batcher vs dynamic batcher (bench/slo_batcher.py)", "",
            f"Model: {args.max_batch} rows per batch, {args.base_ms:g} ms + "
            f"{args.per_row_ms:g} ms per row (capacity {capacity(args):.0f}/s); objective "
            f"{args.objective_ms:g} ms; dynamic batcher delay {args.delay_us} µs; "
            f"{args.seconds:g} s per load.", "", "## Measured", "", table(rows), "",
            *verdict(rows), "", "## Simulated (same loads)", "", table(prediction), "",
            *verdict(prediction), ""]
    (out / "summary.md").write_text("\n".join(text))
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("\n".join(verdict(rows)))
    print(f"wrote {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

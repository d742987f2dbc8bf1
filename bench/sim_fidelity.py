#!/usr/bin/env python3
"""How well ``python -m nursery simulate`` predicts the real server (issue 11's fidelity check).

    python bench/sim_fidelity.py [--policy dynamic] [--max-queue-delay-us 500]
                                 [--rates 200,400,800] [--rounds 15] [--measure-ms 4000]
                                 [--bootstrap 8] [--protocol http]
                                 [--out bench/results/sim-fidelity-<time>]
    python bench/sim_fidelity.py --reuse bench/results/sim-fidelity-<time>   # no measuring
    python bench/sim_fidelity.py --reuse DIR DIR ... --out DIR [--bootstrap 16 --jobs 2]

For the MLP model of this repository with the chosen policy (``dynamic``: its config plus a
``dynamic_batching`` block; ``fifo``: the config as it is), on this machine:

1. profile the model's cost table in-process through the real ONNX Runtime backend (the
   simulator's ``--profile``);
2. measure, on one ``python -m nursery serve`` (loopback, free ports, ``--arrival-log``), every
   load with ``perf_analyzer``: the calibration loads (concurrency 8 and 1, Poisson at
   ``--cold-rate`` and at each ``--fit-rates``) and the rates checked (``--rates``), in
   ``--rounds`` rounds, each in its own shuffled order, and take each figure's median over the
   rounds. On this shared 2-core machine one perf_analyzer run's p99 moves by 20-30% from one
   minute to the next (18% rms); interleaving the loads spreads that drift over all of them
   alike, so calibration and check see the same machine, and the median drops a round gone
   astray. Fifteen rounds (about 55 minutes, more with rounds spoiled by steal) bring the
   medians' noise to about 6% (nine: 7.5%; four draws of three rounds out of one nine-round
   run had 5 to 8 figures of 9 within 15%);
3. calibrate what the simulator cannot know, from the calibration loads only: the server's
   frontend (trio) thread, one per server, so overlapping requests queue for it, costs work
   per request (decode, encode: the simulator's ``--frontend``) and work per batch (handing
   it to the instance thread and collecting it: ``--frontend-batch``), split as its CPU
   (``/proc/<pid>/task/<pid>``) per request is at concurrency 1 (one row per batch) and 8
   (the statistics extension's rows per batch): ``a + b / rows`` through the two points.
   Runs measured before the thread's CPU and the batch counts were recorded (or with
   ``--no-frontend-batch``) charge ``1 / throughput`` at concurrency 8 per request instead;
   everything else outside the instance (network, perf_analyzer's client,
   waking the server) is an :class:`~nursery.simulate.cost.IdleOverhead`: its *warm*
   distribution is perf_analyzer's latency at concurrency 1 minus the simulated one, per
   percentile, its *cold* one the same at the cold rate, and its idle time constant ``tau``
   the one that best fits p50 and p99 at the fit rates (a search over 0.1-300 ms), with the
   engine's ``contention`` too when asked (``--fit-contention``: overlapping requests stretch
   each other's overhead). The defaults are the variant that did best on the two nine-round
   runs measured before it was chosen (docs/research.md): ``--wake tail`` (the waking and
   the warm tail, all that lies above the warm median, is queued on the frontend thread, so
   that requests behind a stalled one wait too), ``--idle-parts 4`` (the server warms by
   degrees) and ``--inherit-idle`` (a request arriving while the one that woke the server is
   still in it is cold too). On this machine the measured latency *falls* as the rate rises
   (a request that finds the server busy finds its threads awake); one fixed overhead
   distribution cannot follow that (it is kept as the *warm only* column);
4. for each rate checked, simulate the same policy at the same rate, Poisson arrivals (the
   prediction), and the server's own recorded arrivals of each round replayed
   (``--arrivals trace``);
5. print and write (``fidelity.json``, and ``summary.md``, kept in git) predicted vs measured
   throughput, p50 and p99 latency and their relative errors, marking those within 15%, with
   the measured spread over the rounds, and how busy the cores were at each load (the server's
   CPU seconds from ``/proc``, per thread too, perf_analyzer's, the share the hypervisor
   stole, the mean rows per batch from the statistics extension);
6. with ``--bootstrap N``, redo steps 3-5 N times on the rounds drawn with replacement: the
   share of draws that pass says how reliable one run's verdict is.
   ``measurements.json`` keeps every run, so ``--reuse DIR`` can redo steps 3-5 (another
   model, another fit) without measuring again; given several runs of the same check (same
   policy, protocol and loads), it pools them as one run of all their rounds.

Never run it beside another benchmark on the 2-core machine. ``--smoke`` runs a tiny version
(one rate, one round, short windows) to check that the pieces work, not to measure anything.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import functools
import json
import math
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nursery.backends.base import get_factory  # noqa: E402
from nursery.scheduling.batch_policy import BatchConfig  # noqa: E402
from nursery.simulate import arrivals, cost, policies, report  # noqa: E402
from nursery.simulate.engine import simulate  # noqa: E402

PERF_ANALYZER = ROOT / ".tools" / "perf_analyzer" / "perf_analyzer"
TOLERANCE = 0.15
PAUSE_S = 2.0  # between two perf_analyzer runs: what cuts the arrival log into runs
SIM_SECONDS = 60.0  # simulated time per prediction
# --fit-frontend: the frontend thread's extra work for a request that finds it idle, tried
FRONTEND_WAKES = (0.0, 0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3, 0.5e-3, 0.7e-3, 1.0e-3)
CONTENTIONS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)  # --fit-contention: the values tried
QUANTILES = (50, 90, 95, 99)
MAX_SPOILED = 3  # rounds added for rounds spoiled by the hypervisor's steal (--max-steal)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_repo(tmp: Path, policy: str, delay_us: int) -> Path:
    repo = tmp / "repo"
    shutil.copytree(ROOT / "model_repository" / "mlp", repo / "mlp")
    if policy == "dynamic":
        config = repo / "mlp" / "config.pbtxt"
        config.write_text(config.read_text() + "dynamic_batching { max_queue_delay_microseconds: "
                          f"{delay_us} }}\n")
    return repo


class Server:
    def __init__(self, repo: Path, log: Path, arrival_log: Path | None = None,
                 root: Path = ROOT, flags: tuple[str, ...] = ()) -> None:
        """``root``: the nursery checkout the server runs from (its working directory);
        ``flags``: more command-line flags (a trace configuration, say)."""
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nursery", "serve", "--model-repository", str(repo),
             "--http-address", "127.0.0.1", "--http-port", str(self.http),
             "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc),
             "--allow-metrics", "false",
             *(["--arrival-log", str(arrival_log)] if arrival_log is not None else []), *flags],
            cwd=root, stdout=self._out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("server not ready")

    def counts(self) -> tuple[int, int]:
        """(inferences, executions) of the MLP so far, from the statistics extension: their
        differences over a run give the mean rows per batch."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/models/mlp/stats",
                                    timeout=5) as r:
            stats = json.loads(r.read())["model_stats"][0]
        return int(stats["inference_count"]), int(stats["execution_count"])

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.grpc if protocol == 'grpc' else self.http}"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


def perf_analyzer(url: str, protocol: str, mode: list[str], measure_ms: int,
                  out: Path) -> dict[str, float]:
    args = [str(PERF_ANALYZER), "-m", "mlp", "-u", url, "-i",
            "grpc" if protocol == "grpc" else "http", "--measurement-interval", str(measure_ms),
            "-f", str(out), *mode]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed:\n{proc.stdout}\n{proc.stderr}")
    with out.open() as f:
        row = list(csv.DictReader(f))[-1]
    return {"throughput": float(row["Inferences/Second"]),
            **{f"p{q}_ms": float(row[f"p{q} latency"]) / 1e3 for q in (50, 90, 95, 99)}}


def predicted(spec: str, batch: BatchConfig, table: cost.CostTable, overhead: Any,
              requests: list[arrivals.SimRequest], rate: float | None,
              frontend: float = 0.0, wake: float = 0.0,
              contention: float = 0.0, inherit: bool = False,
              per_batch: float = 0.0, timer_queues: bool = False) -> dict[str, Any]:
    policy, slots = policies.build(spec, batch, 1)
    if isinstance(overhead, str):
        overhead = cost.parse_overhead(overhead)
    s = report.summarize(simulate(policy, requests, table, slots=slots, overhead=overhead,
                                  frontend=frontend, frontend_wake=wake,
                                  frontend_batch=per_batch, timer_queues=timer_queues,
                                  contention=contention, inherit_idle=inherit), rate=rate)
    lat = s["latency_ms"]
    return {"throughput": s["throughput"], **{f"p{q}_ms": lat[f"p{q}"] for q in QUANTILES},
            "mean_batch_rows": s["mean_batch_rows"]}


def poisson_mode(rate: float) -> list[str]:
    return ["--request-rate-range", f"{rate:g}", "--request-distribution", "poisson"]


def difference(measured: dict[str, float], simulated: dict[str, Any]) -> str:
    """Measured minus simulated latency percentiles, as ``--overhead`` percentiles."""
    return ",".join(f"{q}:{max(0.0, measured[f'p{q}_ms'] - simulated[f'p{q}_ms']):.4f}ms"
                    for q in QUANTILES)


def error(pred: float, real: float) -> float:
    return (pred - real) / real if real else float("nan")


# -- measuring ---------------------------------------------------------------------------------

def load_plan(args: argparse.Namespace, rates: list[float],
              fit_rates: list[float]) -> list[tuple[str, list[str], int]]:
    """(name, perf_analyzer flags, window ms) of every load measured."""
    window = args.measure_ms
    slow = window if args.smoke else 2 * window  # low Poisson rates: few requests per window
    # perf_analyzer's stability bound: its default (three windows within 10%) fails or takes
    # ten windows on this noisy machine, and the rounds' median does that job better;
    # smoke: short and loose
    quick = ["-r", "3", "-s", "1000"] if args.smoke else ["-s", "25"]
    plan = [("c8", ["--concurrency-range", "8", *quick], window),
            ("c1", ["--concurrency-range", "1", *quick], window),
            (f"p{args.cold_rate:g}", poisson_mode(args.cold_rate) + quick, slow)]
    plan += [(f"p{r:g}", poisson_mode(r) + quick, slow) for r in fit_rates]
    plan += [(f"p{r:g}", poisson_mode(r) + quick, window) for r in rates]
    return plan


def split_trace(path: Path, runs: int) -> list[list[str]] | None:
    """The server's arrival log cut into one segment per perf_analyzer run: the runs are
    ``PAUSE_S`` apart, far longer than any gap within a run at the rates used."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    segments: list[list[str]] = []
    last = -math.inf
    for line in lines:
        t = json.loads(line)["time"]
        if t - last > PAUSE_S * 0.75:
            segments.append([])
        segments[-1].append(line)
        last = t
    return segments if len(segments) == runs else None


def stat_cpu(stat: Path) -> float:
    """User plus system CPU seconds of a process or thread, from its ``/proc/.../stat``."""
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, ...]:
    """(the server's CPU seconds, every finished child's CPU seconds: perf_analyzer's, the
    monotonic clock, the machine's stolen ticks, all its ticks) now: their differences over a
    run say how busy the two cores were, and how much of them the hypervisor took."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (stat_cpu(Path(f"/proc/{pid}/stat")), children.ru_utime + children.ru_stime,
            time.monotonic(), ticks[7] if len(ticks) > 7 else 0, sum(ticks))


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each of the server's threads now, by thread id (the trio thread's id is
    the process id; the instance threads and ONNX Runtime's are the others)."""
    seconds: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            seconds[int(task.name)] = stat_cpu(task / "stat")
        except OSError:  # the thread ended
            continue
    return seconds


def thread_use(pid: int, before: dict[int, float], after: dict[int, float]) -> dict[str, Any]:
    """The trio thread's CPU seconds over a run, and the other threads' (busiest first)."""
    used = {tid: s - before.get(tid, 0.0) for tid, s in after.items()}
    return {"main": used.pop(pid, 0.0),
            "others": sorted((s for s in used.values() if s > 0), reverse=True)[:6]}


def measure(args: argparse.Namespace, repo: Path, out: Path,
            plan: list[tuple[str, list[str], int]]) -> list[dict[str, Any]]:
    """Every load of ``plan`` in each of ``args.rounds`` rounds (a shuffled order per round), on
    one server; each run's arrivals are written to ``out/trace-<i>-<load>.jsonl``."""
    rng = random.Random(args.seed)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "arrivals.jsonl"
        server = Server(repo, out / "server.log", log)
        try:
            rnd = spoiled = 0
            while rnd - spoiled < args.rounds:
                order = plan[:]
                rng.shuffle(order)
                for name, flags, window in order:
                    time.sleep(PAUSE_S)
                    i = len(runs)
                    cpu = cpu_seconds(server.proc.pid)
                    threads = thread_cpu(server.proc.pid)
                    counts = server.counts()
                    try:
                        result = perf_analyzer(server.url(args.protocol), args.protocol, flags,
                                               window, out / f"pa-{i:02d}-{name}.csv")
                    except RuntimeError as exc:  # no three windows in a row agreed within 10%
                        if "stable" not in str(exc):
                            raise
                        print(f"round {rnd + 1} {name}: not stable, again with -s 50",
                              flush=True)
                        time.sleep(PAUSE_S)
                        result = perf_analyzer(server.url(args.protocol), args.protocol,
                                               [*flags, "-s", "50"], window,
                                               out / f"pa-{i:02d}-{name}.csv")
                    used = [b - a for a, b in zip(cpu, cpu_seconds(server.proc.pid), strict=True)]
                    inferences, executions = (b - a for a, b in zip(counts, server.counts(),
                                                                    strict=True))
                    runs.append({"load": name, "round": rnd, **result,
                                 # CPU seconds of the server and of perf_analyzer over the run
                                 # (its warm-up windows included), and the run's length
                                 "server_cpu_s": used[0], "client_cpu_s": used[1],
                                 "wall_s": used[2], "steal": used[3] / max(1, used[4]),
                                 "threads_cpu_s": thread_use(server.proc.pid, threads,
                                                             thread_cpu(server.proc.pid)),
                                 # inferences and batches over the run, warm-up included
                                 "inferences": inferences, "executions": executions})
                    (out / "runs-so-far.json").write_text(json.dumps(runs, indent=1))
                    print(f"round {rnd + 1}/{args.rounds} {name}: {result['throughput']:.0f} "
                          f"infer/s, p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms",
                          flush=True)
                rnd += 1
                if rnd - 1 in spoiled_rounds(runs, args.max_steal) and spoiled < MAX_SPOILED:
                    spoiled += 1
                    print(f"round {rnd}: the hypervisor stole over {args.max_steal:.0%} of the "
                          "CPU during a load; one more round", flush=True)
        finally:
            server.stop()
        segments = split_trace(log, len(runs))
    if segments is None:
        print("the arrival log did not split into one segment per run: no trace replay",
              file=sys.stderr)
    for i, run in enumerate(runs):
        if segments is not None:
            rows = [json.loads(line) for line in segments[i]]
            t0 = rows[0]["time"]
            trace = out / f"trace-{i:02d}-{run['load']}.jsonl"
            trace.write_text("".join(json.dumps({**row, "time": row["time"] - t0}) + "\n"
                                     for row in rows))
            run["trace"] = trace.name
    return runs


POOL_KEYS = ("policy", "delay_us", "protocol", "rates", "fit_rates", "cold_rate", "smoke")


def pooled(dirs: list[Path]) -> dict[str, Any]:
    """The measurements of one run, or of several runs of the same check as one run of all
    their rounds: rounds renumbered in turn, trace paths made absolute, each cost table row
    the median over the runs. Runs measured with different settings cannot be pooled."""
    runs = [json.loads((d / "measurements.json").read_text()) for d in dirs]
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    for d, data in zip(dirs[1:], runs[1:], strict=True):
        differ = [k for k in POOL_KEYS if data.get(k) != first.get(k)]
        if differ:
            raise ValueError(f"{d} was measured with other {', '.join(differ)} than {dirs[0]}")
    pool, offset = [], 0
    for d, data in zip(dirs, runs, strict=True):
        pool += [{**run, "round": run["round"] + offset,
                  **({"trace": str((d / run["trace"]).resolve())} if "trace" in run else {})}
                 for run in data["runs"]]
        offset += 1 + max(run["round"] for run in data["runs"])
    rows = sorted(set().union(*(data["cost_s"] for data in runs)), key=int)
    return {**first, "runs": pool, "rounds": offset, "pooled": len(runs),
            "when": " + ".join(data["when"] for data in runs),
            "cost_s": {r: statistics.median(float(data["cost_s"][r]) for data in runs
                                            if r in data["cost_s"]) for r in rows}}


def spoiled_rounds(runs: list[dict[str, Any]], max_steal: float) -> list[int]:
    """The rounds in which the hypervisor stole more than ``max_steal`` of the machine's CPU
    during any load: the server's and perf_analyzer's threads waited for cores that were not
    there, which is not what the simulator models."""
    return sorted({r["round"] for r in runs if r.get("steal", 0.0) > max_steal})


def cpu_use(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The cores the server and perf_analyzer kept busy over a load's runs (medians), and the
    server's CPU milliseconds per request; empty for runs measured before these were kept."""
    if not all("wall_s" in r for r in runs):
        return {}
    batching = ({"rows_per_batch": statistics.median(r["inferences"] / max(1, r["executions"])
                                                     for r in runs),
                 # the trio (frontend) thread's CPU milliseconds per request
                 "main_cpu_ms": statistics.median(1e3 * r["threads_cpu_s"]["main"]
                                                  / max(1, r["inferences"]) for r in runs)}
                if all("executions" in r for r in runs) else {})
    return {**batching,
        "server_cores": statistics.median(r["server_cpu_s"] / r["wall_s"] for r in runs),
        "client_cores": statistics.median(r["client_cpu_s"] / r["wall_s"] for r in runs),
        "steal": statistics.median(r.get("steal", 0.0) for r in runs),
        "server_cpu_ms": statistics.median(
            1e3 * r["server_cpu_s"] / (r["wall_s"] * r["throughput"]) for r in runs)}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per load: each figure's median over the rounds, and its range."""
    by_load: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_load.setdefault(run["load"], []).append(run)
    keys = ("throughput", *(f"p{q}_ms" for q in QUANTILES))
    return {load: {**{k: statistics.median(r[k] for r in rs) for k in keys},
                   **cpu_use(rs),
                   "range": {k: (min(r[k] for r in rs), max(r[k] for r in rs)) for k in keys},
                   "traces": [r["trace"] for r in rs if "trace" in r]}
            for load, rs in by_load.items()}


# -- calibrating and predicting ----------------------------------------------------------------

def frontend_shares(measured: dict[str, dict[str, Any]]) -> tuple[float, float] | None:
    """(seconds per request, seconds per batch) of the trio thread's CPU, from its CPU per
    request at concurrency 1 (one row per batch) and 8 (``rows_per_batch`` rows): m = a + b/r
    through the two points; None where the measurements lack them."""
    c1, c8 = measured["c1"], measured["c8"]
    if "main_cpu_ms" not in c1 or "main_cpu_ms" not in c8 or c8["rows_per_batch"] <= 1:
        return None
    per_batch = max(0.0, c1["main_cpu_ms"] - c8["main_cpu_ms"]) / (1 - 1 / c8["rows_per_batch"])
    per_request = max(0.0, c1["main_cpu_ms"] - per_batch)
    return per_request / 1e3, per_batch / 1e3


def fit_tau(loss: Callable[[float], float]) -> float:
    """The tau (seconds) of least ``loss``: a log grid over 0.1-300 ms, then a golden-section
    refinement between the best point's neighbours."""
    grid = [1e-4 * (3000 ** (i / 24)) for i in range(25)]
    values = [loss(t) for t in grid]
    best = min(range(len(grid)), key=values.__getitem__)
    lo, hi = math.log(grid[max(0, best - 1)]), math.log(grid[min(len(grid) - 1, best + 1)])
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(math.exp(a)), loss(math.exp(b))
    for _ in range(12):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(math.exp(b))
    candidates = [(values[best], grid[best]), (fa, math.exp(a)), (fb, math.exp(b))]
    return min(candidates)[1]


def analyse(args: argparse.Namespace, data: dict[str, Any], batch: BatchConfig,
            traces: Path | None) -> dict[str, Any]:
    """Calibrate on the calibration loads, predict the rates checked; ``traces``: where the
    recorded arrivals lie (None: no replays)."""
    table = cost.CostTable(tuple(sorted((int(k), float(v)) for k, v in data["cost_s"].items())))
    measured = aggregate(data["runs"])
    rates, fit_rates, cold_rate = data["rates"], data["fit_rates"], data["cold_rate"]
    # the frontend thread's cost per request: 1 / throughput at c=8, where it was thought the
    # bottleneck; or, with the per-thread CPU recorded, its CPU split per request and per batch
    per_request, per_batch = 1.0 / measured["c8"]["throughput"], 0.0
    shares = frontend_shares(measured) if args.frontend_batch else None
    if shares is not None:
        per_request, per_batch = shares
    elif args.frontend_batch:
        print("no per-thread CPU or batch counts in these measurements: no per-batch frontend "
              "work (as with --no-frontend-batch)", file=sys.stderr)
    duration = SIM_SECONDS

    def sim(overhead: Any, rate: float, frontend: float, wake: float,
            contention: float = 0.0) -> dict[str, Any]:
        if isinstance(overhead, str):
            overhead = cost.parse_overhead(overhead, args.seed)
        return predicted(args.policy, batch, table, overhead,
                         arrivals.poisson(rate, duration=duration, seed=args.seed), rate,
                         frontend, wake, contention, args.inherit_idle, per_batch,
                         args.timer_queues)

    def calibrate(wake: float, contention: float) -> tuple[float, float, str, str]:
        """(loss at the fit rates, frontend, overhead, warm-only overhead) with ``wake``
        seconds of frontend work for a request that finds the frontend thread idle and the
        overhead stretched by ``1 + contention * (requests in the server)``."""
        frontend = per_request

        def alone() -> dict[str, Any]:  # requests never meet: concurrency 1
            return predicted(args.policy, batch, table, "0", arrivals.constant(1.0, count=50),
                             None, frontend, wake, per_batch=per_batch,
                             timer_queues=args.timer_queues)

        # what the simulator lacks, per percentile: measured minus simulated without it
        warm = difference(measured["c1"], alone())
        if args.wake == "tail":  # the warm tail runs on the frontend thread: keep its mean
            excess = cost.mean_above_median(cost.parse_percentiles(warm))
            frontend = max(frontend - excess, frontend / 4)
            warm = difference(measured["c1"], alone())
        cold = difference(measured[f"p{cold_rate:g}"], sim("0", cold_rate, frontend, wake))

        def model(tau: float) -> str:
            return (f"warm={warm};cold={cold};tau={tau * 1e3:.4g}ms;parts={args.idle_parts};"
                    f"wake={args.wake}")

        def loss(tau: float) -> float:
            return sum(abs(error(sim(model(tau), rate, frontend, wake, contention)[f"p{q}_ms"],
                                 measured[f"p{rate:g}"][f"p{q}_ms"]))
                       for rate in fit_rates for q in (50, 99))

        tau = fit_tau(loss)
        return loss(tau), frontend, model(tau), warm

    wakes = FRONTEND_WAKES if args.fit_frontend else (0.0,)
    contentions = CONTENTIONS if args.fit_contention else (0.0,)
    fits = [(calibrate(wake, c), wake, c) for wake in wakes for c in contentions]
    (_, frontend, overhead, warm), wake, contention = min(fits, key=lambda f: f[0][0])
    tau = cost.IdleOverhead.parse(overhead).tau
    fit = {rate: sim(overhead, rate, frontend, wake, contention) for rate in fit_rates}
    rows = []
    for rate in rates:
        real = measured[f"p{rate:g}"]
        poisson = sim(overhead, rate, frontend, wake, contention)
        baseline = sim(warm, rate, frontend, wake)  # one overhead distribution, always warm
        replays = [predicted(args.policy, batch, table, overhead,
                             arrivals.read_trace(traces / name), rate, frontend, wake,
                             contention, args.inherit_idle, per_batch, args.timer_queues)
                   for name in real["traces"] if traces and (traces / name).exists()]
        traced = ({k: statistics.median(r[k] for r in replays) for k in replays[0]}
                  if replays else None)
        row: dict[str, Any] = {"rate": rate, "measured": real, "simulated": poisson,
                               "replayed_trace": traced, "warm_only": baseline}
        for key in ("throughput", "p50_ms", "p99_ms"):
            row[f"error_{key}"] = error(poisson[key], real[key])
            row[f"trace_error_{key}"] = error(traced[key], real[key]) if traced else math.nan
            row[f"warm_error_{key}"] = error(baseline[key], real[key])
        rows.append(row)
    return {"frontend_s": frontend, "frontend_wake_s": wake, "frontend_batch_s": per_batch,
            "timer_queues": args.timer_queues, "contention": contention,
            "overhead": overhead, "inherit_idle": args.inherit_idle,
            "tau_ms": tau * 1e3,
            "measured": measured, "fit": {f"{r:g}": f for r, f in fit.items()}, "rows": rows}


def fit_line(result: dict[str, Any]) -> str:
    measured = result["measured"]
    return (f"frontend {result['frontend_s'] * 1e3:.3f} ms per request, "
            f"{result.get('frontend_batch_s', 0.0) * 1e3:.3f} ms per batch, "
            f"{result['frontend_wake_s'] * 1e3:.3f} ms more to wake it; contention "
            f"{result['contention']:g}; overhead {result['overhead']}; at the fit rates: "
            + "; ".join(f"{rate}/s p50 {f['p50_ms']:.3f} vs {measured[f'p{rate}']['p50_ms']:.3f}"
                        f" ms, p99 {f['p99_ms']:.3f} vs {measured[f'p{rate}']['p99_ms']:.3f} ms"
                        for rate, f in result["fit"].items()))


FIGURES = ("throughput", "p50_ms", "p99_ms")


def _draw(args: argparse.Namespace, data: dict[str, Any], batch: BatchConfig,
          picked: list[int]) -> dict[str, Any]:
    """One bootstrap draw: the analysis of the rounds ``picked`` alone (no replays)."""
    runs = [{**run, "round": j} for j, r in enumerate(picked)
            for run in data["runs"] if run["round"] == r]
    result = analyse(args, {**data, "runs": runs}, batch, None)
    return {"rounds": sorted(picked), "tau_ms": result["tau_ms"],
            "errors": {f"{row['rate']:g}": {k: row[f"error_{k}"] for k in FIGURES}
                       for row in result["rows"]}}


def bootstrap(args: argparse.Namespace, data: dict[str, Any], batch: BatchConfig,
              count: int, jobs: int = 1) -> dict[str, Any]:
    """How often a run like this one would pass: ``count`` times, draw as many rounds as were
    measured, with replacement, and calibrate and predict from them alone (no replays). The
    errors' spread over the draws is what the rounds' noise does to the check. ``jobs``
    processes share the draws (the draws are the same for any number)."""
    rng = random.Random(args.seed)
    rounds = sorted({run["round"] for run in data["runs"]})
    picks = [[rng.choice(rounds) for _ in rounds] for _ in range(count)]
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        draws = []
        for draw in pool.map(functools.partial(_draw, args, data, batch), picks):
            draws.append(draw)
            print(f"draw {len(draws)}/{count}: tau {draw['tau_ms']:.2f} ms, "
                  + ", ".join(f"{rate}: " + "/".join(f"{e[k] * 100:+.0f}" for k in FIGURES)
                              for rate, e in draw["errors"].items()), flush=True)
    within = [sum(abs(e) <= TOLERANCE for errs in d["errors"].values() for e in errs.values())
              for d in draws]
    figures = len(FIGURES) * len(data["rates"])
    return {"draws": draws, "all_within": sum(w == figures for w in within),
            "figures_within": sum(within), "figures": figures * count}


def bootstrap_lines(boot: dict[str, Any] | None) -> list[str]:
    if not boot:
        return []
    draws = boot["draws"]
    lines = ["", f"Bootstrap ({len(draws)} draws of the rounds with replacement, each "
             f"calibrated and predicted on its own): all figures within {TOLERANCE:.0%} in "
             f"{boot['all_within']} of {len(draws)} draws; {boot['figures_within']} of "
             f"{boot['figures']} figures. Per figure, the share of draws within "
             f"{TOLERANCE:.0%} and the errors' range:", ""]
    for rate in draws[0]["errors"]:
        cells = []
        for k in FIGURES:
            errs = sorted(d["errors"][rate][k] for d in draws)
            share = sum(abs(e) <= TOLERANCE for e in errs) / len(errs)
            cells.append(f"{k.removesuffix('_ms')} {share:.0%} ({errs[0] * 100:+.0f}% to "
                         f"{errs[-1] * 100:+.0f}%)")
        lines.append(f"- {rate}/s: " + "; ".join(cells))
    return lines


def cpu_lines(measured: dict[str, dict[str, Any]]) -> list[str]:
    """How busy the two cores were at each load (medians over the rounds), when measured."""
    loads = [(load, m) for load, m in measured.items() if "server_cores" in m]
    if not loads:
        return []
    return ["CPU (cores busy: server + perf_analyzer; the server's CPU ms per request; the "
            "share the hypervisor stole; the mean batch): "
            + "; ".join(f"{load} {m['server_cores']:.2f} + {m['client_cores']:.2f}, "
                        f"{m['server_cpu_ms']:.3f} ms, {m['steal']:.1%}"
                        + (f", {m['rows_per_batch']:.2f} rows per batch"
                           if "rows_per_batch" in m else "") for load, m in loads),
            ""]


def report_text(data: dict[str, Any], result: dict[str, Any]) -> str:
    measured = result["measured"]
    lines = [f"# Simulator fidelity: mlp, policy {data['policy']}"
             + (f" ({data['delay_us']} us delay)" if data["policy"] == "dynamic" else "")
             + f", {data['protocol']}, {data['when']}", "",
             f"Measured: {len({r['round'] for r in data['runs']})} rounds"
             + (f" (rounds {', '.join(map(str, data['dropped_rounds']))} left out: the "
                "hypervisor stole over the limit, `--max-steal`, of the CPU during a load)"
                if data.get("dropped_rounds") else "")
             + ", each load once per round in a shuffled order, on one server"
             + (f" per run ({data['pooled']} runs pooled)" if data.get("pooled") else "")
             + "; each figure the median over the rounds (the range in brackets). "
             f"Frontend thread {result['frontend_s'] * 1e3:.3f} ms per request (`--frontend`"
             + (f") and {result['frontend_batch_s'] * 1e3:.3f} ms per batch (`--frontend-batch`"
                "), from its CPU at concurrency 1 and 8 ("
                + ("per request less the warm tail's mean, which `--wake tail` charges it; "
                   if "wake=tail" in result["overhead"] else "")
                if result.get("frontend_batch_s") else
                ", from the throughput at concurrency 8; ")
             + f"{result['frontend_wake_s'] * 1e3:.3g} ms more "
             f"for a request that finds it idle"
             + ("; the batcher's timer waits for the thread" if result.get("timer_queues")
                else "") + f"), contention {result['contention']:g} "
             f"(overhead stretched by 1 + c * requests in the server; both fitted where "
             f"asked). Overhead outside the instance: warm from "
             f"concurrency 1, cold from Poisson at {data['cold_rate']:g}/s, the idle time "
             f"constant tau fitted to p50 and p99 at "
             f"{', '.join(f'{r:g}' for r in data['fit_rates'])}/s "
             f"(`--overhead '{result['overhead']}'`"
             + ("; `--inherit-idle`: a request arriving while the one that woke the server is "
                "still in it is as cold" if result.get("inherit_idle") else "")
             + "). Cost table (ms): "
             + ", ".join(f"{r}: {float(s) * 1e3:.3f}" for r, s in data["cost_s"].items()), "",
             "Calibration loads (median; range over the rounds): " + "; ".join(
                 f"{load} {m['throughput']:.0f}/s p50 {m['p50_ms']:.3f} p99 {m['p99_ms']:.3f} "
                 f"[{m['range']['p99_ms'][0]:.3f}-{m['range']['p99_ms'][1]:.3f}]"
                 for load, m in measured.items()
                 if load not in {f"p{r:g}" for r in data["rates"]}), "",
             *cpu_lines(measured),
             "Columns: infer/s, p50 ms, p99 ms. *Simulated*: Poisson arrivals, the idle model; "
             "*replayed*: the server's own recorded arrivals; *warm only*: Poisson with the "
             "concurrency-1 overhead alone (the model before the idle term), for comparison.", "",
             "| rate | measured (p99 range) | simulated | error | replayed trace | error "
             "| warm only | error |",
             "|---|---|---|---|---|---|---|---|"]

    def fmt(d: dict[str, float] | None) -> str:
        return f"{d['throughput']:.0f}, {d['p50_ms']:.3f}, {d['p99_ms']:.3f}" if d else "-"

    def errs(row: dict[str, Any], prefix: str) -> str:
        if math.isnan(row[f"{prefix}p50_ms"]):
            return "-"
        return ", ".join(f"{row[f'{prefix}{k}'] * 100:+.0f}%"
                         + ("" if abs(row[f"{prefix}{k}"]) <= TOLERANCE else " ✗")
                         for k in FIGURES)

    for row in result["rows"]:
        lo, hi = row["measured"]["range"]["p99_ms"]
        lines.append(f"| {row['rate']:g} | {fmt(row['measured'])} ({lo:.3f}-{hi:.3f}) | "
                     f"{fmt(row['simulated'])} | {errs(row, 'error_')} | "
                     f"{fmt(row['replayed_trace'])} | {errs(row, 'trace_error_')} | "
                     f"{fmt(row['warm_only'])} | {errs(row, 'warm_error_')} |")
    within = all(abs(row[f"error_{k}"]) <= TOLERANCE for row in result["rows"]
                 for k in FIGURES)
    lines += ["", f"All Poisson predictions within {TOLERANCE:.0%}: {'yes' if within else 'no'}"
              + (" (smoke run: not a measurement)" if data["smoke"] else ""),
              *bootstrap_lines(result.get("bootstrap"))]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", choices=["dynamic", "fifo"], default="dynamic")
    p.add_argument("--max-queue-delay-us", type=int, default=500)
    p.add_argument("--rates", default="200,400,800")
    p.add_argument("--rounds", type=int, default=15,
                   help="how many times each load is measured (figures: the median)")
    p.add_argument("--measure-ms", type=int, default=4000)
    p.add_argument("--cold-rate", type=float, default=25.0,
                   help="the Poisson rate (requests/s) the cold overhead is calibrated at")
    p.add_argument("--fit-rates", default="100,150,300",
                   help="the Poisson rates the idle time constant tau is fitted at")
    p.add_argument("--idle-parts", type=int, default=4,
                   help="the idle model's parts (see nursery.simulate.cost.IdleOverhead)")
    p.add_argument("--wake", choices=["outside", "frontend", "tail"], default="tail",
                   help="where the idle model's waking time is spent")
    p.add_argument("--inherit-idle", action=argparse.BooleanOptionalAction, default=True,
                   help="a request arriving while the one that woke the server is still in it "
                   "is as cold as that one (the engine's inherit_idle)")
    p.add_argument("--frontend-batch", action=argparse.BooleanOptionalAction, default=True,
                   help="split the frontend thread's cost into work per request and work per "
                   "batch (the simulator's --frontend-batch), as its CPU splits between "
                   "concurrency 1 and 8 (needs the per-thread CPU and batch counts that runs "
                   "since 2026-11-24 01:40 record)")
    p.add_argument("--timer-queues", action=argparse.BooleanOptionalAction, default=False,
                   help="the batcher's timer fires only once the frontend thread has done the "
                   "work queued before it (the simulator's --timer-queues)")
    p.add_argument("--fit-frontend", action="store_true",
                   help="fit the frontend thread's extra work for a request that finds it "
                   "idle (at concurrency 8 it is never idle: requests share its wake-ups and "
                   "system calls)")
    p.add_argument("--fit-contention", action=argparse.BooleanOptionalAction, default=False,
                   help="fit how much overlapping requests stretch each other's overhead "
                   "(the engine's contention)")
    p.add_argument("--bootstrap", type=int, default=0, metavar="N",
                   help="after the analysis, redo it N times on the rounds drawn with "
                   "replacement: how often a run like this one passes (about 2 minutes each)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="processes for the bootstrap's draws (never beside a measurement)")
    p.add_argument("--max-steal", type=float, default=0.05, metavar="SHARE",
                   help="leave out a round in which the hypervisor stole more than this share "
                   "of the CPU during any load; while measuring, add a round for it (at most "
                   f"{MAX_SPOILED}; default 0.05)")
    p.add_argument("--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    p.add_argument("--reuse", type=Path, nargs="+", metavar="DIR",
                   help="analyse the measurements of an earlier run (its measurements.json); "
                   "several runs of the same check are pooled as one run of all their rounds")
    p.add_argument("--smoke", action="store_true", help="a few seconds: checks the pieces only")
    args = p.parse_args()
    if args.reuse:
        if len(args.reuse) > 1 and not args.out:
            p.error("pooling runs needs --out (no one run's summary.md is theirs)")
        try:
            data = pooled(args.reuse)
        except ValueError as exc:
            p.error(str(exc))
        args.policy = data["policy"]
        out = args.out or args.reuse[0]
    else:
        rates = [float(r) for r in args.rates.split(",")]
        fit_rates = [float(r) for r in args.fit_rates.split(",")]
        if {args.cold_rate, *fit_rates} & set(rates):
            p.error("the calibration rates (--cold-rate, --fit-rates) must differ from the "
                    "rates checked (--rates): a rate that was fitted proves nothing")
        if args.smoke:
            rates, fit_rates, args.rounds, args.measure_ms = rates[:1], fit_rates[:1], 1, 300
            args.cold_rate = 50.0  # a 300 ms window needs a few requests
        if not PERF_ANALYZER.exists():
            print(f"perf_analyzer not found at {PERF_ANALYZER}", file=sys.stderr)
            return 1
        data = {"policy": args.policy, "delay_us": args.max_queue_delay_us,
                "protocol": args.protocol, "rates": rates, "fit_rates": fit_rates,
                "cold_rate": args.cold_rate, "rounds": args.rounds, "smoke": args.smoke,
                "when": time.strftime("%Y-%m-%d %H:%M")}
        out = args.out or (ROOT / "bench" / "results"
                           / f"sim-fidelity-{time.strftime('%Y%m%d-%H%M')}")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        repo = make_repo(Path(tmp_name), data["policy"], data["delay_us"])
        from nursery.config.model import read_model_config

        config, _ = read_model_config(repo / "mlp", "mlp", backends=get_factory)
        batch = config.batching or BatchConfig(max_batch_size=config.max_batch_size)
        if not args.reuse:
            table = cost.profile(repo / "mlp", "mlp", runs=50)
            print("cost (rows: ms): " + ", ".join(f"{r}: {s * 1e3:.3f}" for r, s in table.points))
            data["cost_s"] = table.to_json()
            plan = load_plan(args, data["rates"], data["fit_rates"])
            data["runs"] = measure(args, repo, out, plan)
            (out / "measurements.json").write_text(json.dumps(data, indent=2) + "\n")
    dropped = spoiled_rounds(data["runs"], args.max_steal)
    if len(dropped) == len({r["round"] for r in data["runs"]}):
        print(f"every round had a load in which the hypervisor stole over {args.max_steal:.0%} "
              "of the CPU: nothing to analyse (a higher --max-steal keeps them)", file=sys.stderr)
        return 1
    if dropped:
        print(f"rounds {', '.join(str(r + 1) for r in dropped)}: the hypervisor stole over "
              f"{args.max_steal:.0%} of the CPU during a load; left out", flush=True)
    data = {**data, "runs": [r for r in data["runs"] if r["round"] not in dropped],
            "dropped_rounds": [r + 1 for r in dropped]}
    result = analyse(args, data, batch, args.reuse[0] if args.reuse else out)
    print(fit_line(result))
    if args.bootstrap:
        result["bootstrap"] = bootstrap(args, data, batch, args.bootstrap, args.jobs)
    text = report_text(data, result)
    print(text)
    (out / "summary.md").write_text(text)
    (out / "fidelity.json").write_text(json.dumps(
        {**{k: v for k, v in data.items() if k != "runs"}, **result}, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

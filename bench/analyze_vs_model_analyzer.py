"""``python -m nursery analyze`` beside Triton's Model Analyzer on the same model, grid, loads
and p99 budget (issue 31): the time each takes to a recommendation, and the throughput of
what each recommends, measured the same way.

Model Analyzer (``triton-model-analyzer`` on PyPI, 1.58.0) runs here in remote launch mode
against nursery: nursery serves with ``--model-control-mode explicit`` and Model Analyzer
loads each configuration it tries through the repository API's ``config`` override, then
runs perf_analyzer at each concurrency (see ``bench/analyze_vs_model_analyzer.md`` for the
short check that showed it). It lives in its own virtual environment (its pins clash with the
project's): ``bash scripts/install_model_analyzer.sh`` makes ``.venv-ma/``.

Steps: (1) Model Analyzer ``profile`` in brute mode over instance counts 1..``--max-instances``,
``max_batch_size`` powers of two up to ``--max-batch``, concurrencies ``--concurrency``, with
``--latency-budget``, timed; its best configuration under the budget read from its
``metrics-model-inference.csv``. (2) ``python -m nursery analyze`` on the same grid (dynamic
batcher, no queue delay: Model Analyzer's brute search does not vary it), timed; and once more
with its whole default space (delays, FIFO, the latency-objective batcher). (3) Every
recommendation measured with perf_analyzer at every concurrency on one server, in
``--rounds`` interleaved rounds; the medians in ``summary.md``.

``--sweep`` instead (or where Model Analyzer cannot run) sweeps the same grid by brute force
with perf_analyzer on the real server, timed, as Model Analyzer would, and compares that best
with analyze's.

    bash scripts/install_model_analyzer.sh
    python bench/analyze_vs_model_analyzer.py --model add_sub --concurrency 1,4,16 \\
        --latency-budget 5                      # ~30-60 minutes on the 2-core machine
    python bench/analyze_vs_model_analyzer.py --sweep --model add_sub ...
    python bench/analyze_vs_model_analyzer.py --smoke   # the pieces, ~2 minutes
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nursery.analyze import profiler, space  # noqa: E402
from nursery.analyze.search import Load  # noqa: E402
from nursery.backends.base import get_factory  # noqa: E402
from nursery.config import pbtext  # noqa: E402
from nursery.config.model import read_model_config  # noqa: E402
from nursery.schema import inference as pb  # noqa: E402

MA = ROOT / ".venv-ma" / "bin" / "model-analyzer"
PA = ROOT / ".tools" / "perf_analyzer" / "perf_analyzer"


def serve_explicit(repo: Path, model: str,
                   log: Path) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    ports = {k: profiler.free_port() for k in ("http", "grpc", "metrics")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nursery", "serve", "--model-repository", str(repo),
         "--model-control-mode", "explicit", "--load-model", model,
         "--http-address", "127.0.0.1", "--http-port", str(ports["http"]),
         "--grpc-address", "127.0.0.1", "--grpc-port", str(ports["grpc"]),
         "--metrics-address", "127.0.0.1", "--metrics-port", str(ports["metrics"])],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports['http']}/v2/health/ready",
                                        timeout=2) as r:
                if r.status == 200:
                    return proc, ports
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"nursery did not start: see {log}")


def run_model_analyzer(args: argparse.Namespace, repo: Path, out: Path) -> dict[str, Any]:
    if not MA.exists():
        raise SystemExit(f"{MA} is missing: bash scripts/install_model_analyzer.sh (or --sweep)")
    proc, ports = serve_explicit(repo, args.model, out / "ma-server.log")
    config = out / "ma.yaml"
    config.write_text("\n".join([
        f"model_repository: {repo}", "triton_launch_mode: remote",
        f"triton_http_endpoint: 127.0.0.1:{ports['http']}",
        f"triton_grpc_endpoint: 127.0.0.1:{ports['grpc']}",
        f"triton_metrics_url: http://127.0.0.1:{ports['metrics']}/metrics",
        f"perf_analyzer_path: {PA}", f"output_model_repository_path: {out / 'ma_repo'}",
        "override_output_model_repository: true", f"export_path: {out / 'ma'}",
        f"checkpoint_directory: {out / 'ma' / 'checkpoints'}",
        "run_config_search_mode: brute",
        f"run_config_search_max_instance_count: {args.max_instances}",
        f"run_config_search_max_model_batch_size: {args.max_batch}",
        "concurrency: [" + ", ".join(str(c) for c in args.concurrency) + "]",
        f"latency_budget: {args.latency_budget:g}",
        "profile_models:", f"  {args.model}:", "    cpu_only: true", ""]))
    (out / "ma").mkdir(exist_ok=True)
    started = time.monotonic()
    try:
        done = subprocess.run([str(MA), "profile", "-f", str(config)], cwd=out,
                              capture_output=True, text=True, timeout=args.ma_timeout)
    finally:
        proc.terminate()
        proc.wait(30)
    seconds = time.monotonic() - started
    (out / "ma.log").write_text(done.stdout + done.stderr)
    with (out / "ma" / "results" / "metrics-model-inference.csv").open() as f:
        rows = list(csv.DictReader(f))
    p99 = next(k for k in rows[0] if "p99" in k.lower())
    thru = next(k for k in rows[0] if "throughput" in k.lower())
    within = [r for r in rows if float(r[p99]) <= args.latency_budget]
    best = max(within or rows, key=lambda r: float(r[thru]))
    name = best.get("Model Config Path") or best.get("Model Config")
    return {"seconds": seconds, "config": (out / "ma_repo" / name / "config.pbtxt").read_text(),
            "row": best, "met_budget": bool(within)}


def run_analyze(args: argparse.Namespace, repo: Path, out: Path, *extra: str) -> dict[str, Any]:
    target = out / ("analyze" + "-".join(extra).replace("--", "-"))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nursery", "analyze", "--model-repository", str(repo),
         "--model", args.model, "--concurrency", ",".join(map(str, args.concurrency)),
         "--latency-budget-ms", f"{args.latency_budget:g}", "--output-dir", str(target),
         *extra], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    (target / "stderr.log").write_text(done.stderr)
    recommended = repo / args.model / "config.pbtxt.recommended"
    closest = target / "config.pbtxt.closest"  # when nothing met the budget
    config = (recommended.read_text() if done.returncode == 0
              else closest.read_text() if closest.exists() else None)
    return {"seconds": seconds, "config": config, "met_budget": done.returncode == 0,
            "stdout": done.stdout}


def sweep(args: argparse.Namespace, repo: Path, out: Path) -> dict[str, Any]:
    """The same grid by brute force: every candidate on the real server, perf_analyzer at
    every concurrency."""
    model_path = repo / args.model
    model = read_model_config(model_path, args.model, backends=get_factory)[0]
    original = (model_path / "config.pbtxt").read_text()
    grid = space.grid(model, instances=list(range(1, args.max_instances + 1)),
                      max_batch_sizes=[s for s in (1, 2, 4, 8, 16, 32, 64, 128)
                                       if s <= min(args.max_batch, model.max_batch_size)],
                      delays_us=[0], objective=None, policies=["dynamic"])
    started = time.monotonic()
    best: tuple[float, str] | None = None
    fallback: tuple[float, str] | None = None  # the most throughput, when none meets
    for k, candidate in enumerate(grid):
        name = f"{args.model}__s{k}"
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            scratch = profiler.scratch_repo(Path(tmp), model_path, {
                name: space.config_text(original, candidate, None, name=name)})
            server = profiler.ServerProcess(scratch, out / f"sweep-{k}.log")
            try:
                figures = [profiler.perf_analyzer(PA, server, name, model,
                                                  Load("concurrency", c), args.window_ms,
                                                  out / f"sweep-{k}-{c}.csv")
                           for c in args.concurrency]
            finally:
                server.stop()
        if any("error" in f for f in figures):
            continue
        total = sum(f["throughput"] for f in figures)
        text = space.config_text(original, candidate, None)
        if fallback is None or total > fallback[0]:
            fallback = (total, text)
        if all(f["p99_ms"] <= args.latency_budget for f in figures):
            if best is None or total > best[0]:
                best = (total, text)
    chosen = best or fallback
    return {"seconds": time.monotonic() - started, "config": chosen[1] if chosen else None,
            "met_budget": best is not None, "candidates": len(grid)}


def measure(args: argparse.Namespace, repo: Path, configs: dict[str, str | None],
            out: Path) -> dict[str, list[dict[str, Any]]]:
    model_path = repo / args.model
    model = read_model_config(model_path, args.model, backends=get_factory)[0]
    named = {f"{args.model}__{label}": text for label, text in configs.items() if text}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in named}
    if not named:
        return results
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        texts = {}
        for name, text in named.items():
            proto = pbtext.parse(text, pb.ModelConfig())
            proto.name = name
            texts[name] = pbtext.dumps(proto)
        scratch = profiler.scratch_repo(Path(tmp), model_path, texts)
        server = profiler.ServerProcess(scratch, out / "measure-server.log")
        try:
            for r in range(args.rounds):
                for name in (list(named) if r % 2 == 0 else list(reversed(named))):
                    for c in args.concurrency:
                        figures = profiler.perf_analyzer(PA, server, name, model,
                                                         Load("concurrency", c), args.window_ms,
                                                         out / f"measure-{name}-{c}-{r}.csv")
                        results[name].append({"round": r, "concurrency": c, **figures})
        finally:
            server.stop()
    return results


def summary(args: argparse.Namespace, found: dict[str, dict[str, Any]],
            measured: dict[str, list[dict[str, Any]]]) -> str:
    lines = [f"# analyze vs Model Analyzer: {args.model}", "",
             f"Grid: instances 1..{args.max_instances}, max_batch_size powers of two up to "
             f"{args.max_batch}; concurrency {args.concurrency}; p99 budget "
             f"{args.latency_budget:g} ms; {args.rounds} rounds of {args.window_ms} ms "
             "windows.", "", "| tool | time to a recommendation (s) |", "|---|---:|"]
    lines += [f"| {label}{'' if f.get('met_budget', True) else ' (none met the budget)'} | "
              f"{f['seconds']:.0f} |" for label, f in found.items()]
    lines += ["", "| recommendation | concurrency | throughput (median) | p99 ms (median) |",
              "|---|---:|---:|---:|"]
    for name, rows in measured.items():
        for c in args.concurrency:
            mine = [r for r in rows if r["concurrency"] == c and "error" not in r]
            if mine:
                lines.append(f"| {name} | {c} | "
                             f"{statistics.median(r['throughput'] for r in mine):.0f} | "
                             f"{statistics.median(r['p99_ms'] for r in mine):.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="add_sub")
    p.add_argument("--model-repository", default=str(ROOT / "model_repository"))
    p.add_argument("--concurrency", default="1,4,16",
                   type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--latency-budget", type=float, default=5.0, help="p99, ms")
    p.add_argument("--max-instances", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window-ms", type=int, default=2000)
    p.add_argument("--ma-timeout", type=int, default=4 * 3600)
    p.add_argument("--sweep", action="store_true",
                   help="a brute-force perf_analyzer sweep instead of Model Analyzer")
    p.add_argument("--smoke", action="store_true", help="one concurrency, tiny grid, 1 round")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.smoke:
        args.concurrency, args.max_instances, args.max_batch = [2], 1, 2
        args.rounds, args.window_ms, args.latency_budget = 1, 500, 50.0
    out = args.out or ROOT / "bench" / "results" / time.strftime("analyze-vs-ma-%Y%m%d-%H%M")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(Path(args.model_repository) / args.model, repo / args.model)
        found: dict[str, dict[str, Any]] = {}
        if args.sweep:
            found["perf_analyzer sweep"] = sweep(args, repo, out)
        else:
            found["Model Analyzer"] = run_model_analyzer(args, repo, out)
        found["analyze (same grid)"] = run_analyze(
            args, repo, out, "--instances", ",".join(str(i) for i in
                                                      range(1, args.max_instances + 1)),
            "--delays-us", "0", "--policies", "dynamic")
        found["analyze (default space)"] = run_analyze(
            args, repo, out, "--instances", ",".join(str(i) for i in
                                                      range(1, args.max_instances + 1)))
        labels = {"Model Analyzer": "ma", "perf_analyzer sweep": "sweep",
                  "analyze (same grid)": "analyze", "analyze (default space)": "analyze_all"}
        measured = measure(args, repo, {labels[k]: f["config"] for k, f in found.items()}, out)
    text = summary(args, found, measured)
    (out / "summary.md").write_text(text)
    (out / "measurements.json").write_text(json.dumps(
        {"found": {k: {kk: vv for kk, vv in v.items() if kk != "config"}
                   for k, v in found.items()}, "measured": measured}, indent=2, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

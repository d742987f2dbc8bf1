"""Response cache: latency of a hit vs a miss (and vs no cache) for the MLP, with perf_analyzer.

    python bench/cache.py [--concurrency 1 16] [--measure-ms 3000]

Starts ``python -m nursery serve`` on free loopback ports with ``--cache-config local,size=N``
over a repository holding the MLP twice (``mlp_cached`` with ``response_cache { enable: true }``
and ``mlp`` without), then runs perf_analyzer (HTTP, binary tensors, sync, no batching):

- hit:      ``mlp_cached``, one input repeated (every request after the first is a hit);
- miss:     ``mlp_cached``, 512 distinct inputs cycled through a cache that holds about 16
            answers (every request misses: lookup, run, insert, eviction);
- no cache: ``mlp``, the same 512 inputs.

Prints a table and writes it (with the machine) to ``bench/results/cache-<time>/``. Never run
two benchmarks at once on the 2-core machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import PERF_ANALYZER, ServerProcess, make_models  # noqa: E402


def _repo(where: Path) -> Path:
    repo = where / "repo"
    for name, extra in (("mlp_cached", "response_cache { enable: true }\n"), ("mlp", "")):
        make_models.write_model(
            repo, name, make_models.build_mlp(),
            make_models.config_text(name, [("INPUT0", "FP32", [784])],
                                    [("OUTPUT0", "FP32", [10])], 8,
                                    'parameters { key: "intra_op_thread_count" value: '
                                    '{ string_value: "1" } }\n' + extra))
    return repo


def _data(where: Path, distinct: int) -> Path:
    rng = np.random.default_rng(0)
    rows = [{"INPUT0": {"content": rng.standard_normal(784).astype(np.float32).round(4).tolist(),
                        "shape": [784]}} for _ in range(distinct)]
    path = where / f"data_{distinct}.json"
    path.write_text(json.dumps({"data": rows}))
    return path


def _run(server: ServerProcess, model: str, data: Path, c: int, measure_ms: int,
         out: Path) -> dict[str, float]:
    csv_path = out / f"{model}_{data.stem}_c{c}.csv"
    for stability in ("20", "50"):  # a looser criterion once: the machine is noisy
        cmd = [str(PERF_ANALYZER), "-m", model, "-u", server.url, "--concurrency-range",
               str(c), "-p", str(measure_ms), "--stability-percentage", stability,
               "--max-trials", "8", "--input-data", str(data), "-f", str(csv_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode == 0:
            break
    else:
        raise RuntimeError(proc.stdout + proc.stderr)
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    return {"infer_per_s": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1000, "p99_ms": float(row["p99 latency"]) / 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--measure-ms", type=int, default=3000)
    args = parser.parse_args()
    out = ROOT / "bench" / "results" / f"cache-{time.strftime('%Y%m%d-%H%M')}"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        repo = _repo(where)
        one, many = _data(where, 1), _data(where, 512)
        # one MLP answer is about 168 bytes of bookkeeping + 40 bytes of data
        server = ServerProcess(repo, "--cache-config", "local,size=3400",
                               log_path=where / "server.log")
        rows = []
        try:
            server.wait_ready()
            for c in args.concurrency:
                for label, model, data in (("hit", "mlp_cached", one),
                                           ("miss", "mlp_cached", many),
                                           ("no cache", "mlp", many)):
                    r = _run(server, model, data, c, args.measure_ms, out)
                    rows.append({"case": label, "concurrency": c, **r})
                    print(f"{label:9s} c={c:<3d} {r['infer_per_s']:8.0f} infer/s  "
                          f"p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms", flush=True)
            with urllib_open(server) as text:
                hits = [line for line in text.splitlines() if line.startswith("nv_cache_num_")]
        finally:
            server.stop()
    lines = ["# Response cache: hit vs miss, MLP, perf_analyzer (HTTP binary, sync)", "",
             f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}",
             f"command: python bench/cache.py --concurrency {' '.join(map(str, args.concurrency))}"
             f" --measure-ms {args.measure_ms}", "",
             "| case | concurrency | infer/s | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['concurrency']} | {r['infer_per_s']:.0f} | "
              f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} |" for r in rows]
    lines += ["", "cache counters at the end:", "```", *hits, "```"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"summary: {out / 'summary.md'}")


class urllib_open:  # noqa: N801 - a tiny context manager reading the metrics text
    def __init__(self, server: ServerProcess) -> None:
        self.url = f"http://127.0.0.1:{server.metrics_port}/metrics"

    def __enter__(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url, timeout=10) as r:
            return str(r.read().decode())

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()

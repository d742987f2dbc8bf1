#!/usr/bin/env python3
"""Does perf_analyzer's window length move the latency it reports? (the fidelity check's loads)

    python bench/pa_window.py [--rates 200,300] [--windows 4000,8000] [--rounds 8]
                              [--out bench/results/pa-window-<time>]

On one ``python -m nursery serve`` with the fidelity check's model and policy (the MLP, the
dynamic batcher with a 500 us delay), measures Poisson load at each rate with each
``--measurement-interval``, every pair once per round in a shuffled order, and reports each
load's median p50 and p99 over the rounds and, per rate, the median over the rounds of the
p99 with each window against the longest window's p99 (the same round). Writes
``results.json`` and ``summary.md``. Never run it beside another benchmark.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sim_fidelity as sf  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="200,300")
    p.add_argument("--windows", default="4000,8000", help="measurement intervals, ms")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    windows = sorted(int(w) for w in args.windows.split(","))
    out = args.out or sf.ROOT / "bench" / "results" / f"pa-window-{time.strftime('%Y%m%d-%H%M')}"
    out.mkdir(parents=True, exist_ok=True)
    loads = [(rate, ms) for rate in rates for ms in windows]
    rng = random.Random(0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        server = sf.Server(sf.make_repo(Path(tmp), "dynamic", 500), out / "server.log")
        try:
            for rnd in range(args.rounds):
                order = loads[:]
                rng.shuffle(order)
                for rate, ms in order:
                    time.sleep(sf.PAUSE_S)
                    before = sf.cpu_seconds(server.proc.pid)
                    row = sf.perf_analyzer(server.url("http"), "http",
                                           [*sf.poisson_mode(rate), "-s", "25"], ms,
                                           out / f"pa-{rnd:02d}-{rate:g}-{ms}.csv")
                    after = sf.cpu_seconds(server.proc.pid)
                    stolen, total = after[3] - before[3], after[4] - before[4]
                    results.append({"round": rnd, "rate": rate, "window_ms": ms, **row,
                                    "steal": stolen / max(1, total)})
                    print(f"round {rnd + 1} {rate:g}/s {ms} ms: p50 {row['p50_ms']:.3f} "
                          f"p99 {row['p99_ms']:.3f}", flush=True)
        finally:
            server.stop()
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [f"# perf_analyzer's window length, {time.strftime('%Y-%m-%d %H:%M')}", "",
             f"MLP, dynamic batcher (500 us), HTTP, Poisson; {args.rounds} rounds, each load "
             f"once per round in a shuffled order, one server; the hypervisor stole at most "
             f"{max(r['steal'] for r in results):.1%} of the CPU during a load.", "",
             "| rate | window ms | p50 ms (median) | p99 ms (median) | p99 / longest window's "
             "(median over rounds) | rounds below 1 |", "|---|---|---|---|---|---|"]
    for rate in rates:
        def of(ms: int, rate: float = rate) -> list[dict]:
            return sorted((r for r in results if r["rate"] == rate and r["window_ms"] == ms),
                          key=lambda r: r["round"])
        longest = of(windows[-1])
        for ms in windows:
            ratios = [a["p99_ms"] / b["p99_ms"] for a, b in zip(of(ms), longest, strict=True)]
            lines.append(f"| {rate:g} | {ms} | {statistics.median(r['p50_ms'] for r in of(ms)):.3f}"
                         f" | {statistics.median(r['p99_ms'] for r in of(ms)):.3f} | "
                         f"{statistics.median(ratios):.3f} | "
                         f"{sum(x < 1 for x in ratios)} of {len(ratios)} |")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

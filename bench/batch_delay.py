#!/usr/bin/env python3
"""How closely the dynamic batcher keeps its ``max_queue_delay_microseconds``.

    python bench/batch_delay.py [--delays 0,250,500,1000,2000] [--concurrency 1]
                                [--measure-ms 4000] [--rounds 3] [--root DIR]

At concurrency 1 no second request ever joins a batch, so each request waits the whole delay:
its latency should be the latency without batching plus the delay. For each delay this starts
``python -m nursery serve`` on the MLP with that ``dynamic_batching`` block (loopback, free
ports), runs perf_analyzer, and prints p50 and the *excess*: p50 minus the no-delay p50 minus
the delay, the time the server holds a batch beyond what it was told. The delays are measured
in ``--rounds`` rounds, each in a shuffled order (the machine drifts); figures are medians.

``--root DIR`` serves from another checkout of nursery (an A/B of two versions: run it once
per checkout, one after the other, never beside another benchmark).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import sim_fidelity as sf  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delays", default="0,250,500,1000,2000", help="microseconds")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--measure-ms", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--root", type=Path, default=ROOT, help="the nursery checkout to serve")
    args = p.parse_args()
    delays = [int(d) for d in args.delays.split(",")]
    if 0 not in delays:
        delays.insert(0, 0)
    results: dict[int, list[dict[str, float]]] = {d: [] for d in delays}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for rnd in range(args.rounds):
            order = delays[:]
            rng.shuffle(order)
            for delay in order:
                repo = tmp / f"repo-{delay}"
                if not repo.exists():
                    shutil.copytree(ROOT / "model_repository" / "mlp", repo / "mlp")
                    if delay:
                        config = repo / "mlp" / "config.pbtxt"
                        config.write_text(config.read_text() + "dynamic_batching { "
                                          f"max_queue_delay_microseconds: {delay} }}\n")
                server = sf.Server(repo, tmp / "server.log", root=args.root.resolve())
                try:
                    time.sleep(1.0)
                    result = sf.perf_analyzer(
                        server.url("http"), "http",
                        ["--concurrency-range", str(args.concurrency), "-s", "25"],
                        args.measure_ms, tmp / "pa.csv")
                finally:
                    server.stop()
                results[delay].append(result)
                print(f"round {rnd + 1}/{args.rounds} delay {delay} us: "
                      f"{result['throughput']:.0f} infer/s, p50 {result['p50_ms']:.3f} ms",
                      flush=True)
    base = statistics.median(r["p50_ms"] for r in results[0])
    print(f"\nnursery at {args.root}, MLP over HTTP, concurrency {args.concurrency}, "
          f"medians of {args.rounds} rounds\n")
    print("| delay (us) | infer/s | p50 ms | p99 ms | excess over the delay (ms) |")
    print("|---|---|---|---|---|")
    for delay in delays:
        rs = results[delay]
        p50 = statistics.median(r["p50_ms"] for r in rs)
        print(f"| {delay} | {statistics.median(r['throughput'] for r in rs):.0f} | {p50:.3f} | "
              f"{statistics.median(r['p99_ms'] for r in rs):.3f} | "
              + ("-" if delay == 0 else f"{p50 - base - delay / 1e3:+.3f}") + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

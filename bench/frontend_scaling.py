#!/usr/bin/env python3
"""How `--http-frontend-processes N` scales with cores: one server per N, perf_analyzer at each
concurrency, throughput and the server's CPU per request.

    python bench/frontend_scaling.py [--frontends 0,1,2,4,8] [--concurrency 64,256]
                                     [--window-ms 2000] [--protocol http-bin]

For a machine with cores to spare (issue 26's "beyond this machine"): on 2 cores a frontend
process is a loss (docs/architecture.md); this measures what it gives where each process can
have a core. The model is scripts/make_models.py's MLP (ONNX Runtime on the CPU, one intra-op
thread, up to 64 rows a batch) with dynamic batching (1 ms delay), as the peer sweep batches.
Per row: perf_analyzer's mean of three windows (infer/s), the server's CPU µs per request with
its frontend processes, and the engine's trio thread's share (the thread that saturates first).
N=0 is the single process.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ab_perf import perf  # noqa: E402
from tests.conftest import ServerProcess, make_models  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frontends", default="0,1,2,4,8")
    parser.add_argument("--concurrency", default="64,256")
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--protocol", default="http-bin", choices=("http-bin", "http"))
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        folder = make_models.write_mlp(repo)
        config = folder / "config.pbtxt"
        config.write_text(config.read_text()
                          + "dynamic_batching { max_queue_delay_microseconds: 1000 }\n")
        rows: list[str] = []
        for n in (int(v) for v in args.frontends.split(",")):
            extra = ("--http-frontend-processes", str(n)) if n else ()
            server = ServerProcess(repo, *extra, log_path=Path(tmp) / f"server-{n}.log")
            try:
                server.wait_ready(timeout=120)
                for c in (int(v) for v in args.concurrency.split(",")):
                    rate, cpu, main_cpu = perf(server, args.protocol, "mlp", c, args.window_ms)
                    row = f"| {n} | {c} | {rate:,.0f} | {cpu:.0f} ({main_cpu:.0f}) |"
                    print(row, flush=True)
                    rows.append(row)
            finally:
                server.stop()
    print("\n| frontends | c | infer/s | server CPU µs/request (engine trio thread) |\n"
          "|---|---|---|---|\n" + "\n".join(rows))


if __name__ == "__main__":
    main()

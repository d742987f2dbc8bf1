"""Where the server's time goes under load: py-spy samples of ``python -m nursery serve`` while
perf_analyzer drives one (protocol, model, concurrency) point.

    python bench/profile_server.py --protocol http-bin --model mlp --concurrency 16 --batching
    python bench/profile_server.py --protocol grpc --model add_sub --concurrency 1 --seconds 20

Writes, under ``bench/profiles/<name>/``: ``samples.txt.gz`` (py-spy's collapsed stacks, every
thread), ``flame.svg``, and ``summary.md``: infer/s, the server's CPU µs per
request (from /proc), and the top functions by own samples and by inclusive samples on the
trio thread (the one that limits throughput) and over all threads. Models are the peer
harness's: ``add_sub`` (2 x FP32[16]) and ``mlp`` (784-1024-1024-10), ``max_batch_size`` 32 with
``--batching`` (1 ms queue delay) or 64 without, one CPU instance, one ORT thread.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ab_perf import _successes, server_cpu  # noqa: E402
from tests.conftest import PERF_ANALYZER, ServerProcess, make_models  # noqa: E402


def write_repo(repo: Path, batching: bool) -> None:
    extra = 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
    mbs = 64
    if batching:
        extra += "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
        mbs = 32
    io = [("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])]
    out = [("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])]
    make_models.write_model(repo, "add_sub", make_models.build_add_sub(),
                            make_models.config_text("add_sub", io, out, mbs, extra))
    make_models.write_model(repo, "mlp", make_models.build_mlp((784, 1024, 1024, 10)),
                            make_models.config_text("mlp", [("INPUT0", "FP32", [784])],
                                                    [("OUTPUT0", "FP32", [10])], mbs, extra))


def pa_args(server: ServerProcess, protocol: str, model: str, concurrency: int,
            window_ms: int, trials: int, data: str = "zero") -> list[str]:
    url = server.url if protocol != "grpc" else f"127.0.0.1:{server.grpc_port}"
    args = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", "grpc" if protocol == "grpc" else "http",
            "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
            "--stability-percentage", "999", "--max-trials", str(trials), "--input-data", data]
    if protocol == "http":
        args += ["--input-tensor-format", "json", "--output-tensor-format", "json"]
    return args


def summarize(samples: Path, top: int) -> str:
    own_all: collections.Counter[str] = collections.Counter()
    own_gil: collections.Counter[str] = collections.Counter()
    incl_gil: collections.Counter[str] = collections.Counter()
    by_thread: collections.Counter[str] = collections.Counter()
    total = gil_total = 0
    opener = gzip.open if samples.suffix == ".gz" else open
    with opener(samples, "rt") as f:
        lines_in = f.read().splitlines()
    for line in lines_in:
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0]
        by_thread[thread.split(" ")[0] + " " + thread.split(" ")[1] if " " in thread else thread] += count
        total += count
        leaf = frames[-1]
        own_all[leaf] += count
        if "(gil)" in stack or "active+gil" in stack:
            pass
        is_trio = any("trio/_core/_run.py" in f for f in frames[1:3]) or any(
            "run_server" in f or "nursery/__main__.py" in f for f in frames[1:4])
        if is_trio:
            gil_total += count
            own_gil[leaf] += count
            for f in set(frames[1:]):
                incl_gil[f] += count
    lines = [f"samples: {total} (trio thread: {gil_total})", "", "| own, trio thread | % |", "|---|---|"]
    lines += [f"| `{f}` | {100 * c / max(gil_total, 1):.1f} |" for f, c in own_gil.most_common(top)]
    lines += ["", "| inclusive, trio thread | % |", "|---|---|"]
    lines += [f"| `{f}` | {100 * c / max(gil_total, 1):.1f} |" for f, c in incl_gil.most_common(top)]
    lines += ["", "| own, all threads | % |", "|---|---|"]
    lines += [f"| `{f}` | {100 * c / max(total, 1):.1f} |" for f, c in own_all.most_common(top)]
    lines += ["", "| thread | samples |", "|---|---|"]
    lines += [f"| {t} | {c} |" for t, c in by_thread.most_common(12)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", default="http-bin", choices=["http", "http-bin", "grpc"])
    parser.add_argument("--model", default="mlp", choices=["add_sub", "mlp"])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batching", action="store_true")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--name", default="")
    parser.add_argument("--peer-models", type=Path, metavar="BENCH_DIR",
                        help="serve the peer sweep's models (its model_repository, ONNX Runtime's "
                             "default threads) with its perf_data inputs, as bench/peer.sh does")
    parser.add_argument("--summarize", type=Path, help="only summarize an existing samples.txt")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize, args.top))
        return
    name = args.name or (f"{args.protocol}-{args.model}-c{args.concurrency}"
                         f"{'-batching' if args.batching else ''}-{time.strftime('%Y%m%d-%H%M')}")
    out = ROOT / "bench" / "profiles" / name
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="nursery-profile-"))
    data = "zero"
    if args.peer_models:
        repo = args.peer_models / "model_repository"
        data = str(args.peer_models / "perf_data" / f"{args.model}.json")
    else:
        repo = tmp / "repo"
        write_repo(repo, args.batching)
    server = ServerProcess(repo, "--allow-metrics", "false", log_path=tmp / "server.log")
    server.wait_ready()
    env = {**os.environ, "LD_LIBRARY_PATH": str(PERF_ANALYZER.parent / "lib")}
    try:
        # warm up, then sample while a long perf_analyzer run keeps the load on
        subprocess.run(pa_args(server, args.protocol, args.model, args.concurrency, 1000, 3, data),
                       capture_output=True, timeout=120, env=env)
        before, served, t0 = server_cpu(server.proc.pid), _successes(server, args.model), time.monotonic()
        load = subprocess.Popen(pa_args(server, args.protocol, args.model, args.concurrency,
                                        (args.seconds + 4) * 1000 // 3, 3, data),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        time.sleep(1.0)
        subprocess.run(["py-spy", "record", "-p", str(server.proc.pid), "-d", str(args.seconds),
                        "-r", str(args.rate), "-t", "-f", "raw", "-o", str(out / "samples.txt")],
                       check=True, capture_output=True)
        subprocess.run(["py-spy", "record", "-p", str(server.proc.pid), "-d", "3",
                        "-r", str(args.rate), "--gil", "-f", "flamegraph", "-o", str(out / "flame.svg")],
                       check=True, capture_output=True)
        pa_out, _ = load.communicate(timeout=120)
        spent, elapsed = server_cpu(server.proc.pid) - before, time.monotonic() - t0
        requests = _successes(server, args.model) - served
    finally:
        server.stop()
    rate = next((line for line in pa_out.splitlines()
                 if line.startswith(f"Concurrency: {args.concurrency},")), "")
    text = (f"# {name}\n\n`python bench/profile_server.py {' '.join(sys.argv[1:])}`\n\n"
            f"perf_analyzer: {rate}\n\nserver CPU: {spent / max(requests, 1) * 1e6:.0f} µs per request "
            f"({requests} requests, {spent:.1f} s CPU in {elapsed:.1f} s)\n\n"
            + summarize(out / "samples.txt", args.top) + "\n")
    (out / "summary.md").write_text(text)
    raw = out / "samples.txt"
    (out / "samples.txt.gz").write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    print(text)


if __name__ == "__main__":
    main()

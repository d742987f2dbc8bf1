"""Before and after: two checkouts of nursery under perf_analyzer, in interleaved rounds.

For a change that must not cost throughput (issue 21 asks that no HTTP or gRPC row be more
than 5% slower), this serves the same repository from a base revision (a git worktree made
under a temporary folder) and from the working tree, one server at a time, and measures each
(protocol, model, concurrency) in alternating order for ``--rounds`` rounds. It reports, per
row, the median infer/s of each side with the spread (min-max) and the median ratio, and the
server's CPU per request (from /proc, user + system of the server process). Each figure is
perf_analyzer's mean over three windows, whatever their spread (a stability criterion never
settles on this machine while anything else runs); the rounds give the spread.

    python bench/ab_perf.py --base 3c53c53 --rounds 3
    python bench/ab_perf.py --base HEAD~5 --protocols http-bin,grpc --models mlp --concurrency 1,16
    python bench/ab_perf.py --base HEAD --batching --protocols grpc --concurrency 1,16,64
    python bench/ab_perf.py --base HEAD --batching --peer-models --models mlp --concurrency 16
    python bench/ab_perf.py --base HEAD --new-args "--http-frontend-processes 1" --batching \
        --peer-models --models mlp --protocols http-bin --concurrency 16,64

The server's CPU counts its child processes too (the HTTP frontend processes).

The machine is noisy: only ratios from one run mean anything, and a ratio within the spread of
the rounds is a tie.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import PERF_ANALYZER, ServerProcess, make_models  # noqa: E402

PEER_BENCH = Path(os.environ.get("TMPDIR", "/tmp")) / "nursery-peer-bench"


def server_cpu(pid: int, thread: int | None = None) -> float:
    """CPU seconds (user + system) of process ``pid`` and its running children (the HTTP
    frontend processes), or of its thread ``thread`` only."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if thread is None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                child = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(child[1]) == pid:
                ticks += int(child[11]) + int(child[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(busy, all) CPU ticks of the whole machine since boot (/proc/stat's first line)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def wait_quiet(limit: float, timeout: float = 600.0) -> None:
    """Wait until the machine's CPU use over one second is below ``limit`` (a fraction of all
    cores): others' work (a test suite, another session's run) ends or pauses first."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        busy, total = machine_ticks()
        time.sleep(1.0)
        busy2, total2 = machine_ticks()
        if (busy2 - busy) <= limit * max(1, total2 - total):
            return


class Quiet:
    """``--quiet``: a measurement counts only if processes other than the server and
    perf_analyzer used less than ``limit`` of the machine's CPU during it; otherwise it is
    taken again (after waiting for a quiet second), up to ``tries`` times."""

    def __init__(self, limit: float, tries: int = 6) -> None:
        self.limit, self.tries = limit, tries
        self.others: list[float] = []  # the share others used in each counted measurement

    def measure(self, server: ServerProcess, *row: object) -> tuple[float, float, float]:
        for _ in range(self.tries):
            wait_quiet(self.limit)
            busy, total = machine_ticks()
            server_before = server_cpu(server.proc.pid)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            got = perf(server, *row)  # type: ignore[arg-type]
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            busy2, total2 = machine_ticks()
            tick = os.sysconf("SC_CLK_TCK")
            mine = (server_cpu(server.proc.pid) - server_before
                    + after.ru_utime - children.ru_utime + after.ru_stime - children.ru_stime)
            others = max(0.0, (busy2 - busy) / tick - mine) / max(1e-9, (total2 - total) / tick)
            if others < self.limit:
                self.others.append(others)
                return got
            print(f"  others used {others:.0%} of the machine: measured again", flush=True)
        raise RuntimeError("the machine never stayed quiet")


def perf(server: ServerProcess, protocol: str, model: str, concurrency: int,
         window_ms: int, data: Path | None = None) -> tuple[float, float, float]:
    """(infer/s, server CPU µs per request, the trio thread's share of it) of one
    perf_analyzer measurement. The trio thread (the server's main thread) is what saturates
    first: CPU moved off it is throughput where it is the bottleneck."""
    url = server.url if protocol != "grpc" else f"127.0.0.1:{server.grpc_port}"
    args = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", "grpc" if protocol == "grpc" else "http",
            "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
            "--stability-percentage", "999", "--max-trials", "3",
            "--input-data", str(data / f"{model}.json") if data else "zero"]
    if protocol == "http":  # JSON tensors (perf_analyzer's default is the binary extension)
        args += ["--input-tensor-format", "json", "--output-tensor-format", "json"]
    pid = server.proc.pid
    before, served = server_cpu(pid), _successes(server, model)
    main_before = server_cpu(pid, pid)
    out = subprocess.run(args, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "LD_LIBRARY_PATH": str(PERF_ANALYZER.parent / "lib")})
    spent = server_cpu(pid) - before
    main_spent = server_cpu(pid, pid) - main_before
    requests = _successes(server, model) - served
    rate = 0.0
    for line in out.stdout.splitlines():
        if line.startswith(f"Concurrency: {concurrency},"):
            rate = float(line.split("throughput:")[1].split("infer/sec")[0])
    if rate == 0.0 or requests <= 0:
        raise RuntimeError(f"perf_analyzer failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return rate, spent / requests * 1e6, main_spent / requests * 1e6


def _peer_model(source: Path, repo: Path) -> Path:
    """A model of the peer sweep's repository: its config copied, its ONNX file linked."""
    folder = repo / source.name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text((source / "config.pbtxt").read_text())
    (folder / "1" / "model.onnx").symlink_to(source / "1" / "model.onnx")
    return folder


def _successes(server: ServerProcess, model: str) -> int:
    """Requests the server has answered for ``model`` (its statistics extension)."""
    with urllib.request.urlopen(f"http://{server.url}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.load(r)
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare with")
    parser.add_argument("--protocols", default="http,http-bin,grpc")
    parser.add_argument("--models", default="add_sub,mlp")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--batching", action="store_true",
                        help="dynamic batching on, as the peer sweep's batching rows "
                             "(max_batch_size 32, 1 ms queue delay)")
    parser.add_argument("--peer-models", nargs="?", const=str(PEER_BENCH), default=None,
                        metavar="BENCH_DIR",
                        help="the peer sweep's models and input data (../shared/bench's "
                             "model_repository and perf_data under BENCH_DIR, default "
                             f"{PEER_BENCH}; its MLP is 784-1024-1024-10 with ONNX Runtime's "
                             "default threads) instead of scripts/make_models.py's")
    parser.add_argument("--base-args", default="", metavar="FLAGS",
                        help="server flags for the base side only (a quoted string)")
    parser.add_argument("--new-args", default="", metavar="FLAGS",
                        help="server flags for the working tree's side only, e.g. "
                             "\"--http-frontend-processes 1\" with --base HEAD")
    parser.add_argument("--quiet", type=float, default=None, metavar="SHARE",
                        help="count a measurement only when other processes used less than "
                             "SHARE (0-1) of the machine's CPU during it; wait and retry "
                             "otherwise (for a machine shared with other work)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nursery-ab-"))
    base = tmp / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base],
                   check=True, capture_output=True)
    repo = tmp / "repo"
    size = 32 if args.batching else 64
    data = Path(args.peer_models) / "perf_data" if args.peer_models else None
    if args.peer_models:
        folders = [_peer_model(Path(args.peer_models) / "model_repository" / m, repo)
                   for m in args.models.split(",")]
    else:
        folders = [make_models.write_add_sub(repo, max_batch_size=size),
                   make_models.write_mlp(repo, max_batch_size=size)]
    for folder in folders:
        if args.batching:
            config = folder / "config.pbtxt"
            text = config.read_text()
            if args.peer_models:  # as the peer sweep's make_nursery_repo.py writes it
                text = re.sub(r"^max_batch_size:.*$", f"max_batch_size: {size}", text, flags=re.M)
            config.write_text(text + "dynamic_batching { max_queue_delay_microseconds: 1000 }\n")
    sides = {"base": base, "new": ROOT}
    rows = [(p, m, int(c)) for p in args.protocols.split(",") for m in args.models.split(",")
            for c in args.concurrency.split(",")]
    results: dict[tuple[str, str, str, int], list[tuple[float, float, float]]] = {}
    quiet = Quiet(args.quiet) if args.quiet is not None else None
    try:
        for r in range(args.rounds):
            order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
            for name, root in order:
                flags = (args.base_args if name == "base" else args.new_args).split()
                server = ServerProcess(repo, "--allow-metrics", "false", *flags,
                                       log_path=tmp / f"{name}-{r}.log", cwd=root)
                server.wait_ready()
                try:
                    for row in rows:
                        for _attempt in range(3):  # a window perf_analyzer cannot settle: again
                            try:
                                got = (quiet.measure(server, *row, args.window_ms, data)
                                       if quiet else perf(server, *row, args.window_ms, data))
                            except RuntimeError:
                                continue
                            results.setdefault((name, *row), []).append(got)
                            break
                finally:
                    server.stop()
                print(f"round {r + 1} {name} done", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                       capture_output=True)
    print(f"\nbase {args.base} {args.base_args} vs the working tree {args.new_args}, "
          f"{args.rounds} interleaved rounds, "
          f"{args.window_ms} ms windows; infer/s median (min-max), server CPU µs/request "
          "median (of it, the trio thread's)"
          + (f"; others' CPU during the counted windows at most {max(quiet.others):.0%}"
             if quiet and quiet.others else "") + "\n")
    print("| protocol | model | c | base infer/s | new infer/s | new/base | base CPU µs | new CPU µs |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        b = results[("base", *row)]
        n = results[("new", *row)]
        br, nr = [x for x, _, _ in b], [x for x, _, _ in n]
        print(f"| {row[0]} | {row[1]} | {row[2]} | {statistics.median(br):.0f} ({min(br):.0f}-"
              f"{max(br):.0f}) | {statistics.median(nr):.0f} ({min(nr):.0f}-{max(nr):.0f}) | "
              f"{statistics.median(nr) / statistics.median(br):.2f} | "
              f"{_cpu(b)} | {_cpu(n)} |")


def _cpu(side: list[tuple[float, float, float]]) -> str:
    """The median CPU µs per request, and (in brackets) the trio thread's median."""
    return (f"{statistics.median(c for _, c, _ in side):.0f} "
            f"({statistics.median(m for _, _, m in side):.0f})")


if __name__ == "__main__":
    main()

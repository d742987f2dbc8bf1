#!/usr/bin/env python3
"""Python models on threads against Python models in stub processes (issue 24).

    python bench/python_process.py [--measure-ms 3000] [--work-ms 2]
    python bench/python_process.py --hop-only --rounds 3 [--base /path/to/other/checkout]

One server, one repository, both instance modes side by side (the model parameter
``nursery_instance_mode``), driven by perf_analyzer over HTTP:

  1. a CPU-bound pure-Python model (``--work-ms`` of arithmetic per request), two instances:
     throughput at concurrency 8, thread instances against process instances (two threads
     share one interpreter lock; two processes do not);
  2. the ONNX MLP's p99 at concurrency 8, alone and while the CPU-bound model of each mode is
     kept busy by a second perf_analyzer at concurrency 8;
  3. the process hop's cost: a trivial identity model at concurrency 1 and 16, each mode.

``--hop-only`` runs only the third part, ``--rounds`` times; with ``--base`` a second server
runs from that checkout (a ``git worktree`` of an older commit) and the rounds interleave the
two, for an A/B of the hop on a noisy machine (medians and spread printed). With ``--triton``
real Triton (the tritonserver of the shared harness's pytriton environment, its own Python
backend and stub) serves the same ``model.py`` in the same rounds: Triton's hop beside
nursery's.

Never run it beside another benchmark on the 2-core machine.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import PERF_ANALYZER, ServerProcess, free_port, make_models  # noqa: E402

CPU_MODEL = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        import json
        params = json.loads(args["model_config"]).get("parameters", {})
        self.work_s = float(params["work_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            end = time.perf_counter() + self.work_s
            x = 0
            while time.perf_counter() < end:  # pure-Python work: holds the interpreter lock
                for i in range(200):
                    x += i * i
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", data)]))
        return responses
'''

IDENTITY_MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''


def write_python(repo: Path, name: str, source: str, mode: str, count: int,
                 work_ms: float = 0.0) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(source)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        f'instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n'
        f'parameters {{ key: "nursery_instance_mode" value {{ string_value: "{mode}" }} }}\n'
        f'parameters {{ key: "work_ms" value {{ string_value: "{work_ms}" }} }}\n')


def perf(server: ServerProcess | TritonProcess, model: str, concurrency: int, measure_ms: int,
         out: Path, stable: bool = True) -> subprocess.Popen[bytes]:
    # stable=False: three windows, whatever their spread (an A/B on a noisy machine, where the
    # rounds' medians carry the comparison, not one window's stability)
    tries = ["--stability-percentage", "50", "--max-trials", "20"] if stable else [
        "--stability-percentage", "999", "--max-trials", "3"]
    return subprocess.Popen(
        [str(PERF_ANALYZER), "-m", model, "-u", f"127.0.0.1:{server.http_port}",
         "--concurrency-range", str(concurrency), "--measurement-interval", str(measure_ms),
         "--input-data", "zero", "-f", str(out), "--percentile", "99", *tries],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def result(proc: subprocess.Popen[bytes], out: Path) -> dict[str, float]:
    _, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(err.decode()[-2000:])
    with out.open() as f:
        row = next(csv.DictReader(f))
    return {"infer_s": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1000, "p99_ms": float(row["p99 latency"]) / 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure-ms", type=int, default=3000)
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument("--hop-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--base", type=Path, default=None)
    parser.add_argument("--triton", action="store_true",
                        help="with --hop-only: Triton's Python backend in the same rounds")
    args = parser.parse_args()
    if args.hop_only:
        return hop_ab(args)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        make_models.write_mlp(repo)
        for mode in ("thread", "process"):
            write_python(repo, f"cpu_{mode}", CPU_MODEL, mode, 2, args.work_ms)
            write_python(repo, f"identity_{mode}", IDENTITY_MODEL, mode, 1)
        server = ServerProcess(repo, log_path=Path(tmp) / "server.log")
        try:
            server.wait_ready()
            n = 0

            def run(model: str, c: int) -> dict[str, float]:
                nonlocal n
                n += 1
                out = Path(tmp) / f"r{n}.csv"
                return result(perf(server, model, c, args.measure_ms, out), out)

            print(f"CPU-bound model ({args.work_ms} ms of pure Python per request), count 2, "
                  "concurrency 8 (infer/s):")
            cpu = {mode: run(f"cpu_{mode}", 8) for mode in ("thread", "process")}
            for mode, r in cpu.items():
                print(f"  {mode:8s} {r['infer_s']:8.1f}   p99 {r['p99_ms']:.2f} ms")
            print(f"  process / thread: {cpu['process']['infer_s'] / cpu['thread']['infer_s']:.2f}x")

            print("MLP p99 at concurrency 8 (ms):")
            alone = run("mlp", 8)
            print(f"  alone                        {alone['p99_ms']:.2f}  ({alone['infer_s']:.0f} infer/s)")
            for mode in ("thread", "process"):
                n += 1
                busy_out = Path(tmp) / f"busy{n}.csv"
                busy = perf(server, f"cpu_{mode}", 8, args.measure_ms * 3, busy_out)
                mlp = run("mlp", 8)
                result(busy, busy_out)
                print(f"  beside a busy {mode:7s} model  {mlp['p99_ms']:.2f}  "
                      f"({mlp['infer_s']:.0f} infer/s; {mlp['p99_ms'] / alone['p99_ms']:.2f}x alone)")

            print("Identity model (the hop's cost), infer/s and p50 ms:")
            for c in (1, 16):
                for mode in ("thread", "process"):
                    r = run(f"identity_{mode}", c)
                    print(f"  c={c:<3d} {mode:8s} {r['infer_s']:8.1f}   p50 {r['p50_ms']:.3f} ms")
        finally:
            server.stop()
    return 0


class TritonProcess:
    """Real Triton 2.51 (the shared harness's pytriton environment, ``../shared/bench``) on
    free loopback ports, started as the harness starts it, in a session of its own."""

    def __init__(self, repo: Path, work: Path) -> None:
        import glob

        venv = Path("/tmp/anchors-venv-pytriton")
        found = glob.glob(str(venv / "lib/python3*/site-packages/pytriton/tritonserver"))
        if not found:
            raise SystemExit("no Triton: run `bash ../shared/bench/setup_envs.sh pytriton` first")
        ports = [free_port() for _ in range(3)]
        self.http_port = ports[0]
        script = ROOT.parent / "shared/bench/triton_pybackend/start_tritonserver.sh"
        self.log = (work / "triton.log").open("wb")
        self.proc = subprocess.Popen(
            ["bash", str(script), found[0], str(repo), str(venv), *map(str, ports)],
            cwd=work, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 120.0) -> None:
        import time
        import urllib.request

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited: {self.proc.returncode}")
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("tritonserver not ready")

    def stop(self) -> None:
        import os
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def hop_ab(args: argparse.Namespace) -> int:
    """The hop's cost alone, interleaved rounds, this checkout against ``--base``."""
    trees = {"this": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        for mode in ("thread", "process"):
            write_python(repo, f"identity_{mode}", IDENTITY_MODEL, mode, 1)
        servers: dict[str, ServerProcess | TritonProcess] = {
            name: ServerProcess(repo, log_path=Path(tmp) / f"{name}.log", cwd=tree)
            for name, tree in trees.items()}
        if args.triton:
            servers["triton"] = TritonProcess(repo, Path(tmp))
        seen: dict[tuple[str, str, int], list[dict[str, float]]] = {}
        try:
            for server in servers.values():
                server.wait_ready()
            n = 0
            for _ in range(args.rounds):
                for c in (1, 16):
                    for mode in ("thread", "process"):
                        for name, server in servers.items():
                            if name == "triton" and mode == "thread":
                                continue  # Triton has stubs only
                            n += 1
                            out = Path(tmp) / f"r{n}.csv"
                            r = result(perf(server, f"identity_{mode}", c, args.measure_ms, out,
                                            stable=False), out)
                            seen.setdefault((name, mode, c), []).append(r)
        finally:
            for server in servers.values():
                server.stop()
    print("Identity model (the hop's cost): infer/s and p50 ms, median [min-max] of "
          f"{args.rounds} interleaved rounds")
    for (name, mode, c), rs in sorted(seen.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        rate = sorted(r["infer_s"] for r in rs)
        p50 = sorted(r["p50_ms"] for r in rs)
        print(f"  c={c:<3d} {mode:8s} {name:6s} {rate[len(rate) // 2]:8.1f} "
              f"[{rate[0]:.0f}-{rate[-1]:.0f}]   p50 {p50[len(p50) // 2]:.3f} ms "
              f"[{p50[0]:.3f}-{p50[-1]:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())

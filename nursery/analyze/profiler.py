"""Measuring the real model once, on a server of its own, and perf_analyzer runs.

``ServerProcess`` starts ``python -m nursery serve`` on free loopback ports over a scratch
repository (copies of the model whose ``config.pbtxt`` is rewritten; the version folders are
links to the original, so nothing of the user's repository is written). A model that fails to
load ends the start with the server's own reason (:class:`ProfileError`).

``profile`` then measures, as the fidelity check does (``bench/sim_fidelity.py``):

- the execution time per batch size: requests of N rows one at a time, the time from the
  server's statistics extension (``batch_stats``: compute input + infer + output per
  execution of N rows), at a few sizes, and a straight line fitted through them; then scaled
  by how much slower an execution is under load (concurrency 8) than alone, when it is: on a
  small machine the instance's thread shares the cores and the GIL with the server's
  frontend and the client;
- the server's own work: its CPU time per request (``/proc/<pid>/stat``) at concurrency 1
  (one row per batch) and 8 (several), less the model's compute, solved for a share per
  request and a share per batch (the simulator's ``--frontend`` and ``--frontend-batch``);
- the time outside the server: perf_analyzer's latency percentiles at concurrency 1 less the
  server's part (the simulator's ``--overhead`` percentiles).
"""

from __future__ import annotations

import csv
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nursery.analyze.search import Calibration, Load
from nursery.config.model import ModelConfig
from nursery.simulate import cost
from nursery.types import DataType

PA_ENV = "NURSERY_PERF_ANALYZER"


class ProfileError(Exception):
    """Profiling or verifying cannot go on (the model does not load, perf_analyzer fails)."""


def find_perf_analyzer(given: str | None) -> Path:
    """perf_analyzer: ``given``, else $NURSERY_PERF_ANALYZER, else ``.tools/perf_analyzer/``
    of the current directory (scripts/install_perf_analyzer.sh puts it there), else PATH."""
    tried = []
    for candidate in (given, os.environ.get(PA_ENV),
                      str(Path.cwd() / ".tools" / "perf_analyzer" / "perf_analyzer"),
                      shutil.which("perf_analyzer")):
        if not candidate:
            continue
        path = Path(candidate)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        tried.append(str(path))
        if given:
            break
    raise ProfileError(
        "perf_analyzer was not found (tried " + (", ".join(tried) or "nothing") + "): install "
        "it with scripts/install_perf_analyzer.sh, or give --perf-analyzer PATH")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scratch_repo(root: Path, model_path: Path, configs: dict[str, str]) -> Path:
    """A repository under ``root`` with one copy of the model per entry of ``configs`` (name
    -> config.pbtxt text): the text written fresh, every other entry of the model's folder a
    link to the original."""
    repo = root / "repo"
    for name, text in configs.items():
        folder = repo / name
        folder.mkdir(parents=True)
        for entry in model_path.iterdir():
            if entry.name in ("config.pbtxt",) or entry.name.startswith("config.pbtxt."):
                continue
            (folder / entry.name).symlink_to(entry.resolve())
        (folder / "config.pbtxt").write_text(text)
    return repo


class ServerProcess:
    """``python -m nursery serve`` over ``repo`` on free loopback ports."""

    def __init__(self, repo: Path, log: Path, *, timeout: float = 120.0) -> None:
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        self.log_path = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nursery", "serve", "--model-repository", str(repo),
             "--http-address", "127.0.0.1", "--http-port", str(self.http),
             "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc),
             "--allow-metrics", "false", "--exit-on-error", "true"],
            stdout=self._out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._out.close()
                raise ProfileError("the model failed to load during profiling: "
                                   + self._reason())
            try:
                status, _ = self.request("GET", "/v2/health/ready")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ProfileError(f"the server was not ready after {timeout:g} s: " + self._reason())

    def _reason(self) -> str:
        text = self.log_path.read_text(errors="replace")
        lines = [line for line in text.splitlines() if "failed to load" in line
                 or line.startswith("E") or "error" in line.lower()]
        return (lines[0] if lines else text[-500:]).strip() or "(the server wrote nothing)"

    def request(self, method: str, path: str, body: bytes | None = None,
                conn: http.client.HTTPConnection | None = None) -> tuple[int, Any]:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.http, timeout=60)
        try:
            conn.request(method, path, body,
                         {"Content-Type": "application/json"} if body is not None else {})
            response = conn.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else None
        finally:
            if own:
                conn.close()

    def stats(self, model: str) -> dict[str, Any]:
        status, body = self.request("GET", f"/v2/models/{model}/stats")
        if status != 200:
            raise ProfileError(f"statistics of '{model}': HTTP {status}: {body}")
        return body["model_stats"][0]  # type: ignore[no-any-return]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._out.closed:
            self._out.close()


def _json_inputs(model: ModelConfig, rows: int, rng: np.random.Generator) -> bytes:
    inputs = []
    for spec in model.inputs:
        if spec.optional:
            continue
        dims = [1 if d < 0 else d for d in spec.dims]
        shape = [rows, *dims] if model.max_batch_size > 0 else dims
        count = int(np.prod(shape)) if shape else 1
        if spec.datatype == DataType.BYTES:
            data: list[Any] = ["x"] * count
        elif spec.datatype == DataType.BOOL:
            data = [bool(v) for v in rng.integers(0, 2, count)]
        elif spec.datatype.numpy_dtype.kind in "iu":
            data = [int(v) for v in rng.integers(0, 2, count)]
        else:
            data = [float(v) for v in rng.random(count)]
        inputs.append({"name": spec.name, "shape": shape, "datatype": spec.datatype.value,
                       "data": data})
    return json.dumps({"inputs": inputs}).encode()


def _batch_totals(stats: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """Per batch size: (executions, compute input + infer + output ns)."""
    out = {}
    for entry in stats.get("batch_stats", []):
        out[int(entry["batch_size"])] = (
            int(entry["compute_infer"]["count"]),
            sum(int(entry[k]["ns"]) for k in ("compute_input", "compute_infer",
                                               "compute_output")))
    return out


def measure_cost(server: ServerProcess, name: str, model: ModelConfig, sizes: list[int],
                 runs: int, seed: int = 0) -> cost.CostTable:
    """The model's execution time at each size, from the server's batch statistics (a
    warm-up round of every size first, left out)."""
    rng = np.random.default_rng(seed)
    bodies = {rows: _json_inputs(model, rows, rng) for rows in sizes}
    conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=60)

    def send(rows: int, times: int) -> None:
        for _ in range(times):
            status, answer = server.request("POST", f"/v2/models/{name}/infer", bodies[rows],
                                            conn)
            if status != 200:
                raise ProfileError(f"a profiling request of {rows} row(s) failed: HTTP "
                                   f"{status}: {answer}")
    try:
        for rows in sizes:
            send(rows, 3)
        before = _batch_totals(server.stats(name))
        for rows in sizes:
            send(rows, runs)
        after = _batch_totals(server.stats(name))
    finally:
        conn.close()
    points = []
    for size in sizes:
        count = after.get(size, (0, 0))[0] - before.get(size, (0, 0))[0]
        ns = after.get(size, (0, 0))[1] - before.get(size, (0, 0))[1]
        if count > 0:
            points.append((size, ns / count / 1e9))
    if not points:
        raise ProfileError("the server's statistics hold no batch of the profiled sizes")
    return cost.CostTable(tuple(sorted(points)))


def fitted_line(table: cost.CostTable) -> tuple[float, float]:
    """(seconds per batch, seconds per row) through the table's points (least squares)."""
    xs = [float(r) for r, _ in table.points]
    ys = [s for _, s in table.points]
    if len(xs) < 2:
        return ys[0], 0.0
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(intercept), float(slope)


def pa_shape_flags(model: ModelConfig) -> list[str]:
    flags = []
    for spec in model.inputs:
        if any(d < 0 for d in spec.dims):
            flags += ["--shape", f"{spec.name}:" + ",".join(str(1 if d < 0 else d)
                                                             for d in spec.dims)]
    return flags


def load_flags(load: Load, intervals: Path | None = None) -> list[str]:
    if load.kind == "concurrency":
        return ["--concurrency-range", f"{int(load.value)}"]
    if load.kind == "rate":
        return ["--request-rate-range", f"{load.value:g}", "--request-distribution", "poisson"]
    if intervals is None:
        raise ValueError("a trace load needs its intervals file")
    return ["--request-intervals", str(intervals)]


def perf_analyzer(pa: Path, server: ServerProcess, name: str, model: ModelConfig, load: Load,
                  window_ms: int, out: Path, intervals: Path | None = None) -> dict[str, Any]:
    """One perf_analyzer measurement (three windows of ``window_ms``, no stability demand);
    its figures, or ``{"error": ...}`` with its last words when it fails (shed requests end
    its run)."""
    args = [str(pa), "-m", name, "-u", f"127.0.0.1:{server.http}", "-i", "http",
            "--measurement-interval", str(window_ms), "-s", "1000", "-r", "3",
            "-f", str(out), *pa_shape_flags(model), *load_flags(load, intervals)]
    stats_before = server.stats(name)
    cpu_before = server.cpu_seconds()
    try:
        proc = subprocess.run(args, capture_output=True, text=True,
                              timeout=max(60, 20 * window_ms / 1e3))
    except subprocess.TimeoutExpired:
        return {"error": "perf_analyzer did not finish in time"}
    cpu = server.cpu_seconds() - cpu_before
    if proc.returncode != 0 or not out.exists():
        words = (proc.stdout + proc.stderr).strip().splitlines()
        return {"error": (words[-1] if words else f"exit code {proc.returncode}")[:300]}
    with out.open() as f:
        row = list(csv.DictReader(f))[-1]
    after = server.stats(name)
    inferences = after["inference_count"] - stats_before["inference_count"]
    executions = after["execution_count"] - stats_before["execution_count"]
    compute_ns = sum(after["inference_stats"][k]["ns"] - stats_before["inference_stats"][k]["ns"]
                     for k in ("compute_input", "compute_infer", "compute_output"))
    return {"throughput": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1e3, "p90_ms": float(row["p90 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3,
            "inferences": inferences, "executions": executions,
            "cpu_s": cpu, "compute_s": compute_ns / 1e9}


@dataclass
class Profile:
    calibration: Calibration
    line: tuple[float, float]
    runs: dict[str, dict[str, Any]]  # the calibration's perf_analyzer figures


def calibrate(pa: Path, server: ServerProcess, name: str, model: ModelConfig,
              table: cost.CostTable, window_ms: int, work: Path) -> Profile:
    """The server's work per request and per batch, and the time outside it."""
    runs = {}
    for clients in (1, 8):
        result = perf_analyzer(pa, server, name, model, Load("concurrency", clients),
                               window_ms, work / f"calibrate-c{clients}.csv")
        if "error" in result:
            raise ProfileError(f"perf_analyzer failed while calibrating at concurrency "
                               f"{clients}: {result['error']}")
        runs[f"c{clients}"] = result

    def per_request(r: dict[str, Any]) -> tuple[float, float]:
        n = max(1, r["inferences"])
        rows = r["inferences"] / max(1, r["executions"])
        return max(0.0, (r["cpu_s"] - r["compute_s"]) / n), rows
    y1, r1 = per_request(runs["c1"])
    y8, r8 = per_request(runs["c8"])
    # the model's execution under load: on a small machine its thread shares the cores (and
    # the GIL) with the server's and the client's, and runs slower than alone
    c8 = runs["c8"]
    loaded = c8["compute_s"] / max(1, c8["executions"])
    alone = table(max(1, round(r8)))
    slowdown = max(1.0, loaded / alone) if alone > 0 else 1.0
    if slowdown > 1.0:
        table = cost.CostTable(tuple((r, s * slowdown) for r, s in table.points))
    if r8 > r1 * 1.2:  # y = f + fb / rows, at two batch sizes
        fb = max(0.0, (y1 - y8) / (1 / r1 - 1 / r8))
        f = max(0.0, y1 - fb / r1)
    else:  # one row per batch at both: the two shares cannot be told apart
        f, fb = min(y1, y8), 0.0
    c1 = runs["c1"]
    inside = c1["compute_s"] / max(1, c1["executions"]) + f + fb  # the server's part at c1
    overhead = ",".join(f"{q}:{max(0.0, c1[f'p{q}_ms'] - inside * 1e3):.4f}ms"
                        for q in (50, 90, 99))
    runs["slowdown"] = {"factor": slowdown}
    return Profile(Calibration(table, f, fb, overhead), fitted_line(table), runs)


def profile(pa: Path, model_path: Path, model: ModelConfig, original: str, *,
            sizes: list[int], runs: int, window_ms: int, work: Path,
            config_for: Any) -> Profile:
    """Start a server with a profiling copy of the model (``config_for(name)``: its
    config.pbtxt text), measure, stop it."""
    name = f"{model.name}__profile"
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        repo = scratch_repo(Path(tmp), model_path, {name: config_for(name)})
        server = ServerProcess(repo, work / "profile-server.log")
        try:
            table = measure_cost(server, name, model, sizes, runs)
            return calibrate(pa, server, name, model, table, window_ms, work)
        finally:
            server.stop()

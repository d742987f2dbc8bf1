#!/usr/bin/env python3
"""Soak: one server under a long, mixed, moderately loaded day, checked for leaks and lost answers.

    python bench/soak.py [--minutes 30] [--interval 10] [--warmup 0.2] [--scale 1.0]
                         [--without KIND,KIND...] [--out DIR]

Builds a small repository in a temporary folder and starts ``python -m nursery serve`` on free
loopback ports with ``--model-control-mode explicit``: ``add_sub`` and ``mlp`` (ONNX, dynamic
batching), ``py_identity_fp32`` (Python backend), ``py_repeat`` (Python, decoupled) and a
``spare`` ONNX identity that is loaded and unloaded all the time. Then, for ``--minutes``, a
bounded set of client threads (each paced, each stopping by itself at the deadline) sends:

  http_json / http_binary   tritonclient.http infers (JSON tensors, binary tensors) on the three models
  grpc                      tritonclient.grpc infers on the same models
  stream                    gRPC bidirectional streams to py_repeat, restarted every 20 requests
  churn_*                   load / infer / unload of ``spare`` over HTTP and gRPC in turn, with an
                            infer in flight during every third unload, and the repository index
  shm_*                     system shared memory: create, register, infer from and into the
                            region, unregister, destroy, over HTTP and gRPC in turn
  vanish_*                  clients that go away: raw sockets that send half a request (or a
                            whole one) and close with a TCP reset (SO_LINGER 0), on the HTTP and
                            gRPC ports, and tritonclient calls whose client is dropped mid-flight

Every request that is not deliberately abandoned must get an answer: a success or a proper error
status (an HTTP status / a gRPC status sent by the server). Transport failures and timeouts count
as lost. Every ``--interval`` seconds the server's RSS, open file descriptors and threads are
read from /proc and the interval's p50/p99 of the HTTP and gRPC infer latencies are taken.

The verdict (after a warm-up, the first ``--warmup`` share of the run):
  - RSS: the median of the last minute's samples at most 5% above the median of the first
    minute after warm-up (the start of the measured part, not its middle: a steady leak would be
    halved by a median over the whole measured part); in a run too short for that, the first
    and the last third of the measured part, so that the two windows never overlap;
  - fds and threads: last-minute median minus the post-warm-up minute's median at most 16 fds /
    8 threads (the soak's own clients hold about a dozen connections at any moment, so a wobble
    below that is traffic, a step above it is a leak);
  - p99, per protocol: the median of the last minute's interval p99s at most
    max(2 x, +5 ms) the median of all post-warm-up interval p99s (one interval's p99 on a shared
    2-core machine jumps by tens of percent when a neighbour runs; the median of six intervals
    does not, while a real drift -- queues that grow, leak-driven GC pauses -- moves it; 5 ms is
    about one scheduler slice taken by another process, which a sub-millisecond baseline would
    otherwise turn into a false alarm);
  - zero lost requests, no error answers except where a request races an unload (or follows
    it), the server alive at the end (live, ready, one infer per protocol)
    and exiting 0 on SIGTERM.

If the server dies (or stops answering health checks for three intervals) the soak stops at
once and says so, with the last client actions before the death and the server log's tail.
Writes ``summary.md``, ``samples.csv`` and ``server.log`` (tail) to
``bench/results/soak-<date>/`` and exits 1 on a failed verdict. Never run it beside another
benchmark on the 2-core machine.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gc
import json
import os
import platform
import queue
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import ServerProcess, make_models  # noqa: E402
from tests.shm_client import system_shm as shm  # noqa: E402

MODELS = ("add_sub", "mlp", "py_identity_fp32")
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
CALL_TIMEOUT = 15.0  # seconds any one client call may take before it counts as lost
RSS_LIMIT = 0.05
FD_TOLERANCE = 16
THREAD_TOLERANCE = 8
P99_FACTOR = 2.0
P99_FLOOR_MS = 5.0
# kinds whose requests are expected to be refused now and then (a model being unloaded)
ERRORS_EXPECTED = {"churn_unload_inflight", "churn_infer_after_unload"}
VANISH_KINDS = ("http_half_headers", "http_half_body", "http_full_rst", "grpc_preface_rst",
                "grpc_half_rst", "grpc_infer_rst", "http_client_timeout", "grpc_client_dropped")
# a traceback's last line, also inside an ExceptionGroup's "|" margin
EXCEPTION_LINE = re.compile(r"^[\s|]*[A-Za-z_][\w.]*(Error|Exception|Group)\b.*:")
# gRPC status texts that mean the transport failed, not that the server answered
TRANSPORT_WORDS = ("socket closed", "connection reset", "failed to connect", "connection refused",
                   "broken pipe", "end of tcp", "stream removed", "rst_stream", "eof",
                   "unexpected eof", "connection aborted", "channel closed", "dns resolution")


# ---------------------------------------------------------------------------------------------
# repository and server


def build_repo(repo: Path) -> None:
    make_models.write_model(
        repo, "add_sub", make_models.build_add_sub(),
        make_models.config_text("add_sub", [("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])],
                                [("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])], 8, BATCHING))
    make_models.write_model(
        repo, "mlp", make_models.build_mlp(),
        make_models.config_text("mlp", [("INPUT0", "FP32", [784])], [("OUTPUT0", "FP32", [10])], 64,
                                'parameters { key: "intra_op_thread_count" value: '
                                '{ string_value: "1" } }\n' + BATCHING))
    make_models.write_model(
        repo, "spare", make_models.build_identity("FP32", ["batch", "n"]),
        make_models.config_text("spare", [("INPUT0", "FP32", [-1])], [("OUTPUT0", "FP32", [-1])], 8,
                                BATCHING))
    for name in ("py_identity_fp32", "py_repeat"):
        shutil.copytree(ROOT / "tests" / "models" / name, repo / name)


def server_flags() -> list[str]:
    # --allow-client-shm: the shm_* workers register regions
    flags = ["--model-control-mode", "explicit", "--log-verbose", "0", "--allow-client-shm=true"]
    for name in (*MODELS, "py_repeat"):
        flags += ["--load-model", name]
    return flags


# ---------------------------------------------------------------------------------------------
# accounting


@dataclass
class KindCount:
    sent: int = 0
    ok: int = 0
    abandoned: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    lost: collections.Counter[str] = field(default_factory=collections.Counter)


class Tally:
    """Per-kind counts and the current interval's infer latencies, shared by every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kinds: dict[str, KindCount] = collections.defaultdict(KindCount)
        self.latency: dict[str, list[float]] = {"http": [], "grpc": []}

    def sent(self, kind: str) -> None:
        with self.lock:
            self.kinds[kind].sent += 1

    def ok(self, kind: str, proto: str | None = None, seconds: float | None = None) -> None:
        with self.lock:
            self.kinds[kind].ok += 1
            if proto is not None and seconds is not None:
                self.latency[proto].append(seconds)

    def error(self, kind: str, message: str) -> None:
        with self.lock:
            self.kinds[kind].errors[_short(message)] += 1

    def lost(self, kind: str, message: str) -> None:
        with self.lock:
            self.kinds[kind].lost[_short(message)] += 1

    def abandoned(self, kind: str) -> None:
        with self.lock:
            self.kinds[kind].sent += 1
            self.kinds[kind].abandoned += 1

    def take_latencies(self) -> dict[str, list[float]]:
        with self.lock:
            taken, self.latency = self.latency, {"http": [], "grpc": []}
        return taken

    def totals(self) -> dict[str, int]:
        with self.lock:
            t = {"sent": 0, "ok": 0, "errors": 0, "lost": 0, "abandoned": 0}
            for k in self.kinds.values():
                t["sent"] += k.sent
                t["ok"] += k.ok
                t["errors"] += sum(k.errors.values())
                t["lost"] += sum(k.lost.values())
                t["abandoned"] += k.abandoned
            return t

    def unanswered(self, kind: str) -> int:
        """Sent, and neither answered, lost nor abandoned: still in flight (a stuck worker)."""
        k = self.kinds[kind]
        return k.sent - k.ok - k.abandoned - sum(k.errors.values()) - sum(k.lost.values())


def _short(message: str) -> str:
    text = " ".join(str(message).split())
    return text[:140]


def classify(exc: BaseException) -> tuple[str, str]:
    """("error", message) when the server answered with a proper status, else ("lost", why)."""
    if isinstance(exc, InferenceServerException):
        status = str(exc.status() or "")
        message = exc.message() or str(exc)
        if not status:
            return "lost", f"no status: {message}"
        if status.startswith("StatusCode."):
            lowered = message.lower()
            if status in ("StatusCode.DEADLINE_EXCEEDED", "StatusCode.CANCELLED"):
                return "lost", f"{status} {message}"
            if status in ("StatusCode.UNAVAILABLE", "StatusCode.INTERNAL", "StatusCode.UNKNOWN") \
                    and any(w in lowered for w in TRANSPORT_WORDS):
                return "lost", f"{status} {message}"
        return "error", f"{status} {message}"
    return "lost", f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------------
# the run's shared state


class Ctx:
    def __init__(self, server: ServerProcess, seconds: float, scale: float, without: set[str]) -> None:
        self.server = server
        self.http_url = server.url
        self.grpc_url = f"127.0.0.1:{server.grpc_port}"
        self.t0 = time.monotonic()
        self.deadline = self.t0 + seconds
        self.seconds = seconds
        self.scale = scale
        self.without = without
        self.stop = threading.Event()
        self.tally = Tally()
        self.events: collections.deque[tuple[float, str]] = collections.deque(maxlen=40)
        self.events_lock = threading.Lock()
        self.died: dict[str, Any] | None = None
        self.frozen_at: float | None = None
        self.worker_crashes: list[str] = []
        self.stopping_server = False

    def now(self) -> float:
        return time.monotonic() - self.t0

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def event(self, what: str) -> None:
        with self.events_lock:
            self.events.append((self.now(), what))

    def bound(self, rate: float) -> int:
        """The most iterations a loop paced at ``rate``/s may make: a bound, not a target."""
        return int(rate * self.scale * self.seconds * 1.5) + 10

    def pace(self, rate: float, started: float) -> None:
        wait = 1.0 / (rate * self.scale) - (time.monotonic() - started)
        if wait > 0:
            self.stop.wait(wait)

    def call(self, kind: str, fn: Callable[[], Any], proto: str | None = None,
             check: Callable[[Any], str | None] | None = None) -> tuple[bool, Any]:
        """One request: counted as sent, then ok / error / lost. Returns (answered ok, result)."""
        self.tally.sent(kind)
        start = time.perf_counter()
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is classified and counted
            outcome, message = classify(exc)
            (self.tally.error if outcome == "error" else self.tally.lost)(kind, message)
            return False, exc
        elapsed = time.perf_counter() - start
        problem = check(result) if check is not None else None
        if problem:
            self.tally.error(kind, f"wrong answer: {problem}")
            return False, result
        self.tally.ok(kind, proto, elapsed)
        return True, result


# ---------------------------------------------------------------------------------------------
# request contents


Check = Callable[[Callable[[str], Any]], str | None]


def case(model: str, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], Check]:
    """Inputs for ``model`` and a check of its outputs (given a name -> array getter)."""
    if model == "add_sub":
        a, b = rng.standard_normal((2, 1, 16)).astype(np.float32)

        def check_add_sub(get: Callable[[str], Any]) -> str | None:
            if not np.allclose(get("OUTPUT0"), a + b) or not np.allclose(get("OUTPUT1"), a - b):
                return "add_sub outputs differ"
            return None
        return {"INPUT0": a, "INPUT1": b}, check_add_sub
    if model == "mlp":
        x = rng.standard_normal((1, 784)).astype(np.float32)

        def check_mlp(get: Callable[[str], Any]) -> str | None:
            out = get("OUTPUT0")
            if out is None or out.shape != (1, 10) or not np.all(np.isfinite(out)):
                return f"mlp output {None if out is None else out.shape}"
            return None
        return {"INPUT0": x}, check_mlp
    n = int(rng.integers(1, 64))
    x = rng.standard_normal((1, n)).astype(np.float32)

    def check_identity(get: Callable[[str], Any]) -> str | None:
        out = get("OUTPUT0")
        return None if out is not None and np.array_equal(out, x) else "identity output differs"
    return {"INPUT0": x}, check_identity


def http_inputs(arrays: dict[str, np.ndarray], binary: bool) -> list[httpclient.InferInput]:
    return [httpclient.InferInput(name, list(a.shape), "FP32").set_data_from_numpy(a, binary_data=binary)
            for name, a in arrays.items()]


def grpc_inputs(arrays: dict[str, np.ndarray], datatype: str = "FP32") -> list[grpcclient.InferInput]:
    out = []
    for name, a in arrays.items():
        inp = grpcclient.InferInput(name, list(a.shape), datatype)
        inp.set_data_from_numpy(a)
        out.append(inp)
    return out


def add_sub_json_body() -> bytes:
    data = list(range(16))
    return json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": data}]}).encode()


def model_infer_message(model: str = "add_sub") -> bytes:
    """A gRPC-framed ModelInferRequest for add_sub (raw input contents)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, "FP32"
        tensor.shape.extend([1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    body = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


# ---------------------------------------------------------------------------------------------
# workers


def http_infer_worker(ctx: Ctx, binary: bool, rate: float, seed: int) -> None:
    kind = "http_binary" if binary else "http_json"
    rng = np.random.default_rng(seed)
    client = httpclient.InferenceServerClient(ctx.http_url, connection_timeout=CALL_TIMEOUT,
                                              network_timeout=CALL_TIMEOUT)
    try:
        for i in range(ctx.bound(rate)):
            if not ctx.running():
                break
            started = time.monotonic()
            model = MODELS[i % len(MODELS)]
            arrays, check = case(model, rng)
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary)
                       for n in (("OUTPUT0", "OUTPUT1") if model == "add_sub" else ("OUTPUT0",))]
            ctx.call(kind, lambda m=model, a=arrays, o=outputs: client.infer(
                m, http_inputs(a, binary), outputs=o), proto="http", check=lambda r, c=check: c(r.as_numpy))
            ctx.pace(rate, started)
    finally:
        client.close()


def grpc_infer_worker(ctx: Ctx, rate: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    client = grpcclient.InferenceServerClient(ctx.grpc_url)
    try:
        for i in range(ctx.bound(rate)):
            if not ctx.running():
                break
            started = time.monotonic()
            model = MODELS[i % len(MODELS)]
            arrays, check = case(model, rng)
            ctx.call("grpc", lambda m=model, a=arrays: client.infer(
                m, grpc_inputs(a), client_timeout=CALL_TIMEOUT),
                     proto="grpc", check=lambda r, c=check: c(r.as_numpy))
            ctx.pace(rate, started)
    finally:
        client.close()


def stream_worker(ctx: Ctx, rate: float, seed: int, per_stream: int = 20) -> None:
    """py_repeat over gRPC streams: each request of n values must come back as n responses
    (the values, in order) and an empty final one; a stream is restarted every ``per_stream``
    requests and after any failure."""
    rng = np.random.default_rng(seed)
    sent = 0
    while ctx.running() and sent < ctx.bound(rate):
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = grpcclient.InferenceServerClient(ctx.grpc_url)
        broken = False
        try:
            client.start_stream(callback=lambda result, error, q=answers: q.put((result, error)))
            for _ in range(per_stream):
                if not ctx.running() or broken:
                    break
                started = time.monotonic()
                values = rng.integers(0, 1000, int(rng.integers(1, 5))).astype(np.int32)
                sent += 1
                ctx.tally.sent("stream")
                request_id = f"s{sent}"
                try:
                    client.async_stream_infer("py_repeat", grpc_inputs({"IN": values}, "INT32"),
                                              request_id=request_id, enable_empty_final_response=True)
                except Exception as exc:  # noqa: BLE001
                    outcome, message = classify(exc)
                    cause = _stream_error(answers)  # why the stream broke, if it said
                    if cause:
                        message = f"{message} (the stream's error: {cause})"
                    (ctx.tally.error if outcome == "error" else ctx.tally.lost)("stream", message)
                    broken = True
                    break
                got: list[int] = []
                outcome = None
                deadline = time.monotonic() + CALL_TIMEOUT
                while outcome is None:
                    try:
                        result, error = answers.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        ctx.tally.lost("stream", f"no final response within {CALL_TIMEOUT:.0f} s")
                        outcome, broken = "lost", True
                        break
                    if error is not None:
                        kind, message = classify(error)
                        (ctx.tally.error if kind == "error" else ctx.tally.lost)("stream", message)
                        outcome, broken = kind, True  # the stream itself failed
                        break
                    response = result.get_response()
                    if response.id != request_id:
                        ctx.tally.error("stream", f"answer for {response.id!r}, waiting for {request_id!r}")
                        outcome, broken = "error", True
                        break
                    final = response.parameters.get("triton_final_response")
                    if response.outputs:
                        got.append(int(result.as_numpy("OUT")[0]))
                    if final is not None and final.bool_param:
                        if got == values.tolist():
                            ctx.tally.ok("stream")
                        else:
                            ctx.tally.error("stream", f"wrong answer: {got} for {values.tolist()}")
                        outcome = "done"
                ctx.pace(rate, started)
        finally:
            stopper = threading.Thread(target=_quietly, args=(client.stop_stream, True), daemon=True)
            stopper.start()
            stopper.join(CALL_TIMEOUT)
            if stopper.is_alive():
                ctx.tally.lost("stream", "stop_stream did not return")
            _quietly(client.close)


def churn_worker(ctx: Ctx, rate: float) -> None:
    """Load / infer / unload of ``spare`` (explicit mode), HTTP and gRPC admins in turn; every
    third cycle an infer is in flight while the model is unloaded; every fifth load carries a
    config override. Errors are expected only where a request races the unload."""
    http = httpclient.InferenceServerClient(ctx.http_url, connection_timeout=CALL_TIMEOUT,
                                            network_timeout=60)
    grpc = grpcclient.InferenceServerClient(ctx.grpc_url)
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    try:
        for cycle in range(ctx.bound(rate)):
            if not ctx.running():
                break
            started = time.monotonic()
            admin = http if cycle % 2 == 0 else grpc
            proto = "http" if admin is http else "grpc"
            if cycle % 5 == 4:
                config = json.dumps({"max_batch_size": 4, "dynamic_batching": {}})
                ctx.event(f"churn load spare (config override, {proto})")
                ctx.call("churn_load", lambda a=admin, c=config: a.load_model("spare", config=c))
            else:
                ctx.event(f"churn load spare ({proto})")
                ctx.call("churn_load", lambda a=admin: a.load_model("spare"))
            ctx.call("churn_infer", lambda: http.infer("spare", http_inputs({"INPUT0": x}, True)),
                     check=lambda r: None if np.array_equal(r.as_numpy("OUTPUT0"), x) else "spare output")
            ctx.call("churn_index", lambda a=admin: a.get_model_repository_index())
            inflight: queue.Queue[tuple[Any, Any]] = queue.Queue()
            if cycle % 3 == 0:
                ctx.tally.sent("churn_unload_inflight")
                try:
                    grpc.async_infer("spare", grpc_inputs({"INPUT0": x}), client_timeout=CALL_TIMEOUT,
                                     callback=lambda result, error, q=inflight: q.put((result, error)))
                except Exception as exc:  # noqa: BLE001
                    inflight.put((None, exc))
            ctx.event(f"churn unload spare ({proto})")
            ctx.call("churn_unload", lambda a=admin: a.unload_model("spare"))
            if cycle % 3 == 0:
                try:
                    result, error = inflight.get(timeout=CALL_TIMEOUT + 5)
                except queue.Empty:
                    ctx.tally.lost("churn_unload_inflight", "no answer to the infer raced with unload")
                else:
                    if error is None:
                        ctx.tally.ok("churn_unload_inflight")
                    else:
                        kind, message = classify(error)
                        record = ctx.tally.error if kind == "error" else ctx.tally.lost
                        record("churn_unload_inflight", message)
            ctx.call("churn_infer_after_unload",
                     lambda: http.infer("spare", http_inputs({"INPUT0": x}, True)))
            ctx.pace(rate, started)
    finally:
        _quietly(http.close)
        _quietly(grpc.close)


def shm_worker(ctx: Ctx, rate: float, seed: int) -> None:
    """System shared memory churn: two fresh regions per cycle, registered, read by an add_sub
    infer and written by it, unregistered and destroyed; HTTP and gRPC in turn."""
    rng = np.random.default_rng(seed)
    http = httpclient.InferenceServerClient(ctx.http_url, connection_timeout=CALL_TIMEOUT,
                                            network_timeout=CALL_TIMEOUT)
    grpc = grpcclient.InferenceServerClient(ctx.grpc_url)
    tag = f"soak{os.getpid()}"
    try:
        for cycle in range(ctx.bound(rate)):
            if not ctx.running():
                break
            started = time.monotonic()
            lib, client = (httpclient, http) if cycle % 2 == 0 else (grpcclient, grpc)
            names = (f"{tag}_{cycle}_in", f"{tag}_{cycle}_out")
            handles = [shm.create_shared_memory_region(n, f"/{n}", 128) for n in names]
            try:
                a, b = rng.standard_normal((2, 1, 16)).astype(np.float32)
                shm.set_shared_memory_region(handles[0], [a, b])
                for n in names:
                    ctx.call("shm_register",
                             lambda n=n, c=client: c.register_system_shared_memory(n, f"/{n}", 128))
                inputs = [lib.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
                inputs[0].set_shared_memory(names[0], 64)
                inputs[1].set_shared_memory(names[0], 64, offset=64)
                outputs = [lib.InferRequestedOutput("OUTPUT0"), lib.InferRequestedOutput("OUTPUT1")]
                outputs[0].set_shared_memory(names[1], 64)
                outputs[1].set_shared_memory(names[1], 64, offset=64)

                def check(_: Any, a: np.ndarray = a, b: np.ndarray = b, out: Any = handles[1]) -> str | None:
                    got0 = shm.get_contents_as_numpy(out, np.float32, [1, 16])
                    got1 = shm.get_contents_as_numpy(out, np.float32, [1, 16], offset=64)
                    same = np.allclose(got0, a + b) and np.allclose(got1, a - b)
                    return None if same else "region contents"
                if client is http:
                    ctx.call("shm_infer", lambda i=inputs, o=outputs: http.infer("add_sub", i, outputs=o),
                             check=check)
                else:
                    ctx.call("shm_infer", lambda i=inputs, o=outputs: grpc.infer(
                        "add_sub", i, outputs=o, client_timeout=CALL_TIMEOUT), check=check)
                for n in names:
                    ctx.call("shm_unregister", lambda n=n, c=client: c.unregister_system_shared_memory(n))
            finally:
                for h in handles:
                    _quietly(shm.destroy_shared_memory_region, h)
            ctx.pace(rate, started)
    finally:
        _quietly(http.close)
        _quietly(grpc.close)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sock


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the kernel sends a TCP RST instead of a FIN."""
    sock.close()


def _h2_request(body: bytes, cut: int | None) -> bytes:
    """A client connection's bytes: preface, SETTINGS, HEADERS of a ModelInfer and its DATA
    (the first ``cut`` bytes of it when cut is given, without END_STREAM)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1"),
                            (":path", "/inference.GRPCInferenceService/ModelInfer"),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    if cut is None:
        conn.send_data(sid, body, end_stream=True)
    else:
        conn.send_data(sid, body[:cut])
    return conn.data_to_send()


def vanish_worker(ctx: Ctx, rate: float) -> None:
    """Clients that go away mid-request, one kind after another (minus ``--without``)."""
    kinds = [k for k in VANISH_KINDS if k not in ctx.without]
    if not kinds:
        return
    http_body = add_sub_json_body()
    head = (f"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(http_body)}\r\n\r\n").encode()
    grpc_body = model_infer_message()
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    for i in range(ctx.bound(rate)):
        if not ctx.running():
            break
        started = time.monotonic()
        kind = kinds[i % len(kinds)]
        ctx.event(f"vanish {kind}")
        try:
            if kind == "http_half_headers":
                sock = _connect(ctx.server.http_port)
                sock.sendall(head[: len(head) // 2])
                _reset(sock)
            elif kind == "http_half_body":
                sock = _connect(ctx.server.http_port)
                sock.sendall(head + http_body[: len(http_body) // 2])
                _reset(sock)
            elif kind == "http_full_rst":
                sock = _connect(ctx.server.http_port)
                sock.sendall(head + http_body)
                time.sleep(0.01)  # long enough for the answer to be on its way
                _reset(sock)
            elif kind == "grpc_preface_rst":
                sock = _connect(ctx.server.grpc_port)
                conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
                conn.initiate_connection()
                sock.sendall(conn.data_to_send())
                _reset(sock)
            elif kind == "grpc_half_rst":
                sock = _connect(ctx.server.grpc_port)
                sock.sendall(_h2_request(grpc_body, len(grpc_body) // 2))
                _reset(sock)
            elif kind == "grpc_infer_rst":
                sock = _connect(ctx.server.grpc_port)
                sock.sendall(_h2_request(grpc_body, None))
                time.sleep(0.02)  # the reply is written to a client that never reads it
                _reset(sock)
            elif kind == "http_client_timeout":
                client = httpclient.InferenceServerClient(ctx.http_url, network_timeout=0.0005)
                try:
                    client.infer("mlp", http_inputs({"INPUT0": np.zeros((1, 784), np.float32)}, True))
                except Exception:  # noqa: BLE001, S110 - the point is to give up mid-flight
                    pass
                _quietly(client.close)
            elif kind == "grpc_client_dropped":
                # its own TCP connection: grpcio shares one between channels to the same target,
                # and closing this channel mid-call closed the socket under the other clients'
                # streams ("Stream removed (Socket closed)"), which the soak counted as lost
                client = grpcclient.InferenceServerClient(
                    ctx.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
                client.async_infer("add_sub", grpc_inputs({"INPUT0": x, "INPUT1": x}),
                                   callback=lambda result, error: None)
                client.close()  # cancels the call in flight
                del client
        except OSError as exc:
            # a vanishing client that cannot even connect says the port is gone
            ctx.tally.lost(f"vanish_{kind}", f"connect/send failed: {type(exc).__name__}: {exc}")
            ctx.tally.sent(f"vanish_{kind}")
        else:
            ctx.tally.abandoned(f"vanish_{kind}")
        ctx.pace(rate, started)


def _stream_error(answers: queue.Queue[tuple[Any, Any]]) -> str:
    """The error a broken stream's callback delivered (tritonclient marks the stream dead
    on an RpcError and reports it only through the callback), or ''."""
    while True:
        try:
            _, error = answers.get_nowait()
        except queue.Empty:
            return ""
        if error is not None:
            return f"{error.status() or ''} {error.message() or error}".strip()[:200]


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001, S110 - cleanup of a client whose fate is already counted
        pass


def guarded(ctx: Ctx, name: str, fn: Callable[..., None], *args: Any) -> threading.Thread:
    def run() -> None:
        try:
            fn(ctx, *args)
        except Exception:  # noqa: BLE001 - a bug in the soak itself is reported, not hidden
            ctx.worker_crashes.append(f"{name}: {traceback.format_exc()}")
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------------------------------
# sampling


def proc_status(pid: int) -> dict[str, Any]:
    values: dict[str, Any] = {"rss_kb": None, "threads": None, "fds": None, "cpu_s": None}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                values["rss_kb"] = int(line.split()[1])
            elif line.startswith("Threads:"):
                values["threads"] = int(line.split()[1])
        values["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        # utime and stime, fields 14 and 15 of /proc/<pid>/stat (after the parenthesised name)
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        values["cpu_s"] = round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError):
        pass
    return values


def machine_cpu() -> tuple[float, float, float, float]:
    """The machine's busy, stolen and total CPU seconds since boot, and this soak process's
    own CPU seconds: per interval they say how much of the two cores went to
    neither the server nor the soak (other tenants of a shared machine), which is what a p99
    jump that the server did not cause coincides with."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    busy = sum(ticks[i] for i in (0, 1, 2, 5, 6) if i < len(ticks))
    steal = ticks[7] if len(ticks) > 7 else 0
    own = os.times()
    return busy / hz, steal / hz, sum(ticks[:8]) / hz, own.user + own.system


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def healthy(ctx: Ctx, path: str = "/v2/health/live") -> bool:
    try:
        with urllib.request.urlopen(f"http://{ctx.http_url}{path}", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def watch_process(ctx: Ctx) -> None:
    code = ctx.server.proc.wait()
    if not ctx.stopping_server:
        name = signal.Signals(-code).name if code < 0 else f"exit code {code}"
        ctx.died = {"at": ctx.now(), "code": code, "how": name}
        ctx.stop.set()


COLUMNS = ["t_s", "rss_kb", "fds", "threads", "cpu_s", "other_cpu_pct", "steal_pct", "http_n", "http_p50_ms",
           "http_p99_ms", "grpc_n", "grpc_p50_ms", "grpc_p99_ms", "sent", "ok", "errors", "lost", "abandoned",
           "live"]


def sample_loop(ctx: Ctx, interval: float, out_csv: Path) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    unhealthy = 0
    with open(out_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        next_at = time.monotonic() + interval
        before, server_before = machine_cpu(), proc_status(ctx.server.proc.pid)["cpu_s"] or 0.0
        while not ctx.stop.is_set():
            ctx.stop.wait(max(0.0, min(next_at, ctx.deadline) - time.monotonic()))
            if ctx.stop.is_set():
                break
            next_at += interval
            status = proc_status(ctx.server.proc.pid)
            latency = ctx.tally.take_latencies()
            live = healthy(ctx)
            row: dict[str, Any] = {"t_s": round(ctx.now(), 1), **status, **ctx.tally.totals(),
                                   "live": int(live)}
            after = machine_cpu()
            busy, steal, total, own = (b - a for a, b in zip(before, after, strict=True))
            server_cpu = (status["cpu_s"] or server_before) - server_before
            if total > 0:
                row["other_cpu_pct"] = round(100 * max(0.0, busy - server_cpu - own) / total, 1)
                row["steal_pct"] = round(100 * steal / total, 1)
            before, server_before = after, status["cpu_s"] or server_before
            for proto in ("http", "grpc"):
                row[f"{proto}_n"] = len(latency[proto])
                row[f"{proto}_p50_ms"] = _round(percentile(latency[proto], 50))
                row[f"{proto}_p99_ms"] = _round(percentile(latency[proto], 99))
            samples.append(row)
            writer.writerow(row)
            f.flush()
            print(f"[{row['t_s']:7.1f} s] rss {row['rss_kb']} kB  fds {row['fds']}  "
                  f"threads {row['threads']}  "
                  f"http p99 {row['http_p99_ms']} ms ({row['http_n']})  grpc p99 {row['grpc_p99_ms']} ms "
                  f"({row['grpc_n']})  others' CPU {row.get('other_cpu_pct')}%  "
                  f"sent {row['sent']} lost {row['lost']} errors {row['errors']}"
                  f"{'' if live else '  NOT LIVE'}", flush=True)
            unhealthy = 0 if live else unhealthy + 1
            if unhealthy >= 3 and ctx.server.proc.poll() is None:
                ctx.frozen_at = ctx.now()
                print("server alive but not answering health checks for three intervals: stopping",
                      flush=True)
                ctx.stop.set()
            if time.monotonic() >= ctx.deadline:
                break
    return samples


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ---------------------------------------------------------------------------------------------
# verdict and report


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(statistics.median(values)) if values else None


def verdict(ctx: Ctx, samples: list[dict[str, Any]], warmup: float,
            final: dict[str, Any]) -> list[tuple[str, bool, str]]:
    checks: list[tuple[str, bool, str]] = []
    end = samples[-1]["t_s"] if samples else 0.0
    warm_end = ctx.seconds * warmup
    measured = [s for s in samples if s["t_s"] > warm_end]
    # the first and the last minute of the measured part; a third of it each in a short run, so
    # that the two windows never overlap
    window = min(60.0, (end - warm_end) / 3)
    base = [s for s in measured if s["t_s"] <= warm_end + window] or measured[:1]
    last = [s for s in measured if s["t_s"] > end - window] or samples[-1:]
    enough = len(measured) >= 2
    if not enough:
        checks.append(("samples after warm-up", False, f"{len(measured)} (the run ended too early)"))
    else:
        b, e = _median(base, "rss_kb"), _median(last, "rss_kb")
        if b and e:
            growth = e / b - 1
            checks.append(("RSS growth < 5%", growth < RSS_LIMIT,
                           f"{b / 1024:.1f} MiB (first {window:.0f} s after warm-up) -> {e / 1024:.1f} MiB "
                           f"(last {window:.0f} s): {growth * 100:+.2f}%"))
        for key, tol in (("fds", FD_TOLERANCE), ("threads", THREAD_TOLERANCE)):
            b, e = _median(base, key), _median(last, key)
            if b is not None and e is not None:
                checks.append((f"{key} flat (+{tol} at most)", e - b <= tol,
                               f"{b:g} -> {e:g} (max over the run {max(s[key] or 0 for s in samples)})"))
        for proto in ("http", "grpc"):
            ref = _median(measured, f"{proto}_p99_ms")
            tail = _median(last, f"{proto}_p99_ms")
            if ref is None or tail is None:
                checks.append((f"{proto} p99 stable", False, "no latencies measured"))
                continue
            limit = max(P99_FACTOR * ref, ref + P99_FLOOR_MS)
            worst = max(s[f"{proto}_p99_ms"] or 0 for s in measured)
            others = (_median(last, "other_cpu_pct"), _median(measured, "other_cpu_pct"))
            checks.append((f"{proto} p99 stable", tail <= limit,
                           f"last {window:.0f} s {tail:.2f} ms vs post-warm-up median {ref:.2f} ms "
                           f"(limit {limit:.2f} ms; worst interval {worst:.2f} ms; other processes' "
                           f"CPU {others[0]}% of the machine then, {others[1]}% over the run)"))
    totals = ctx.tally.totals()
    unanswered = sum(max(0, ctx.tally.unanswered(k)) for k in list(ctx.tally.kinds))
    checks.append(("zero lost requests", totals["lost"] == 0 and unanswered == 0,
                   f"{totals['lost']} lost, {unanswered} never answered, of {totals['sent']} sent"))
    unexpected = {k: sum(v.errors.values()) for k, v in ctx.tally.kinds.items()
                  if k not in ERRORS_EXPECTED and v.errors}
    checks.append(("no unexpected error answers", not unexpected,
                   ", ".join(f"{k}: {n}" for k, n in unexpected.items()) or "none"))
    if ctx.died:
        checks.append(("server alive", False, f"DIED at {ctx.died['at']:.1f} s ({ctx.died['how']})"))
    elif ctx.frozen_at is not None:
        checks.append(("server alive", False, f"FROZE (no health answer) by {ctx.frozen_at:.1f} s"))
    else:
        checks.append(("server alive at the end", final["alive"], final["detail"]))
        checks.append(("clean exit on SIGTERM", final.get("exit_code") == 0,
                       f"exit code {final.get('exit_code')} after {final.get('exit_s', 0):.1f} s"))
    if ctx.worker_crashes:
        checks.append(("soak workers ran to the end", False,
                       f"{len(ctx.worker_crashes)} crashed (see below)"))
    return checks


def final_checks(ctx: Ctx) -> dict[str, Any]:
    if ctx.server.proc.poll() is not None:
        return {"alive": False, "detail": "process gone"}
    parts, alive = [], True
    for path in ("/v2/health/live", "/v2/health/ready"):
        ok = healthy(ctx, path)
        parts.append(f"{path.rsplit('/', 1)[1]} {'ok' if ok else 'FAILED'}")
        alive &= ok
    rng = np.random.default_rng(99)
    arrays, check = case("add_sub", rng)
    http = httpclient.InferenceServerClient(ctx.http_url, network_timeout=CALL_TIMEOUT)
    grpc = grpcclient.InferenceServerClient(ctx.grpc_url)
    try:
        ok, _ = ctx.call("final", lambda: http.infer("add_sub", http_inputs(arrays, True)),
                         check=lambda r: check(r.as_numpy))
        parts.append(f"http infer {'ok' if ok else 'FAILED'}")
        alive &= ok
        ok, _ = ctx.call("final", lambda: grpc.infer("add_sub", grpc_inputs(arrays),
                                                      client_timeout=CALL_TIMEOUT),
                         check=lambda r: check(r.as_numpy))
        parts.append(f"grpc infer {'ok' if ok else 'FAILED'}")
        alive &= ok
    finally:
        _quietly(http.close)
        _quietly(grpc.close)
    return {"alive": alive, "detail": ", ".join(parts)}


def stop_server(ctx: Ctx, final: dict[str, Any]) -> None:
    ctx.stopping_server = True
    proc = ctx.server.proc
    if proc.poll() is not None:
        return
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        final["exit_code"] = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        final["exit_code"] = "none: killed after 60 s"
    final["exit_s"] = time.monotonic() - started


def report(ctx: Ctx, args: argparse.Namespace, samples: list[dict[str, Any]],
           checks: list[tuple[str, bool, str]], out: Path, log_text: str, stuck: list[str]) -> str:
    passed = all(ok for _, ok, _ in checks)
    lines = [f"# Soak, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
             f"{'PASSED' if passed else 'FAILED'}", "",
             f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}",
             f"command: python bench/soak.py {' '.join(sys.argv[1:])}",
             f"ran {ctx.now():.0f} s of {ctx.seconds:.0f} s planned; warm-up {args.warmup * 100:.0f}% "
             f"({ctx.seconds * args.warmup:.0f} s); {len(samples)} samples every {args.interval:g} s",
             f"vanishing kinds left out: {', '.join(sorted(ctx.without)) or 'none'}", "",
             "## Verdict", "", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {name} | {'pass' if ok else '**FAIL**'} | {detail} |" for name, ok, detail in checks]
    if ctx.died:
        lines += ["", "## The server died", "",
                  f"At {ctx.died['at']:.1f} s into the run, {ctx.died['how']}. "
                  "The client actions just before:",
                  "", "```"]
        lines += [f"{t:8.2f} s  {what}" for t, what in ctx.events if t <= ctx.died["at"] + 0.5][-15:]
        lines += ["```"]
    if ctx.died or ctx.frozen_at is not None or not passed:
        log_lines = log_text.splitlines()
        causes = [line.strip(" |") for line in log_lines if EXCEPTION_LINE.match(line)]
        if causes:
            lines += ["", f"Last exception in the server log: `{causes[-1]}`"]
        tail = log_lines[-40:]
        lines += ["", "Server log, last lines:", "", "```", *tail, "```"]
    lines += ["", "## Requests by kind", "",
              "| kind | sent | ok | error answers | lost | abandoned (on purpose) |",
              "|---|---|---|---|---|---|"]
    with ctx.tally.lock:
        kinds = sorted(ctx.tally.kinds.items())
        for name, k in kinds:
            lines.append(f"| {name} | {k.sent} | {k.ok} | {sum(k.errors.values())} | {sum(k.lost.values())} "
                         f"| {k.abandoned} |")
        messages = [(name, "error", m, n) for name, k in kinds for m, n in k.errors.most_common(8)]
        messages += [(name, "lost", m, n) for name, k in kinds for m, n in k.lost.most_common(8)]
    if messages:
        lines += ["", "Error answers and losses by message (up to 8 per kind):", "",
                  "| kind | outcome | count | message |", "|---|---|---|---|"]
        lines += [f"| {name} | {what} | {n} | `{m.replace('|', '/')}` |" for name, what, m, n in messages]
    if stuck:
        lines += ["", f"Workers still running after the stop: {', '.join(stuck)}"]
    if ctx.worker_crashes:
        lines += ["", "Soak workers that crashed (a bug in the soak, not the server):", "", "```"]
        lines += [c for crash in ctx.worker_crashes for c in crash.splitlines()[-6:]]
        lines += ["```"]
    if samples:
        lines += ["", "## Samples", "",
                  "| t s | RSS MiB | fds | threads | server CPU s | others' CPU % | http p50 / p99 ms "
                  "| grpc p50 / p99 ms | sent | lost |", "|---|---|---|---|---|---|---|---|---|---|"]
        step = max(1, len(samples) // 30)
        for s in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
            rss = f"{s['rss_kb'] / 1024:.1f}" if s["rss_kb"] else "-"
            lines.append(f"| {s['t_s']:.0f} | {rss} | {s['fds']} | {s['threads']} | {s['cpu_s']} | "
                         f"{s.get('other_cpu_pct')} | "
                         f"{s['http_p50_ms']} / {s['http_p99_ms']} | "
                         f"{s['grpc_p50_ms']} / {s['grpc_p99_ms']} | "
                         f"{s['sent']} | {s['lost']} |")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


# ---------------------------------------------------------------------------------------------


# name: (function, its arguments after ctx); rates are requests (or cycles) per second
WORKERS: dict[str, tuple[Callable[..., None], tuple[Any, ...]]] = {
    "http_json": (http_infer_worker, (False, 25.0, 1)),
    "http_binary": (http_infer_worker, (True, 25.0, 2)),
    "grpc": (grpc_infer_worker, (25.0, 3)),
    "stream": (stream_worker, (5.0, 4)),
    "churn": (churn_worker, (1.0,)),
    "shm": (shm_worker, (3.0, 5)),
    "vanish": (vanish_worker, (4.0,)),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=0.2, help="share of the run left out of the verdict")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every worker's request rate")
    parser.add_argument("--without", default="",
                        help=f"comma-separated workers ({', '.join(WORKERS)}) or vanishing kinds "
                             f"({', '.join(VANISH_KINDS)}) to leave out")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    without = {w for w in args.without.split(",") if w}
    unknown = without - set(WORKERS) - set(VANISH_KINDS)
    if unknown:
        parser.error(f"unknown --without entries: {', '.join(sorted(unknown))}")
    out = args.out or ROOT / "bench" / "results" / f"soak-{time.strftime('%Y%m%d-%H%M')}"
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="nursery-soak-"))
    try:
        repo = tmp / "repo"
        build_repo(repo)
        server = ServerProcess(repo, *server_flags(), log_path=tmp / "server.log")
        try:
            server.wait_ready(timeout=120)
        except (RuntimeError, TimeoutError) as exc:
            server.stop()
            print(f"the server did not start: {exc}", file=sys.stderr)
            return 2
        print(f"server pid {server.proc.pid}: http {server.http_port}, grpc {server.grpc_port}; "
              f"soaking {args.minutes:g} min, results in {out}", flush=True)
        ctx = Ctx(server, args.minutes * 60, args.scale, without)
        threading.Thread(target=watch_process, args=(ctx,), name="watch", daemon=True).start()
        threads = [guarded(ctx, name, fn, *fargs) for name, (fn, fargs) in WORKERS.items()
                   if name not in without]
        try:
            samples = sample_loop(ctx, args.interval, out / "samples.csv")
        except KeyboardInterrupt:
            samples = []
            print("interrupted", flush=True)
        ctx.stop.set()
        join_until = time.monotonic() + CALL_TIMEOUT + 30
        for t in threads:
            t.join(max(0.0, join_until - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        final: dict[str, Any] = {"alive": False, "detail": "not checked"}
        if not ctx.died and ctx.frozen_at is None:
            final = final_checks(ctx)
        stop_server(ctx, final)
        server._log.close()
        log_text = server.log_path.read_text(errors="replace")
        log_lines = log_text.splitlines()
        (out / "server.log").write_text("\n".join(log_lines[-2000:]) + "\n")
        # every warning and error of the whole run (glog's W/E lines), with what follows each
        problems = [line for line in log_lines if line[:1] in ("W", "E")]
        (out / "server-problems.log").write_text("\n".join(problems[-5000:]) + "\n")
        checks = verdict(ctx, samples, args.warmup, final)
        text = report(ctx, args, samples, checks, out, log_text, stuck)
        print(text)
        print(f"summary: {out / 'summary.md'}")
        gc.collect()  # tritonclient.http clients' __del__ needs gevent: run it now, not at interpreter exit
        return 0 if all(ok for _, ok, _ in checks) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

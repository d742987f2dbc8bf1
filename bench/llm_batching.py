#!/usr/bin/env python3
"""Continuous batching against static batching and one request at a time, on the bundled
tiny_llm, with NVIDIA's tritonclient (gRPC streams: one response per token).

    python bench/llm_batching.py [--modes continuous,static,sequential]
                                 [--concurrency 1,8,16,32] [--requests-per-client 12]
                                 [--max-tokens 8,16,32,64,128,256] [--slots 32] [--json OUT]
                                 [--max-num-batched-tokens N] [--width W --layers L]
                                 [--max-prefill-overhead 0.1,off]

For each batching mode (the model's ``batching_mode`` parameter) it copies tiny_llm into a
temporary repository, starts ``python -m nursery serve`` on free loopback ports and, at each
concurrency C, runs C clients, each with its own stream, each sending its requests one after
another (``stream`` true, a seeded sampled generation, ``max_tokens`` drawn from the
``--max-tokens`` list: mixed output lengths). Reported per mode and concurrency: output
tokens/s (all tokens over the wall time), time to first token (p50, p99), inter-token
latency (the gaps between a request's consecutive tokens, p50, p99), and at the end the
ratios the issue sets as its target (continuous >= 2x sequential and >= 1.5x static tokens/s
at C=16, p99 inter-token latency no worse than static's).

Twelve requests per client by default: with four (the default until 2026-11-25) the last
third of a run is a few clients' long requests finishing alone, a drain in which every
mode runs the same few sequences, which pulls every ratio toward 1 (continuous 1.27-1.38x
static at four requests per client, 1.84x at twelve, in one run under load).

The clients run in this process, beside the server: on a small machine they share its cores.
Run it on a quiet machine and alone; a smoke run is
``--concurrency 1,2 --requests-per-client 1 --max-tokens 4,8``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tritonclient.grpc as grpcclient  # noqa: E402

from tests.conftest import ServerProcess  # noqa: E402

MODEL = "tiny_llm"
PROMPTS = ["Serve the bundled models", "The scheduler takes every waiting message",
           "A model repository in a bucket", "What does the decode loop do at each step?",
           "Triton users switch unchanged", "tokens per second"]


@dataclass
class Trace:
    """One request: when it was sent, when each of its tokens arrived."""

    sent: float
    arrivals: list[float] = field(default_factory=list)
    error: str | None = None


def with_mode(repo: Path, mode: str, slots: int, process: bool = False,
              width: int = 0, layers: int = 0, budget: int = 0, overhead: str = "") -> None:
    source = ROOT / "model_repository" / MODEL
    shutil.copytree(source, repo / MODEL)
    if width:  # a wider decoder: its step, not the serving path, sets the pace
        sys.path.insert(0, str(ROOT / "scripts"))
        import make_llm

        make_llm.widen(repo / MODEL, width, layers or 4)
    config = (repo / MODEL / "config.pbtxt").read_text()
    lines = []
    for line in config.splitlines():
        if '"batching_mode"' in line:
            line = f'parameters {{ key: "batching_mode" value: {{ string_value: "{mode}" }} }}'
        elif '"max_slots"' in line:
            line = f'parameters {{ key: "max_slots" value: {{ string_value: "{slots}" }} }}'
        lines.append(line)
    if process:
        lines.append('parameters { key: "nursery_instance_mode" value: { string_value: "process" } }')
    if budget:  # the decode step's token budget (chunked prefill; default: max_slots)
        lines.append(f'parameters {{ key: "max_num_batched_tokens" value: {{ string_value: '
                     f'"{budget}" }} }}')
    if overhead:  # continuous mode's prefill cap (default: the model's, 0.1)
        lines.append(f'parameters {{ key: "max_prefill_overhead" value: {{ string_value: '
                     f'"{overhead}" }} }}')
    (repo / MODEL / "config.pbtxt").write_text("\n".join(lines) + "\n")


def _tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def client_run(url: str, worker: int, count: int, lengths: list[int], seed: int,
               traces: list[Trace], start: threading.Barrier, cpus: set[int]) -> None:
    if cpus:  # this thread, and the client library's threads it starts, on these cores only
        os.sched_setaffinity(0, cpus)
    client = grpcclient.InferenceServerClient(url)
    answers: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(
        (time.perf_counter(), result, error)))
    rng = np.random.default_rng(seed + worker)
    start.wait()
    try:
        for n in range(count):
            max_tokens = int(rng.choice(lengths))
            prompt = PROMPTS[(worker + n) % len(PROMPTS)]
            inputs = [
                _tensor("text_input", np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
                _tensor("stream", np.array([[True]]), "BOOL"),
                _tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
                _tensor("seed", np.array([[seed * 1000 + worker * 100 + n]], dtype=np.uint64),
                        "UINT64"),
                _tensor("return_num_output_tokens", np.array([[True]]), "BOOL"),
            ]
            trace = Trace(time.perf_counter())
            traces.append(trace)
            client.async_stream_infer(MODEL, inputs, request_id=f"{worker}-{n}",
                                      enable_empty_final_response=True)
            while True:
                at, result, error = answers.get(timeout=600)
                if error is not None:
                    trace.error = error.message()
                    break
                tokens = result.as_numpy("num_output_tokens")
                if tokens is not None:
                    trace.arrivals += [at] * int(tokens.reshape(-1)[0])
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
    finally:
        client.stop_stream()
        client.close()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def measure(server: ServerProcess, concurrency: int, args: argparse.Namespace
            ) -> dict[str, float]:
    url = f"127.0.0.1:{server.grpc_port}"
    traces: list[Trace] = []
    start = threading.Barrier(concurrency + 1)
    threads = [threading.Thread(target=client_run, args=(
        url, w, args.requests_per_client, args.lengths, args.seed, traces, start,
        args.client_cpus))
        for w in range(concurrency)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    errors = [t.error for t in traces if t.error]
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed, first: {errors[0]}")
    tokens = sum(len(t.arrivals) for t in traces)
    ttft = [(t.arrivals[0] - t.sent) * 1e3 for t in traces if t.arrivals]
    itl = [(b - a) * 1e3 for t in traces for a, b in zip(t.arrivals, t.arrivals[1:],
                                                          strict=False)]
    return {"concurrency": concurrency, "requests": len(traces), "tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "itl_p50_ms": percentile(itl, 50), "itl_p99_ms": percentile(itl, 99),
            "itl_mean_ms": statistics.fmean(itl) if itl else float("nan")}


def warm_up(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    done = threading.Event()
    client.start_stream(callback=lambda result, error: done.set())
    client.async_stream_infer(MODEL, [
        _tensor("text_input", np.array([[b"warm up"]], dtype=np.object_), "BYTES"),
        _tensor("max_tokens", np.array([[4]], dtype=np.int32), "INT32")])
    done.wait(120)
    client.stop_stream()
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="continuous,static,sequential")
    parser.add_argument("--concurrency", default="1,8,16,32")
    parser.add_argument("--requests-per-client", type=int, default=12)
    parser.add_argument("--max-tokens", default="8,16,32,64,128,256")
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--process", action="store_true",
                        help="run the model in a stub process (nursery_instance_mode)")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    parser.add_argument("--width", type=int, default=0,
                        help="serve tiny_llm widened to this hidden size (random weights, "
                        "4x wider MLP, no adapters): a decode step that costs what a real "
                        "model's does beside the serving path (0: the bundled weights)")
    parser.add_argument("--layers", type=int, default=0, help="with --width: layers (4)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=0,
                        help="the model's max_num_batched_tokens: tokens a decode step runs "
                        "at most, decodes first, then prompt chunks (0: the model's default, "
                        "max_slots)")
    parser.add_argument("--max-prefill-overhead", default="",
                        help="comma-separated values of the model's max_prefill_overhead "
                        "(continuous mode's prefill cap; 'off': the token budget only): "
                        "continuous batching runs once per value, labelled continuous@VALUE "
                        "(empty: the model's default)")
    parser.add_argument("--client-cpus", default="",
                        help="comma-separated CPU numbers the client threads run on (Linux; "
                        "empty: any): keeps the measuring clients off the server's cores")
    args = parser.parse_args()
    args.client_cpus = {int(c) for c in args.client_cpus.split(",") if c}
    args.lengths = [int(x) for x in args.max_tokens.split(",")]
    modes = args.modes.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    rows: list[dict[str, Any]] = []
    print("| mode | C | requests | output tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    overheads = args.max_prefill_overhead.split(",") if args.max_prefill_overhead else [""]
    runs = [(f"{mode}@{o}" if o and mode == "continuous" and len(overheads) > 1 else mode,
             mode, o if mode == "continuous" else "")
            for mode in modes for o in (overheads if mode == "continuous" else [""])]
    for label, mode, overhead in runs:
        with tempfile.TemporaryDirectory() as tmp:
            repo = Path(tmp) / "repo"
            repo.mkdir()
            with_mode(repo, mode, args.slots, args.process, args.width, args.layers,
                      args.max_num_batched_tokens, overhead)
            server = ServerProcess(repo, log_path=Path(tmp) / "server.log")
            try:
                server.wait_ready()
                warm_up(server)
                for c in levels:
                    row = {"mode": label, **measure(server, c, args)}
                    rows.append(row)
                    print(f"| {label} | {c} | {row['requests']} | {row['tokens_per_s']:.0f} | "
                          f"{row['ttft_p50_ms']:.1f} / {row['ttft_p99_ms']:.1f} | "
                          f"{row['itl_p50_ms']:.2f} / {row['itl_p99_ms']:.2f} |", flush=True)
            finally:
                code = server.stop()
                if code != 0:
                    print(server.log()[-3000:], file=sys.stderr)
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    for label, _, _ in runs:
        if label.startswith("continuous"):
            ratios(by, label, levels)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


def ratios(by: dict[tuple[str, int], dict[str, Any]], label: str, levels: list[int]) -> None:
    for c in levels:
        cont = by.get((label, c))
        if cont is None:
            continue
        notes = []
        for other in ("sequential", "static"):
            base = by.get((other, c))
            if base:
                notes.append(f"{cont['tokens_per_s'] / base['tokens_per_s']:.2f}x {other}")
        static = by.get(("static", c))
        if static:
            notes.append(f"p99 ITL {cont['itl_p99_ms']:.2f} vs static {static['itl_p99_ms']:.2f} ms")
        if notes:
            print(f"C={c}: {label} = " + ", ".join(notes))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The decode loop alone, on its own CPU clock: continuous against static batching with no
server, no client and no other process in the measurement (issue 27).

    python bench/llm_loop.py [--width 512 --layers 6] [--concurrency 16]
                             [--requests-per-client 12] [--max-tokens 8,16,32,64,128,256]
                             [--modes continuous,static] [--overhead off,0.25,0.1]
                             [--budget 0] [--rounds 3]

``bench/llm_batching.py`` measures the served path, where the 2-core machine's other
processes (the measuring clients, the server's threads, other work) preempt the decode
thread: its inter-token gaps are partly waits. Here the same model (tiny_llm widened as that
bench widens it: random weights, the bundled tokenizer) runs in ``nursery.llm.DecodeLoop``,
driven step by step in this process by C closed-loop clients, each sending its next request
as soon as its previous one ends (the bench's prompts and mixed ``max_tokens``, end-of-sequence
ignored so that every request runs to its length). Time is the decode thread's CPU time
(``time.thread_time``) summed over the steps: a token's arrival is the end of the step that
made it, so a gap is exactly the work of the steps between two tokens of a request, whatever
else the machine runs. Reported per mode: output tokens per CPU second, time to first token
and inter-token latency (p50, p99, max) in CPU milliseconds, and the step count. Rounds
alternate the modes; figures are medians over rounds. Use it to choose a scheduling policy
(the prefill cap ``--overhead``, the token budget ``--budget``); confirm the choice on the
served path with ``bench/llm_batching.py`` on a quiet machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench.llm_batching import MODEL, PROMPTS  # noqa: E402
from nursery.llm.decoder import load_decoder, set_blas_threads  # noqa: E402
from nursery.llm.engine import Chunk, DecodeLoop, Job  # noqa: E402
from nursery.llm.sampling import SamplingParams  # noqa: E402
from nursery.llm.tokenizer import ByteBPETokenizer  # noqa: E402


class Client:
    """One closed-loop client: its requests one after another, each one's token times."""

    def __init__(self, worker: int, count: int, lengths: list[int], seed: int,
                 tokenizer: ByteBPETokenizer) -> None:
        rng = np.random.default_rng(seed + worker)
        self.requests = [(tokenizer.encode(PROMPTS[(worker + n) % len(PROMPTS)]),
                          int(rng.choice(lengths)), seed * 1000 + worker * 100 + n)
                         for n in range(count)]
        self.sent: list[float] = []
        self.tokens: list[list[float]] = []
        self.done = False


def run(loop: DecodeLoop, clients: list[Client]) -> dict[str, float]:
    now = [0.0]  # the decode thread's CPU seconds so far

    def send(client: Client) -> None:
        n = len(client.sent)
        if n == len(client.requests):
            client.done = True
            return
        prompt, max_tokens, seed = client.requests[n]
        client.sent.append(now[0])
        client.tokens.append([])
        times = client.tokens[-1]

        def emit(chunk: Chunk) -> None:
            times.extend([now[0]] * chunk.tokens)  # stamped at the end of the step below
            if chunk.final:
                finished.append(client)

        loop.submit(Job(prompt, max_tokens, emit, SamplingParams(seed=seed)))

    finished: list[Client] = []
    for client in clients:
        send(client)
    steps = 0
    while not all(c.done for c in clients):
        loop.pending()
        began = time.thread_time()
        # tokens are stamped when the step ends: note where each request's list stood
        marks = [(t, len(t)) for c in clients for t in c.tokens[-1:]]
        loop.step()
        now[0] += time.thread_time() - began
        steps += 1
        for times, mark in marks:
            for i in range(mark, len(times)):
                times[i] = now[0]
        while finished:
            send(finished.pop(0))
    tokens = sum(len(t) for c in clients for t in c.tokens)
    ttft = [(t[0] - s) * 1e3 for c in clients for s, t in zip(c.sent, c.tokens, strict=True)
            if t]
    itl = [(b - a) * 1e3 for c in clients for t in c.tokens
           for a, b in zip(t, t[1:], strict=False)]
    return {"tokens_per_cpu_s": tokens / now[0], "cpu_s": now[0], "steps": steps,
            "ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
            "itl_p50": float(np.percentile(itl, 50)), "itl_p99": float(np.percentile(itl, 99)),
            "itl_max": max(itl)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=12)
    parser.add_argument("--max-tokens", default="8,16,32,64,128,256")
    parser.add_argument("--modes", default="continuous,static")
    parser.add_argument("--overhead", default="off",
                        help="continuous mode's prefill caps to try (max_prefill_overhead)")
    parser.add_argument("--budget", type=int, default=0,
                        help="the token budget per step (max_num_batched_tokens; 0: the slots)")
    parser.add_argument("--blas-threads", type=int, default=1,
                        help="OpenBLAS threads (1: the CPU clock is one thread's work)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    set_blas_threads(args.blas_threads)
    lengths = [int(x) for x in args.max_tokens.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="nursery-llm-loop-"))
    try:
        import make_llm

        folder = tmp / MODEL
        shutil.copytree(ROOT / "model_repository" / MODEL, folder)
        if args.width:
            make_llm.widen(folder, args.width, args.layers)
        tokenizer = ByteBPETokenizer.from_file(folder / "tokenizer" / "tokenizer.json")
        variants: list[tuple[str, str, float | None]] = []
        for mode in args.modes.split(","):
            if mode == "continuous":
                for cap in args.overhead.split(","):
                    variants.append((f"continuous cap {cap}", mode,
                                     None if cap == "off" else float(cap)))
            else:
                variants.append((mode, mode, None))
        rows: dict[str, list[dict[str, float]]] = {}
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else list(reversed(variants))
            for name, mode, cap in order:
                decoder = load_decoder(folder / "1", args.slots)
                loop = DecodeLoop(decoder, tokenizer.token_bytes, args.slots, mode, (),
                                  seed=args.seed, token_budget=args.budget or None,
                                  prefill_overhead=cap)
                clients = [Client(w, args.requests_per_client, lengths, args.seed, tokenizer)
                           for w in range(args.concurrency)]
                rows.setdefault(name, []).append(run(loop, clients))
                print(f"round {r + 1}: {name} done", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nwidth {args.width}, {args.layers} layers, C={args.concurrency}, "
          f"{args.requests_per_client} requests per client, max_tokens {args.max_tokens}, "
          f"budget {args.budget or args.slots}; medians of {args.rounds} rounds, CPU time\n")
    print("| mode | tokens per CPU s | TTFT p50 / p99 ms | ITL p50 / p99 / max ms | steps |")
    print("|---|---|---|---|---|")
    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for name, runs in rows.items()}
    for name, m in med.items():
        print(f"| {name} | {m['tokens_per_cpu_s']:.0f} | {m['ttft_p50']:.1f} / "
              f"{m['ttft_p99']:.1f} | {m['itl_p50']:.2f} / {m['itl_p99']:.2f} / "
              f"{m['itl_max']:.2f} | {m['steps']:.0f} |")
    if "static" in med:
        base = med["static"]
        print()
        for name, m in med.items():
            if name.startswith("continuous"):
                print(f"- {name}: {m['tokens_per_cpu_s'] / base['tokens_per_cpu_s']:.2f}x "
                      f"static's tokens per CPU second; p99 ITL {m['itl_p99']:.2f} against "
                      f"static's {base['itl_p99']:.2f} ms")


if __name__ == "__main__":
    main()

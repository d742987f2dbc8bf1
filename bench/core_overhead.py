#!/usr/bin/env python3
"""In-process cost of the actor pipeline, without any HTTP: Core.infer round trips per second.

    python bench/core_overhead.py [--model add_sub] [--repo model_repository] [--n 20000]
                                  [--concurrency 1,16] [--batching]

Loads the repository with the real ModelManager, then drives Core.infer from N concurrent
trio tasks. The figure is the ceiling the frontends can reach on this machine; compare it with
perf_analyzer's figures to see what the HTTP stack costs.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nursery.actors import model_manager  # noqa: E402
from nursery.actors.directory import Directory  # noqa: E402
from nursery.core import Core  # noqa: E402
from nursery.types import InferenceRequest, Tensor  # noqa: E402


def request_for(core: Core, model: str) -> InferenceRequest:
    config = core.resolve(model).config
    inputs = {}
    for spec in config.inputs:
        shape = tuple(d if d > 0 else 1 for d in spec.dims)
        if config.max_batch_size > 0:
            shape = (1, *shape)
        data = np.ones(shape, dtype=spec.datatype.numpy_dtype)
        inputs[spec.name] = Tensor(spec.name, spec.datatype, shape, data)
    return InferenceRequest(model, "", inputs)


async def main(args: argparse.Namespace) -> None:
    directory = Directory()
    core = Core.over(directory)
    async with trio.open_nursery() as nursery:
        commands, inbox = trio.open_memory_channel[Any](1)
        await nursery.start(partial(model_manager.run, repositories=(Path(args.repo),),
                                    directory=directory, inbox=inbox,
                                    startup_models=[args.model], exit_on_error=True))
        request = request_for(core, args.model)
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            per_task = args.n // concurrency

            async def worker(per_task: int = per_task) -> None:
                for _ in range(per_task):
                    await core.infer(request)

            start, cpu = time.perf_counter(), time.process_time()
            own = time.thread_time()  # the trio thread: the part a frontend process would share
            async with trio.open_nursery() as workers:
                for _ in range(concurrency):
                    workers.start_soon(worker)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            own = time.thread_time() - own
            total = per_task * concurrency
            print(f"{args.model} concurrency {concurrency}: {total / elapsed:,.0f} infer/s, "
                  f"{elapsed / total * 1e6:.1f} us per request, CPU {cpu / total * 1e6:.1f} us "
                  f"per request (all threads), trio thread {own / total * 1e6:.1f} us "
                  f"(one core: {total / own:,.0f} requests/s)")
        await commands.aclose()


if __name__ == "__main__":  # noqa
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="add_sub")
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--batching", action="store_true",
                   help="serve the MLP with dynamic batching (max_batch_size 32, 1 ms delay), "
                        "as the peer sweep's batching rows, from a temporary repository")
    parsed = p.parse_args()
    if parsed.batching:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
        import tempfile

        import make_models  # type: ignore[import-not-found]
        repo = Path(tempfile.mkdtemp(prefix="nursery-core-")) / "repo"
        folder = make_models.write_mlp(repo, max_batch_size=32)
        config = folder / "config.pbtxt"
        config.write_text(config.read_text()
                          + "dynamic_batching { max_queue_delay_microseconds: 1000 }\n")
        parsed.repo, parsed.model = str(repo), "mlp"
    trio.run(main, parsed)

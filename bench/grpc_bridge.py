#!/usr/bin/env python3
"""What hosting grpclib inside the trio process costs: trio-asyncio against plain asyncio.

    python bench/grpc_bridge.py [--calls 3000] [--concurrency 1,16]

Starts grpclib servers in subprocesses, one per way of hosting it, each serving the real
GRPCInferenceService over a core with no models, and drives them with a grpclib client:

- ``asyncio``:       grpclib on a plain asyncio loop; ServerLive answered in asyncio, no trio.
- ``trio-asyncio``:  grpclib on trio-asyncio under a trio root nursery (what nursery does);
                     ServerLive answered in asyncio.
- ``trio-asyncio+cross``: the same, with one asyncio->trio crossing per call (``trio_as_aio``),
                     what every ModelInfer pays to reach the core.
- ``thread``:        grpclib on plain asyncio in its own thread, each call crossing into the
                     trio thread with ``trio.from_thread.run`` (the plan's fallback design).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import threading
import time
from typing import Any

MODES = ("asyncio", "trio-asyncio", "trio-asyncio+cross", "thread")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(mode: str, port: int) -> None:
    import trio
    from grpclib.server import Server

    from nursery.actors.directory import Directory
    from nursery.core import Core
    from nursery.protocol.grpc.service import Draining, InferenceService
    from nursery.schema import inference as pb

    core = Core.over(Directory())
    core.lifecycle.accepting = True

    class Service(InferenceService):
        crossing: Any = None

        async def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
            if self.crossing is not None:
                await self.crossing()
            return pb.ServerLiveResponse(live=True)

    service = Service(core, Draining())

    async def run_server() -> None:
        server = Server([service])
        await server.start("127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.Event().wait()

    if mode == "asyncio":
        asyncio.run(run_server())
    elif mode.startswith("trio-asyncio"):
        import trio_asyncio

        async def main() -> None:
            async with trio_asyncio.open_loop():
                if mode.endswith("+cross"):
                    service.crossing = trio_asyncio.trio_as_aio(trio.lowlevel.checkpoint)
                await trio_asyncio.aio_as_trio(run_server)()

        trio.run(main)
    else:  # thread: asyncio loop in a thread, crossing into trio for each call
        async def main() -> None:
            token = trio.lowlevel.current_trio_token()

            async def cross() -> None:
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: trio.from_thread.run(trio.lowlevel.checkpoint, trio_token=token))

            service.crossing = cross
            threading.Thread(target=lambda: asyncio.run(run_server()), daemon=True).start()
            await trio.sleep_forever()

        trio.run(main)


async def drive(port: int, calls: int, concurrency: int) -> float:
    from grpclib.client import Channel

    from nursery.schema import inference as pb
    from nursery.schema.inference.services import GrpcInferenceServiceStub

    channel = Channel("127.0.0.1", port)
    stub = GrpcInferenceServiceStub(channel)
    await stub.server_live(pb.ServerLiveRequest())
    per = calls // concurrency

    async def worker() -> None:
        for _ in range(per):
            await stub.server_live(pb.ServerLiveRequest())

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    channel.close()
    return per * concurrency / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--serve", choices=MODES)
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    for mode in MODES:
        port = _port()
        proc = subprocess.Popen([sys.executable, __file__, "--serve", mode, "--port", str(port)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            for c in (int(x) for x in args.concurrency.split(",")):
                rate = asyncio.run(drive(port, args.calls, c))
                print(f"{mode:20s} concurrency {c:3d}: {rate:8,.0f} calls/s")
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()

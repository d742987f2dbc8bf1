"""Host grpclib's asyncio gRPC server inside the trio process, under the root nursery.

trio-asyncio runs an asyncio loop on top of trio, so the gRPC server lives in the same
structured-concurrency tree as everything else: it starts with the frontends, and on shutdown
it refuses new inference RPCs, lets the ones in flight finish (bounded by the caller's cancel
scope), then closes its connections.
"""

from __future__ import annotations

import logging

import trio
import trio_asyncio
from grpclib.server import Server

from nursery.core import Core
from nursery.protocol.codecs.grpc_wire import StrictProtoCodec
from nursery.protocol.grpc.service import Draining, HealthService, InferenceService
from nursery.settings import Settings

log = logging.getLogger("nursery.grpc")


async def serve_grpc(
    core: Core,
    host: str,
    port: int,
    shutdown: trio.Event,
    impl: str = "nursery",
    settings: Settings | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    if impl == "nursery":  # the lean HTTP/2 server (grpc_lean.py); "grpclib" below
        from nursery.protocol.grpc.lean import serve_lean

        await serve_lean(core, host, port, shutdown, settings, task_status=task_status)
        return
    draining = Draining()
    async with trio_asyncio.open_loop():
        server = Server([InferenceService(core, draining), HealthService(core)],
                        codec=StrictProtoCodec())
        await trio_asyncio.aio_as_trio(server.start)(host or None, port, backlog=1024)
        task_status.started([f"{host or '0.0.0.0'}:{port}"])
        try:
            await shutdown.wait()
            # refuse new inference RPCs, let those in flight finish, then close: grpclib's
            # close() cancels whatever is still running
            draining.draining = True
            await draining.idle.wait()
        finally:
            with trio.CancelScope(shield=True):
                server.close()
                with trio.move_on_after(5):
                    await trio_asyncio.aio_as_trio(server.wait_closed)()

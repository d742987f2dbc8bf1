"""The design card's gRPC server: grpclib's asyncio server inside the trio process.

Selected with ``--grpc-server grpclib`` and installed with the 'card-servers' extra
(``pip install "nursery[card-servers]"``); nothing imports this module unless that flag selects
it (``nursery/protocol/card_servers.py``). trio-asyncio runs an asyncio loop on top of trio, so
the gRPC server lives in the same structured-concurrency tree as everything else: it starts
with the frontends, and on shutdown it refuses new inference RPCs, lets the ones in flight
finish (bounded by the caller's cancel scope), then closes its connections. The services are
those of nursery's own server (``service.py``); each handler crosses into trio once.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import trio
import trio_asyncio
from grpclib.server import Server

from nursery.core import Core
from nursery.protocol.access import NO_FORWARD
from nursery.protocol.codecs.grpc_wire import StrictProtoCodec
from nursery.protocol.grpc.service import Draining, HealthService, InferenceService
from nursery.settings import Settings


class AsyncioInferenceService(InferenceService):
    """The same RPCs with grpclib calling them on the asyncio loop: each call crosses into
    trio (``trio_as_aio``) to reach the core, a stream's messages cross back to asyncio."""

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await super()._call(trio_asyncio.trio_as_aio(fn), *args)

    async def _stream_rpc(self, stream: Any) -> None:
        await trio_asyncio.trio_as_aio(self._stream_trio)(stream)

    def _endpoints(self, stream: Any) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
        return (trio_asyncio.aio_as_trio(stream.recv_message),
                trio_asyncio.aio_as_trio(stream.send_message))


async def serve_grpclib(
    core: Core,
    host: str,
    port: int,
    shutdown: trio.Event,
    settings: Settings | None = None,
    tls: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``settings``: the forwarded headers; ``tls``: the port speaks TLS only (grpclib
    checks the ALPN itself). Restricted groups are refused at start (card_servers)."""
    draining = Draining()
    forward = settings.grpc_forward if settings is not None else NO_FORWARD
    async with trio_asyncio.open_loop():
        server = Server([AsyncioInferenceService(core, draining, forward), HealthService(core)],
                        codec=StrictProtoCodec())
        await trio_asyncio.aio_as_trio(server.start)(host or None, port, backlog=1024, ssl=tls)
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

"""The gRPC port: nursery's lean HTTP/2 server on trio (``lean.py``, the default), or the
design card's grpclib server on a trio-asyncio loop (``grpclib_server.py``, with
``--grpc-server grpclib`` and the 'card-servers' extra, imported only then)."""

from __future__ import annotations

import ssl

import trio

from nursery.core import Core
from nursery.protocol import card_servers
from nursery.protocol.grpc.lean import serve_lean
from nursery.settings import Settings


async def serve_grpc(
    core: Core,
    host: str,
    port: int,
    shutdown: trio.Event,
    impl: str = "nursery",
    settings: Settings | None = None,
    tls: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    if impl == "grpclib":
        card = card_servers.grpclib_server()
        await card.serve_grpclib(core, host, port, shutdown, settings, tls,
                                 task_status=task_status)
        return
    await serve_lean(core, host, port, shutdown, settings, tls, task_status=task_status)

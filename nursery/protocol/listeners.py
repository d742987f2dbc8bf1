"""Opening the TCP listeners of a frontend, shared by the HTTP and the HTTP/2 servers."""

from __future__ import annotations

import trio


async def open_listeners(host: str, port: int) -> tuple[list[trio.SocketListener], list[str]]:
    """Listeners on ``host:port`` (every address when ``host`` is empty) and their
    ``address:port`` names, with the real port when ``port`` is 0."""
    listeners = await trio.open_tcp_listeners(port, host=host or None, backlog=1024)
    binds = []
    for listener in listeners:
        address = listener.socket.getsockname()
        binds.append(f"{address[0]}:{address[1]}")
    return listeners, binds

"""Opening the TCP listeners of a frontend, shared by the HTTP and the HTTP/2 servers; with a
TLS context, each listener hands out TLS streams (``trio.SSLStream``), whose handshake runs on
the connection's first read, in the connection's task."""

from __future__ import annotations

import ssl

import trio

Listener = trio.SocketListener | trio.SSLListener[trio.SocketStream]
ServerStream = trio.SocketStream | trio.SSLStream[trio.SocketStream]


async def open_listeners(host: str, port: int, tls: ssl.SSLContext | None = None,
                         reuse_port: bool = False) -> tuple[list[Listener], list[str]]:
    """Listeners on ``host:port`` (every address when ``host`` is empty) and their
    ``address:port`` names, with the real port when ``port`` is 0. ``reuse_port``: the
    sockets allow other processes to listen on the same port (SO_REUSEPORT, Triton's
    --reuse-http-port / --reuse-grpc-port)."""
    if reuse_port:
        listeners: list[trio.SocketListener] = await _reuse_port_listeners(host, port)
    else:
        listeners = await trio.open_tcp_listeners(port, host=host or None, backlog=1024)
    binds = []
    for listener in listeners:
        address = listener.socket.getsockname()
        binds.append(f"{address[0]}:{address[1]}")
    if tls is None:
        return list(listeners), binds
    # https_compatible: a peer may close without TLS's close_notify (as browsers, curl and
    # gRPC clients do), and closing does not wait for the peer's
    return [trio.SSLListener(listener, tls, https_compatible=True) for listener in listeners], \
        binds


async def _reuse_port_listeners(host: str, port: int) -> list[trio.SocketListener]:
    """trio.open_tcp_listeners, with SO_REUSEPORT set before each bind."""
    tsocket = trio.socket
    found = await tsocket.getaddrinfo(host or None, port, type=tsocket.SOCK_STREAM,
                                      flags=tsocket.AI_PASSIVE)
    listeners = []
    try:
        for family, kind, proto, _, address in found:
            sock = tsocket.socket(family, kind, proto)
            try:
                sock.setsockopt(tsocket.SOL_SOCKET, tsocket.SO_REUSEADDR, 1)
                sock.setsockopt(tsocket.SOL_SOCKET, tsocket.SO_REUSEPORT, 1)
                if family == tsocket.AF_INET6:
                    sock.setsockopt(tsocket.IPPROTO_IPV6, tsocket.IPV6_V6ONLY, 1)
                await sock.bind(address)
                sock.listen(1024)
            except BaseException:
                sock.close()
                raise
            listeners.append(trio.SocketListener(sock))
    except BaseException:
        for listener in listeners:
            listener.socket.close()
        raise
    return listeners


def socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType:
    """The TCP socket under a connection's stream, TLS or not."""
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    assert isinstance(stream, trio.SocketStream)
    return stream.socket


async def send_eof(stream: trio.abc.Stream) -> None:
    """Half-close the sending side where the stream can (a TLS stream cannot without ending
    TLS: then nothing; the caller closes it soon)."""
    if isinstance(stream, trio.abc.HalfCloseableStream):
        await stream.send_eof()

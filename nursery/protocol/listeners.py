"""Opening the TCP listeners of a frontend, shared by the HTTP and the HTTP/2 servers; with a
TLS context, each listener hands out TLS streams (``trio.SSLStream``), whose handshake runs on
the connection's first read, in the connection's task."""

from __future__ import annotations

import errno
import socket
import ssl

import trio

Listener = trio.SocketListener | trio.SSLListener[trio.SocketStream]


class PlainStream(trio.abc.HalfCloseableStream):
    """A clear-text TCP connection with the per-call bookkeeping of ``trio.SocketStream`` left
    out of the hot path: ``send_all`` and ``receive_some`` call the non-blocking socket
    directly and wait for readiness only when the kernel says so. Every request then costs two
    trips through trio's run loop fewer (the schedule points trio adds after a send or a
    receive that did not wait), and none of the context managers around each call.

    Fairness is kept: a receive that found data without waiting yields once, as trio's does,
    so a client pipelining requests that need no waiting cannot hold the loop. Both calls
    stay cancellation points (a cancelled task leaves before touching the socket). Errors
    read as trio's: ``BrokenResourceError`` when the peer is gone, ``ClosedResourceError``
    once closed."""

    def __init__(self, stream: trio.SocketStream, raw: socket.socket) -> None:
        self.stream = stream
        self.socket = stream.socket
        self._raw = raw
        self._fd = raw.fileno()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        sent, total = self.try_send(data), len(data)
        if sent >= total:
            return
        view = memoryview(data)
        while sent < total:
            await trio.lowlevel.wait_writable(self._fd)
            sent += self.try_send(view[sent:])

    def try_send(self, data: bytes | bytearray | memoryview) -> int:
        """Send what the socket takes now, without waiting: the bytes sent (0 when full)."""
        try:
            return self._raw.send(data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise _translated(exc) from exc

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint_if_cancelled()
        raw, size = self._raw, max_bytes or 65536
        try:
            data = raw.recv(size)
        except BlockingIOError:
            pass
        except OSError as exc:
            raise _translated(exc) from exc
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()  # found without waiting: yield
            return data
        return await self.receive_when_ready(size)

    async def receive_when_ready(self, max_bytes: int | None = None) -> bytes:
        """:meth:`receive_some` for a caller that knows nothing is there yet (the client
        waits for an answer still on its way): it waits for readiness first, sparing the
        ``recv`` that would only say ``EAGAIN``."""
        raw, size = self._raw, max_bytes or 65536
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                return raw.recv(size)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise _translated(exc) from exc

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


def _translated(exc: OSError) -> trio.BrokenResourceError | trio.ClosedResourceError:
    if exc.errno == errno.EBADF:
        return trio.ClosedResourceError("this connection was closed")
    return trio.BrokenResourceError(f"the connection broke: {exc}")


def plain(stream: ServerStream) -> ServerStream:
    """The fast clear-text stream for a TCP connection; a TLS stream (or a socket whose
    standard-library object cannot be reached) is returned as it is."""
    if isinstance(stream, trio.SocketStream):
        raw = getattr(stream.socket, "_sock", None)  # trio keeps the stdlib socket here
        if isinstance(raw, socket.socket):
            return PlainStream(stream, raw)
    return stream


ServerStream = trio.SocketStream | trio.SSLStream[trio.SocketStream] | PlainStream


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
    assert isinstance(stream, trio.SocketStream | PlainStream)
    return stream.socket


async def send_eof(stream: trio.abc.Stream) -> None:
    """Half-close the sending side where the stream can (a TLS stream cannot without ending
    TLS: then nothing; the caller closes it soon)."""
    if isinstance(stream, trio.abc.HalfCloseableStream):
        await stream.send_eof()

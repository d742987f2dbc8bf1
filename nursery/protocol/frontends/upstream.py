"""What a frontend process does not answer itself goes to the engine's own HTTP server.

The engine serves its HTTP routes on a loopback port of its own (the same server, routes and
settings as the public port). A frontend forwards there every request that is not a plain
inference (model control, metadata, statistics, shared-memory registration, ``generate``, the
logging and trace extensions...) and every inference the engine answered ``FALLBACK``: the
client then gets exactly what the single-process server would answer, streamed responses
included (relayed chunk by chunk). Connections to it are kept alive in a small pool; one that
fails or that the engine closes is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from nursery.errors import Unavailable
from nursery.protocol.http import http1
from nursery.protocol.http.infer import Response, error_response
from nursery.protocol.http.streaming import Streaming, StreamWriter

_HOP = frozenset((b"content-length", b"transfer-encoding", b"connection", b"keep-alive",
                  b"expect", b"te", b"upgrade"))
_MAX_HEAD = 64 * 1024
_MAX_LINE = 4096
_READ = 64 * 1024
_IDLE_KEPT = 64  # idle connections to the engine kept for reuse


@dataclass(eq=False)
class _Conn:
    stream: trio.SocketStream
    buf: bytearray = field(default_factory=bytearray)

    async def fill(self) -> None:
        data = await self.stream.receive_some(_READ)
        if not data:
            raise trio.BrokenResourceError("the engine closed the connection")
        self.buf += data

    async def line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[:end + 2]
                return line
            if len(self.buf) > _MAX_LINE:
                raise trio.BrokenResourceError("a chunk line from the engine is too long")
            await self.fill()

    async def take(self, size: int) -> bytes:
        while len(self.buf) < size:
            await self.fill()
        data = bytes(self.buf[:size])
        del self.buf[:size]
        return data


def request_bytes(head: http1.RequestHead, body: bytes) -> bytes:
    """``head`` and ``body`` as one HTTP/1.1 request with a known length (the frontend has
    read a chunked body whole; 100-continue was the frontend's to answer)."""
    parts = [head.method, b" ", head.target, b" HTTP/1.1\r\n"]
    for name, value in head.forwardable():
        if name not in _HOP:
            parts += [name, b": ", value, b"\r\n"]
    parts += [b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body]
    return b"".join(parts)


class Upstream:
    """The engine's HTTP server, as one frontend reaches it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[_Conn] = []

    async def forward(self, head: http1.RequestHead, body: bytes) -> Response | Streaming:
        """The engine's answer to ``head`` and ``body``: whole, or relayed as it streams."""
        request = request_bytes(head, body)
        for attempt in (1, 2):
            pooled = bool(self._idle) and attempt == 1
            if pooled:
                conn = self._idle.pop()
            else:
                try:
                    conn = _Conn(await trio.open_tcp_stream(self.host, self.port))
                except OSError as exc:
                    return error_response(
                        Unavailable(f"the server's engine is not reachable: {exc}"))
            try:
                await conn.stream.send_all(request)
                status, headers, length, chunked, reusable = await self._read_head(conn)
                break
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await _close(conn)
                if not pooled:
                    raise
                # an idle connection the engine had closed (its keep-alive deadline): the
                # request never reached it; the other idle ones are as old
                await self.aclose()
            except BaseException:
                await _close(conn)
                raise
        try:
            if head.method == b"HEAD" or status in (204, 304):
                length, chunked = 0, False
            if chunked:
                return Streaming(lambda writer: self._relay(conn, status, headers, writer))
            if length is None:  # delimited by the close
                data = bytes(conn.buf)
                conn.buf.clear()
                while True:
                    piece = await conn.stream.receive_some(_READ)
                    if not piece:
                        break
                    data += piece
                reusable = False
            else:
                data = await conn.take(length)
        except BaseException:
            await _close(conn)
            raise
        if reusable and len(self._idle) < _IDLE_KEPT:
            self._idle.append(conn)
        else:
            await _close(conn)
        return status, headers, data

    async def _read_head(self, conn: _Conn,
                         ) -> tuple[int, list[tuple[bytes, bytes]], int | None, bool, bool]:
        while True:
            end = conn.buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(conn.buf) > _MAX_HEAD:
                raise trio.BrokenResourceError("the engine's response head is too long")
            await conn.fill()
        lines = bytes(conn.buf[:end]).split(b"\r\n")
        del conn.buf[:end + 4]
        status = int(lines[0].split(b" ", 2)[1])
        headers: list[tuple[bytes, bytes]] = []
        length: int | None = None
        chunked, reusable = False, True
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                reusable = b"close" not in value.lower()
            if name not in _HOP:
                headers.append((name, value))
        return status, headers, length, chunked, reusable

    async def _relay(self, conn: _Conn, status: int, headers: list[tuple[bytes, bytes]],
                     writer: StreamWriter) -> None:
        """A chunked answer, chunk by chunk, to the client's writer."""
        done = False
        try:
            await writer.start(status, headers)
            while True:
                size = int((await conn.line()).split(b";", 1)[0], 16)
                if size == 0:
                    while await conn.line():  # trailers, up to the empty line
                        pass
                    break
                data = await conn.take(size)
                await conn.take(2)
                await writer.send(data)
            done = True
        finally:
            if done and len(self._idle) < _IDLE_KEPT:
                self._idle.append(conn)
            else:
                await _close(conn)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close(conn)


async def _close(conn: _Conn) -> None:
    with trio.CancelScope(shield=True):
        await conn.stream.aclose()

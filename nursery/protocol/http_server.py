"""The HTTP port's server: HTTP/1.1 on trio sockets, one task per connection.

The inference route is answered by ``http_infer.infer_response`` directly; every other route
goes to the quart-trio app through a minimal ASGI call. Measured on the 2-core machine, this
costs a fraction of what hypercorn + h11 cost per request (see bench/README.md), which is why
it serves the inference port; ``--http-server=hypercorn`` serves the same app through
hypercorn instead.

Shutdown (``close``): stop accepting, close idle keep-alive connections, let busy ones finish
their request and close. The caller's cancel scope bounds the wait.
"""

from __future__ import annotations

import logging
import math
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import trio

from nursery.core import Core
from nursery.protocol import http1
from nursery.protocol.http_infer import Response, error_response, infer_response, too_large
from nursery.protocol.listeners import open_listeners
from nursery.protocol.status_map import error_body

log = logging.getLogger("nursery.http")

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
_INFER = re.compile(rb"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")
_BIG = 64 * 1024


async def call_asgi(app: ASGIApp, head: http1.RequestHead, body: bytes,
                    client: tuple[str, int] | None, server: tuple[str, int] | None) -> Response:
    """One request through an ASGI application, collected into a response."""
    path = head.path
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": head.version.decode(),
        "method": head.method.decode("latin-1"),
        "scheme": "http",
        "path": unquote(path.decode("latin-1")),
        "raw_path": path,
        "query_string": head.query,
        "root_path": "",
        "headers": head.headers,
        "client": client,
        "server": server,
        "extensions": {},
    }
    delivered = False
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []
    finished = trio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = [(k.lower(), v) for k, v in message.get("headers", [])
                       if k.lower() not in (b"content-length", b"transfer-encoding", b"connection")]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                finished.set()

    await app(scope, receive, send)
    return status, headers, b"".join(chunks)


class Lifespan:
    """Runs an ASGI app's lifespan protocol (quart's startup/shutdown hooks)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._to_app, self._app_inbox = trio.open_memory_channel[dict[str, Any]](2)
        self._from_app, self._replies = trio.open_memory_channel[dict[str, Any]](2)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": {}}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.app, scope, self._app_inbox.receive, self._from_app.send)
            await self._to_app.send({"type": "lifespan.startup"})
            reply = await self._replies.receive()
            if reply["type"] != "lifespan.startup.complete":
                raise RuntimeError(f"HTTP app failed to start: {reply.get('message', reply)}")
            task_status.started()
            await trio.sleep_forever()

    async def shutdown(self) -> None:
        await self._to_app.send({"type": "lifespan.shutdown"})
        with trio.move_on_after(5):
            await self._replies.receive()


@dataclass(eq=False)
class _Connection:
    scope: trio.CancelScope
    stream: trio.SocketStream
    idle: bool = False  # waiting for the next request: shutdown may close it at once
    request_scope: trio.CancelScope | None = None  # the request being handled, if any
    busy_since: float = 0.0


def _client_gone(stream: trio.SocketStream) -> bool:
    """True when the peer closed the connection (EOF pending); never blocks, consumes nothing."""
    try:
        fd = stream.socket.fileno()
        with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as probe:
            return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False  # nothing to read: still there
    except OSError:
        return True  # reset or closed


class HttpServer:
    def __init__(self, core: Core, app: ASGIApp, *, max_input_size: int,
                 keep_alive_timeout: float = 75.0, read_timeout: float = 60.0,
                 disconnect_check: float = 0.1, serve_infer: bool = True) -> None:
        self.core = core
        self.serve_infer = serve_infer  # False for the metrics port: every route is the app's
        self.app = app
        self.max_input_size = max_input_size
        self.keep_alive_timeout = keep_alive_timeout
        self.read_timeout = read_timeout
        self.disconnect_check = disconnect_check
        self.closing = False
        self._connections: set[_Connection] = set()
        self._accepting: trio.CancelScope | None = None

    async def serve(self, host: str, port: int,
                    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        listeners, binds = await open_listeners(host, port)
        async with trio.open_nursery() as connections:
            sweeper = trio.CancelScope()
            connections.start_soon(self._sweep_disconnects, sweeper)
            with trio.CancelScope() as self._accepting:
                task_status.started(binds)
                await trio.serve_listeners(self._connection, listeners,
                                           handler_nursery=connections)
            sweeper.cancel()
        # leaving the nursery waited for every connection to finish its request

    async def _sweep_disconnects(self, scope: trio.CancelScope) -> None:
        """Cancel requests whose client went away while they waited (long queues, batching
        delays): their requests leave the scheduler's queue without running. One task checks
        the connections whose request is older than a sweep, so requests that finish quickly
        cost nothing extra."""
        with scope:
            while True:
                await trio.sleep(self.disconnect_check)
                cutoff = trio.current_time() - self.disconnect_check
                for conn in list(self._connections):
                    request = conn.request_scope
                    if (request is not None and conn.busy_since <= cutoff
                            and _client_gone(conn.stream)):
                        request.cancel()

    def close(self) -> None:
        """Stop accepting; idle connections close now, busy ones after their response."""
        self.closing = True
        if self._accepting is not None:
            self._accepting.cancel()
        for conn in list(self._connections):
            if conn.idle:
                conn.scope.cancel()

    async def _receive(self, stream: trio.SocketStream, conn: _Connection, idle: bool) -> bytes:
        """Next bytes from the client. Waiting longer than the keep-alive (idle) or read
        timeout, or idling through a shutdown, cancels the connection's scope: it closes."""
        if idle:
            if self.closing:
                return b""
            conn.idle = True
            conn.scope.deadline = trio.current_time() + self.keep_alive_timeout
        else:
            conn.scope.deadline = trio.current_time() + self.read_timeout
        data = await stream.receive_some(_BIG)
        conn.idle = False
        conn.scope.deadline = math.inf
        return data

    async def _connection(self, stream: trio.SocketStream) -> None:
        try:
            client = stream.socket.getpeername()
            server = stream.socket.getsockname()
        except OSError:
            return
        buf = bytearray()
        conn = _Connection(trio.CancelScope(), stream)
        self._connections.add(conn)
        try:
            with conn.scope:
                while not self.closing or buf:
                    parsed = http1.parse_head(buf) if buf else None
                    while parsed is None:
                        data = await self._receive(stream, conn, idle=not buf)
                        if not data:
                            return
                        buf += data
                        parsed = http1.parse_head(buf)
                    head, used = parsed
                    del buf[:used]
                    body, error = await self._read_body(stream, conn, head, buf)
                    if body is None:
                        if error is not None:
                            await self._send(stream, head, error, keep_alive=False)
                        return
                    keep_alive = head.keep_alive and not self.closing
                    with trio.CancelScope() as request_scope:
                        conn.request_scope = request_scope
                        conn.busy_since = trio.current_time()
                        response = await self._handle(head, body, client, server)
                    conn.request_scope = None
                    if request_scope.cancelled_caught:
                        return  # the client went away while its request waited
                    await self._send(stream, head, response, keep_alive)
                    if not keep_alive:
                        return
        except http1.HttpError as exc:
            response = (exc.status, [(b"content-type", b"application/json")],
                        error_body(exc.message))
            try:
                await self._send(stream, None, response, keep_alive=False)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._connections.discard(conn)
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _read_body(self, stream: trio.SocketStream, conn: _Connection,
                         head: http1.RequestHead, buf: bytearray) -> tuple[bytes | None, Response | None]:
        """The request body (taking bytes from ``buf`` first), or (None, error to send)."""
        length = head.content_length
        if head.expect_continue and (length or head.chunked):
            if length is not None and length > self.max_input_size:
                return None, error_response(too_large(length, self.max_input_size))
            await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        if head.chunked:
            reader = http1.ChunkedReader(self.max_input_size)
            data = bytes(buf)
            buf.clear()
            while not reader.feed(data):
                data = await self._receive(stream, conn, idle=False)
                if not data:
                    return None, None
            buf += reader.leftover
            return bytes(reader.body), None
        if not length:
            return b"", None
        if length > self.max_input_size:
            return None, error_response(too_large(length, self.max_input_size))
        while len(buf) < length:
            data = await self._receive(stream, conn, idle=False)
            if not data:
                return None, None
            buf += data
        body = bytes(buf[:length])
        del buf[:length]
        return body, None

    async def _handle(self, head: http1.RequestHead, body: bytes, client: Any,
                      server: Any) -> Response:
        if head.method == b"POST" and self.serve_infer:
            match = _INFER.match(head.path)
            if match is not None:
                model = unquote(match.group(1).decode("latin-1"))
                version = match.group(2).decode() if match.group(2) else ""
                return await infer_response(self.core, model, version, head.headers, body,
                                            self.max_input_size)
        try:
            return await call_asgi(self.app, head, body, client, server)
        except Exception:
            log.exception("error in the HTTP app for %s %s", head.method, head.target)
            return 500, [(b"content-type", b"application/json")], error_body("Internal Server Error")

    async def _send(self, stream: trio.SocketStream, head: http1.RequestHead | None,
                    response: Response, keep_alive: bool) -> None:
        status, headers, payload = response
        version = head.version if head is not None else b"1.1"
        if head is not None and head.method == b"HEAD":
            payload = b""
        start = http1.response_head(status, headers, len(payload), keep_alive, version)
        if len(payload) <= _BIG:
            await stream.send_all(start + payload)
        else:
            await stream.send_all(start)
            await stream.send_all(payload)

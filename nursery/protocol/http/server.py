"""The HTTP port's server: HTTP/1.1 on trio sockets, one task per connection.

The inference route is answered by ``infer.infer_response`` directly; every other route goes
to the route table's ASGI app (``routes.build_routes_app``) through a minimal ASGI call.
Measured on the 2-core machine, this costs a fraction of what hypercorn + h11 cost per request
(see bench/README.md), which is why it serves the inference port; ``--http-server=hypercorn``
serves the same routes through hypercorn and quart-trio instead (``quart_app.py``, an optional
extra). The metrics port is served by another instance (``serve_infer=False``).

What a client may hold (the house rules 8 and 9), each a setting (``nursery/settings.py``):

- deadlines: a new connection must deliver its first request head within ``head_timeout``; a
  kept-alive connection may idle ``keep_alive_timeout`` between requests, and once the first
  byte of a head arrives, the whole head must arrive within ``head_timeout`` (a slowloris that
  trickles bytes is cut off, not kept alive by each byte); the whole body must arrive within
  ``body_timeout`` of the head, and the response must be taken within ``body_timeout`` too.
  A head or body that misses its deadline is answered 408, then the connection closes; an idle
  connection just closes. One sweep task enforces them every 0.1 s (``sweep_interval``), so
  the request path only stores a float per wait.
- a body past its limit is refused unread (400, the connection then closes); what the client
  still sends of it is read and dropped for at most ``LINGER_TIME`` (``LINGER_IDLE`` between
  reads), never kept, so a client that writes its whole body before it reads gets the answer
  rather than a reset.
- a cap of ``max_connections`` open connections: the next one is accepted, answered
  ``503 connection limit reached`` and closed (at most ``_MAX_REFUSING`` such answers in flight;
  past those a connection is closed at once), so a flood costs neither file descriptors nor
  memory beyond the cap.
- supervision: each request runs inside a boundary that turns any unexpected exception, an
  ``ExceptionGroup`` from the app included, into a 500 with a short JSON error, one log line
  (the traceback at ``--log-verbose`` 1) and one count in :attr:`HttpServer.internal_errors`;
  each connection has one too, for the server's own code. ``trio.Cancelled`` (and anything not
  an ``Exception``) always passes through. A peer that resets or vanishes ends its connection
  quietly (``trio.BrokenResourceError`` and ``OSError``).

The doors (docs/security.md): with ``tls`` the port speaks HTTPS only (the handshake runs on
the connection's first read, under its head deadline; a failed one ends the connection
quietly); ``restrictions`` answers 403 to a request of a restricted group without its header,
before anything else is looked at; ``forward`` turns matching headers into request parameters.

Shutdown (``close``): stop accepting, close idle keep-alive connections, let busy ones finish
their request and close. The caller's cancel scope bounds the wait.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import trio

from nursery.core import Core
from nursery.protocol.access import NO_FORWARD, OPEN, HeaderForward, Restrictions
from nursery.protocol.codecs.status import error_body
from nursery.protocol.http import http1
from nursery.protocol.http.generate import GENERATE_PATH, generate_response
from nursery.protocol.http.infer import (
    AfterSend,
    Response,
    body_limit,
    body_too_large,
    error_response,
    infer_now,
    infer_response,
    restricted,
    run_after_send,
    too_large,
)
from nursery.protocol.http.streaming import Streaming, StreamWriter
from nursery.protocol.listeners import (
    Listener,
    PlainStream,
    ServerStream,
    open_listeners,
    plain,
    send_eof,
    socket_of,
)
from nursery.runtime.countdown import count_down
from nursery.runtime.supervision import FaultCounter, describe, split_unexpected
from nursery.settings import DEFAULT_HTTP_MAX_BODY_SIZE

log = logging.getLogger("nursery.http")
# one line per request at --log-verbose 1, as Triton's HTTP server logs (L0_logging counts them);
# not under nursery.http, whose own debug lines wait for --log-verbose 2
request_log = logging.getLogger("nursery.http_requests")
# the shutdown's countdown, at the server's level (not under nursery.http's either)
stop_log = logging.getLogger("nursery.http_stop")

# how Triton's HTTP server prints a request's method: libevhtp's method number
_EVHTP_METHODS = {b"GET": 0, b"HEAD": 1, b"POST": 2, b"PUT": 3, b"DELETE": 4, b"OPTIONS": 8,
                  b"TRACE": 13, b"CONNECT": 14, b"PATCH": 15}

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
# a port's own handler (the OpenAI and SageMaker frontends): head, body, and what to run once
# the answer is written (a traced request's end)
Handler = Callable[[http1.RequestHead, bytes, AfterSend], Awaitable["Response | Streaming"]]
_INFER = re.compile(rb"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")
_BIG = 64 * 1024
# After a body refused unread (too large), what the client still sends is read and dropped
# for at most this long in all, and this long between two reads (nginx's lingering close):
# a client that writes its whole body before it reads (tritonclient's HTTP client does)
# then gets the answer, not a connection reset. Nothing read is kept.
LINGER_TIME = 30.0
LINGER_IDLE = 5.0


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


# What a connection is doing, for the deadline that cancelled it and for ``close``.
_IDLE, _HEAD, _BODY, _HANDLING, _SENDING = range(5)
_MAX_REFUSING = 64  # refusals (503 then close) in flight at once; past this: close at once
_REFUSE_GRACE = 1.0  # seconds a refused connection or a final error answer may take
_INTERNAL_ERROR = error_body("Internal Server Error")
_JSON = [(b"content-type", b"application/json")]
# what a connection accepted during the shutdown's drain may ask (Kubernetes' probes)
_PROBES = (b"/v2/health/live", b"/v2/health/ready")
_SHUTTING_DOWN: Response = (503, _JSON, error_body("Server is shutting down"))


def _NOT_YET() -> None:
    """``_Connection.pending`` while a fast request is being queued."""


def _model_version(match: re.Match[bytes]) -> tuple[str, str]:
    """The model name (percent-decoded) and version ("" for the server's choice) of a
    matched ``/v2/models/{m}[/versions/{v}]/...`` path."""
    return (unquote(match.group(1).decode("latin-1")),
            match.group(2).decode() if match.group(2) else "")


def _log_request(head: http1.RequestHead) -> None:
    if request_log.isEnabledFor(logging.DEBUG):  # Triton's line at --log-verbose 1
        request_log.debug("HTTP request: %d %s", _EVHTP_METHODS.get(head.method, 16),
                          head.path.split(b"?", 1)[0].decode("latin-1"))


@dataclass(eq=False)
class _Connection:
    scope: trio.CancelScope
    stream: ServerStream
    # When the sweep cancels ``scope``: a plain float, since setting a cancel scope's own
    # deadline costs about 2.5 us (trio's deadline heap) and a request would set it 3 times.
    deadline: float = math.inf
    phase: int = _IDLE  # _IDLE: waiting for the next request, shutdown may close it at once
    request_scope: trio.CancelScope | None = None  # the request being handled, if any
    busy_since: float = 0.0
    served: int = 0  # request heads read
    late: bool = False  # accepted during the shutdown's drain: health probes only
    broken: bool = False  # a streamed response ended early (or by the close): close it
    # the fast path's request in flight (see HttpServer._infer_fast): what abandons it, and
    # the event a pipelined request waits on until its answer is written
    pending: Callable[[], None] | None = None
    written: trio.Event | None = None


def _client_gone(stream: ServerStream) -> bool:
    """True when the peer closed the connection (EOF pending); never blocks, consumes nothing.
    On a TLS connection, bytes still to read (a TLS record) count as "still there"."""
    try:
        probe = socket.fromfd(socket_of(stream).fileno(), socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return False  # cannot tell (no file descriptor to spare): keep the request
    with probe:
        try:
            return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False  # nothing to read: still there
        except OSError:
            return True  # reset or closed


async def _last_answer(stream: ServerStream, status: int, message: str) -> None:
    """Send an error answer with ``connection: close``, then read what the client sent
    meanwhile until it closes (at most ``_BIG`` bytes, at most ``_REFUSE_GRACE`` seconds for
    all of it), so that closing with unread bytes does not reset the connection before the
    client has read the answer. A peer that is gone is not an error."""
    body = error_body(message)
    try:
        with trio.move_on_after(_REFUSE_GRACE):
            await stream.send_all(http1.response_head(status, _JSON, len(body), False) + body)
            await send_eof(stream)  # a TLS stream: the client closes after the answer
            drained = 0
            while drained < _BIG:
                data = await stream.receive_some(_BIG)
                if not data:
                    break
                drained += len(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


class HttpServer:
    """One listening port. :attr:`internal_errors` counts the unexpected exceptions its
    boundaries stopped (each answered 500 or ending one connection); :attr:`refused_connections`
    the connections turned away at the cap."""

    def __init__(self, core: Core, app: ASGIApp, *, max_input_size: int,
                 max_body_size: int = DEFAULT_HTTP_MAX_BODY_SIZE,
                 keep_alive_timeout: float = 75.0, head_timeout: float = 30.0,
                 body_timeout: float = 60.0, max_connections: int = 1000,
                 sweep_interval: float = 0.1, serve_infer: bool = True,
                 faults: FaultCounter | None = None, tls: ssl.SSLContext | None = None,
                 restrictions: Restrictions = OPEN,
                 forward: HeaderForward = NO_FORWARD,
                 handler: Handler | None = None,
                 refuse_body: Callable[[int, int], Response] | None = None,
                 limit_body: Callable[[http1.RequestHead], int] | None = None,
                 unit: str | None = None) -> None:
        self.core = core
        self.faults = faults or FaultCounter()  # the server's, for nursery_internal_errors_total
        self.serve_infer = serve_infer  # False for the metrics port: every route is the app's
        self.app = app
        self.max_input_size = max_input_size
        self.max_body_size = max_body_size  # the hard cap, binary tensor data included
        self.keep_alive_timeout = keep_alive_timeout
        self.head_timeout = head_timeout
        self.body_timeout = body_timeout
        self.max_connections = max_connections
        self.sweep_interval = sweep_interval
        self.tls = tls  # --http-ssl-cert / --http-ssl-key: the port speaks TLS only
        self.restrictions = restrictions  # --http-restricted-api
        self.forward = forward  # --http-header-forward-pattern
        # every request of a port that is not KServe's (the OpenAI frontend): the route table
        # and the inference routes are not consulted
        self.handler = handler
        self.refuse_body = refuse_body  # the answer to a body past the limit (declared size, limit)
        self.limit_body = limit_body  # a handler's body limit for a request head
        # the unit its unexpected errors count under (nursery_internal_errors_total)
        self.unit = unit or ("http" if serve_infer else "metrics")
        self.closing = False  # no new connection takes traffic (probes apart)
        self.ending = False  # idle connections close; every answer says "connection: close"
        self.internal_errors = 0
        self.refused_connections = 0
        self._connections: set[_Connection] = set()
        # open when close() came (busy ones only, unless it held them): the drain's wait
        self._draining: set[_Connection] = set()
        self._drained = trio.Event()
        self._refusing = 0
        self._accepting: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None  # the connections' (a slow answer's writer)

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def serve(self, host: str, port: int, reuse_port: bool = False,
                    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        listeners, binds = await open_listeners(host, port, self.tls, reuse_port)
        await self.serve_on(listeners, binds, task_status)

    async def serve_on(self, listeners: list[Listener], binds: list[str],
                       task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
                       ) -> None:
        """:meth:`serve` on listeners opened elsewhere (a frontend process is given the
        engine's)."""
        async with trio.open_nursery() as connections:
            self._nursery = connections
            sweeper = trio.CancelScope()
            connections.start_soon(self._sweep, sweeper)
            with trio.CancelScope() as self._accepting:
                task_status.started(binds)
                # serve_listeners rides out EMFILE/ENFILE (it logs and waits), never exits on it
                await trio.serve_listeners(self._connection, listeners,
                                           handler_nursery=connections)
            sweeper.cancel()
        # leaving the nursery waited for every connection to finish its request

    async def _sweep(self, scope: trio.CancelScope) -> None:
        """Every ``sweep_interval``: end the connections past their deadline (head, body,
        response or keep-alive), and cancel the requests whose client went away while they
        waited (long queues, batching delays), so that they leave the scheduler's queue
        without running. One task for all connections keeps deadlines off the request path;
        the client check only looks at requests older than a sweep."""
        with scope:
            while True:
                await trio.sleep(self.sweep_interval)
                now = trio.current_time()
                cutoff = now - self.sweep_interval
                for conn in list(self._connections):
                    if now >= conn.deadline:
                        conn.scope.cancel()
                        continue
                    request = conn.request_scope
                    if (request is not None and conn.busy_since <= cutoff
                            and _client_gone(conn.stream)):
                        request.cancel()

    def close(self, hold: bool = False) -> None:
        """Stop serving: idle connections close now, busy ones after their response. Until
        those responses are sent (the drain), the inference port still accepts connections
        for the health probes only (``/v2/health/live`` 200, ``/v2/health/ready`` 400, so
        that Kubernetes sees a live pod that takes no traffic; anything else: 503); then it
        stops accepting. The metrics port stops accepting at once.

        ``hold`` (see :meth:`drain`): the connections open now, idle ones too, stay served
        as before, kept alive, until their clients close them or :meth:`end` comes."""
        self.closing = True
        self._draining = {c for c in self._connections
                          if not c.late and (hold or c.phase != _IDLE)}
        if not hold:
            self.end()
        if not self._draining:
            self._drained.set()
        if not self.serve_infer or not self._draining:
            self._stop_accepting()

    def end(self) -> None:
        """The drain's last step: idle connections close now, busy ones after their
        response (which says ``connection: close``)."""
        self.ending = True
        for conn in list(self._connections):
            if conn.phase == _IDLE:
                conn.scope.cancel()

    async def drain(self, exit_timeout: float, service: str = "HTTP") -> None:
        """Stop as Triton's HTTP server does: no new connection takes traffic (the probes
        apart, as in :meth:`close`), the ones open now keep being served, keep-alive and
        all, and each second while some are open and the exit timeout lasts the log says
        ``Timeout N: Found C HTTP service connections``; then :meth:`end`."""
        self.close(hold=True)
        await count_down(exit_timeout, lambda: len(self._draining), self._drained,
                         lambda left, count: stop_log.info(
                             "Timeout %d: Found %d %s service connections", left, count,
                             service))
        self.end()

    def _stop_accepting(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()

    async def _connection(self, stream: ServerStream) -> None:
        """One connection. Its supervision boundary is in :meth:`_run_connection` (which answers
        500 where it still can); this outer one only makes sure that nothing but a
        ``BaseException`` that is not an ``Exception`` (``trio.Cancelled``...) ever leaves a
        connection task for the server's nursery, whatever the inner one's handlers do."""
        try:
            if len(self._connections) >= self.max_connections:
                await self._refuse(stream)
            else:
                await self._run_connection(stream)
        except BaseException as exc:
            unexpected, rest = split_unexpected(exc)
            if unexpected is not None:
                self._count(unexpected, "connection")
            if rest is not None:
                raise rest from None

    async def _run_connection(self, stream: ServerStream) -> None:
        stream = plain(stream)  # clear text: the lean socket calls
        conn = _Connection(trio.CancelScope(), stream, trio.current_time() + self.head_timeout,
                           late=self.closing)
        self._connections.add(conn)
        try:
            sock = socket_of(stream)
            client = sock.getpeername()
            server = sock.getsockname()
            with conn.scope:
                await self._serve(conn, client, server)
            if conn.scope.cancelled_caught and conn.phase in (_HEAD, _BODY):
                await self._final_answer(conn, 408, "request timed out")
        except http1.HttpError as exc:
            await self._final_answer(conn, exc.status, exc.message)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the peer reset or went away: nothing to answer
        except BaseException as exc:
            unexpected, rest = split_unexpected(exc)
            if unexpected is not None:
                self._count(unexpected, "connection")
                if conn.phase in (_HEAD, _BODY, _HANDLING):  # nothing of an answer sent yet
                    await self._final_answer(conn, 500, "Internal Server Error")
            if rest is not None:
                raise rest from None
        finally:
            if conn.pending is not None:  # the client left before its answer: drop it
                conn.pending()
                conn.pending = None
            self._connections.discard(conn)
            if conn in self._draining:
                self._draining.discard(conn)
                if not self._draining:  # the drain is over: no more probes either
                    self._drained.set()
                    self._stop_accepting()
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _refuse(self, stream: ServerStream) -> None:
        """Answer ``503 connection limit reached`` and close (past ``_MAX_REFUSING`` answers
        in flight: close at once)."""
        self.refused_connections += 1
        if self._refusing < _MAX_REFUSING:
            self._refusing += 1
            try:
                await _last_answer(stream, 503, "connection limit reached")
            finally:
                self._refusing -= 1
        with trio.CancelScope(shield=True):
            await stream.aclose()

    async def _final_answer(self, conn: _Connection, status: int, message: str) -> None:
        """An error answer just before closing (malformed request, deadline, internal error)."""
        await _last_answer(conn.stream, status, message)

    def _count(self, exc: Exception, where: str) -> None:
        """One log line per unexpected exception (the traceback at --log-verbose 1), one count."""
        self.internal_errors += 1
        self.faults.count(self.unit)
        log.error("internal error in an HTTP %s: %s", where, describe(exc))
        log.debug("the internal error's traceback", exc_info=exc)

    async def _serve(self, conn: _Connection, client: Any, server: Any) -> None:
        """Requests on one connection, in order, until it closes."""
        stream = conn.stream
        buf = bytearray()
        while True:
            head = await self._read_head(conn, buf)
            if head is None:
                return
            body, error = await self._read_body(conn, head, buf)
            if body is None:
                if error is not None:
                    conn.phase = _SENDING
                    await self._send(stream, head, error, keep_alive=False)
                    await self._linger(conn, head, len(buf))
                return
            keep_alive = head.keep_alive and not self.ending and not conn.late
            if conn.late and head.path.split(b"?", 1)[0] not in _PROBES:
                conn.phase = _SENDING
                await self._send(stream, head, _SHUTTING_DOWN, keep_alive=False)
                return
            conn.phase = _HANDLING
            conn.deadline = math.inf
            if (head.method == b"POST" and isinstance(stream, PlainStream)
                    and self._infer_fast(conn, head, body, keep_alive)):
                if not await self._after_fast(conn, buf):
                    return
                continue
            after: AfterSend = []  # a traced response's end, once it is written
            sent = False
            try:
                with trio.CancelScope() as request_scope:
                    conn.request_scope = request_scope
                    conn.busy_since = trio.current_time()
                    try:
                        response = await self._handle(head, body, client, server, after)
                    except BaseException as exc:
                        response = self._request_failed(exc, head)
                    if isinstance(response, Streaming):
                        streamed = await self._stream(conn, head, response, keep_alive)
                        if streamed is not None:
                            response = streamed  # it failed before its head went out
                        elif not keep_alive or conn.broken:
                            return
                conn.request_scope = None
                if request_scope.cancelled_caught or conn.broken:
                    return  # the client went away while its request waited (or streamed)
                if isinstance(response, Streaming):
                    continue  # written already; the connection goes on
                conn.phase = _SENDING
                conn.deadline = trio.current_time() + self.body_timeout
                await self._send(stream, head, response, keep_alive)
                sent = True
            finally:
                run_after_send(after, sent)
            if not keep_alive:
                return

    def _infer_fast(self, conn: _Connection, head: http1.RequestHead, body: bytes,
                    keep_alive: bool) -> bool:
        """An inference request queued with no task waiting for it (``infer.infer_now``): its
        answer is written where the model's answer is delivered, and the connection's task
        only reads the next request (one wake-up per request instead of two, no cancel
        scope). False when the request is not taken so; the task path then serves it. Only
        clear-text connections of the inference port with no restricted groups and no
        handler of their own come here."""
        if (not self.serve_infer or self.handler is not None or self.restrictions
                or conn.late):
            return False
        match = _INFER.match(head.path)
        if match is None:
            return False
        _log_request(head)
        model, version = _model_version(match)
        stream = conn.stream
        assert isinstance(stream, PlainStream)
        taken = False

        def reply(response: Response) -> None:
            if conn.pending is None and taken:
                return  # abandoned: the client left
            try:
                status, headers, payload = response
                data = http1.response_head(status, headers, len(payload), keep_alive,
                                           head.version) + payload
                sent = stream.try_send(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._written(conn, False)  # the client is gone: the task ends
                return
            except Exception as exc:  # noqa: BLE001 - this connection's boundary
                self._count(exc, "fast inference answer")
                self._written(conn, False)
                return
            if sent >= len(data):
                self._written(conn, keep_alive)
                return
            # the client's window is full: a task writes the rest, under the send deadline
            conn.phase = _SENDING
            conn.deadline = trio.current_time() + self.body_timeout
            assert self._nursery is not None
            self._nursery.start_soon(self._finish_send, conn, memoryview(data)[sent:],
                                     keep_alive)

        conn.pending = _NOT_YET  # an answer given while queueing is written at once
        try:
            abandon = self._queue_fast(model, version, head, body, reply)
        except Exception:  # noqa: BLE001 - the task path meets it again, and answers 500
            abandon = None
        if abandon is None:
            conn.pending = None
            return False
        taken = True
        if conn.pending is _NOT_YET:
            conn.pending = abandon
        return True

    def _queue_fast(self, model: str, version: str, head: http1.RequestHead, body: bytes,
                    reply: Callable[[Response], None]) -> Callable[[], None] | None:
        """Queue a fast-path request (``infer.infer_now``); a frontend process hands it to
        the engine instead (``protocol/frontends``)."""
        return infer_now(self.core, model, version, head.headers, body, self.max_input_size,
                         self.forward, head.forwardable(), reply)

    def _written(self, conn: _Connection, keep_alive: bool) -> None:
        """The fast path's answer is out (or cannot be): the connection goes idle, or ends."""
        conn.pending = None
        if conn.written is not None:
            conn.written.set()
            conn.written = None
        if keep_alive and not self.ending:
            conn.phase = _IDLE
            conn.deadline = trio.current_time() + self.keep_alive_timeout
        else:
            conn.phase = _SENDING  # not a head or body cut short: no 408
            conn.scope.cancel()

    async def _finish_send(self, conn: _Connection, rest: memoryview, keep_alive: bool) -> None:
        """The rest of a fast answer the socket could not take at once. The sweep ends the
        connection past the send deadline, which closes the stream under this write."""
        try:
            await conn.stream.send_all(rest)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            keep_alive = False
        except Exception as exc:  # noqa: BLE001 - this connection's boundary
            self._count(exc, "fast inference answer")
            keep_alive = False
        self._written(conn, keep_alive)

    async def _after_fast(self, conn: _Connection, buf: bytearray) -> bool:
        """While a fast request's answer is on its way: read what the client sends next. A
        request sent before the answer is written (pipelining) waits for it; False when the
        client closed (the request is dropped on the way out) or the connection ends."""
        stream = conn.stream
        assert isinstance(stream, PlainStream)
        while conn.pending is not None:
            if buf:
                conn.written = trio.Event()
                await conn.written.wait()
                break
            data = await stream.receive_when_ready(_BIG)
            if not data:
                return False
            buf += data
        return conn.phase == _IDLE

    async def _stream(self, conn: _Connection, head: http1.RequestHead, response: Streaming,
                      keep_alive: bool) -> Response | None:
        """Write a streamed response as it is produced, inside the request's cancel scope.
        None once written (or abandoned: ``conn.broken``); the answer to send instead when
        it failed before its head went out."""
        stream = conn.stream
        scope = conn.request_scope
        version = head.version
        chunked = version != b"1.0"

        async def write(data: bytes) -> None:
            conn.deadline = trio.current_time() + self.body_timeout  # the client must read
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                # the client went away: cancel the request (its model is told), end quietly
                conn.broken = True
                if scope is not None:
                    scope.cancel()
                await trio.lowlevel.checkpoint()
                raise
            conn.deadline = math.inf

        async def start(status: int, headers: list[tuple[bytes, bytes]]) -> None:
            conn.phase = _SENDING
            await write(http1.stream_head(status, headers, keep_alive, version))

        async def send(data: bytes) -> None:
            await write(http1.chunk(data) if chunked else data)

        writer = StreamWriter(start, send)
        try:
            await response.run(writer)
        except BaseException as exc:
            if conn.broken:
                raise
            if not writer.started:
                return self._request_failed(exc, head)
            unexpected, rest = split_unexpected(exc)
            if unexpected is not None:
                self._count(unexpected, f"streamed response ({head.path[:200].decode('latin-1')})")
            if rest is not None:
                raise rest from None
            conn.broken = True  # the body is cut short: only closing tells the client
            return None
        if not writer.started:
            return 500, _JSON, _INTERNAL_ERROR
        if chunked:
            await write(http1.LAST_CHUNK)
        else:
            conn.broken = True  # HTTP/1.0: the close ends the body
        return None

    def _request_failed(self, exc: BaseException, head: http1.RequestHead) -> Response:
        """The request's supervision boundary: the unexpected becomes a 500."""
        unexpected, rest = split_unexpected(exc)
        if unexpected is not None:
            self._count(unexpected, f"request ({head.method.decode('latin-1')} "
                                    f"{head.path[:200].decode('latin-1')}), answered 500")
        if rest is not None:
            raise rest
        return 500, _JSON, _INTERNAL_ERROR

    async def _read_head(self, conn: _Connection, buf: bytearray) -> http1.RequestHead | None:
        """The next request head, or None when the client closed (or idles through a shutdown).

        Deadlines are set once per wait rather than per read: a new connection keeps the one
        it was opened with, a kept-alive one idles until ``keep_alive_timeout``, and a head
        that has started must end within ``head_timeout``."""
        if buf:  # pipelined bytes already here
            parsed = http1.parse_head(buf)
            if parsed is None:
                conn.phase = _HEAD
                conn.deadline = trio.current_time() + self.head_timeout
        else:
            if self.ending and not conn.late:
                return None
            parsed = None
            if conn.served:
                conn.phase = _IDLE
                conn.deadline = trio.current_time() + self.keep_alive_timeout
        stream = conn.stream
        while parsed is None:
            searched = len(buf)
            data = await stream.receive_some(_BIG)
            if not data:
                return None
            buf += data
            parsed = http1.parse_head(buf, searched)
            if parsed is None and conn.phase == _IDLE:
                conn.phase = _HEAD
                if conn.served:
                    conn.deadline = trio.current_time() + self.head_timeout
        head, used = parsed
        del buf[:used]
        conn.phase = _BODY
        conn.served += 1
        return head

    async def _read_body(self, conn: _Connection, head: http1.RequestHead,
                         buf: bytearray) -> tuple[bytes | None, Response | None]:
        """The request body (taking bytes from ``buf`` first), or (None, error to send);
        None, None when the client closed."""
        stream = conn.stream
        length = head.content_length
        limit = self._body_limit(head)
        if head.expect_continue and (length or head.chunked):
            if length is not None and length > limit:
                return None, self._refuse_body(length, limit)
            conn.deadline = trio.current_time() + self.body_timeout
            await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        if head.chunked:
            reader = http1.ChunkedReader(limit)
            data: bytes | bytearray = bytes(buf)
            buf.clear()
            if not reader.feed(data):
                conn.deadline = trio.current_time() + self.body_timeout
                while True:
                    data = await stream.receive_some(_BIG)
                    if not data:
                        return None, None
                    if reader.feed(data):
                        break
            buf += reader.leftover
            return bytes(reader.body), None
        if not length:
            return b"", None
        if length > limit:
            return None, self._refuse_body(length, limit)
        if len(buf) < length:
            conn.deadline = trio.current_time() + self.body_timeout
            while len(buf) < length:
                piece = await stream.receive_some(_BIG)
                if not piece:
                    return None, None
                buf += piece
        with memoryview(buf) as view:  # one copy (a bytearray slice would make two)
            body = bytes(view[:length])
        del buf[:length]
        return body, None

    async def _linger(self, conn: _Connection, head: http1.RequestHead, held: int) -> None:
        """Read and drop the rest of a refused body (``held`` bytes of it were read), bounded
        by ``LINGER_TIME`` and ``LINGER_IDLE``; idle meanwhile, so a shutdown ends it at once.
        A chunked body's rest is unknown: until the client stops or closes."""
        remaining = math.inf if head.chunked else (head.content_length or 0) - held
        if remaining <= 0:
            return
        conn.phase = _IDLE  # its answer is out: nothing is lost if it is cut short
        conn.deadline = trio.current_time() + LINGER_TIME
        while remaining > 0:
            with trio.move_on_after(LINGER_IDLE):
                data = await conn.stream.receive_some(_BIG)
                if data:
                    remaining -= len(data)
                    continue
            return  # the client closed, or went quiet

    def _body_limit(self, head: http1.RequestHead) -> int:
        """``--http-max-input-size`` for every body but an inference request's with an
        ``Inference-Header-Content-Length``: its binary tensor data may reach the hard cap
        (``infer.body_limit``; the JSON part is checked against the input size once read).
        The body is buffered as its bytes arrive, never ahead of them."""
        if self.limit_body is not None:
            return self.limit_body(head)
        if (self.serve_infer and head.method == b"POST"
                and _INFER.match(head.path) is not None):
            return body_limit(head.headers, self.max_input_size, self.max_body_size)
        return self.max_input_size

    def _refuse_body(self, length: int, limit: int) -> Response:
        if self.refuse_body is not None:
            return self.refuse_body(length, limit)
        refuse = too_large if limit == self.max_input_size else body_too_large
        return error_response(refuse(length, limit))

    async def _handle(self, head: http1.RequestHead, body: bytes, client: Any,
                      server: Any, after: AfterSend) -> Response | Streaming:
        _log_request(head)
        if self.restrictions:
            refused = restricted(self.restrictions, head.path, head.headers)
            if refused is not None:
                return refused
        if self.handler is not None:
            return await self.handler(head, body, after)
        if head.method != b"POST" and self.serve_infer and GENERATE_PATH.match(head.path):
            return 405, _JSON, error_body("Method Not Allowed")  # as Triton answers
        if head.method == b"POST" and self.serve_infer:
            match = _INFER.match(head.path)
            if match is not None:
                model, version = _model_version(match)
                return await infer_response(self.core, model, version, head.headers, body,
                                            self.max_input_size, self.forward,
                                            head.forwardable(), after)
            match = GENERATE_PATH.match(head.path)
            if match is not None:
                model, version = _model_version(match)
                return await generate_response(
                    self.core, model, version, head.headers, body, self.max_input_size,
                    streaming=match.group(3) == b"generate_stream", forward=self.forward,
                    sent=head.forwardable())
        return await call_asgi(self.app, head, body, client, server)

    async def _send(self, stream: ServerStream, head: http1.RequestHead | None,
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

"""One HTTP frontend process (``--http-frontend-processes``): the HTTP port's protocol work on
a core of its own, beside the engine.

It accepts on the engine's listening sockets (inherited; the kernel hands each connection to
one of the processes waiting on them) and runs the same HTTP server as the engine would
(``protocol/http/server.py``: deadlines, limits, the connection cap, the drain). A plain
inference request (``POST /v2/models/{m}[/versions/{v}]/infer`` on a clear-text connection,
KServe JSON with or without binary tensor blocks) is decoded here and handed to the engine
over the link (``link.py``); the engine's answer is encoded and written here. Everything else,
and every request the engine answers ``FALLBACK``, is forwarded to the engine's own HTTP
server (``upstream.py``), so the answer is the single-process server's own.

Started by the engine's supervisor (``supervisor.py``) as
``python -m nursery.protocol.frontends.process``; it ignores SIGINT and SIGTERM (the engine
decides when it stops: ``CLOSE`` on the link, then the drain) and exits when the link closes
(the engine is gone).
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import pickle
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from nursery.errors import InternalError, NurseryError, Unavailable
from nursery.observability.logs import log_manager_for
from nursery.protocol.access import OPEN, Restrictions
from nursery.protocol.codecs import json_tensors as json_codec
from nursery.protocol.frontends.link import (
    ABANDON,
    ANSWER,
    CLOSE,
    FAILED,
    FALLBACK,
    INFER,
    Link,
    pack_request,
    unpack_response,
)
from nursery.protocol.frontends.upstream import Upstream
from nursery.protocol.http import http1
from nursery.protocol.http.infer import (
    Asked,
    Deep,
    RawBody,
    Response,
    answered_response,
    decode_body,
    error_response,
    failed_response,
    forward_headers,
    restricted,
)
from nursery.protocol.http.server import HttpServer
from nursery.protocol.http.streaming import Streaming
from nursery.protocol.listeners import Listener
from nursery.protocol.tls import server_context
from nursery.runtime.supervision import FaultCounter
from nursery.settings import Settings

log = logging.getLogger("nursery.http")
SETTINGS_ENV = "NURSERY_FRONTEND_SETTINGS"


class _NotHere(Exception):
    """The request names a shared-memory region: the engine holds the registry."""


class _NoRegions:
    """The shared-memory access of a frontend: none; a request that names a region is
    forwarded whole to the engine."""

    def lookup(self, name: str, offset: int, byte_size: int) -> Any:
        raise _NotHere(name)

    def read(self, name: str, offset: int, byte_size: int) -> memoryview:
        raise _NotHere(name)

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview,
              output: str) -> None:
        raise _NotHere(name)


_NO_REGIONS = _NoRegions()


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise RuntimeError("a frontend process forwards its routes to the engine")


@dataclass(eq=False)
class _Waiting:
    """A request handed to the engine, until its answer is written."""

    head: http1.RequestHead
    body: bytes
    fmt: json_codec.OutputFormat
    asked: Asked
    request: Any
    reply: Callable[[Response], None]
    scope: trio.CancelScope | None = None  # while forwarded after a FALLBACK


class FrontendServer(HttpServer):
    """The HTTP server of a frontend process: plain inferences over the link, the rest to the
    engine's own server. The restricted groups (``guard``) are checked by the engine, which
    sees every header: a request of a restricted group is forwarded, never handed over."""

    def __init__(self, link: Link, upstream: Upstream, guard: Restrictions,
                 **options: Any) -> None:
        super().__init__(None, _no_app, restrictions=OPEN, **options)  # type: ignore[arg-type]
        self.link = link
        self.upstream = upstream
        self.guard = guard
        self._waiting: dict[int, _Waiting] = {}
        self._next = 0

    def _queue_fast(self, model: str, version: str, head: http1.RequestHead, body: bytes,
                    reply: Callable[[Response], None]) -> Callable[[], None] | None:
        if self.link.closed:
            return None
        if self.guard and restricted(self.guard, head.path, head.headers) is not None:
            return None
        asked = Asked(head.headers)
        try:
            request, fmt = decode_body(model, version, asked, body, self.max_input_size,
                                       _NO_REGIONS)
            forward_headers(self.forward, head.forwardable(), request)
        except (NurseryError, RawBody, Deep, _NotHere):
            return None  # forwarded: the engine decodes it again and answers
        self._next += 1
        rid = self._next
        self._waiting[rid] = _Waiting(head, body, fmt, asked, request, reply)
        self.link.send((INFER, rid, pack_request(request), asked.encoding))
        waiting, link = self._waiting, self.link

        def abandon() -> None:
            left = waiting.pop(rid, None)
            if left is None:
                return
            if left.scope is not None:
                left.scope.cancel()
            else:
                link.send((ABANDON, rid))

        return abandon

    async def _handle(self, head: http1.RequestHead, body: bytes, client: Any, server: Any,
                      after: Any) -> Response | Streaming:
        return await self.upstream.forward(head, body)

    def delivered(self, message: tuple[Any, ...]) -> None:
        """A message from the engine; one that cannot be taken costs only itself (logged,
        counted)."""
        try:
            self._deliver(message)
        except Exception as exc:  # noqa: BLE001 - one message's boundary
            self._count(exc, "message from the engine")
            left = self._waiting.pop(message[1], None) if len(message) > 1 else None
            if left is not None and left.scope is None:  # its client is answered, not left
                left.reply(error_response(InternalError("Internal Server Error")))

    def _deliver(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == CLOSE:
            self.close()
            return
        waiting = self._waiting.get(message[1])
        if waiting is None or waiting.scope is not None:
            return  # abandoned, or being forwarded
        if kind == FALLBACK:
            assert self._nursery is not None
            waiting.scope = trio.CancelScope()
            self._nursery.start_soon(self._fall_back, message[1], waiting)
            return
        if kind == ANSWER:
            try:
                response = answered_response(unpack_response(message[2]), waiting.fmt,
                                             waiting.asked.accept)
            except NurseryError as error:
                response = failed_response(error, waiting.request, waiting.asked.encoding)
        elif kind == FAILED:
            response = message[2]
        else:
            return
        del self._waiting[message[1]]
        waiting.reply(response)

    async def _fall_back(self, rid: int, waiting: _Waiting) -> None:
        """A request the engine did not take on the link: forwarded whole."""
        assert waiting.scope is not None
        response: Response | Streaming
        with waiting.scope:
            try:
                response = await self.upstream.forward(waiting.head, waiting.body)
            except Exception as exc:  # noqa: BLE001 - this request's boundary
                response = self._request_failed(exc, waiting.head)
        if self._waiting.pop(rid, None) is None:
            return  # the client left meanwhile
        if isinstance(response, Streaming):  # an inference answer is never streamed
            response = self._request_failed(RuntimeError("a streamed inference answer"),
                                            waiting.head)
        waiting.reply(response)

    def link_lost(self) -> None:
        """The engine is gone: what waits for it is answered 503."""
        waiting, self._waiting = self._waiting, {}
        for left in waiting.values():
            if left.scope is not None:
                left.scope.cancel()
            else:
                left.reply(error_response(Unavailable("the server's engine stopped")))


def _listeners(fds: list[int], settings: Settings) -> list[Listener]:
    out: list[Listener] = []
    tls = None
    if settings.http_tls is not None:
        tls = server_context(settings.http_tls, ["http/1.1"], "--http-ssl-cert")
    for fd in fds:
        sock = trio.socket.from_stdlib_socket(socket.socket(fileno=fd))
        listener = trio.SocketListener(sock)
        out.append(trio.SSLListener(listener, tls, https_compatible=True) if tls else listener)
    return out


async def run(settings: Settings, link_fd: int, listen_fds: list[int], engine_port: int,
              connection_cap: int) -> None:
    link = Link(trio.socket.from_stdlib_socket(socket.socket(fileno=link_fd)))
    upstream = Upstream("127.0.0.1", engine_port)
    server = FrontendServer(
        link, upstream, settings.http_restrictions, faults=FaultCounter(),
        max_input_size=settings.http_max_input_size, max_body_size=settings.http_max_body_size,
        max_connections=connection_cap, forward=settings.http_forward,
        head_timeout=settings.http_head_timeout, body_timeout=settings.http_body_timeout,
        keep_alive_timeout=settings.http_keepalive_timeout)
    listeners = _listeners(listen_fds, settings)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run_writer)

        async def serve(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
                        ) -> None:
            await server.serve_on(listeners, [], task_status)
            nursery.cancel_scope.cancel()  # drained after CLOSE: the process ends

        await nursery.start(serve)  # accepting before a CLOSE can be read
        while messages := await link.receive():
            for message in messages:
                server.delivered(message)
        server.link_lost()  # the engine is gone: so is this process
        nursery.cancel_scope.cancel()
    await upstream.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nursery.protocol.frontends.process")
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--listen-fds", required=True)
    parser.add_argument("--engine-port", type=int, required=True)
    parser.add_argument("--connections", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine decides when this one stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    settings: Settings = pickle.loads(base64.b64decode(os.environ[SETTINGS_ENV]))
    log_manager_for(settings)
    trio.run(run, settings, args.link_fd, [int(fd) for fd in args.listen_fds.split(",")],
             args.engine_port, args.connections)
    return 0


if __name__ == "__main__":
    sys.exit(main())

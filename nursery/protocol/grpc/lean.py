"""gRPC on the lean HTTP/2 server (``h2.py``): the same services, no asyncio.

grpclib's services are reused as they are: each method's handler (``__mapping__``) is called
with :class:`Call`, a small stand-in for ``grpclib.server.Stream`` (``recv_message``,
``send_message``, ``send_trailing_metadata``, ``metadata``, ``deadline``), so every RPC has one
implementation whichever server hosts it. The request checks and status answers follow
grpclib's (``grpclib.server.request_handler``): the same HTTP statuses for a wrong method,
content-type or ``te``; UNIMPLEMENTED for an unknown method; ``grpc-timeout`` honoured with
DEADLINE_EXCEEDED; errors as ``grpc-status``/``grpc-message`` trailers, Trailers-Only when
nothing was sent yet. A stream reset by the client cancels its handler, which abandons the core
request as an HTTP disconnect does. An unexpected exception in a handler (an exception group
included) is answered INTERNAL and counted in the server's ``internal_errors``.

Sizes (docs/architecture.md, rule 9): a message's declared length (the 5-byte prefix) is checked
against ``--grpc-max-input-size`` before a byte of it is buffered, and a compressed message is
inflated in steps of at most ``_INFLATE_STEP`` bytes, refused with RESOURCE_EXHAUSTED as soon
as its output would pass the same limit: a small gzip body never becomes a large allocation.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import ssl
import zlib
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

import grpclib
import grpclib.const
import grpclib.exceptions
import trio
from grpclib.const import Status

from nursery.core import Core
from nursery.protocol.access import GRPC_GROUPS, OPEN, Restrictions, grpc_refusal_message
from nursery.protocol.codecs.grpc_wire import StrictProtoCodec
from nursery.protocol.grpc.h2 import (
    FastPath,
    H2Server,
    Stream,
    StreamReset,
    encode_headers,
    only_gone,
    timeout_seconds,
)
from nursery.protocol.grpc.service import Draining, HealthService, InferenceService
from nursery.runtime.countdown import count_down
from nursery.runtime.supervision import split_unexpected
from nursery.scheduling.start_delay import env_count
from nursery.schema import inference as pb
from nursery.settings import DEFAULT_GRPC_MAX_INPUT_SIZE, Settings

log = logging.getLogger("nursery.grpc")

_CONTENT_TYPES = {"application/grpc", "application/grpc+proto"}
_ENCODINGS = ("identity", "gzip", "deflate")
HEAD = encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc"),
                       (b"grpc-accept-encoding", b",".join(e.encode() for e in _ENCODINGS))])
OK_TRAILERS = encode_headers([(b"grpc-status", b"0")])
# grpclib's percent-encoding of grpc-message: printable ASCII except '%' stays as it is
_UNQUOTED = "".join(chr(i) for i in range(0x20, 0x7F) if chr(i) != "%")
_SPECIAL = {"te", "content-type", "user-agent"}
_INFLATE_STEP = 1024 * 1024  # the most one decompress() call may produce
# --grpc-infer-response-compression-level: the zlib level of the gzip'd infer responses
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 6, "high": 9}
_COMPRESSED_RPCS = {"/inference.GRPCInferenceService/ModelInfer",
                    "/inference.GRPCInferenceService/ModelStreamInfer"}
GZIP_HEAD = HEAD + encode_headers([(b"grpc-encoding", b"gzip")])


def status_headers(status: Status, message: str | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"grpc-status", str(status.value).encode())]
    if message:
        headers.append((b"grpc-message", quote(message, safe=_UNQUOTED).encode("ascii")))
    return headers


def too_large(size: int | str, limit: int) -> grpclib.GRPCError:
    """gRPC's answer to a message over the limit (grpc core's status and wording)."""
    return grpclib.GRPCError(Status.RESOURCE_EXHAUSTED,
                             f"Received message larger than max ({size} vs. {limit})")


def parse_prefix(prefix: bytes | bytearray, limit: int) -> tuple[bool, int]:
    """The compressed flag and the length of a gRPC message's 5-byte prefix; a length over
    ``limit`` is refused here, before any of the message is buffered."""
    flag = prefix[0]
    if flag > 1:
        raise grpclib.GRPCError(Status.INTERNAL, f"Invalid compressed-flag {flag} in message")
    length = int.from_bytes(prefix[1:5], "big")
    if length > limit:
        raise too_large(length, limit)
    return bool(flag), length


def decompress(data: bytes, encoding: str, limit: int) -> bytes:
    """A message compressed with ``encoding`` (grpc-encoding), inflated in steps of at most
    ``_INFLATE_STEP`` bytes: refused with RESOURCE_EXHAUSTED once the output would pass
    ``limit``, so at most ``limit`` bytes are ever allocated for it."""
    if encoding == "identity":
        raise grpclib.GRPCError(Status.INTERNAL, "Compressed message without a grpc-encoding header")
    if encoding not in _ENCODINGS:
        raise grpclib.GRPCError(
            Status.UNIMPLEMENTED, f"Compression algorithm '{encoding}' is not supported")
    inflater = zlib.decompressobj(31 if encoding == "gzip" else 15)
    out = bytearray()
    pending = data
    try:
        while True:
            room = limit - len(out)
            chunk = inflater.decompress(pending, min(_INFLATE_STEP, room + 1))
            if len(chunk) > room:
                raise too_large(f"more than {limit} bytes decompressed", limit)
            out += chunk
            pending = inflater.unconsumed_tail
            if not pending and len(chunk) < _INFLATE_STEP:
                break  # all input consumed and the inflater ran dry
    except zlib.error:
        raise grpclib.GRPCError(Status.INTERNAL, "Unable to decompress message") from None
    if not inflater.eof:
        raise grpclib.GRPCError(Status.INTERNAL, "Unable to decompress message")
    if inflater.unused_data:
        raise grpclib.GRPCError(Status.INTERNAL, "Unable to decompress message")
    return bytes(out)


class Call:
    """One RPC, as a grpclib handler sees its ``Stream``."""

    def __init__(self, stream: Stream, handler: grpclib.const.Handler, codec: StrictProtoCodec,
                 encoding: str, metadata: dict[str, str], deadline: float | None,
                 max_input: int = DEFAULT_GRPC_MAX_INPUT_SIZE, compress: int = 0) -> None:
        self.stream = stream
        self.compress = compress  # zlib level of the replies (gzip); 0: not compressed
        self.head = GZIP_HEAD if compress else HEAD
        self.handler = handler
        self.codec = codec
        self.max_input = max_input
        self.encoding = encoding
        self.metadata = metadata
        self.deadline = deadline
        self.user_agent = metadata.get("user-agent")
        self.head_sent = False
        self.done = False
        self.reply: bytes | None = None  # a unary reply, sent with the trailers
        self._buf = bytearray()
        self._ended = False
        self._received = False  # a message has arrived

    # -- receiving -------------------------------------------------------------------------

    async def _fill(self, n: int) -> bool:
        buf = self._buf
        while len(buf) < n:
            if self._ended:
                return False
            chunk = await self.stream.receive_data()
            if not chunk:
                self._ended = True
                return False
            buf += chunk
        return True

    async def recv_message(self) -> Any:
        if not await self._fill(5):
            if self._buf:
                raise grpclib.GRPCError(Status.INTERNAL, "Incomplete message at end of stream")
            if not self._received and not self.handler.cardinality.client_streaming:
                raise grpclib.GRPCError(Status.INTERNAL, "Missing request message")
            return None
        self._received = True
        buf = self._buf
        compressed, length = parse_prefix(buf, self.max_input)
        if not await self._fill(5 + length):
            raise grpclib.GRPCError(Status.INTERNAL, "Incomplete message at end of stream")
        with memoryview(buf) as view:  # one copy (a bytearray slice would make two)
            data = bytes(view[5:5 + length])
        del buf[:5 + length]
        if compressed:
            data = decompress(data, self.encoding, self.max_input)
        return self.codec.decode(data, self.handler.request_type)

    def __aiter__(self) -> Call:
        return self

    async def __anext__(self) -> Any:
        message = await self.recv_message()
        if message is None:
            raise StopAsyncIteration
        return message

    # -- sending ---------------------------------------------------------------------------

    async def send_initial_metadata(self, *, metadata: Any = None) -> None:
        if self.head_sent:
            raise grpclib.exceptions.ProtocolError("Initial metadata was already sent")
        block = self.head
        if metadata:
            block += encode_headers([(k.encode(), v.encode()) for k, v in dict(metadata).items()])
        self.head_sent = True
        await self.stream.send_headers(block)

    async def send_message(self, message: Any) -> None:
        data = self.codec.encode(message, self.handler.reply_type)
        if self.compress:
            packer = zlib.compressobj(self.compress, zlib.DEFLATED, 31)  # gzip
            data = packer.compress(data) + packer.flush()
            framed = b"\x01" + len(data).to_bytes(4, "big") + data
        else:
            framed = b"\x00" + len(data).to_bytes(4, "big") + data
        if not self.handler.cardinality.server_streaming:
            if self.reply is not None:
                raise grpclib.exceptions.ProtocolError("Message was already sent")
            self.reply = framed  # sent with the trailers, in one write
            return
        if not self.head_sent:
            await self.send_initial_metadata()
        await self.stream.send_data(framed)

    async def send_trailing_metadata(self, *, status: Status = Status.OK,
                                     status_message: str | None = None,
                                     status_details: Any = None, metadata: Any = None) -> None:
        if self.done:
            raise grpclib.exceptions.ProtocolError("Trailing metadata was already sent")
        self.done = True
        if status is Status.OK and self.reply is None \
                and not self.handler.cardinality.server_streaming:
            status, status_message = Status.UNKNOWN, "Internal Server Error"
        headers = status_headers(status, status_message)
        if metadata:
            headers += [(k.encode(), v.encode()) for k, v in dict(metadata).items()]
        trailers = encode_headers(headers)
        if self.reply is not None and status is Status.OK:
            await self.stream.send_response(self.head, self.reply, trailers)
        elif self.head_sent:
            await self.stream.send_headers(trailers, end_stream=True)
        else:  # Trailers-Only
            await self.stream.send_headers(HEAD + trailers, end_stream=True)


def status_answer(exc: BaseException) -> grpclib.GRPCError | None:
    """The first GRPCError of an exception group whose leaves are all GRPCErrors or a
    departed peer; None when anything else is in it."""
    if isinstance(exc, BaseExceptionGroup):
        found = None
        for leaf in exc.exceptions:
            answer = status_answer(leaf)
            if answer is None and not only_gone(leaf):
                return None
            found = found or answer
        return found
    return exc if isinstance(exc, grpclib.GRPCError) else None


async def _abort(stream: Stream, http_status: int, status: Status | None = None,
                 message: str | None = None) -> None:
    headers = [(b":status", str(http_status).encode())]
    if http_status == 200:
        headers.append((b"content-type", b"application/grpc"))
    if status is not None:
        headers += status_headers(status, message)
    await stream.send_headers(encode_headers(headers), end_stream=True)


# Triton's test-only hook: every reply of a non-inference RPC (health, metadata, model
# control, statistics, settings, shared memory) is written this many whole seconds late
# (atoi's reading: leading digits, else 0); its qa/L0_client_timeout sets it to see client
# deadlines expire
REPLY_DELAY_ENV = "TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC"
_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_INFER_PATHS = frozenset({_MODEL_INFER,
                          "/inference.GRPCInferenceService/ModelStreamInfer"})


def reply_delay_from(environ: Any) -> int:
    """The hook's seconds, read as Triton's ``atoi`` reads them."""
    return env_count(environ.get(REPLY_DELAY_ENV))


def _delayed(handler: grpclib.const.Handler, seconds: int) -> grpclib.const.Handler:
    """``handler`` whose reply (or error status) is held back ``seconds``: the reply of a
    unary call goes out with its trailers, after the handler returned."""
    async def func(call: Any) -> None:
        try:
            await handler.func(call)
        except grpclib.GRPCError:
            await _hold(seconds)
            raise
        await _hold(seconds)

    return handler._replace(func=func)


async def _hold(seconds: int) -> None:
    log.debug("Delaying the write of the response by %d seconds", seconds)  # Triton's words
    await trio.sleep(seconds)


# Triton's test-only hooks inside its ModelInfer handler, in milliseconds (its qa
# L0_request_cancellation sets them to cancel a call while its answer is held): the call
# waits ENTRY before it is processed; a reply waits EXEC, then COMPLETION, before it is
# written (Triton's two waits around building it). Its NOTIFICATION and ENQUEUE hooks only
# reorder Triton's own handler threads; nursery has one thread, so they are not read.
INFER_HOOK_ENVS = ("TRITONSERVER_DELAY_GRPC_PROCESS_ENTRY",
                   "TRITONSERVER_DELAY_RESPONSE_COMPLETE_EXEC",
                   "TRITONSERVER_DELAY_RESPONSE_COMPLETION")
_INFER_HOOK_WORDS = ("Delaying the entry to Process thread by %d ms...",
                     "Delaying InferResponseComplete execution by %d ms...",
                     "Delaying InferResponseComplete by %d ms...")


def infer_hooks_from(environ: Any) -> tuple[int, int, int]:
    """The three hooks' milliseconds (0: unset or unreadable)."""
    entry, complete_exec, completion = (env_count(environ.get(name)) for name in INFER_HOOK_ENVS)
    return entry, complete_exec, completion


async def _hook_wait(index: int, ms: int) -> None:
    if ms > 0:
        log.info(_INFER_HOOK_WORDS[index], ms)  # Triton's words
        await trio.sleep(ms / 1000)


class _HeldReply:
    """A call whose reply is written only after the reply hooks' waits; a client that
    cancels meanwhile resets the stream, and nothing is written."""

    def __init__(self, call: Any, complete_exec: int, completion: int) -> None:
        self._call = call
        self._waits = (complete_exec, completion)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    async def send_message(self, message: Any) -> None:
        await _hook_wait(1, self._waits[0])
        await _hook_wait(2, self._waits[1])
        await self._call.send_message(message)


def _hooked_infer(handler: grpclib.const.Handler,
                  hooks: tuple[int, int, int]) -> grpclib.const.Handler:
    entry, complete_exec, completion = hooks

    async def func(call: Any) -> None:
        await _hook_wait(0, entry)
        await handler.func(_HeldReply(call, complete_exec, completion))

    return handler._replace(func=func)


class GrpcApp:
    """Routes each HTTP/2 stream to its service method (the grpclib handler mapping)."""

    def __init__(self, services: Iterable[Any], codec: StrictProtoCodec,
                 max_input: int = DEFAULT_GRPC_MAX_INPUT_SIZE,
                 restrictions: Restrictions = OPEN, compression: str = "none",
                 reply_delay: int = 0, infer_hooks: tuple[int, int, int] = (0, 0, 0)) -> None:
        self.mapping: dict[str, grpclib.const.Handler] = {}
        self.compress = COMPRESSION_LEVELS[compression]  # infer replies, gzip, this level
        for service in services:
            self.mapping.update(service.__mapping__())
        self.infer_hooks = any(infer_hooks)  # INFER_HOOK_ENVS: ModelInfer takes no fast path
        if self.infer_hooks and _MODEL_INFER in self.mapping:
            self.mapping[_MODEL_INFER] = _hooked_infer(self.mapping[_MODEL_INFER], infer_hooks)
        if reply_delay > 0:  # REPLY_DELAY_ENV
            self.mapping = {path: handler if path in _INFER_PATHS
                            else _delayed(handler, reply_delay)
                            for path, handler in self.mapping.items()}
        self.codec = codec
        self.max_input = max_input
        self.restrictions = restrictions  # --grpc-restricted-protocol

    async def __call__(self, stream: Stream) -> None:
        headers = dict(stream.headers)
        if headers.get(":method") != "POST":
            await _abort(stream, 405)
            return
        content_type = headers.get("content-type")
        if content_type is None:
            await _abort(stream, 415, Status.UNKNOWN, "Missing content-type header")
            return
        if content_type not in _CONTENT_TYPES:
            await _abort(stream, 415, Status.UNKNOWN, "Unacceptable content-type header")
            return
        if headers.get("te") != "trailers":
            await _abort(stream, 400, Status.UNKNOWN, 'Required "te: trailers" header is missing')
            return
        path = headers.get(":path", "")
        handler = self.mapping.get(path)
        if handler is None:
            await _abort(stream, 200, Status.UNIMPLEMENTED, "Method not found")
            return
        if self.restrictions:  # Triton: UNAVAILABLE before the call runs (a stream: at once)
            key = self.restrictions.refusal(GRPC_GROUPS.get(path), stream.headers)
            if key is not None:
                await _abort(stream, 200, Status.UNAVAILABLE, grpc_refusal_message(key))
                return
        deadline = None
        timeout = headers.get("grpc-timeout")
        if timeout is not None:
            try:
                deadline = trio.current_time() + timeout_seconds(timeout)
            except ValueError:
                await _abort(stream, 200, Status.UNKNOWN, "Invalid grpc-timeout header")
                return
        metadata = {k: v for k, v in stream.headers
                    if not k.startswith((":", "grpc-")) and k not in _SPECIAL}
        compress = 0  # infer replies are compressed when asked for and the client takes gzip
        if self.compress and path in _COMPRESSED_RPCS and "gzip" in (
                e.strip() for e in headers.get("grpc-accept-encoding", "").split(",")):
            compress = self.compress
        call = Call(stream, handler, self.codec, headers.get("grpc-encoding", "identity"),
                    metadata, deadline, self.max_input, compress)
        status, message = Status.OK, None
        try:
            with trio.move_on_at(deadline if deadline is not None else float("inf")) as scope:
                await handler.func(call)
            if scope.cancelled_caught:
                status, message = Status.DEADLINE_EXCEEDED, "Deadline Exceeded"
        except grpclib.GRPCError as error:
            status, message = error.status, error.message
        except StreamReset:
            return
        except BaseException as exc:  # the call's boundary: groups split, Cancelled kept
            rest, fatal = split_unexpected(exc)
            if fatal is exc:
                raise
            if fatal is not None:
                raise fatal from None
            assert rest is not None
            if only_gone(rest):
                return  # the client or the connection went away: nobody to answer
            answer = status_answer(rest)
            if answer is not None:  # a status raised in a task of the handler's nursery
                status, message = answer.status, answer.message
            else:
                stream.conn.server.internal_error(f"gRPC method {headers.get(':path')}", rest)
                status, message = Status.INTERNAL, "Internal Server Error"
        if not call.done:
            await call.send_trailing_metadata(status=status, status_message=message)


# a unary route served without a task: it gets the decoded request and ``reply``, queues the
# work and returns the function that abandons it (None: not taken, served as any other call);
# ``reply`` later gets the reply message in wire form or a GRPCError
UnaryRoute = Callable[[Any, Callable[[Any], None]], Callable[[], None] | None]
_OK_TRAILERS = encode_headers(status_headers(Status.OK, None))


class UnaryFastPath(FastPath):
    """The unary calls of ``routes`` (path -> request type and route), served without a task
    each (see :class:`~nursery.protocol.grpc.h2.FastPath`) when nothing in the call needs
    one: no deadline, no compression either way, no restricted groups. Anything unusual (a
    malformed or compressed message, a request the route does not take) goes to the
    ordinary path, which answers it exactly as before."""

    def __init__(self, app: GrpcApp, routes: dict[str, tuple[type, UnaryRoute]]) -> None:
        self.app = app
        self.routes = routes

    def accepts(self, headers: list[tuple[str, str]]) -> Any:
        app = self.app
        if app.restrictions:
            return None
        route = method = content_type = te = None
        for key, value in headers:
            if key == ":path":
                route = self.routes.get(value)
            elif key == ":method":
                method = value
            elif key == "content-type":
                content_type = value
            elif key == "te":
                te = value
            elif key == "grpc-timeout" or (key == "grpc-encoding" and value != "identity") \
                    or (key == "grpc-accept-encoding" and app.compress and "gzip" in value):
                return None
        if method != "POST" or te != "trailers" or content_type not in _CONTENT_TYPES:
            return None
        return route

    def deliver(self, stream: Stream, route: Any) -> bool:
        chunks = stream.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if len(data) < 5 or data[0] != 0:
            return False
        length = int.from_bytes(data[1:5], "big")
        if length != len(data) - 5 or length > self.app.max_input:
            return False
        request_type, serve = route
        try:
            message = self.app.codec.decode(data[5:], request_type)
        except grpclib.GRPCError:
            return False  # the ordinary path gives the error

        def reply(answer: Any) -> None:
            if isinstance(answer, grpclib.GRPCError):
                stream.respond_nowait(HEAD, None, encode_headers(
                    status_headers(answer.status, answer.message)))
            else:
                stream.respond_nowait(HEAD, b"\x00" + len(answer).to_bytes(4, "big") + answer,
                                      _OK_TRAILERS)

        abandon = serve(message, reply)
        if abandon is None:
            return False
        chunks.clear()
        stream.abandon = abandon
        return True


def _seconds(ms: int) -> float:
    """A millisecond flag in seconds; 0 or less (or Triton's INT_MAX) turns the clock off."""
    return math.inf if ms <= 0 or ms >= 2**31 - 1 else ms / 1000


def h2_server_for(app: GrpcApp, settings: Settings,
                  tls: ssl.SSLContext | None = None) -> H2Server:
    """The HTTP/2 server with the gRPC flags' limits, keepalive and ping policy."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and settings.grpc_max_connections > soft // 2:
        log.warning("--grpc-max-connections %d is more than half of this process's file "
                    "descriptor limit (%d): connections may fail to open before the cap "
                    "refuses them", settings.grpc_max_connections, soft)
    return H2Server(
        app,
        max_connections=settings.grpc_max_connections,
        handshake_timeout=_seconds(settings.grpc_handshake_timeout),
        idle_timeout=_seconds(settings.grpc_idle_timeout),
        keepalive_time=_seconds(settings.grpc_keepalive_time),
        keepalive_timeout=_seconds(settings.grpc_keepalive_timeout),
        keepalive_permit_without_calls=settings.grpc_keepalive_permit_without_calls,
        max_pings_without_data=settings.grpc_http2_max_pings_without_data,
        min_recv_ping_interval=settings.grpc_http2_min_recv_ping_interval_without_data / 1000,
        max_ping_strikes=settings.grpc_http2_max_ping_strikes,
        write_timeout=_seconds(settings.grpc_write_timeout),
        tls=tls,
    )


async def _wait_for_rpcs(draining: Draining, exit_timeout: float) -> None:
    """Until the RPCs in flight are done, saying each second how many are left, in Triton's
    words, for as long as the exit timeout lasts."""
    await count_down(exit_timeout, lambda: draining.active, draining.idle,
                     lambda left, count: log.info(
                         "Timeout %d: Found %d gRPC service connections and inference "
                         "handlers", left, count))
    await draining.idle.wait()


async def serve_lean(
    core: Core,
    host: str,
    port: int,
    shutdown: trio.Event,
    settings: Settings | None = None,
    tls: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The gRPC port on the lean server; shutdown as Triton's gRPC server's graceful stop:
    the port closes and every connection gets GOAWAY at once (a client's next call then
    finds the port closed), new inference RPCs are refused, those in flight finish, then
    the connections close. ``settings`` gives the port's limits, keepalive, restricted groups and
    forwarded headers (the defaults when None); ``tls``: the port speaks TLS only."""
    draining = Draining()
    options = settings if settings is not None else Settings(model_repositories=())
    inference = InferenceService(core, draining, options.grpc_forward)
    app = GrpcApp([inference, HealthService(core)], StrictProtoCodec(), options.grpc_max_input_size,
                  options.grpc_restrictions, options.grpc_response_compression,
                  reply_delay_from(os.environ), infer_hooks_from(os.environ))
    server = h2_server_for(app, options, tls)
    if not app.infer_hooks:  # ModelInfer without a task per call (the common case)
        server.fast = UnaryFastPath(app, {
            _MODEL_INFER: (pb.ModelInferRequest, inference.infer_now)})
    server.faults = core.faults  # counted in nursery_internal_errors_total{unit="grpc"}
    inference.on_internal_error = server.internal_error
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(server.serve, host, port, options.reuse_grpc_port)
        task_status.started(binds)
        try:
            await shutdown.wait()
            draining.draining = True
            await server.stop_accepting()
            await _wait_for_rpcs(draining, options.exit_timeout_secs)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await server.close()

"""A lean HTTP/2 server on trio sockets: framing, flow control and HPACK, no asyncio.

Written for the gRPC port (``lean.py`` is the application on top): the server side of
RFC 9113 that a gRPC server needs, without the per-frame event objects and state-machine
checks of the ``h2`` library, which together with grpclib and the trio-asyncio crossing cost
more per call than the whole inference (see docs/architecture.md). Header blocks are decoded
with ``hpack`` (h2's own HPACK codec); the server encodes its few headers itself as literals
without indexing, so it keeps no encoder state.

One task reads each connection and handles every frame; each request stream runs the
application in its own task, under a cancel scope that an RST_STREAM, the peer going away or a
connection error cancels. Every task queues its frames for the connection's one writer task,
which sends what one scheduling round queued in one write (the answers to a batch leave
together). Flow control: the peer's
windows bound what we send (``send_data`` waits for WINDOW_UPDATE); ours are credited back as
the application consumes the data, so a stream that nobody reads holds at most its window.

A protocol error from the peer (a malformed frame, a lying length, a broken header block,
a window overflow) ends that connection with GOAWAY and nothing else. ``close`` sends GOAWAY to
every connection and stops accepting.

Supervision (docs/architecture.md, rule 8): each connection and each stream is a boundary. A
peer that goes away (EOF, a TCP reset, a broken pipe) ends its connection quietly; anything
unexpected, exception groups included, ends only its stream (RST_STREAM INTERNAL_ERROR, which a
gRPC client reads as INTERNAL) or its connection (GOAWAY INTERNAL_ERROR), with one log line and
one count in :attr:`H2Server.internal_errors`; ``trio.Cancelled`` and other BaseExceptions
always propagate. Limits (rule 9): the client preface and first SETTINGS must arrive within
``handshake_timeout``; a connection without open streams is closed with GOAWAY after
``idle_timeout``; keepalive PINGs every ``keepalive_time`` must be acknowledged within
``keepalive_timeout``; a client that leaves a piece of a response (at most 256 KiB) unread for
``write_timeout`` is closed; PINGs faster than gRPC's ping policy allows are strikes, and too many end
the connection with GOAWAY ENHANCE_YOUR_CALM; connections beyond ``max_connections`` are refused
at once (GOAWAY, then close); header blocks are capped in bytes and in CONTINUATION frames.
"""

from __future__ import annotations

import builtins
import logging
import math
import ssl
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import hpack
import hpack.exceptions
import trio

from nursery.protocol.listeners import PlainStream, ServerStream, open_listeners, plain
from nursery.runtime import supervision
from nursery.runtime.supervision import FaultCounter, describe, split_unexpected

log = logging.getLogger("nursery.grpc")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384

_U32 = struct.Struct(">I")
_READ = 256 * 1024
_WRITE_STEP = 256 * 1024  # a large write goes out in pieces of this size (see Connection.writer)
_QUEUE_LIMIT = 256 * 1024  # a writer queueing beyond this many unsent bytes waits for the send
# a stream served without a task (FastPath) buffers at most this much of its request before
# it gets a task after all (which reads it as it comes and opens the stream's window again)
_FAST_BODY = 1024 * 1024
MAX_CONTINUATIONS = 256  # CONTINUATION frames in one header block (each may be empty)
KEEPALIVE = b"nursery!"  # the opaque data of our keepalive PINGs
NO_CALLS_PING_INTERVAL = 7200.0  # gRPC: pings on a connection without calls, at most every 2 h
SHORT = 1.0  # seconds allowed for a farewell write (GOAWAY, RST_STREAM) to a peer


def frame(kind: int, flags: int, stream_id: int, payload: bytes | bytearray | memoryview = b""
          ) -> bytes:
    n = len(payload)
    return bytes((n >> 16, (n >> 8) & 0xFF, n & 0xFF, kind, flags)) + _U32.pack(stream_id) \
        + bytes(payload)


def _int(value: int, prefix: int, first: int) -> bytes:
    """An HPACK integer with an N-bit prefix, ``first`` holding the representation's bits."""
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block of literals without indexing (no Huffman, no dynamic table): stateless,
    so blocks can be built once and reused. ``:status: 200`` is the static entry 8."""
    out = bytearray()
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(0x88)
            continue
        out.append(0x00)
        out += _int(len(name), 7, 0) + name
        out += _int(len(value), 7, 0) + value
    return bytes(out)


class ConnectionError(Exception):  # noqa: A001 - HTTP/2's own term, module-local
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class StreamReset(Exception):
    """The stream was reset (by the peer, or the connection is gone)."""


def decode_header_block(decoder: hpack.Decoder, block: bytes) -> list[tuple[str, str]]:
    """A request's header block decoded; any fault in it is the connection's
    COMPRESSION_ERROR (:class:`ConnectionError`), never another exception."""
    try:
        return [(str(name), str(value)) for name, value in decoder.decode(block)]
    except (hpack.exceptions.HPACKError, UnicodeDecodeError, IndexError, ValueError) as exc:
        raise ConnectionError(COMPRESSION_ERROR, f"bad header block: {str(exc)[:80]}") from None


def indexed_only(block: bytes) -> bool:
    """Whether a header block is made only of indexed header fields (RFC 7541 6.1): decoding
    it reads the tables and changes nothing, so the same bytes mean the same headers for as
    long as no other block changes the dynamic table."""
    i, n = 0, len(block)
    while i < n:
        first = block[i]
        if not first & 0x80:  # a literal or a table size update: the table may change
            return False
        i += 1
        if first & 0x7F == 0x7F:  # the index goes on in continuation bytes
            while i < n and block[i] & 0x80:
                i += 1
            i += 1
    return True


class HeaderDecoder:
    """A connection's HPACK decoder with a memo of its last all-indexed block: a client that
    sends the same headers request after request (gRPC clients do, once the table holds them)
    sends the same bytes, which are then not decoded again. Any other block clears the memo,
    since it may change what the indexes point at."""

    def __init__(self, max_header_list_size: int) -> None:
        self.hpack = hpack.Decoder()
        self.hpack.max_header_list_size = max_header_list_size
        self._block: bytes | None = None
        self._headers: list[tuple[str, str]] = []

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        if block == self._block:
            return list(self._headers)
        self._block = None
        headers = decode_header_block(self.hpack, block)
        if indexed_only(block):
            self._block, self._headers = block, headers
            return list(headers)
        return headers


class Stream:
    """One request stream, as the application sees it."""

    def __init__(self, conn: Connection, stream_id: int, headers: list[tuple[str, str]],
                 end: bool) -> None:
        self.conn = conn
        self.id = stream_id
        self.headers = headers
        self.scope = trio.CancelScope()
        self.chunks: deque[bytes] = deque()
        self.remote_closed = end  # END_STREAM received
        self.local_closed = False  # END_STREAM sent (or reset)
        self.reset = False
        self.readable = trio.Event()
        self.recv_window = conn.server.stream_window
        self.uncredited = 0
        self.send_window = conn.peer_window
        # served without a task (the server's FastPath): ``fast`` while its request is still
        # arriving (``buffered`` bytes so far); ``abandon`` while its answer is awaited
        self.fast: Any = None  # the FastPath's route while its request is still arriving
        self.buffered = 0
        self.abandon: Callable[[], None] | None = None

    # -- receiving -------------------------------------------------------------------------

    async def receive_data(self) -> bytes:
        """The next chunk of the request body; ``b""`` once the client has ended it."""
        while not self.chunks:
            if self.reset:
                raise StreamReset
            if self.remote_closed:
                return b""
            self.readable = trio.Event()
            await self.readable.wait()
        chunk = self.chunks.popleft()
        await self.conn.credit(self, len(chunk))
        return chunk

    # -- sending ---------------------------------------------------------------------------

    async def send_headers(self, block: bytes, end_stream: bool = False) -> None:
        if self.reset or self.local_closed:
            raise StreamReset
        await self.conn.write_data(self._headers_frames(block, end_stream))

    def _headers_frames(self, block: bytes, end_stream: bool) -> bytes:
        if end_stream:
            self.local_closed = True
        size = self.conn.peer_frame
        flags = END_STREAM if end_stream else 0
        if len(block) <= size:
            return frame(HEADERS, flags | END_HEADERS, self.id, block)
        parts = [frame(HEADERS, flags, self.id, block[:size])]
        for pos in range(size, len(block), size):
            last = pos + size >= len(block)
            parts.append(frame(CONTINUATION, END_HEADERS if last else 0, self.id,
                               block[pos:pos + size]))
        return b"".join(parts)

    def _fits(self, n: int) -> bool:
        return n <= self.send_window and n <= self.conn.send_window and n <= self.conn.peer_frame

    async def send_data(self, data: bytes | bytearray | memoryview, end_stream: bool = False
                        ) -> None:
        view = memoryview(data)
        conn = self.conn
        while True:
            if self.reset or self.local_closed:
                raise StreamReset
            n = len(view)
            if self._fits(n):  # the common case: one frame
                self.send_window -= n
                conn.send_window -= n
                if end_stream:
                    self.local_closed = True
                await conn.write_data(frame(DATA, END_STREAM if end_stream else 0, self.id, view))
                return
            room = min(self.send_window, conn.send_window, conn.peer_frame, n)
            if room <= 0:
                await conn.window_opened()
                continue
            self.send_window -= room
            conn.send_window -= room
            await conn.write_data(frame(DATA, 0, self.id, view[:room]))
            view = view[room:]

    async def send_response(self, head: bytes, data: bytes, trailers: bytes) -> None:
        """Headers, one DATA frame and trailers in one write when the windows allow it (a
        unary response), else the same frames as the windows open."""
        if self.reset or self.local_closed:
            raise StreamReset
        if self._fits(len(data)):
            await self.conn.write_data(self._response_frames(head, data, trailers))
            return
        await self.send_headers(head)
        await self.send_data(data)
        await self.send_headers(trailers, end_stream=True)

    def _response_frames(self, head: bytes, data: bytes, trailers: bytes) -> bytes:
        """A whole unary response in one piece (the windows must allow ``data``; they are
        spent here)."""
        self.send_window -= len(data)
        self.conn.send_window -= len(data)
        return self._headers_frames(head, False) + frame(DATA, 0, self.id, data) \
            + self._headers_frames(trailers, True)

    def respond_nowait(self, head: bytes, data: bytes | None, trailers: bytes) -> None:
        """:meth:`send_response` from plain code (a FastPath's answer; ``data`` None: a
        trailers-only answer, ``head + trailers`` in one HEADERS): the frames are queued for
        the connection's writer at once, and the stream is done. When the windows do not
        allow it, or the peer is slow to read, a task finishes the stream instead."""
        self.abandon = None
        conn = self.conn
        if self.reset or self.local_closed or conn.broken or conn.writer_gone:
            conn._forget(self)
            return
        n = 0 if data is None else len(data)
        if not self._fits(n) or conn.out_bytes > _QUEUE_LIMIT:
            try:
                conn.spawn(self._respond_later, head, data, trailers)
            except RuntimeError:  # the connection is ending: nobody to answer
                conn._forget(self)
            return
        conn.write_nowait(self._headers_frames(head + trailers, True) if data is None
                          else self._response_frames(head, data, trailers))
        conn._forget(self)

    async def _respond_later(self, head: bytes, data: bytes | None, trailers: bytes) -> None:
        try:
            with self.scope:  # a reset cancels the wait for a window, as on the task path
                if data is None:
                    await self.send_headers(head + trailers, end_stream=True)
                else:
                    await self.send_response(head, data, trailers)
                await self.conn.flushed()
        except GONE:
            pass
        finally:
            self.conn._forget(self)

    async def send_reset(self, code: int = CANCEL) -> None:
        if not self.reset and not (self.local_closed and self.remote_closed):
            self.reset = True
            self.local_closed = True
            await self.conn.write(frame(RST_STREAM, 0, self.id, _U32.pack(code)))


Application = Callable[[Stream], Awaitable[None]]


class FastPath(Protocol):
    """What an application may add to serve some streams without a task each: ``accepts``
    tells from a new stream's headers whether it may be one (its route, or None; nothing may
    be sent yet); ``deliver`` gets it with that route once its whole request has arrived and
    either takes it (True: it answers later with :meth:`Stream.respond_nowait`, and sets
    ``stream.abandon`` for a client that leaves first) or leaves it (False), and the
    application then serves it as any other. Both are plain calls on the trio thread."""

    def accepts(self, headers: list[tuple[str, str]]) -> Any: ...

    def deliver(self, stream: Stream, route: Any) -> bool: ...


class Connection:
    def __init__(self, server: H2Server, sock: ServerStream) -> None:
        self.server = server
        self.sock = sock
        self.scope = trio.CancelScope()
        # frames wait in ``out`` for ``writer``, which sends them
        self.out: list[bytes | bytearray] = []
        self.out_bytes = 0
        self.out_ready = trio.Event()  # set: something waits in ``out``
        self.out_drained = trio.Event()  # set (and replaced) whenever ``out`` has been sent
        self.writer_busy = False
        self.writer_gone = False
        # a clear-text socket's send without waiting (None: TLS, every write goes to ``writer``)
        self.try_send = sock.try_send if isinstance(sock, PlainStream) else None
        self.decoder = HeaderDecoder(server.max_header_list)
        self.streams: dict[int, Stream] = {}
        self.last_id = 0  # highest client stream id seen
        self.peer_window = DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.peer_frame = DEFAULT_FRAME
        self.send_window = DEFAULT_WINDOW  # connection-level, ours to spend
        self.recv_window = DEFAULT_WINDOW  # connection-level, the peer's to spend
        self.uncredited = 0
        self.window_event = trio.Event()
        self.goaway_sent = False
        self.idle = trio.Event()  # no stream open
        self.idle.set()
        self.idle_since = trio.current_time()
        self.closed = False
        self.broken = False  # a write was cut: the framing is lost, nothing more can be sent
        self.handshaken = trio.Event()  # the preface and the first SETTINGS arrived
        # gRPC's ping policy: the clock restarts whenever we send data, headers or a window
        # update (``write_data``)
        self.last_ping = -math.inf  # when the peer's last PING came
        self.ping_strikes = 0
        self.pings_without_data = 0  # our keepalive PINGs since we last sent data
        self.ping_ack: trio.Event | None = None  # set when our keepalive PING is acknowledged
        self.writing_since = math.inf  # when the write in progress (its current piece) began
        self.nursery: trio.Nursery | None = None  # the connection's, for its streams' tasks

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(fn, *args)

    def write_nowait(self, data: bytes | bytearray) -> None:
        """:meth:`write_data` without waiting: the frames go now if the socket takes them and
        nothing else waits, else to the writer. (Callers mind ``out_bytes`` themselves.)"""
        self.last_ping = -math.inf
        self.ping_strikes = self.pings_without_data = 0
        try:
            self._send_or_queue(data)
        except GONE:
            self.broken = True
            self.out_ready.set()

    def _send_or_queue(self, data: bytes | bytearray) -> None:
        """With one stream nothing could share the send, so it goes now, without the
        writer's wake; what the socket does not take (or all of it, with more streams) is
        queued for the writer. Raises what the socket raises."""
        if (self.try_send is not None and not self.out and not self.writer_busy
                and len(self.streams) <= 1):
            sent = self.try_send(data)
            if sent == len(data):
                return
            data = bytes(memoryview(data)[sent:])
        self.out.append(data)
        self.out_bytes += len(data)
        if not self.writer_busy:
            self.out_ready.set()

    async def write(self, data: bytes | bytearray, *, flush: bool = False) -> None:
        """Queue whole frames for the connection's writer (``writer``), which sends what every
        task queued in one scheduling round as one write: the answers to a batch leave in one
        send per connection, not one each. The caller waits only when more than
        ``_QUEUE_LIMIT`` bytes wait to leave (the peer reads slowly) or when it asks for
        ``flush``; then it returns once its frames are sent."""
        if self.broken or self.writer_gone:
            raise trio.BrokenResourceError("the connection can send nothing more")
        self._send_or_queue(data)
        if flush or self.out_bytes > _QUEUE_LIMIT:
            await self.flushed()

    async def flushed(self) -> None:
        """Return once everything queued so far has been sent (raise if it never will be)."""
        while self.out or self.writer_busy:
            if self.broken or self.writer_gone:
                raise trio.BrokenResourceError("the connection can send nothing more")
            await self.out_drained.wait()

    async def writer(self) -> None:
        """The connection's one sender. A send cut by a cancellation may have left a frame
        half sent: then the connection can carry nothing more and is closed.
        ``writing_since`` tells the watchdog how long the peer has left the current piece (at
        most ``_WRITE_STEP`` bytes) unread."""
        try:
            while True:
                await self.out_ready.wait()
                self.out_ready = trio.Event()
                self.writer_busy = True
                while self.out:
                    out = self.out
                    data = out[0] if len(out) == 1 else b"".join(out)
                    self.out = []
                    self.out_bytes = 0
                    try:
                        if len(data) <= _WRITE_STEP:
                            self.writing_since = trio.current_time()
                            await self.sock.send_all(data)
                        else:
                            view = memoryview(data)
                            for pos in range(0, len(data), _WRITE_STEP):
                                self.writing_since = trio.current_time()
                                await self.sock.send_all(view[pos:pos + _WRITE_STEP])
                        self.writing_since = math.inf
                    except trio.Cancelled:
                        self.broken = True
                        self.scope.cancel()
                        raise
                self.writer_busy = False
                drained, self.out_drained = self.out_drained, trio.Event()
                drained.set()
        finally:
            self.writer_gone = True
            self.writer_busy = False
            self.out_drained.set()

    async def write_data(self, data: bytes) -> None:
        """``write`` for data, headers and window updates: these restart gRPC's ping clock."""
        self.last_ping = -math.inf
        self.ping_strikes = self.pings_without_data = 0
        await self.write(data)

    async def write_quietly(self, data: bytes) -> None:
        """A farewell frame: shielded, bounded in time, and nothing if the peer is gone."""
        if self.broken or self.writer_gone:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(SHORT):
            try:
                await self.write(data, flush=True)
            except GONE:
                pass

    async def window_opened(self) -> None:
        event = self.window_event
        await event.wait()
        if self.closed:
            raise StreamReset

    def _open_windows(self) -> None:
        self.window_event.set()
        self.window_event = trio.Event()

    async def credit(self, stream: Stream, n: int) -> None:
        """Give ``n`` consumed bytes back to the stream's window (batched)."""
        if n == 0 or stream.remote_closed:
            return
        stream.uncredited += n
        if stream.uncredited >= self.server.stream_window // 4:
            n, stream.uncredited = stream.uncredited, 0
            stream.recv_window += n
            try:
                await self.write_data(frame(WINDOW_UPDATE, 0, stream.id, _U32.pack(n)))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise StreamReset from None

    async def goaway(self, code: int = NO_ERROR, message: str = "") -> None:
        """Send GOAWAY once (shielded, bounded in time, quiet if the peer is gone)."""
        if self.goaway_sent:
            return
        self.goaway_sent = True
        payload = _U32.pack(self.last_id) + _U32.pack(code) + message.encode()[:256]
        await self.write_quietly(frame(GOAWAY, 0, 0, payload))

    async def close_gracefully(self, code: int, message: str) -> None:
        """GOAWAY, then our end of the TCP stream; the peer gets ``SHORT`` seconds to close
        its end (so that what it sent meanwhile does not turn our close into a reset), then
        the connection is cancelled."""
        await self.goaway(code, message)
        if not self.broken:
            with trio.CancelScope(shield=True), trio.move_on_after(SHORT):
                try:
                    await self.flushed()
                    await self.sock.send_eof()
                except (*GONE, OSError):
                    pass
        with trio.move_on_after(SHORT):
            await trio.sleep_forever()
        self.scope.cancel()

    # -- deadlines and keepalive -----------------------------------------------------------

    async def watchdog(self) -> None:
        """The connection's clocks: the handshake deadline, the idle timeout and keepalive
        PINGs. Runs beside the reading loop; ends the connection when a clock runs out."""
        server = self.server
        with trio.move_on_after(server.handshake_timeout):
            await self.handshaken.wait()
        if not self.handshaken.is_set():
            log.info("gRPC connection closed: no HTTP/2 preface and SETTINGS within %g s",
                     server.handshake_timeout)
            self.scope.cancel()
            return
        next_ping = trio.current_time() + server.keepalive_time
        while True:
            # wake for the next keepalive PING, when idle again (busy) or at the idle deadline
            # (idle), and at least every write_timeout to look at the write in progress
            look = trio.current_time() + server.write_timeout
            if self.streams:
                with trio.move_on_at(min(next_ping, look)):
                    await self.idle.wait()
            else:
                await trio.sleep_until(min(next_ping, look, self.idle_since + server.idle_timeout))
                if not self.streams and \
                        trio.current_time() >= self.idle_since + server.idle_timeout:
                    log.info("gRPC connection closed: idle for %g s", server.idle_timeout)
                    await self.close_gracefully(NO_ERROR, "max_idle")
                    return
            if trio.current_time() - self.writing_since >= server.write_timeout:
                log.info("gRPC connection closed: the client read nothing for %g s",
                         server.write_timeout)
                self.broken = True  # a write is stuck half done: nothing more can be sent
                self.scope.cancel()
                return
            if trio.current_time() >= next_ping:
                if self.streams or server.keepalive_permit_without_calls:
                    await self.keepalive()
                next_ping = trio.current_time() + server.keepalive_time

    async def keepalive(self) -> None:
        """One keepalive PING; no acknowledgement within ``keepalive_timeout`` closes the
        connection. As gRPC, at most ``max_pings_without_data`` PINGs are sent while we send
        nothing else (0: no such limit)."""
        server = self.server
        if server.max_pings_without_data and \
                self.pings_without_data >= server.max_pings_without_data:
            return
        self.pings_without_data += 1
        ack = self.ping_ack = trio.Event()
        with trio.move_on_after(server.keepalive_timeout):
            await self.write(frame(PING, 0, 0, KEEPALIVE))
            await ack.wait()
            return
        log.info("gRPC connection closed: keepalive PING not acknowledged within %g s",
                 server.keepalive_timeout)
        self.scope.cancel()

    def _ping_received(self) -> None:
        """gRPC's ping policy: a PING sooner than the allowed interval after the previous one,
        with no data sent between them, is a strike; more than ``max_ping_strikes`` end the
        connection (GOAWAY ENHANCE_YOUR_CALM, "too_many_pings")."""
        server = self.server
        now = trio.current_time()
        interval = server.min_recv_ping_interval if (
            self.streams or server.keepalive_permit_without_calls) else NO_CALLS_PING_INTERVAL
        allowed, self.last_ping = self.last_ping + interval, now
        if allowed > now:
            self.ping_strikes += 1
            if self.ping_strikes > server.max_ping_strikes:
                raise ConnectionError(ENHANCE_YOUR_CALM, "too_many_pings")

    # -- the reading loop ------------------------------------------------------------------

    async def run(self, nursery: trio.Nursery) -> None:
        server = self.server
        self.nursery = nursery
        buf = bytearray()
        while len(buf) < len(PREFACE):
            data = await self.sock.receive_some(_READ)
            if not data:
                return
            buf += data
        if bytes(buf[:len(PREFACE)]) != PREFACE:
            return  # not HTTP/2 with prior knowledge: nothing to say in HTTP/2
        del buf[:len(PREFACE)]
        settings = struct.pack(">HI", S_MAX_CONCURRENT_STREAMS, server.max_streams) \
            + struct.pack(">HI", S_INITIAL_WINDOW_SIZE, server.stream_window) \
            + struct.pack(">HI", S_MAX_FRAME_SIZE, server.max_frame) \
            + struct.pack(">HI", S_MAX_HEADER_LIST_SIZE, server.max_header_list)
        grow = server.connection_window - DEFAULT_WINDOW
        self.recv_window += grow
        await self.write(frame(SETTINGS, 0, 0, settings)
                         + frame(WINDOW_UPDATE, 0, 0, _U32.pack(grow)))
        first = True
        block: bytearray | None = None  # a header block awaiting CONTINUATION
        block_stream = block_flags = block_frames = 0
        pos = 0
        while True:
            while len(buf) - pos >= 9:
                length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if length > server.max_frame:
                    raise ConnectionError(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                if len(buf) - pos < 9 + length:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                stream_id = _U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
                payload = bytes(buf[pos + 9:pos + 9 + length])
                pos += 9 + length
                if first:
                    if kind != SETTINGS or flags & ACK:
                        raise ConnectionError(PROTOCOL_ERROR, "the preface must be followed by SETTINGS")
                    first = False
                    self.handshaken.set()
                if block is not None:
                    if kind != CONTINUATION or stream_id != block_stream:
                        raise ConnectionError(PROTOCOL_ERROR, "expected CONTINUATION")
                    block += payload
                    block_frames += 1
                    if len(block) > 4 * server.max_header_list or block_frames > MAX_CONTINUATIONS:
                        raise ConnectionError(ENHANCE_YOUR_CALM, "header block too large")
                    if flags & END_HEADERS:
                        self._headers(block_stream, block_flags, bytes(block), nursery)
                        block = None
                    continue
                if kind == DATA:
                    await self._data(stream_id, flags, payload)
                elif kind == HEADERS:
                    fragment = self._headers_fragment(stream_id, flags, payload)
                    if flags & END_HEADERS:
                        self._headers(stream_id, flags, fragment, nursery)
                    else:
                        block, block_stream, block_flags = bytearray(fragment), stream_id, flags
                        block_frames = 0
                elif kind == SETTINGS:
                    await self._settings(stream_id, flags, payload)
                elif kind == WINDOW_UPDATE:
                    await self._window_update(stream_id, payload)
                elif kind == PING:
                    if length != 8:
                        raise ConnectionError(FRAME_SIZE_ERROR, "PING of the wrong size")
                    if stream_id != 0:
                        raise ConnectionError(PROTOCOL_ERROR, "PING on a stream")
                    if not flags & ACK:
                        if server.max_ping_strikes:
                            self._ping_received()
                        await self.write(frame(PING, ACK, 0, payload))
                    elif payload == KEEPALIVE and self.ping_ack is not None:
                        self.ping_ack.set()
                elif kind == RST_STREAM:
                    if length != 4:
                        raise ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
                    if stream_id == 0 or stream_id > self.last_id:
                        raise ConnectionError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
                    stream = self.streams.get(stream_id)
                    if stream is not None:
                        self._drop(stream)
                elif kind == PRIORITY:
                    if length != 5:
                        raise ConnectionError(FRAME_SIZE_ERROR, "PRIORITY of the wrong size")
                    if stream_id == 0:
                        raise ConnectionError(PROTOCOL_ERROR, "PRIORITY on stream 0")
                elif kind == GOAWAY:
                    if stream_id != 0:
                        raise ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
                elif kind == CONTINUATION:
                    raise ConnectionError(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
                elif kind == PUSH_PROMISE:
                    raise ConnectionError(PROTOCOL_ERROR, "clients cannot push")
                # other frame types are ignored, as the RFC asks
            if pos:
                del buf[:pos]
                pos = 0
            if self.server.closing and not self.streams:
                return
            data = await self.sock.receive_some(_READ)
            if not data:
                return
            buf += data

    def _headers_fragment(self, stream_id: int, flags: int, payload: bytes) -> bytes:
        if stream_id == 0:
            raise ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & PADDED:
            if not payload:
                raise ConnectionError(FRAME_SIZE_ERROR, "padded HEADERS without a pad length")
            start, end = 1, end - payload[0]
        if flags & PRIORITY_FLAG:
            start += 5
        if end < start:
            raise ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[start:end]

    def _headers(self, stream_id: int, flags: int, block: bytes, nursery: trio.Nursery) -> None:
        headers = self.decoder.decode(block)  # always: the table follows the peer's
        end = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client
            if stream.remote_closed or not end:
                raise ConnectionError(PROTOCOL_ERROR, "HEADERS on a half-closed stream")
            stream.remote_closed = True
            if stream.fast is not None:
                self._body_arrived(stream)
            else:
                stream.readable.set()
            return
        if stream_id % 2 == 0 or stream_id <= self.last_id:
            raise ConnectionError(PROTOCOL_ERROR if stream_id % 2 == 0 else STREAM_CLOSED,
                                  "HEADERS on a closed or server stream")
        self.last_id = stream_id
        if self.goaway_sent:
            return  # after GOAWAY: ignored, as its last stream id told the peer
        stream = Stream(self, stream_id, headers, end)
        if len(self.streams) >= self.server.max_streams:
            nursery.start_soon(self._refuse, stream)
            return
        self.streams[stream_id] = stream
        self.idle = trio.Event() if len(self.streams) == 1 else self.idle
        fast = self.server.fast
        if fast is not None and not end:
            stream.fast = fast.accepts(headers)
            if stream.fast is not None:
                return  # no task yet: the request's body is awaited (``_data``)
        nursery.start_soon(self._serve_stream, stream)

    def _body_arrived(self, stream: Stream) -> None:
        """A FastPath stream's request is complete: the fast path takes it, or a task serves
        it as any other stream."""
        route, stream.fast = stream.fast, None
        fast = self.server.fast
        assert fast is not None and self.nursery is not None
        try:
            taken = fast.deliver(stream, route)
        except Exception as exc:  # noqa: BLE001 - a fault of the fast path: the slow one serves
            self.server.internal_error(f"stream {stream.id}", exc)
            taken = stream.abandon is not None
        if not taken:
            self.nursery.start_soon(self._serve_stream, stream)

    async def _refuse(self, stream: Stream) -> None:
        await self.write_quietly(frame(RST_STREAM, 0, stream.id, _U32.pack(REFUSED_STREAM)))

    async def _serve_stream(self, stream: Stream) -> None:
        """The stream's supervision boundary: whatever the application raises ends this
        stream only (Cancelled and other BaseExceptions propagate)."""
        try:
            with stream.scope:
                await self.server.app(stream)
        except BaseException as exc:
            rest, fatal = split_unexpected(exc)
            if rest is not None and not only_gone(rest):
                self.server.internal_error(f"stream {stream.id}", rest)
            if fatal is exc:
                raise
            if fatal is not None:
                raise fatal from None
        finally:
            self._forget(stream)
            if not stream.reset and not self.closed and not self.scope.cancel_called:
                if not stream.local_closed:  # the application ended without finishing
                    code = INTERNAL_ERROR
                elif not stream.remote_closed:  # answered, but the client is still sending
                    code = NO_ERROR
                else:
                    code = -1
                if code >= 0:
                    stream.reset = stream.local_closed = True
                    await self.write_quietly(frame(RST_STREAM, 0, stream.id, _U32.pack(code)))

    def _forget(self, stream: Stream) -> None:
        self.streams.pop(stream.id, None)
        if not self.streams and not self.idle.is_set():
            self.idle_since = trio.current_time()
            self.idle.set()

    def _drop(self, stream: Stream) -> None:
        """The peer reset the stream: abandon its work."""
        stream.reset = True
        stream.local_closed = True
        stream.fast = None
        stream.readable.set()
        stream.scope.cancel()
        abandon, stream.abandon = stream.abandon, None
        if abandon is not None:
            abandon()
        self._forget(stream)

    async def _data(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        n = len(payload)
        self.recv_window -= n
        if self.recv_window < 0:
            raise ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        # the connection window is credited on receipt (each stream's bounds the memory)
        self.uncredited += n
        if self.uncredited >= self.server.connection_window // 4:
            grant, self.uncredited = self.uncredited, 0
            self.recv_window += grant
            await self.write_data(frame(WINDOW_UPDATE, 0, 0, _U32.pack(grant)))
        if flags & PADDED:
            if not payload or payload[0] >= n:
                raise ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
            data = payload[1:n - payload[0]]
        else:
            data = payload
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_id:
                raise ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream that we reset or finished: ignored
        if stream.remote_closed:
            raise ConnectionError(STREAM_CLOSED, "DATA after END_STREAM")
        stream.recv_window -= n
        if stream.recv_window < 0:
            raise ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the stream window")
        padding = n - len(data)
        if padding:
            stream.uncredited += padding
        if data:
            stream.chunks.append(data)
        if flags & END_STREAM:
            stream.remote_closed = True
        if stream.fast is not None:
            stream.buffered += len(data)
            if stream.remote_closed:
                self._body_arrived(stream)
            elif stream.buffered > min(_FAST_BODY, self.server.stream_window // 2):
                # a large request: a task reads it as it comes, opening the window again
                stream.fast = None
                assert self.nursery is not None
                self.nursery.start_soon(self._serve_stream, stream)
            return
        stream.readable.set()

    async def _settings(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        for pos in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, pos)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_window
                self.peer_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ConnectionError(FLOW_CONTROL_ERROR, "window overflow")
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 2**24 - 1:
                    raise ConnectionError(PROTOCOL_ERROR, "invalid SETTINGS_MAX_FRAME_SIZE")
                self.peer_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ConnectionError(PROTOCOL_ERROR, "invalid SETTINGS_ENABLE_PUSH")
            # the rest (header table size: we never index; limits on what the peer sends) need
            # nothing from us
        self._open_windows()
        await self.write(frame(SETTINGS, ACK, 0))

    async def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError(FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            if stream_id > self.last_id:
                raise ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            if increment == 0:
                self._drop(stream)
                await self.write(frame(RST_STREAM, 0, stream_id, _U32.pack(PROTOCOL_ERROR)))
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                self._drop(stream)
                await self.write(frame(RST_STREAM, 0, stream_id, _U32.pack(FLOW_CONTROL_ERROR)))
                return
        self._open_windows()

    def close_streams(self) -> None:
        self.closed = True
        self._open_windows()
        for stream in list(self.streams.values()):
            self._drop(stream)


class H2Server:
    """Serves HTTP/2 with ``app`` answering each stream: prior knowledge in clear text, or,
    with ``tls`` (an ``ssl.SSLContext`` offering ALPN h2), over TLS only."""

    def __init__(self, app: Application, *, max_streams: int = 4096,
                 stream_window: int = 4 * 1024 * 1024, connection_window: int = 16 * 1024 * 1024,
                 max_frame: int = 1024 * 1024, max_header_list: int = 64 * 1024,
                 max_connections: int = 1000, handshake_timeout: float = 10.0,
                 idle_timeout: float = 300.0, keepalive_time: float = 7200.0,
                 keepalive_timeout: float = 20.0, keepalive_permit_without_calls: bool = False,
                 max_pings_without_data: int = 2, min_recv_ping_interval: float = 300.0,
                 max_ping_strikes: int = 2, write_timeout: float = 60.0,
                 tls: ssl.SSLContext | None = None, fast: FastPath | None = None) -> None:
        self.app = app
        self.fast = fast  # streams the application serves without a task each
        self.tls = tls
        self.max_streams = max_streams
        self.stream_window = stream_window
        self.connection_window = connection_window
        self.max_frame = max_frame
        self.max_header_list = max_header_list
        self.max_connections = max_connections
        self.handshake_timeout = handshake_timeout  # seconds; the rest likewise
        self.idle_timeout = idle_timeout
        self.keepalive_time = keepalive_time
        self.keepalive_timeout = keepalive_timeout
        self.keepalive_permit_without_calls = keepalive_permit_without_calls
        self.max_pings_without_data = max_pings_without_data
        self.min_recv_ping_interval = min_recv_ping_interval
        self.max_ping_strikes = max_ping_strikes
        self.write_timeout = write_timeout
        self.closing = False
        self.connections: set[Connection] = set()
        self._accepting: trio.CancelScope | None = None
        self.internal_errors = 0  # unexpected exceptions stopped at a stream or connection
        self.faults: FaultCounter | None = None  # the server's counter, when serving one
        self.refused_connections = 0  # connections beyond ``max_connections``

    def internal_error(self, where: str, exc: BaseException) -> None:
        """Count and log (one line; the traceback at debug level) an unexpected exception
        that a boundary stopped."""
        self.internal_errors += 1
        if self.faults is not None:
            self.faults.count("grpc")
        log.error("gRPC internal error in %s: %s", where, describe(exc))
        log.debug("gRPC internal error in %s", where, exc_info=exc)

    async def serve(self, host: str, port: int, reuse_port: bool = False,
                    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        listeners, binds = await open_listeners(host, port, self.tls, reuse_port)
        async with trio.open_nursery() as connections:
            with trio.CancelScope() as self._accepting:
                task_status.started(binds)
                await trio.serve_listeners(self._connection, listeners,
                                           handler_nursery=connections)

    async def stop_accepting(self) -> None:
        """The start of a graceful stop, as gRPC's ``Server::Shutdown``: the listeners close
        and every connection gets GOAWAY with the last stream it took, so the streams in
        flight finish and a client's next call goes to a new connection (refused: the port
        is closed)."""
        self.closing = True
        if self._accepting is not None:
            self._accepting.cancel()
        for conn in list(self.connections):
            with trio.move_on_after(1):  # a peer that reads nothing does not hold us up
                await conn.goaway(NO_ERROR, "server shutting down")

    async def close(self) -> None:
        """Stop accepting; send GOAWAY everywhere (once: after ``stop_accepting`` it was
        sent); cancel what is still open; the connections then close."""
        await self.stop_accepting()
        for conn in list(self.connections):
            conn.close_streams()
            conn.scope.cancel()

    async def _connection(self, sock: ServerStream) -> None:
        """The connection's supervision boundary: nothing but Cancelled (and the like) leaves
        it, so one connection never ends the others or the server."""
        try:
            if len(self.connections) >= self.max_connections:
                await self._refuse_connection(sock)
                return
            conn = Connection(self, plain(sock))  # clear text: the lean socket calls
            self.connections.add(conn)
            try:
                await self._serve_connection(conn)
            finally:
                self.connections.discard(conn)
        except BaseException as exc:
            rest, fatal = split_unexpected(exc)
            if rest is not None and not only_gone(rest):
                self.internal_error("connection", rest)
            if fatal is exc:
                raise
            if fatal is not None:
                raise fatal from None
        finally:
            with trio.CancelScope(shield=True):
                await sock.aclose()

    async def _serve_connection(self, conn: Connection) -> None:
        with conn.scope:
            async with trio.open_nursery() as streams:
                clocks = trio.CancelScope()

                async def watch() -> None:
                    with clocks:
                        await conn.watchdog()

                streams.start_soon(watch)
                sending = trio.CancelScope()

                async def write() -> None:
                    with sending:
                        await conn.writer()

                streams.start_soon(write)
                try:
                    await conn.run(streams)
                except ConnectionError as exc:
                    log.info("gRPC connection closed: %s", exc.message)
                    await conn.goaway(exc.code, exc.message)
                except GONE:
                    pass  # the peer went away (a reset, a broken pipe)
                except Exception as exc:  # noqa: BLE001 - the boundary: this connection only
                    self.internal_error("connection", exc)
                    await conn.goaway(INTERNAL_ERROR, "internal error")
                finally:  # the peer left or broke the protocol: abandon its streams
                    clocks.cancel()
                    conn.close_streams()
                    with trio.move_on_after(SHORT):  # what was queued still leaves
                        try:
                            await conn.flushed()
                        except GONE:
                            pass
                    sending.cancel()

    async def _refuse_connection(self, sock: ServerStream) -> None:
        """Beyond the cap: our SETTINGS and GOAWAY (no stream processed), then close. Nothing
        is read, so the socket is held for at most ``SHORT`` seconds."""
        self.refused_connections += 1
        if self.refused_connections == 1 or self.refused_connections % 1000 == 0:
            log.warning("gRPC connection refused: %d connections open (--grpc-max-connections); "
                        "%d refused so far", len(self.connections), self.refused_connections)
        payload = _U32.pack(0) + _U32.pack(REFUSED_STREAM) + b"too many connections"
        with trio.move_on_after(SHORT):
            await sock.send_all(frame(SETTINGS, 0, 0) + frame(GOAWAY, 0, 0, payload))


# the stream or the peer went away: not an error of ours (trio's SocketStream reports a reset
# as BrokenResourceError; the builtin ConnectionError family covers raw sockets)
GONE = (StreamReset, trio.BrokenResourceError, trio.ClosedResourceError, builtins.ConnectionError)


def only_gone(exc: BaseException) -> bool:
    """True when ``exc`` (an exception group included) says only that the stream or the
    connection went away."""
    return supervision.only_gone(exc, GONE)


def timeout_seconds(value: str) -> float:
    """A ``grpc-timeout`` value (at most 8 digits and a unit) in seconds."""
    units = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in units:
        raise ValueError(f"invalid grpc-timeout {value!r}")
    return int(digits) * units[unit]


__all__ = ["FastPath", "H2Server", "Stream", "StreamReset", "encode_headers", "frame", "only_gone",
           "timeout_seconds"]

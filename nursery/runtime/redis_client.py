"""A Redis client on trio for the response cache (``--cache-config redis,...``).

Redis speaks RESP2: a command is an array of bulk strings, a reply one of five types
(``+simple``, ``-ERROR text``, ``:integer``, ``$bulk``, ``*array``). :class:`ReplyReader` is
the pure half (bytes in, replies out, every declared length bounded before anything is
allocated); :class:`Connection` speaks it over a trio stream (TCP, or TLS when asked), and
:class:`Pool` keeps up to ``pool_size`` connections, as Triton's Redis cache (redis-plus-plus)
does: a command waits ``wait_timeout`` for a free connection, a connection that failed is
dropped and a new one made on the next command.

Errors are :class:`RedisError` with the words a Triton user knows from its log: ``failed to
connect to Redis (host:port): Connection refused``, the server's own replies (``WRONGPASS
invalid username-password pair or user is disabled.``, ``NOAUTH Authentication required.``).
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from nursery.scheduling.cache_store import RedisOptions

# what a reply may declare: Redis' own proto-max-bulk-len (512 MB) and a bound on arrays
MAX_BULK = 512 * 1024 * 1024
MAX_ARRAY = 1 << 24
MAX_LINE = 64 * 1024
PING_TEXT = b"nursery response cache connected"


class RedisError(Exception):
    """A command failed: the server's error reply, a broken connection or a timeout."""


class ReplyError(RedisError):
    """The server answered ``-<text>`` (the connection is still good)."""


def encode_command(*args: bytes | str | int) -> bytes:
    """One command as RESP2: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n" % len(data))
        parts.append(data)
        parts.append(b"\r\n")
    return b"".join(parts)


INCOMPLETE = object()  # what ReplyReader.next gives until a whole reply is in


class ReplyReader:
    """Bytes in (:meth:`feed`), whole replies out (:meth:`next`, or :data:`INCOMPLETE`
    while one is not all in; a nil reply is None). An error reply comes out as a
    :class:`ReplyError` instance; a reply that breaks the protocol raises
    :class:`RedisError`."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray) -> None:
        if self._pos:
            del self._buffer[:self._pos]
            self._pos = 0
        self._buffer += data

    def next(self) -> Any:
        start = self._pos
        value = self._parse()
        if value is INCOMPLETE:
            self._pos = start
        return value

    def _line(self) -> bytes | object:
        end = self._buffer.find(b"\r\n", self._pos)
        if end < 0:
            if len(self._buffer) - self._pos > MAX_LINE:
                raise RedisError("protocol error: a reply line longer than 64 KiB")
            return INCOMPLETE
        line = bytes(self._buffer[self._pos:end])
        self._pos = end + 2
        return line

    def _parse(self) -> Any:
        line = self._line()
        if line is INCOMPLETE:
            return INCOMPLETE
        assert isinstance(line, bytes)
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            return ReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return self._int(rest)
        if kind == b"$":
            size = self._int(rest)
            if size < 0:
                return None
            if size > MAX_BULK:
                raise RedisError(f"protocol error: a bulk reply of {size} bytes")
            if len(self._buffer) - self._pos < size + 2:
                return INCOMPLETE
            data = bytes(self._buffer[self._pos:self._pos + size])
            if self._buffer[self._pos + size:self._pos + size + 2] != b"\r\n":
                raise RedisError("protocol error: a bulk reply without its CRLF")
            self._pos += size + 2
            return data
        if kind == b"*":
            count = self._int(rest)
            if count < 0:
                return None
            if count > MAX_ARRAY:
                raise RedisError(f"protocol error: an array reply of {count} elements")
            items = []
            for _ in range(count):
                item = self._parse()
                if item is INCOMPLETE:
                    return INCOMPLETE
                items.append(item)
            return items
        raise RedisError(f"protocol error: unexpected reply {line[:32]!r}")

    @staticmethod
    def _int(text: bytes) -> int:
        try:
            return int(text)
        except ValueError:
            raise RedisError(f"protocol error: {text[:32]!r} is not a number") from None


def _seconds(ms: int) -> float:
    return ms / 1000 if ms > 0 else float("inf")


def _tls_context(options: RedisOptions) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=options.cacert or None,
                                         capath=options.cacert_dir or None)
    if options.cert:
        context.load_cert_chain(options.cert, options.key or None)
    return context


class Connection:
    """One connection to Redis, one command at a time."""

    def __init__(self, stream: trio.abc.Stream, options: RedisOptions) -> None:
        self._stream = stream
        self._options = options
        self._reader = ReplyReader()
        self.broken = False

    @classmethod
    async def open(cls, options: RedisOptions) -> Connection:
        """Connect, authenticate, select the database and ping, as Triton's Redis cache does
        at start-up; RedisError with the reason."""
        where = f"{options.host}:{options.port}"
        tcp: trio.SocketStream | None = None
        with trio.move_on_after(_seconds(options.connect_timeout)):
            tcp = await _connect(options.host, options.port)
        if tcp is None:
            raise RedisError(f"failed to connect to Redis ({where}): Connection timed out")
        stream: trio.abc.Stream = tcp
        if options.tls_enabled:
            try:
                context = _tls_context(options)
            except (OSError, ssl.SSLError) as exc:
                await tcp.aclose()
                raise RedisError(f"failed to set up TLS for Redis: {exc}") from None
            stream = trio.SSLStream(tcp, context,
                                    server_hostname=options.sni or options.host)
        connection = cls(stream, options)
        try:
            if options.password:
                if options.user and options.user != "default":
                    await connection.call(b"AUTH", options.user, options.password)
                else:
                    await connection.call(b"AUTH", options.password)
            if options.db:
                await connection.call(b"SELECT", options.db)
            if await connection.call(b"PING", PING_TEXT) != PING_TEXT:
                raise RedisError("Failed to ping Redis server.")
        except BaseException:
            await connection.aclose()
            raise
        return connection

    async def call(self, *args: bytes | str | int) -> Any:
        """Send one command and return its reply (ReplyError for an error reply)."""
        if self.broken:
            raise RedisError("the connection to Redis is closed")
        try:
            with trio.fail_after(_seconds(self._options.socket_timeout)):
                await self._stream.send_all(encode_command(*args))
                while True:
                    reply = self._reader.next()
                    if reply is not INCOMPLETE:
                        break
                    data = await self._stream.receive_some(65536)
                    if not data:
                        raise RedisError("Redis closed the connection")
                    self._reader.feed(data)
        except trio.TooSlowError:
            self.broken = True
            raise RedisError(f"Redis did not answer within {self._options.socket_timeout} "
                             "ms") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                ssl.SSLError) as exc:
            self.broken = True
            raise RedisError(f"the connection to Redis failed: {_reason(exc)}") from None
        except RedisError:
            self.broken = True
            raise
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    async def aclose(self) -> None:
        self.broken = True
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self._stream)


def _reason(exc: BaseException) -> str:
    """The first words in ``exc`` or what caused it (trio wraps a TLS failure in a
    BrokenResourceError that has none of its own)."""
    seen: BaseException | None = exc
    while seen is not None:
        if str(seen):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


async def _connect(host: str, port: int) -> trio.SocketStream:
    """TCP to ``host:port``, every address tried in turn; RedisError in hiredis' words."""
    where = f"{host}:{port}"
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise RedisError(f"failed to connect to Redis ({where}): {exc.strerror}") from None
    reason = "no address"
    for family, kind, proto, _, address in infos:
        sock = trio.socket.socket(family, kind, proto)
        try:
            await sock.connect(address)
        except OSError as exc:
            sock.close()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            continue
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return trio.SocketStream(sock)
    raise RedisError(f"failed to connect to Redis ({where}): {reason}")


class Pool:
    """Up to ``pool_size`` connections; :meth:`call` takes a free one (waiting at most
    ``wait_timeout``), makes one when none is open, and drops one that broke."""

    def __init__(self, options: RedisOptions) -> None:
        self.options = options
        self._idle: list[Connection] = []
        self._slots = trio.Semaphore(options.pool_size)
        self._closed = False

    async def start(self) -> None:
        """The first connection, made now so that a server that cannot reach Redis does
        not start (as Triton's)."""
        self._idle.append(await Connection.open(self.options))

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        if self._closed:
            raise RedisError("the Redis cache is closed")
        with trio.move_on_after(_seconds(self.options.wait_timeout)) as scope:
            await self._slots.acquire()
        if scope.cancelled_caught:
            raise RedisError(f"no connection to Redis free within {self.options.wait_timeout}"
                             " ms")
        try:
            connection = self._idle.pop() if self._idle else await Connection.open(
                self.options)
            try:
                yield connection
            finally:
                if connection.broken or self._closed:
                    await connection.aclose()
                else:
                    self._idle.append(connection)
        finally:
            self._slots.release()

    async def call(self, *args: bytes | str | int) -> Any:
        async with self._connection() as connection:
            return await connection.call(*args)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.aclose()

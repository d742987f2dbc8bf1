"""A response that is written while it is produced: Server-Sent Events for ``generate_stream``
and the OpenAI frontend's ``stream: true``.

A handler that streams returns a :class:`Streaming` instead of a whole response: the server
calls its ``run`` with a :class:`StreamWriter` inside the request's cancel scope, so a client
that leaves (found by the server's sweep, or by a failed write) cancels the request, and the
core then withdraws it from its model (``CancelWork``: a Python model's ``is_cancelled()``
turns true). ``run`` calls ``start`` once with the status and headers (the head goes out with
``transfer-encoding: chunked``), then ``send`` once per event. A ``run`` that fails before
``start`` is answered 500 like any request; one that fails after it ends the connection (the
client sees a truncated body).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

SSE_TYPE = b"text/event-stream; charset=utf-8"


def sse_event(data: bytes) -> bytes:
    """One Server-Sent Event carrying ``data`` (JSON: one line)."""
    return b"data: " + data + b"\n\n"


class StreamWriter:
    """What a streaming handler writes through; the server supplies the I/O."""

    def __init__(self, start: Callable[[int, list[tuple[bytes, bytes]]], Awaitable[None]],
                 send: Callable[[bytes], Awaitable[None]]) -> None:
        self._start = start
        self._send = send
        self.started = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self.started:
            raise RuntimeError("the response was already started")
        self.started = True
        await self._start(status, headers)

    async def send(self, data: bytes) -> None:
        if not self.started:
            raise RuntimeError("send before start")
        if data:
            await self._send(data)


@dataclass(frozen=True, slots=True)
class Streaming:
    """A response produced by ``run(writer)``."""

    run: Callable[[StreamWriter], Awaitable[None]]


async def collect(streaming: Streaming) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The whole of a streamed response, for a server that cannot stream (the ASGI path and
    tests): status, headers and the body written."""
    head: list[tuple[int, list[tuple[bytes, bytes]]]] = []
    chunks: list[bytes] = []

    async def start(status: int, headers: list[tuple[bytes, bytes]]) -> None:
        head.append((status, headers))

    async def send(data: bytes) -> None:
        chunks.append(data)

    await streaming.run(StreamWriter(start, send))
    if not head:
        raise RuntimeError("the streamed response never started")
    return head[0][0], head[0][1], b"".join(chunks)


__all__ = ["SSE_TYPE", "StreamWriter", "Streaming", "collect", "sse_event"]

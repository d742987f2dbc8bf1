"""The HTTP server's supervision boundaries, in process on a loopback socket: an application
that raises (an ExceptionGroup included) costs its request a 500, or its connection, and one
count in ``HttpServer.internal_errors``; the server keeps serving."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import trio

from nursery.protocol.http.server import HttpServer


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = scope["path"]
    if path == "/group":
        async with trio.open_nursery() as nursery:  # a child fails: trio wraps it in a group
            nursery.start_soon(trio.sleep_forever)
            raise ValueError("the app failed")
    if path == "/plain":
        raise RuntimeError("oops")
    if path == "/bad-headers":  # breaks the server's own code, after the request was handled
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x", "str")]})
        await send({"type": "http.response.body", "body": b"never"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _start(nursery: trio.Nursery, **options: Any) -> tuple[HttpServer, int]:
    server = HttpServer(None, _app, max_input_size=1000, serve_infer=False,  # type: ignore[arg-type]
                        **options)
    binds = await nursery.start(server.serve, "127.0.0.1", 0)
    return server, int(binds[0].rsplit(":", 1)[1])


async def _read_response(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head + b"\r\n\r\n" + body


async def _get(stream: trio.SocketStream, path: bytes) -> bytes:
    await stream.send_all(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    return await _read_response(stream)


@pytest.mark.parametrize("path", [b"/group", b"/plain"])
async def test_app_exception_is_a_500_and_the_connection_goes_on(
        path: bytes, caplog: pytest.LogCaptureFixture) -> None:
    async with trio.open_nursery() as nursery:
        server, port = await _start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with caplog.at_level(logging.INFO, logger="nursery.http"):
            reply = await _get(stream, path)
        assert reply.startswith(b"HTTP/1.1 500 Internal Server Error")
        assert json.loads(reply.partition(b"\r\n\r\n")[2]) == {"error": "Internal Server Error"}
        assert server.internal_errors == 1
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and errors[0].exc_info is None  # one line, no traceback
        assert ("ValueError: the app failed" if path == b"/group" else "RuntimeError: oops") \
            in errors[0].getMessage()
        assert (await _get(stream, b"/ok")).endswith(b"\r\n\r\nok")  # same connection
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_traceback_only_at_debug_level(caplog: pytest.LogCaptureFixture) -> None:
    async with trio.open_nursery() as nursery:
        server, port = await _start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with caplog.at_level(logging.DEBUG, logger="nursery.http"):
            await _get(stream, b"/plain")
        assert any(r.exc_info is not None and r.levelno == logging.DEBUG for r in caplog.records)
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_server_bug_costs_its_connection_only() -> None:
    async with trio.open_nursery() as nursery:
        server, port = await _start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /bad-headers HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await stream.receive_some(65536) == b""  # the connection closed
        assert server.internal_errors == 1
        other = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await _get(other, b"/ok")).endswith(b"\r\n\r\nok")
        await stream.aclose()
        await other.aclose()
        nursery.cancel_scope.cancel()


async def test_connection_cap_refuses_and_counts() -> None:
    async with trio.open_nursery() as nursery:
        server, port = await _start(nursery, max_connections=1)
        held = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await _get(held, b"/ok")).endswith(b"ok")
        extra = await trio.open_tcp_stream("127.0.0.1", port)
        reply = await _get(extra, b"/ok")
        assert reply.startswith(b"HTTP/1.1 503") and b"connection limit reached" in reply
        assert server.refused_connections == 1 and server.open_connections == 1
        await extra.aclose()
        await held.aclose()
        nursery.cancel_scope.cancel()


async def test_cancellation_passes_through_the_boundaries() -> None:
    """Shutting the server's nursery down while a request waits in the app is a cancellation,
    never an internal error."""
    entered = trio.Event()

    async def slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        entered.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server = HttpServer(None, slow_app, max_input_size=1000,  # type: ignore[arg-type]
                            serve_infer=False)
        binds = await nursery.start(server.serve, "127.0.0.1", 0)
        stream = await trio.open_tcp_stream("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await entered.wait()
        nursery.cancel_scope.cancel()
    assert server.internal_errors == 0
    await stream.aclose()


async def test_outer_boundary_holds_when_the_inner_one_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Even an error inside the connection's own error handling stays in that connection."""
    async with trio.open_nursery() as nursery:
        server, port = await _start(nursery)
        original = server._run_connection

        async def broken(stream: trio.SocketStream) -> None:
            monkeypatch.setattr(server, "_run_connection", original)  # only the first one
            await stream.aclose()
            raise ExceptionGroup("handler", [RuntimeError("the boundary's own bug")])

        monkeypatch.setattr(server, "_run_connection", broken)
        first = await trio.open_tcp_stream("127.0.0.1", port)
        assert await first.receive_some(65536) == b""
        assert server.internal_errors == 1
        second = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await _get(second, b"/ok")).endswith(b"\r\n\r\nok")
        await first.aclose()
        await second.aclose()
        nursery.cancel_scope.cancel()


async def test_drain_serves_the_open_connections_until_their_clients_close_them(
        caplog: pytest.LogCaptureFixture) -> None:
    """Triton's HTTP stop: the connections open at the drain, idle ones too, keep being
    served and kept alive; the log counts them down once a second; the drain ends as soon as
    the last one closes."""
    caplog.set_level(logging.INFO, logger="nursery.http_stop")
    async with trio.open_nursery() as nursery:
        server, port = await _start(nursery)
        busy = await trio.open_tcp_stream("127.0.0.1", port)
        idle = await trio.open_tcp_stream("127.0.0.1", port)
        for stream in (busy, idle):
            assert (await _get(stream, b"/ok")).startswith(b"HTTP/1.1 200")
        ended = trio.Event()

        async def drain() -> None:
            await server.drain(30)
            ended.set()

        nursery.start_soon(drain)
        await trio.sleep(0.1)
        for _ in range(2):  # served, and still kept alive
            answer = await _get(busy, b"/ok")
            assert answer.startswith(b"HTTP/1.1 200") and b"close" not in answer.lower()
        await busy.aclose()
        await trio.sleep(0.1)
        assert not ended.is_set()  # the idle one holds it
        await idle.aclose()
        with trio.fail_after(5):
            await ended.wait()
    lines = [r.getMessage() for r in caplog.records if r.name == "nursery.http_stop"]
    assert lines[0] == "Timeout 30: Found 2 HTTP service connections", lines
    assert all("Timeout 30" not in line for line in lines[1:]), lines


async def test_drain_ends_at_the_exit_timeout_and_closes_what_is_left() -> None:
    """A client that never closes holds the drain for the exit timeout, no longer: then its
    idle connection is closed (the client reads the end of the stream)."""
    async with trio.open_nursery() as nursery:
        server, port = await _start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await _get(stream, b"/ok")).startswith(b"HTTP/1.1 200")
        start = trio.current_time()
        with trio.fail_after(10):
            await server.drain(2)
            assert await stream.receive_some(10) == b""
        assert trio.current_time() - start >= 1.5  # it waited for the client, then ended
        await stream.aclose()

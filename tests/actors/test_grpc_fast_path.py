"""Unary calls served without a task (``UnaryFastPath`` on the lean HTTP/2 server), on trio's
virtual clock: one connection of a real :class:`H2Server` over an in-memory stream pair,
spoken to frame by frame, with a route the test answers by hand.

What is checked: an answer (or an error status) written later from plain code reaches the
client as a whole gRPC response; a client's RST_STREAM, or its connection closing, abandons
the request exactly once and a late answer then writes nothing; anything the fast path does
not take (the route declines, a compressed or malformed message, a deadline, a large body)
is served by the ordinary path (here a handler that reads the request and answers
UNAVAILABLE)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import grpclib
import grpclib.const
import hpack
import trio
import trio.testing
from grpclib.const import Status

from nursery.protocol.codecs.grpc_wire import StrictProtoCodec
from nursery.protocol.grpc.h2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    RST_STREAM,
    S_INITIAL_WINDOW_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
    H2Server,
    encode_headers,
    frame,
)
from nursery.protocol.grpc.lean import GrpcApp, UnaryFastPath
from nursery.schema import inference as pb
from tests.actors.test_h2_supervision import Peer, connected

PATH = b"/inference.GRPCInferenceService/ModelInfer"


def _headers(*extra: tuple[bytes, bytes]) -> bytes:
    return encode_headers([
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", PATH), (b":authority", b"a"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers"), *extra])


def _message(name: str = "m", compressed: bool = False) -> bytes:
    body = bytes(pb.ModelInferRequest(model_name=name))
    return (b"\x01" if compressed else b"\x00") + len(body).to_bytes(4, "big") + body


class Route:
    """The test's route: it takes or declines each request and keeps its ``reply``."""

    def __init__(self, take: bool = True) -> None:
        self.take = take
        self.calls: list[tuple[Any, Callable[[Any], None]]] = []
        self.abandoned = 0

    def __call__(self, message: Any, reply: Callable[[Any], None]) -> Callable[[], None] | None:
        self.calls.append((message, reply))
        if not self.take:
            return None

        def abandon() -> None:
            self.abandoned += 1

        return abandon


class Ordinary:
    """The ordinary path's service: it reads the request, then answers UNAVAILABLE."""

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {PATH.decode(): grpclib.const.Handler(
            self.infer, grpclib.const.Cardinality.UNARY_UNARY, pb.ModelInferRequest,
            pb.ModelInferResponse)}

    async def infer(self, call: Any) -> None:
        await call.recv_message()
        raise grpclib.GRPCError(Status.UNAVAILABLE, "the ordinary path")


def _server(route: Route, **limits: Any) -> H2Server:
    app = GrpcApp([Ordinary()], StrictProtoCodec())
    server = H2Server(app, **limits)
    server.fast = UnaryFastPath(app, {PATH.decode(): (pb.ModelInferRequest, route)})
    return server


async def _response(peer: Peer, stream_id: int) -> tuple[bytes, dict[str, str]]:
    """The stream's DATA and its trailers (a decoder of the server's header blocks)."""
    decoder = hpack.Decoder()
    data = b""
    while True:
        f = await peer.next()
        assert f is not None, "closed before the response ended"
        kind, flags, sid, payload = f
        if sid != stream_id:
            continue
        if kind == DATA:
            data += payload
        elif kind == HEADERS:
            block = dict((str(k), str(v)) for k, v in decoder.decode(payload))
            if flags & END_STREAM:
                return data, block


async def test_an_answer_written_later_is_one_grpc_response(
        autojump_clock: trio.testing.MockClock) -> None:
    route = Route()
    async with connected(_server(route)) as peer:
        await peer.send(frame(HEADERS, END_HEADERS, 1, _headers())
                        + frame(DATA, END_STREAM, 1, _message("mlp")))
        await trio.sleep(1)
        ((message, reply),) = route.calls
        assert message.model_name == "mlp"
        reply(b"abc")
        data, trailers = await _response(peer, 1)
        assert data == b"\x00\x00\x00\x00\x03abc" and trailers["grpc-status"] == "0"
        # an error: a trailers-only answer with its status and message
        await peer.send(frame(HEADERS, END_HEADERS, 3, _headers()) + frame(DATA, END_STREAM, 3, _message()))
        await trio.sleep(1)
        route.calls[1][1](grpclib.GRPCError(Status.NOT_FOUND, "no such model"))
        data, trailers = await _response(peer, 3)
        assert data == b"" and trailers["grpc-status"] == str(Status.NOT_FOUND.value)
        assert trailers["grpc-message"] == "no such model"
    assert route.abandoned == 0


async def test_a_reset_abandons_the_request_once(autojump_clock: trio.testing.MockClock) -> None:
    route = Route()
    async with connected(_server(route)) as peer:
        await peer.send(frame(HEADERS, END_HEADERS, 1, _headers()) + frame(DATA, END_STREAM, 1, _message()))
        await trio.sleep(1)
        await peer.send(frame(RST_STREAM, 0, 1, (8).to_bytes(4, "big")))
        await trio.sleep(1)
        assert route.abandoned == 1
        route.calls[0][1](b"late")  # the model answers after all: nothing is written
        await peer.send(frame(HEADERS, END_HEADERS, 3, _headers()) + frame(DATA, END_STREAM, 3, _message()))
        await trio.sleep(1)
        route.calls[1][1](b"ok")
        data, trailers = await _response(peer, 3)  # the connection still serves
        assert data.endswith(b"ok") and trailers["grpc-status"] == "0"
    assert route.abandoned == 1


async def test_a_closed_connection_abandons_its_requests(
        autojump_clock: trio.testing.MockClock) -> None:
    route = Route()
    async with connected(_server(route)) as peer:
        for sid in (1, 3):
            await peer.send(frame(HEADERS, END_HEADERS, sid, _headers())
                            + frame(DATA, END_STREAM, sid, _message()))
        await trio.sleep(1)
        await peer.stream.aclose()
        await trio.sleep(1)
        assert route.abandoned == 2
        for _, reply in route.calls:
            reply(b"late")  # harmless: the connection is gone


async def test_what_the_fast_path_does_not_take_goes_the_ordinary_way(
        autojump_clock: trio.testing.MockClock) -> None:
    declining = Route(take=False)
    async with connected(_server(declining)) as peer:
        await peer.send(frame(HEADERS, END_HEADERS, 1, _headers()) + frame(DATA, END_STREAM, 1, _message()))
        _, trailers = await _response(peer, 1)
        assert len(declining.calls) == 1
        assert trailers["grpc-message"] == "the ordinary path"
    route = Route()
    server = _server(route, stream_window=64 * 1024)
    async with connected(server) as peer:
        cases = [
            (_headers(), _message(compressed=True)),  # compressed: the ordinary path inflates
            (_headers(), _message()[:-1]),  # a short message
            (_headers((b"grpc-timeout", b"5S")), _message()),  # a deadline needs a task
            (_headers((b"grpc-encoding", b"gzip")), _message()),
        ]
        sid = 1
        for head, body in cases:
            await peer.send(frame(HEADERS, END_HEADERS, sid, head) + frame(DATA, END_STREAM, sid, body))
            _, trailers = await _response(peer, sid)
            assert trailers["grpc-status"] != "0", (head, body)
            sid += 2
        # a body beyond half the stream window before its end: a task reads it as it comes
        await peer.send(frame(HEADERS, END_HEADERS, sid, _headers()))
        prefix = b"\x00" + (3 * 16000 + 1 - 5).to_bytes(4, "big")
        for n in range(3):
            await peer.send(frame(DATA, 0, sid, (b"" if n else prefix).ljust(16000, b"\x00")))
        update = await peer.until(WINDOW_UPDATE)  # the task read it and opened the window
        assert update[2] == sid
        await peer.send(frame(DATA, END_STREAM, sid, b"\x00"))
        _, trailers = await _response(peer, sid)
        assert trailers["grpc-status"] != "0"
    assert route.calls == []


async def test_an_answer_larger_than_the_window_waits_for_it_or_its_reset(
        autojump_clock: trio.testing.MockClock) -> None:
    """An answer the client's window cannot take yet is finished by a task: it goes out as
    the window opens, and a reset meanwhile ends it (the connection serves on)."""
    route = Route()
    small = frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 16))
    async with connected(_server(route), PREFACE + small) as peer:
        await peer.send(frame(HEADERS, END_HEADERS, 1, _headers()) + frame(DATA, END_STREAM, 1, _message()))
        await trio.sleep(1)
        route.calls[0][1](b"x" * 40)  # 45 bytes framed: 16 go now, the rest as the window opens
        first = await peer.until(DATA)
        assert first[2] == 1 and len(first[3]) == 16
        await peer.send(frame(WINDOW_UPDATE, 0, 1, (100).to_bytes(4, "big")))
        data, trailers = await _response(peer, 1)
        assert first[3] + data == b"\x00\x00\x00\x00\x28" + b"x" * 40
        assert trailers["grpc-status"] == "0"
        await peer.send(frame(HEADERS, END_HEADERS, 3, _headers()) + frame(DATA, END_STREAM, 3, _message()))
        await trio.sleep(1)
        route.calls[1][1](b"y" * 40)
        await peer.until(DATA)
        await peer.send(frame(RST_STREAM, 0, 3, (8).to_bytes(4, "big")))  # gone mid-answer
        await trio.sleep(1)
        await peer.send(frame(HEADERS, END_HEADERS, 5, _headers()) + frame(DATA, END_STREAM, 5, _message()))
        await trio.sleep(1)
        route.calls[2][1](b"z")
        data, trailers = await _response(peer, 5)
        assert data.endswith(b"z") and trailers["grpc-status"] == "0"

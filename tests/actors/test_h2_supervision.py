"""The lean HTTP/2 server's supervision boundaries and clocks, on trio's virtual clock: one
connection of a real :class:`H2Server` over an in-memory stream pair, spoken to frame by frame.

What is checked: an unexpected exception (groups too) ends only its stream, answered
RST_STREAM INTERNAL_ERROR or grpc-status INTERNAL and counted in ``internal_errors``; the
handshake deadline, the idle timeout (GOAWAY max_idle), keepalive PINGs and their timeout, the
ping-strike policy (GOAWAY ENHANCE_YOUR_CALM), the connection cap and CONTINUATION floods."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import grpclib.const
import hpack
import pytest
import trio
import trio.testing

from nursery.errors import NotFound
from nursery.protocol.codecs.grpc_wire import StrictProtoCodec
from nursery.protocol.grpc import service as grpc_service
from nursery.protocol.grpc.h2 import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    HEADERS,
    INTERNAL_ERROR,
    NO_ERROR,
    PING,
    PREFACE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    H2Server,
    Stream,
    encode_headers,
    frame,
)
from nursery.protocol.grpc.lean import GrpcApp
from nursery.protocol.grpc.service import Draining, InferenceService
from nursery.runtime.supervision import split_unexpected
from nursery.schema import inference as pb
from tests.property.test_fuzz_h2 import REQUEST_HEADERS, StubCore, echo_app

Frame = tuple[int, int, int, bytes]


class Peer:
    """The client's end of one connection: frames out, frames in."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = b""
        self.closed = False

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def next(self) -> Frame | None:
        """The next frame, or None once the server has closed."""
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk
        length = int.from_bytes(self.buf[:3], "big")
        f = (self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big"), self.buf[9:9 + length])
        self.buf = self.buf[9 + length:]
        return f

    async def until(self, kind: int) -> Frame:
        while (f := await self.next()) is not None:
            if f[0] == kind:
                return f
        raise AssertionError(f"closed before a frame of kind {kind}")

    async def rest(self) -> list[Frame]:
        out = []
        while (f := await self.next()) is not None:
            out.append(f)
        return out


@asynccontextmanager
async def connected(server: H2Server, hello: bytes = PREFACE + frame(SETTINGS, 0, 0)
                    ) -> AsyncIterator[Peer]:
    async with trio.open_nursery() as nursery:
        client, inside = trio.testing.memory_stream_pair()
        nursery.start_soon(server._connection, inside)
        peer = Peer(client)
        if hello:
            await peer.send(hello)
        yield peer
        nursery.cancel_scope.cancel()


def goaway_code(f: Frame) -> int:
    return int.from_bytes(f[3][4:8], "big")


# -- supervision ---------------------------------------------------------------------------

async def test_app_exception_ends_only_its_stream(autojump_clock: trio.testing.MockClock) -> None:
    async def app(stream: Stream) -> None:
        if dict(stream.headers).get(":path") == "/boom":
            raise ValueError("boom")
        if dict(stream.headers).get(":path") == "/group":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep_forever)
                raise KeyError("in a group")
        await echo_app(stream)

    server = H2Server(app)
    boom = encode_headers([(b":method", b"POST"), (b":path", b"/boom")])
    group = encode_headers([(b":method", b"POST"), (b":path", b"/group")])
    async with connected(server) as peer:
        await peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, boom))
        rst = await peer.until(RST_STREAM)
        assert rst[2] == 1 and int.from_bytes(rst[3], "big") == INTERNAL_ERROR
        await peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, group))
        rst = await peer.until(RST_STREAM)
        assert rst[2] == 3 and int.from_bytes(rst[3], "big") == INTERNAL_ERROR
        await peer.send(frame(HEADERS, END_HEADERS, 5, REQUEST_HEADERS) + frame(DATA, END_STREAM, 5, b"hi"))
        data = await peer.until(DATA)
        assert data[2:] == (5, b"hi")  # the connection still serves
    assert server.internal_errors == 2


async def test_grpc_handler_exception_is_internal(autojump_clock: trio.testing.MockClock) -> None:
    class Service:
        def __mapping__(self) -> dict[str, grpclib.const.Handler]:
            async def boom(call: object) -> None:
                async with trio.open_nursery():
                    raise RuntimeError("unexpected")
            return {"/t/Boom": grpclib.const.Handler(boom, grpclib.const.Cardinality.UNARY_UNARY,
                                                     pb.ServerLiveRequest, pb.ServerLiveResponse)}

    server = H2Server(GrpcApp([Service()], StrictProtoCodec()))
    headers = encode_headers([(b":method", b"POST"), (b":path", b"/t/Boom"),
                              (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    async with connected(server) as peer:
        await peer.send(frame(HEADERS, END_HEADERS, 1, headers) + frame(DATA, END_STREAM, 1, b"\0" * 5))
        trailers = dict(hpack.Decoder().decode((await peer.until(HEADERS))[3]))
    assert trailers["grpc-status"] == "13"  # INTERNAL
    assert server.internal_errors == 1


async def test_cancellation_is_never_swallowed() -> None:
    cancelled: list[BaseException] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.sleep(1)
        except trio.Cancelled as exc:
            cancelled.append(exc)
            raise
    inner = ExceptionGroup("inner", [KeyError("k")])
    group = BaseExceptionGroup("mixed", [cancelled[0], ValueError("x"), inner])
    rest, fatal = split_unexpected(group)
    assert fatal is not None and [type(e) for e in fatal.exceptions] == [trio.Cancelled]  # type: ignore[attr-defined]
    assert rest is not None and isinstance(rest, ExceptionGroup)
    assert split_unexpected(cancelled[0]) == (None, cancelled[0])
    assert split_unexpected(KeyboardInterrupt())[0] is None
    error = ValueError("v")
    assert split_unexpected(error) == (error, None)


async def test_server_shutdown_cancels_a_busy_stream(autojump_clock: trio.testing.MockClock) -> None:
    """Cancelling the server's nursery ends the connection and its application tasks."""
    started = trio.Event()

    async def app(stream: Stream) -> None:
        started.set()
        await trio.sleep_forever()

    server = H2Server(app)
    with trio.fail_after(10):
        async with connected(server) as peer:
            await peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, REQUEST_HEADERS))
            await started.wait()
    assert server.internal_errors == 0


# -- clocks --------------------------------------------------------------------------------

@pytest.mark.parametrize("hello", [b"", PREFACE[:5], PREFACE])
async def test_handshake_deadline(autojump_clock: trio.testing.MockClock, hello: bytes) -> None:
    server = H2Server(echo_app, handshake_timeout=10)
    async with connected(server, hello) as peer:
        start = trio.current_time()
        frames = await peer.rest()
        assert trio.current_time() - start == pytest.approx(10, abs=0.01)
    assert GOAWAY not in [f[0] for f in frames]


async def test_idle_connection_gets_goaway(autojump_clock: trio.testing.MockClock) -> None:
    server = H2Server(echo_app, idle_timeout=30)
    async with connected(server) as peer:
        # a call keeps the connection busy; the idle clock starts when it ends
        await trio.sleep(20)
        await peer.send(frame(HEADERS, END_HEADERS, 1, REQUEST_HEADERS))
        await trio.sleep(25)
        await peer.send(frame(DATA, END_STREAM, 1, b"x"))
        await peer.until(DATA)
        answered = trio.current_time()
        goaway = await peer.until(GOAWAY)
        assert trio.current_time() - answered == pytest.approx(30, abs=0.01)
        assert goaway_code(goaway) == NO_ERROR and goaway[3][8:] == b"max_idle"
        assert await peer.rest() == []


async def test_keepalive_ping_acknowledged_or_closed(autojump_clock: trio.testing.MockClock) -> None:
    server = H2Server(echo_app, keepalive_time=60, keepalive_timeout=5, idle_timeout=10_000,
                      max_pings_without_data=0)
    async with connected(server) as peer:
        await peer.send(frame(HEADERS, END_HEADERS, 1, REQUEST_HEADERS))  # a call in flight
        for _ in range(3):  # answered PINGs keep the connection
            ping = await peer.until(PING)
            assert ping[1] == 0
            await peer.send(frame(PING, ACK, 0, ping[3]))
        await peer.until(PING)  # this one is left unanswered
        unanswered = trio.current_time()
        assert await peer.rest() == []
        assert trio.current_time() - unanswered == pytest.approx(5, abs=0.01)


async def test_no_keepalive_without_calls_unless_permitted(autojump_clock: trio.testing.MockClock) -> None:
    for permit in (False, True):
        server = H2Server(echo_app, keepalive_time=60, keepalive_timeout=5, idle_timeout=1000,
                          keepalive_permit_without_calls=permit)
        async with connected(server) as peer:
            kinds = [f[0] for f in await peer.rest()]
        assert (PING in kinds) is permit
        # without calls: no PING, closed idle (GOAWAY); permitted: closed for the unanswered PING
        assert (GOAWAY in kinds) is not permit


async def test_ping_strikes(autojump_clock: trio.testing.MockClock) -> None:
    server = H2Server(echo_app)
    async with connected(server) as peer:
        await peer.send(b"".join(frame(PING, 0, 0, b"%08d" % i) for i in range(4)))
        frames = await peer.rest()
    acks = [f for f in frames if f[0] == PING]
    assert len(acks) == 3  # the first PING, then two strikes tolerated
    goaway = [f for f in frames if f[0] == GOAWAY][0]
    assert goaway_code(goaway) == ENHANCE_YOUR_CALM and goaway[3][8:] == b"too_many_pings"


async def test_pings_spaced_or_between_data_are_not_strikes(autojump_clock: trio.testing.MockClock) -> None:
    server = H2Server(echo_app, min_recv_ping_interval=1, keepalive_permit_without_calls=True)
    async with connected(server) as peer:
        for i in range(10):  # one PING a second: allowed
            await peer.send(frame(PING, 0, 0, b"%08d" % i))
            await peer.until(PING)
            await trio.sleep(1)
        for i in range(1, 10, 2):  # a PING after each answer: the ping clock restarts
            await peer.send(frame(HEADERS, END_HEADERS, i, REQUEST_HEADERS)
                            + frame(DATA, END_STREAM, i, b"x"))
            await peer.until(DATA)
            await peer.send(frame(PING, 0, 0, b"pingping"))
            await peer.until(PING)
    assert not peer.closed


async def test_connection_cap(autojump_clock: trio.testing.MockClock) -> None:
    server = H2Server(echo_app, max_connections=1)
    async with connected(server) as first:
        await first.until(SETTINGS)
        async with connected(server, b"") as second:
            frames = await second.rest()
        assert [f[0] for f in frames] == [SETTINGS, GOAWAY]
        assert goaway_code(frames[1]) == REFUSED_STREAM
        await first.send(frame(HEADERS, END_HEADERS, 1, REQUEST_HEADERS) + frame(DATA, END_STREAM, 1, b"ok"))
        assert (await first.until(DATA))[3] == b"ok"
    assert server.refused_connections == 1


async def test_continuation_flood_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    server = H2Server(echo_app)
    async with connected(server) as peer:
        await peer.send(frame(HEADERS, 0, 1, REQUEST_HEADERS[:4])
                        + b"".join(frame(CONTINUATION, 0, 1) for _ in range(1000)))
        goaway = await peer.until(GOAWAY)
    assert goaway_code(goaway) == ENHANCE_YOUR_CALM
    assert server.internal_errors == 0


async def test_stream_request_failing_unexpectedly_fails_alone(
        autojump_clock: trio.testing.MockClock) -> None:
    """In ModelStreamInfer the unit of failure is the request: "Internal Server Error" as its
    error_message, counted, and the stream goes on."""
    inference = InferenceService(StubCore(), Draining())  # type: ignore[arg-type]
    server = H2Server(GrpcApp([inference], StrictProtoCodec()))
    inference.on_internal_error = server.internal_error
    headers = encode_headers([(b":method", b"POST"),
                              (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer"),
                              (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    body = b""
    for name in ("boom", "nope", "boom"):
        message = bytes(pb.ModelInferRequest(model_name=name))
        body += b"\0" + len(message).to_bytes(4, "big") + message
    async with connected(server) as peer:
        await peer.send(frame(HEADERS, END_HEADERS, 1, headers) + frame(DATA, END_STREAM, 1, body))
        answers = []
        while len(answers) < 3:
            data = (await peer.until(DATA))[3]
            while data:
                length = int.from_bytes(data[1:5], "big")
                answers.append(pb.ModelStreamInferResponse().parse(data[5:5 + length]).error_message)
                data = data[5 + length:]
        trailers = dict(hpack.Decoder().decode((await peer.until(HEADERS))[3]))  # (head skipped)
    assert sorted(answers) == ["Internal Server Error", "Internal Server Error",
                               "Request for unknown model: 'nope' is not found"]
    assert trailers["grpc-status"] == "0"
    assert server.internal_errors == 2


async def test_stream_requests_in_flight_are_bounded(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_STREAM_IN_FLIGHT unanswered requests, a ModelStreamInfer stream is not read
    further until one is answered."""
    monkeypatch.setattr(grpc_service, "MAX_STREAM_IN_FLIGHT", 2)
    release = trio.Event()

    class HeldCore(StubCore):
        started = 0

        def resolve(self, name: str, version: str = "") -> object:
            return SimpleNamespace(name=name, config=SimpleNamespace(decoupled=False, sequence=None))

        async def infer(self, request: object, handle: object) -> object:
            HeldCore.started += 1
            await release.wait()
            raise NotFound("done")

    class HeldClient:
        """What a stream asks of the model client: check and queue (here: nothing), then
        the answer (here: held until released, then an error)."""

        def submit(self, request: object, handle: object, *, queue: bool = True,
                   slot: object = None) -> tuple[object, object]:
            return object(), slot

        def start(self, work: object, slot: object, handle: object) -> object:
            return HeldCore().infer(work, handle)

    HeldCore.client = HeldClient()  # type: ignore[attr-defined]
    inference = InferenceService(HeldCore(), Draining())  # type: ignore[arg-type]
    server = H2Server(GrpcApp([inference], StrictProtoCodec()))
    headers = encode_headers([(b":method", b"POST"),
                              (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer"),
                              (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    message = bytes(pb.ModelInferRequest(model_name="m", inputs=[
        pb.ModelInferRequestInferInputTensor(name="INPUT0", datatype="FP32", shape=[1])],
        raw_input_contents=[b"\0" * 4]))
    body = (b"\0" + len(message).to_bytes(4, "big") + message) * 5
    async with connected(server) as peer:
        await peer.send(frame(HEADERS, END_HEADERS, 1, headers) + frame(DATA, END_STREAM, 1, body))
        await trio.sleep(10)
        assert HeldCore.started == 2
        release.set()
        answers = 0
        while answers < 5:
            data = (await peer.until(DATA))[3]
            while data:
                answers += 1
                data = data[5 + int.from_bytes(data[1:5], "big"):]
    assert HeldCore.started == 5
    assert server.internal_errors == 0


async def test_a_client_that_reads_nothing_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    """A client that stops reading while a response is written: the connection closes once
    a piece of it has waited ``write_timeout`` (the watchdog looks every ``write_timeout``)."""
    server = H2Server(echo_app, write_timeout=30, keepalive_time=10_000)
    client, inside = trio.testing.lockstep_stream_pair()  # a write waits for the reader
    ended: list[float] = []

    async def serve() -> None:
        await server._connection(inside)
        ended.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        peer = Peer(client)
        await peer.send(PREFACE + frame(SETTINGS, 0, 0))
        while (f := await peer.next()) is not None and f[:2] != (SETTINGS, ACK):
            pass
        await peer.send(frame(HEADERS, END_HEADERS, 1, REQUEST_HEADERS)
                        + frame(DATA, END_STREAM, 1, b"x" * 1000))
        asked = trio.current_time()
        await trio.sleep(1000)  # reading nothing
        assert ended and 30 <= ended[0] - asked <= 60
    assert server.internal_errors == 0

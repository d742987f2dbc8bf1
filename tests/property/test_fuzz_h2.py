"""Fuzzing the gRPC port's decoders: HTTP/2 frames after the preface, HPACK header blocks, and
gRPC message framing with compression.

Each target of ``TARGETS`` takes raw bytes and must return normally or raise only its
decoder's documented error (the oracle shared with bench/'s long campaign):

- ``h2_frames``: the bytes follow the client preface and a SETTINGS frame into one connection
  of a real :class:`H2Server` (over an in-memory trio stream pair, virtual clock); the
  connection must end (GOAWAY or a close), with no unexpected exception reaching its boundary
  (``internal_errors`` stays 0) and no hang. Nothing may escape: no documented error.
- ``hpack_block``: one header block through :func:`decode_header_block`; documented error:
  the connection's ``ConnectionError`` (COMPRESSION_ERROR).
- ``grpc_message_framing``: the first byte picks grpc-encoding (identity, gzip, deflate), the
  rest is a request body of 5-byte-prefixed messages read by :class:`Call`, with a 64 KiB
  limit; documented error: ``grpclib.GRPCError``. The messages are taken as bytes
  (:class:`BytesCodec`): protobuf decoding has its own targets (test_fuzz_tensors.py).
- ``grpc_calls``: like ``h2_frames``, but the connection serves the real gRPC application
  (``GrpcApp`` with ``InferenceService``) over :class:`StubCore`; every answer must be a gRPC
  status or a stream's ``error_message``: the only unexpected exceptions reaching a boundary
  may be the core's planted :class:`PlantedBug` (model "boom"). No documented error.

``SEEDS`` holds valid inputs of each target for the mutation campaign (bench/fuzz.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import grpclib
import grpclib.const
import hpack
import pytest
import trio
import trio.testing
from grpclib.const import Status
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.errors import NotFound
from nursery.protocol.codecs.grpc_wire import StrictProtoCodec
from nursery.protocol.grpc.h2 import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    ConnectionError,
    H2Server,
    Stream,
    decode_header_block,
    encode_headers,
    frame,
)
from nursery.protocol.grpc.lean import Call, GrpcApp
from nursery.protocol.grpc.service import Draining, InferenceService
from nursery.schema import inference as pb
from nursery.shm.system import SharedMemoryRegistry

FRAMING_LIMIT = 64 * 1024
_ENCODINGS = ("identity", "gzip", "deflate")


async def echo_app(stream: Stream) -> None:
    """Reads the whole request body, answers it back with trailers."""
    body = bytearray()
    while chunk := await stream.receive_data():
        body += chunk
    await stream.send_headers(encode_headers([(b":status", b"200")]))
    await stream.send_data(bytes(body))
    await stream.send_headers(encode_headers([(b"grpc-status", b"0")]), end_stream=True)


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    pos = 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos:pos + 3], "big")
        out.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF,
                    data[pos + 9:pos + 9 + length]))
        pos += 9 + length
    return out


async def converse(server: H2Server, data: bytes, *, eof: bool = True) -> bytes:
    """``data`` into one connection of ``server``; returns all it sent until it closed."""
    client, inside = trio.testing.memory_stream_pair()
    received = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server._connection, inside)
        await client.send_all(data)
        await trio.testing.wait_all_tasks_blocked()
        if eof:
            await client.send_eof()
        with trio.fail_after(3600):  # virtual time: a hang is a failure, not a wait
            while chunk := await client.receive_some(65536):
                received += chunk
    return bytes(received)


async def _h2_frames(data: bytes) -> None:
    server = H2Server(echo_app, max_frame=16384, stream_window=65535,
                      connection_window=65535 * 4, max_header_list=4096, max_streams=8)
    out = await converse(server, PREFACE + frame(SETTINGS, 0, 0) + data)
    if server.internal_errors:
        raise AssertionError(f"{server.internal_errors} internal errors")
    if not out or parse_frames(out)[0][0] != SETTINGS:
        raise AssertionError("the server's SETTINGS did not come first")


def h2_frames(data: bytes) -> None:
    trio.run(_h2_frames, data, clock=trio.testing.MockClock(autojump_threshold=0))


def hpack_block(data: bytes) -> None:
    decoder = hpack.Decoder()
    decoder.max_header_list_size = 64 * 1024
    try:
        decode_header_block(decoder, data)
    except ConnectionError:
        pass


class BodyStream:
    """The request side of a stream, as :class:`Call` reads it: the body in chunks."""

    def __init__(self, body: bytes, chunk: int = 4096) -> None:
        self.chunks = [body[i:i + chunk] for i in range(0, len(body), chunk)]

    async def receive_data(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


class BytesCodec:
    """Messages as the bytes the framing delivered (the framing layer alone)."""

    max_message = 2**31 - 1

    def decode(self, data: bytes, message_type: object) -> bytes:
        return data


_HANDLER = grpclib.const.Handler(None, grpclib.const.Cardinality.UNARY_UNARY,  # type: ignore[arg-type]
                                 pb.ModelReadyRequest, pb.ModelReadyResponse)


async def read_messages(encoding: str, body: bytes, limit: int = FRAMING_LIMIT) -> list[bytes]:
    call = Call(BodyStream(body), _HANDLER, BytesCodec(), encoding,  # type: ignore[arg-type]
                {}, None, limit)
    return [message async for message in call]


def grpc_message_framing(data: bytes) -> None:
    if not data:
        return
    encoding = _ENCODINGS[data[0] % 3]
    try:
        trio.run(read_messages, encoding, data[1:])
    except grpclib.GRPCError:
        pass


class PlantedBug(Exception):
    """What :class:`StubCore` raises for model "boom": a stand-in for a bug in the core."""


class StubCore:
    """Just enough of a Core for the RPCs to reach it: model "boom" fails unexpectedly (a
    planted bug, to show the boundaries), any other model is unknown (an ordinary error)."""

    shm = SharedMemoryRegistry()  # the frontends take each request's hold from it

    class tracer:  # noqa: N801 - an attribute namespace
        active = False

    def resolve(self, name: str, version: str = "") -> object:
        if name == "boom":
            raise PlantedBug("a bug")
        raise NotFound(f"Request for unknown model: '{name}' is not found")

    async def acquire(self, name: str, version: str = "") -> object:
        return self.resolve(name, version)  # as the core does without loading on demand

    def server_live(self) -> bool:
        return True

    async def server_ready(self) -> bool:
        return True

    async def model_ready(self, name: str, version: str = "") -> bool:
        return False


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def grpc_server(max_input: int = FRAMING_LIMIT) -> tuple[H2Server, list[BaseException]]:
    """The gRPC application over :class:`StubCore`, and the list where the exceptions its
    boundaries stop are recorded (besides ``internal_errors``)."""
    inference = InferenceService(StubCore(), Draining())  # type: ignore[arg-type]
    server = H2Server(GrpcApp([inference], StrictProtoCodec(), max_input), max_frame=16384)
    stopped: list[BaseException] = []
    count = server.internal_error

    def record(where: str, exc: BaseException) -> None:
        stopped.extend(_leaves(exc))
        count(where, exc)

    server.internal_error = record  # type: ignore[method-assign]
    inference.on_internal_error = record
    return server, stopped


async def _grpc_calls(data: bytes) -> None:
    server, stopped = grpc_server()
    await converse(server, PREFACE + frame(SETTINGS, 0, 0) + data)
    unexpected = [e for e in stopped if not isinstance(e, PlantedBug)]
    if unexpected:
        raise AssertionError(f"internal errors: {unexpected!r}")


def grpc_calls(data: bytes) -> None:
    trio.run(_grpc_calls, data, clock=trio.testing.MockClock(autojump_threshold=0))


TARGETS: dict[str, Callable[[bytes], None]] = {
    "h2_frames": h2_frames,
    "hpack_block": hpack_block,
    "grpc_message_framing": grpc_message_framing,
    "grpc_calls": grpc_calls,
}


# -- hypothesis drivers ------------------------------------------------------------------------

REQUEST_HEADERS = encode_headers([
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/x"), (b":authority", b"a"),
    (b"content-type", b"application/grpc"), (b"te", b"trailers")])

frames = st.one_of(
    st.builds(lambda sid, end, body: frame(DATA, END_STREAM if end else 0, sid, body),
              st.integers(0, 9), st.booleans(), st.binary(max_size=300)),
    st.builds(lambda sid, flags, block: frame(HEADERS, flags, sid, block),
              st.integers(0, 9), st.sampled_from([0, END_HEADERS, END_HEADERS | END_STREAM, 0x8, 0x20]),
              st.one_of(st.just(REQUEST_HEADERS), st.binary(max_size=64))),
    st.builds(lambda sid, flags, block: frame(CONTINUATION, flags, sid, block),
              st.integers(0, 9), st.sampled_from([0, END_HEADERS]), st.binary(max_size=32)),
    st.builds(lambda sid, code: frame(RST_STREAM, 0, sid, code.to_bytes(4, "big")),
              st.integers(0, 9), st.integers(0, 15)),
    st.builds(lambda sid, inc: frame(WINDOW_UPDATE, 0, sid, inc.to_bytes(4, "big")),
              st.integers(0, 9), st.integers(0, 2**32 - 1)),
    st.builds(lambda flags, body: frame(SETTINGS, flags, 0, body),
              st.sampled_from([0, 1]), st.binary(max_size=18)),
    st.builds(lambda flags, body: frame(PING, flags, 0, body), st.sampled_from([0, 1]),
              st.binary(min_size=8, max_size=8)),
    st.builds(lambda sid, body: frame(PRIORITY, 0, sid, body), st.integers(0, 9), st.binary(max_size=6)),
    st.builds(lambda body: frame(GOAWAY, 0, 0, body), st.binary(max_size=12)),
    st.builds(lambda kind, flags, sid, body: frame(kind, flags, sid, body),
              st.integers(0, 255), st.integers(0, 255), st.integers(0, 2**31 - 1), st.binary(max_size=40)),
    st.binary(max_size=40),  # not even a frame
)


@settings(max_examples=150, deadline=None)
@given(st.lists(frames, max_size=12))
def test_h2_frames_end_cleanly(parts: list[bytes]) -> None:
    h2_frames(b"".join(parts))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=2000))
def test_h2_raw_bytes_end_cleanly(data: bytes) -> None:
    h2_frames(data)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.lists(st.sampled_from(
    [b"\x82", b"\x84", b"\x86", b"\x3f\xe1\x1f", b"\x40\x01a\x01b", b"\x00\x01a\x01b", b"\x7f",
     b"\xff", b"\x10", b"\x0f\xff", b"\x20", b"\xbe"]), max_size=40).map(b"".join)))
def test_hpack_block_decodes_or_refuses(data: bytes) -> None:
    hpack_block(data)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_grpc_framing_raw_bytes(data: bytes) -> None:
    grpc_message_framing(data)


def _compress(encoding: str, data: bytes) -> bytes:
    if encoding == "gzip":
        packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    else:
        packer = zlib.compressobj(6, zlib.DEFLATED, 15)
    return packer.compress(data) + packer.flush()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["gzip", "deflate"]), st.integers(0, 3 * FRAMING_LIMIT))
def test_compressed_messages_inflate_up_to_the_limit(encoding: str, size: int) -> None:
    """A message whose inflated size is within the limit decodes; one beyond it is refused
    with RESOURCE_EXHAUSTED, however small its compressed form."""
    message = bytes(range(256)) * (size // 256) + b"m" * (size % 256)
    packed = _compress(encoding, message)
    body = b"\x01" + len(packed).to_bytes(4, "big") + packed
    if len(message) <= FRAMING_LIMIT:
        got = trio.run(read_messages, encoding, body)
        assert got == [message]
    else:
        with pytest.raises(grpclib.GRPCError) as err:
            trio.run(read_messages, encoding, body)
        assert err.value.status is Status.RESOURCE_EXHAUSTED


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_declared_length_refused_before_buffering(length: int, compressed: bool) -> None:
    """A prefix declaring more than the limit is refused at once, whatever follows; one
    within it never is (RESOURCE_EXHAUSTED)."""
    body = bytes([compressed]) + length.to_bytes(4, "big") + b"\0" * 16
    encoding = "gzip" if compressed else "identity"
    status = None
    try:
        trio.run(read_messages, encoding, body)
    except grpclib.GRPCError as err:
        status = err.status
    assert (status is Status.RESOURCE_EXHAUSTED) == (length > FRAMING_LIMIT)


def test_a_gzip_bomb_is_refused_after_the_limit_only() -> None:
    """256 MiB of zeros in ~260 KB of gzip: refused once 64 KiB are out, not inflated."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * (1 << 20)
    packed = b"".join(packer.compress(block) for _ in range(256)) + packer.flush()
    body = b"\x01" + len(packed).to_bytes(4, "big") + packed
    with pytest.raises(grpclib.GRPCError) as err:
        trio.run(read_messages, "gzip", body)
    assert err.value.status is Status.RESOURCE_EXHAUSTED


# -- gRPC calls on the real application --------------------------------------------------------

SERVICE = b"/inference.GRPCInferenceService/"


def call_headers(path: bytes, content_type: bytes = b"application/grpc", timeout: bytes | None = None,
                 encoding: bytes | None = None, method: bytes = b"POST") -> bytes:
    headers = [(b":method", method), (b":scheme", b"http"), (b":path", path),
               (b":authority", b"a"), (b"content-type", content_type), (b"te", b"trailers")]
    if timeout is not None:
        headers.append((b"grpc-timeout", timeout))
    if encoding is not None:
        headers.append((b"grpc-encoding", encoding))
    return encode_headers(headers)


def prefixed(message: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(message).to_bytes(4, "big") + message


def infer_message(name: str) -> bytes:
    return bytes(pb.ModelInferRequest(model_name=name, inputs=[
        pb.ModelInferRequestInferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 2])],
        raw_input_contents=[b"\0" * 8]))


messages = st.one_of(
    st.builds(lambda name, flag: prefixed(infer_message(name), flag),
              st.sampled_from(["boom", "nope", ""]), st.sampled_from([0, 0, 1, 2])),
    st.builds(lambda enc, name: prefixed(_compress(enc, infer_message(name)), 1),
              st.sampled_from(["gzip", "deflate"]), st.sampled_from(["boom", "nope"])),
    st.builds(prefixed, st.just(b"")),
    st.builds(lambda n: n.to_bytes(5, "big"), st.integers(0, 2**40 - 1)),  # a bare prefix
)
calls = st.tuples(
    st.sampled_from([SERVICE + b"ModelInfer", SERVICE + b"ModelStreamInfer", SERVICE + b"ServerLive",
                     SERVICE + b"ModelReady", SERVICE + b"Nope", b"/x"]),
    st.sampled_from([b"application/grpc", b"application/grpc+proto", b"text/plain"]),
    st.one_of(st.none(), st.sampled_from([b"1S", b"", b"99999999H", b"5m", b"x1", b"123456789S"])),
    st.one_of(st.none(), st.sampled_from([b"gzip", b"deflate", b"br", b"identity"])),
    st.lists(messages, max_size=3),
    st.sampled_from(["end", "open", "reset"]),
)


def _conversation(spec: list[tuple[bytes, bytes, bytes | None, bytes | None, list[bytes], str]]) -> bytes:
    out = []
    for i, (path, content_type, timeout, encoding, body, ending) in enumerate(spec):
        sid = 2 * i + 1
        out.append(frame(HEADERS, END_HEADERS, sid, call_headers(path, content_type, timeout, encoding)))
        out.append(frame(DATA, END_STREAM if ending != "open" else 0, sid, b"".join(body)))
        if ending == "reset":
            out.append(frame(RST_STREAM, 0, sid, (8).to_bytes(4, "big")))
    return b"".join(out)


@settings(max_examples=200, deadline=None)
@given(st.lists(calls, min_size=1, max_size=4))
def test_grpc_calls_are_answered_without_internal_errors(
        spec: list[tuple[bytes, bytes, bytes | None, bytes | None, list[bytes], str]]) -> None:
    """Valid and invalid calls (statuses, deadlines, encodings, truncated and oversized
    messages, resets): every one answered by a status; only the planted bug of model "boom"
    reaches a boundary."""
    grpc_calls(_conversation(spec))


SEEDS: dict[str, list[bytes]] = {
    "h2_frames": [
        frame(HEADERS, END_HEADERS, 1, REQUEST_HEADERS) + frame(DATA, END_STREAM, 1, b"hello"),
        frame(HEADERS, 0, 1, REQUEST_HEADERS[:10]) + frame(CONTINUATION, END_HEADERS, 1, REQUEST_HEADERS[10:])
        + frame(DATA, END_STREAM, 1, b"x" * 100),
        frame(PING, 0, 0, b"12345678")
        + frame(SETTINGS, 0, 0, (4).to_bytes(2, "big") + (1 << 20).to_bytes(4, "big"))
        + frame(WINDOW_UPDATE, 0, 0, (1000).to_bytes(4, "big")),
        frame(HEADERS, END_HEADERS, 1, REQUEST_HEADERS) + frame(RST_STREAM, 0, 1, (8).to_bytes(4, "big"))
        + frame(PRIORITY, 0, 3, b"\0\0\0\1\x10") + frame(GOAWAY, 0, 0, b"\0" * 8),
    ],
    "hpack_block": [REQUEST_HEADERS, hpack.Encoder().encode([(":method", "POST"), (":path", "/x"),
                                                              ("te", "trailers"), ("x-custom", "v" * 50)])],
    "grpc_message_framing": [b"\0" + prefixed(b"abc") + prefixed(b""),
                             b"\1" + prefixed(_compress("gzip", b"m" * 300), 1),
                             b"\2" + prefixed(_compress("deflate", b"m" * 300), 1)],
    "grpc_calls": [
        _conversation([(SERVICE + b"ModelInfer", b"application/grpc", None, None,
                        [prefixed(infer_message("nope"))], "end")]),
        _conversation([(SERVICE + b"ModelStreamInfer", b"application/grpc", b"5S", b"gzip",
                        [prefixed(_compress("gzip", infer_message("nope")), 1),
                         prefixed(infer_message("nope"))], "end")]),
        _conversation([(SERVICE + b"ServerLive", b"application/grpc+proto", None, None,
                        [prefixed(b"")], "end"),
                       (SERVICE + b"ModelReady", b"application/grpc", None, None, [prefixed(b"\n\x01m")],
                        "reset")]),
    ],
}


def test_seeds_are_valid_inputs() -> None:
    for name, seeds in SEEDS.items():
        for seed in seeds:
            TARGETS[name](seed)

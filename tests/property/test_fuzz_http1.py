"""Fuzzing the HTTP/1.1 port's decoders: request heads, chunked bodies, and whole connections.

Each target of :data:`TARGETS` takes raw bytes and must return normally; the decoder's
documented error, :class:`http1.HttpError` (a status to answer), is caught inside. Anything
else escaping -- a ``ValueError`` from ``int()``, an ``IndexError``, httptools' own exception
types, a hang -- is a bug (the oracle shared with bench/'s long campaign):

- ``http1_head``: :func:`http1.parse_head` on the bytes, then what the server reads from a
  parsed head (path, query, a header, the response head it builds).
- ``http1_chunked``: the first byte picks a split size, the rest is fed in pieces of that
  size to a :class:`http1.ChunkedReader` with a 4 KiB limit; the body it returns stays within
  the limit and the bytes it hands back are the input's tail.
- ``http1_connection``: the bytes into one connection of a real :class:`HttpServer` (a
  socket pair, virtual clock, a small ASGI app), once followed by EOF and once with the client
  waiting for the server's deadlines; the connection must end with no exception reaching a
  boundary (``internal_errors`` stays 0) and no hang.

:data:`SEEDS` holds valid inputs per target for the campaign to mutate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import h11
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery.protocol.http import http1
from nursery.protocol.http.server import HttpServer

CHUNK_LIMIT = 4096

# -- the targets ----------------------------------------------------------------------------


def _refused(exc: http1.HttpError, statuses: tuple[int, ...]) -> None:
    """A documented refusal carries a status the server can answer."""
    assert exc.status in statuses and exc.message, exc


def http1_head(data: bytes) -> None:
    try:
        parsed = http1.parse_head(data)
    except http1.HttpError as exc:
        _refused(exc, (400, 417, 431, 501, 505))
        return
    if parsed is None:
        assert len(data) <= http1.MAX_HEAD + 4
        return
    head, used = parsed
    assert 0 < used <= len(data) and data[used - 4 : used] == b"\r\n\r\n"
    assert head.version in (b"1.0", b"1.1") and len(head.headers) <= http1.MAX_HEADERS
    assert head.content_length is None or 0 <= head.content_length < 10**http1.MAX_LENGTH_DIGITS
    assert not (head.chunked and head.content_length is not None)
    head.path, head.query, head.header(b"content-type")  # noqa: B018 - what the server reads
    http1.response_head(200, [(b"content-type", b"application/json")], 2, head.keep_alive,
                        head.version)


def http1_chunked(data: bytes) -> None:
    if not data:
        return
    split = 1 + data[0] % 64
    wire = data[1:]
    reader = http1.ChunkedReader(CHUNK_LIMIT)
    fed = 0
    try:
        for start in range(0, len(wire), split):
            fed = start + split
            if reader.feed(wire[start:fed]):
                break
    except http1.HttpError as exc:
        _refused(exc, (400, 413, 431))
        return
    assert len(reader.body) <= CHUNK_LIMIT
    if reader.done:
        assert wire[:fed].endswith(reader.leftover)


async def _answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = (await receive())["body"]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"%d" % len(body)})


async def _one_connection(data: bytes, eof: bool) -> HttpServer:
    server = HttpServer(None, _answer, max_input_size=CHUNK_LIMIT,  # type: ignore[arg-type]
                        serve_infer=False, head_timeout=5.0, body_timeout=5.0,
                        keep_alive_timeout=5.0)
    ours, theirs = trio.socket.socketpair()
    client = trio.SocketStream(theirs)
    with trio.fail_after(60):  # virtual seconds: every deadline has passed long before
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server._connection, trio.SocketStream(ours))
            sweep = trio.CancelScope()
            nursery.start_soon(server._sweep, sweep)  # it enforces the deadlines
            try:
                await client.send_all(data)
                if eof:
                    await client.send_eof()
                while await client.receive_some(65536):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            await client.aclose()
            sweep.cancel()
    return server


def http1_connection(data: bytes) -> None:
    for eof in (True, False):  # the client closes its side, or waits for the server's deadlines
        server = trio.run(_one_connection, data, eof,
                          clock=trio.testing.MockClock(autojump_threshold=0))
        assert server.internal_errors == 0 and server.open_connections == 0


TARGETS: dict[str, Callable[[bytes], None]] = {
    "http1_head": http1_head,
    "http1_chunked": http1_chunked,
    "http1_connection": http1_connection,
}

_HEAD_SEEDS = [
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nuser-agent: python/gevent-http-client-2.0.2\r\n"
    b"inference-header-content-length: 165\r\nhost: 127.0.0.1:8000\r\ncontent-length: 229\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost:8000\r\nAccept: */*\r\n\r\n",
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"Expect: 100-continue\r\n\r\n",
    b"GET http://h/metrics?x=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
]
_CHUNKED_SEEDS = [
    b"\x05" + b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT",
    b"\x01" + b'a ; n="q\\"x"\r\n0123456789\r\n0\r\n\r\n',
]
SEEDS: dict[str, list[bytes]] = {
    "http1_head": _HEAD_SEEDS,
    "http1_chunked": _CHUNKED_SEEDS,
    "http1_connection": [
        _HEAD_SEEDS[1] + _HEAD_SEEDS[1].replace(b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\nabc"),
        _HEAD_SEEDS[2].replace(b"Expect: 100-continue\r\n", b"") + _CHUNKED_SEEDS[0][1:],
    ],
}

# -- hypothesis drivers ------------------------------------------------------------------------

_TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
tokens = st.text(_TOKEN_CHARS, min_size=1, max_size=12).map(str.encode)
# field values: visible ASCII and obs-text, spaces and tabs inside but never at either end
values = st.builds(
    lambda inner: inner.strip(b" \t"),
    st.binary(max_size=24).map(lambda b: bytes(c for c in b if c in b" \t" or 0x21 <= c != 0x7F)))
paths = st.lists(st.text("abcdefghijklmnopqrstuvwxyz0123456789-._~%", max_size=8),
                 min_size=1, max_size=4).map(lambda parts: ("/" + "/".join(parts)).encode())
fields = st.lists(st.tuples(tokens.filter(lambda t: t.lower() not in (
    b"content-length", b"transfer-encoding", b"expect", b"connection", b"host", b"upgrade")),
    values), max_size=8)
ows = st.sampled_from([b"", b" ", b"\t", b"  "])


@st.composite
def well_formed_heads(draw: Any) -> tuple[bytes, bytes, bytes, list[tuple[bytes, bytes]]]:
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS"]))
    target = draw(paths) + draw(st.sampled_from([b"", b"?a=1", b"?x=y&z="]))
    headers = [(b"host", draw(st.sampled_from([b"localhost:8000", b"127.0.0.1"])))]
    headers += draw(fields)
    if draw(st.booleans()):
        headers.append((b"content-length", str(draw(st.integers(0, 10**12))).encode()))
    lines = [method + b" " + target + b" HTTP/1.1"]
    lines += [name + b":" + draw(ows) + value + draw(ows) for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n", method, target, headers


def _h11_view(raw: bytes) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    event = conn.next_event()
    assert isinstance(event, h11.Request), event
    return event.method, event.target, [(n, v) for n, v in event.headers]


@settings(max_examples=300, deadline=None)
@given(well_formed_heads())
def test_well_formed_heads_parse_as_h11_parses_them(case: Any) -> None:
    """A differential check: on well-formed heads, llhttp (through http1) and h11 agree on
    the method, the target and every field (names lower-cased, values without OWS)."""
    raw, method, target, headers = case
    head, used = http1.parse_head(raw)  # type: ignore[misc]
    assert used == len(raw)
    assert (head.method, head.target, head.headers) == _h11_view(raw)
    assert (head.method, head.target, head.headers) == (
        method, target, [(name.lower(), value) for name, value in headers])


@settings(max_examples=300, deadline=None)
@given(well_formed_heads(), st.data())
def test_mutated_heads_parse_or_refuse(case: Any, data: st.DataObject) -> None:
    raw = bytearray(case[0])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "repeat"]))
        if op == "flip":
            raw[at] = data.draw(st.integers(0, 255))
        elif op == "insert":
            raw[at:at] = data.draw(st.sampled_from(
                [b" ", b"\t", b"\r", b"\n", b"\r\n", b":", b"\x00", b"\x7f", b"\xff", b"9" * 30,
                 b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n", b" " * 3000]))
        elif op == "delete":
            del raw[at : at + data.draw(st.integers(1, 8))]
        else:
            raw[at:at] = raw[at : at + 16] * data.draw(st.integers(2, 50))
    http1_head(bytes(raw))


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_heads(data: bytes) -> None:
    http1_head(data)


chunks = st.lists(st.binary(max_size=40), max_size=6)
chunk_exts = st.sampled_from([b"", b";a", b" ; a = b", b';n="v\\"q"', b";"])


@settings(max_examples=500, deadline=None)
@given(chunks, chunk_exts, st.integers(1, 9), st.data())
def test_chunked_round_trip_and_mutations(parts: list[bytes], ext: bytes, split: int,
                                          data: st.DataObject) -> None:
    wire = b"".join(b"%x" % len(p) + ext + b"\r\n" + p + b"\r\n" for p in parts if p)
    wire += b"0\r\nA: b\r\n\r\nREST"
    if ext != b";":  # the only malformed extension here
        reader = http1.ChunkedReader(CHUNK_LIMIT)
        fed = 0
        while not reader.feed(wire[fed : fed + split]):
            fed += split
        assert bytes(reader.body) == b"".join(parts)
        assert reader.leftover + wire[fed + split :] == b"REST"
    mutated = bytearray(wire)
    at = data.draw(st.integers(0, len(mutated) - 1))
    mutated[at:at] = data.draw(st.sampled_from([b"f" * 20, b"\r\n", b"x", b"-", b"0x"]))
    http1_chunked(bytes([split]) + bytes(mutated))


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_chunked_bodies(data: bytes) -> None:
    http1_chunked(data)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(_HEAD_SEEDS + [b"abc", b"\r\n", b"0\r\n\r\n", b"5\r\nhello\r\n",
                                            b"Content-Length: 99999999999999999999\r\n"]),
             max_size=5).map(b"".join),
))
def test_connections_end_cleanly(data: bytes) -> None:
    http1_connection(data)


def test_seeds_pass() -> None:
    for name, seeds in SEEDS.items():
        for seed in seeds:
            TARGETS[name](seed)

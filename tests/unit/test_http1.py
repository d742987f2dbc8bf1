"""The sans-IO HTTP/1.1 layer: heads, chunked bodies, response heads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nursery.protocol import http1


def test_parse_simple_head() -> None:
    raw = (b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
           b"Inference-Header-Content-Length: 3\r\n\r\nhello")
    head, used = http1.parse_head(raw)  # type: ignore[misc]
    assert raw[used:] == b"hello"
    assert head.method == b"POST" and head.path == b"/v2/models/m/infer" and head.query == b"x=1"
    assert head.content_length == 5 and head.keep_alive and not head.chunked
    assert head.header(b"inference-header-content-length") == b"3"


def test_incomplete_head_waits() -> None:
    assert http1.parse_head(b"GET / HTTP/1.1\r\nHost: a\r\n") is None


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nExpect: something\r\n\r\n", 417),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (70 * 1024) + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (70 * 1024), 431),
    ],
)
def test_malformed_heads(raw: bytes, status: int) -> None:
    with pytest.raises(http1.HttpError) as err:
        http1.parse_head(raw)
    assert err.value.status == status


def test_keep_alive_rules() -> None:
    def ka(raw: bytes) -> bool:
        return http1.parse_head(raw)[0].keep_alive  # type: ignore[index]

    assert ka(b"GET / HTTP/1.1\r\n\r\n")
    assert not ka(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert not ka(b"GET / HTTP/1.0\r\n\r\n")
    assert ka(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")


def test_chunked_body() -> None:
    reader = http1.ChunkedReader(limit=100)
    assert not reader.feed(b"5\r\nhel")
    assert not reader.feed(b"lo\r\n6;ext=1\r\n world\r\n")
    assert reader.feed(b"0\r\nTrailer: x\r\n\r\nNEXT")
    assert bytes(reader.body) == b"hello world"
    assert reader.leftover == b"NEXT"


def test_chunked_limits_and_errors() -> None:
    with pytest.raises(http1.HttpError) as err:
        http1.ChunkedReader(limit=4).feed(b"5\r\nhello\r\n0\r\n\r\n")
    assert err.value.status == 413
    with pytest.raises(http1.HttpError):
        http1.ChunkedReader(limit=100).feed(b"zz\r\n")
    with pytest.raises(http1.HttpError):
        http1.ChunkedReader(limit=100).feed(b"2\r\nabXX")


@given(st.lists(st.binary(min_size=1, max_size=30), max_size=6), st.integers(1, 7))
def test_chunked_round_trip(chunks: list[bytes], split: int) -> None:
    wire = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    reader = http1.ChunkedReader(limit=10_000)
    done = False
    for i in range(0, len(wire), split):
        done = reader.feed(wire[i : i + split])
    assert done and bytes(reader.body) == b"".join(chunks)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(raw: bytes) -> None:
    try:
        http1.parse_head(raw)
    except http1.HttpError:
        pass


def test_response_head() -> None:
    head = http1.response_head(200, [(b"content-type", b"application/json")], 10, True)
    assert head == b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n"
    head = http1.response_head(404, [], 0, False)
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n") and b"connection: close" in head

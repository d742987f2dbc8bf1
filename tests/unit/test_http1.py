"""The sans-IO HTTP/1.1 layer: heads, chunked bodies, response heads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nursery.protocol.http import http1


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
        # chunked not last: the length cannot be known, RFC 9112 6.1 says 400
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"GET / HTTP/1.1\r\nExpect: something\r\n\r\n", 417),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (70 * 1024) + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (70 * 1024), 431),
        (b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * (http1.MAX_HEADERS + 1) + b"\r\n", 431),
        (b"GET / HTTP/1.2\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
        (b"CONNECT a:443 HTTP/1.1\r\n\r\n", 501),
        (b"GET  / HTTP/1.1\r\n\r\n", 400),  # one space between the parts, not two
        (b"GET /  HTTP/1.1\r\n\r\n", 400),
        (b"GET a:80 HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nA : b\r\n\r\n", 400),  # no space before the colon
        (b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 400),  # no obs-fold
        (b"GET / HTTP/1.1\r\nA: b\x01c\r\n\r\n", 400),  # no control characters
        (b"GET / HTTP/1.1\r\nA: b\nB: c\r\n\r\n", 400),  # no bare LF
        (b"GET / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n", 400),  # 20 digits
    ],
)
def test_malformed_heads(raw: bytes, status: int) -> None:
    with pytest.raises(http1.HttpError) as err:
        http1.parse_head(raw)
    assert err.value.status == status


def test_thousands_digit_content_length_is_400() -> None:
    raw = b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: " + b"9" * 4000 + b"\r\n\r\n"
    with pytest.raises(http1.HttpError) as err:
        http1.parse_head(raw)
    assert err.value.status == 400 and "Content-Length" in err.value.message


def test_nineteen_digits_is_the_longest_content_length() -> None:
    head, _ = http1.parse_head(b"POST / HTTP/1.1\r\nContent-Length: 0000000000000000005\r\n\r\n")  # type: ignore[misc]
    assert head.content_length == 5


@pytest.mark.parametrize("spaces", [30_000, 60_000])
def test_long_run_of_spaces_in_a_value_parses(spaces: int) -> None:
    """Issue 21: the regex parser backtracked quadratically on this (minutes at 60,000)."""
    raw = b"GET / HTTP/1.1\r\nx: a" + b" " * spaces + b"b\r\n\r\n"
    head, used = http1.parse_head(raw)  # type: ignore[misc]
    assert used == len(raw) and head.header(b"x") == b"a" + b" " * spaces + b"b"


def test_long_run_of_spaces_at_a_values_end_fails_fast() -> None:
    raw = b"GET / HTTP/1.1\r\nx: a" + b" " * 60_000 + b"\x01\r\n\r\n"
    with pytest.raises(http1.HttpError) as err:
        http1.parse_head(raw)
    assert err.value.status == 400


def test_values_are_stripped_and_names_lowered() -> None:
    head, _ = http1.parse_head(b"GET / HTTP/1.1\r\nX-Thing: \t v a \t\r\nEXPECT:\r\n\r\n")  # type: ignore[misc]
    assert head.headers == [(b"x-thing", b"v a"), (b"expect", b"")]
    assert not head.expect_continue  # an empty Expect asks for nothing


def test_forwardable_values_keep_their_trailing_whitespace() -> None:
    """What --http-header-forward-pattern forwards is the value as sent, trailing whitespace
    included (Triton's parser keeps it); the protocol itself reads the trimmed value."""
    raw = b"GET / HTTP/1.1\r\nA: x \r\nB: y\r\nC: \tz\t \r\n\r\n"
    head, _ = http1.parse_head(raw)  # type: ignore[misc]
    assert head.headers == [(b"a", b"x"), (b"b", b"y"), (b"c", b"z")]
    assert head.forwardable() == [(b"a", b"x "), (b"b", b"y"), (b"c", b"z\t ")]
    plain, _ = http1.parse_head(b"GET / HTTP/1.1\r\nB: y\r\n\r\n")  # type: ignore[misc]
    assert plain.forwardable() is plain.headers  # nothing copied when nothing was trimmed


def test_leading_empty_lines_are_skipped() -> None:
    raw = b"\r\n\r\nGET /x HTTP/1.1\r\n\r\nNEXT"
    head, used = http1.parse_head(raw)  # type: ignore[misc]
    assert head.path == b"/x" and raw[used:] == b"NEXT"
    assert http1.parse_head(b"\r\n\r\n") is None


def test_absolute_form_keeps_the_path() -> None:
    head, _ = http1.parse_head(b"GET http://h:8000/v2/health/ready?a=b HTTP/1.1\r\n\r\n")  # type: ignore[misc]
    assert head.target == b"/v2/health/ready?a=b"


def test_search_resumes_where_it_stopped() -> None:
    raw = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
    for cut in range(1, len(raw)):
        assert http1.parse_head(raw[:cut]) is None
        head, used = http1.parse_head(raw, cut)  # type: ignore[misc]
        assert used == len(raw) and head.header(b"host") == b"a"


def test_upgrade_is_ignored() -> None:
    head, _ = http1.parse_head(b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n")  # type: ignore[misc]
    assert head.method == b"GET" and head.keep_alive


def test_keep_alive_rules() -> None:
    def ka(raw: bytes) -> bool:
        return http1.parse_head(raw)[0].keep_alive  # type: ignore[index]

    assert ka(b"GET / HTTP/1.1\r\n\r\n")
    assert not ka(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert not ka(b"GET / HTTP/1.0\r\n\r\n")
    assert ka(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert not ka(b"GET / HTTP/1.1\r\nConnection: Upgrade, Close\r\n\r\n")
    assert ka(b"GET / HTTP/1.1\r\nConnection: closed\r\n\r\n")  # a token, not a substring
    assert not ka(b"POST / HTTP/1.1\r\nConnection: close\r\nContent-Length: 3\r\n\r\n")
    assert ka(b"POST / HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\n")


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


@pytest.mark.parametrize(
    "wire",
    [
        b"0x5\r\nhello\r\n0\r\n\r\n",  # int(x, 16) took these; the grammar has HEXDIG only
        b"+5\r\nhello\r\n0\r\n\r\n",
        b"-5\r\nhello\r\n0\r\n\r\n",
        b"5_0\r\n",
        b" 5\r\nhello\r\n0\r\n\r\n",
        b"5 \r\nhello\r\n0\r\n\r\n",
        b"\r\n",
        b"5;\r\nhello\r\n0\r\n\r\n",  # an extension needs a name
        b"5;a=\"x\r\nhello\r\n0\r\n\r\n",  # an unterminated quoted value
        b"1" * 17 + b"\r\n",  # more than 16 hex digits
        b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",
        b"5\r\nhello\r\n0\r\nA: b\x00\r\n\r\n",
    ],
)
def test_chunk_grammar_is_strict(wire: bytes) -> None:
    with pytest.raises(http1.HttpError) as err:
        http1.ChunkedReader(limit=1000).feed(wire)
    assert err.value.status == 400


def test_chunk_extensions_and_trailers_are_accepted() -> None:
    reader = http1.ChunkedReader(limit=100)
    assert reader.feed(b'5 ; a = b ;c="q\\"t"\r\nhello\r\n000\r\nA: b\r\nC:d\r\n\r\n')
    assert bytes(reader.body) == b"hello"


def test_chunk_size_over_the_limit_is_refused_before_its_data() -> None:
    with pytest.raises(http1.HttpError) as err:
        http1.ChunkedReader(limit=1 << 20).feed(b"f" * 16 + b"\r\n")
    assert err.value.status == 413


def test_chunk_lines_and_trailers_are_bounded() -> None:
    with pytest.raises(http1.HttpError) as err:  # a size line that never ends
        http1.ChunkedReader(limit=100).feed(b"5;a=" + b"b" * (http1.MAX_CHUNK_LINE + 10))
    assert err.value.status == 400
    reader = http1.ChunkedReader(limit=100)  # a long line that did end is bounded all the same
    with pytest.raises(http1.HttpError):
        reader.feed(b"5;a=" + b"b" * (http1.MAX_CHUNK_LINE + 10) + b"\r\n")
    trailers = b"".join(b"T%d: v\r\n" % i for i in range(http1.MAX_TRAILERS + 1))
    with pytest.raises(http1.HttpError) as err:
        http1.ChunkedReader(limit=100).feed(b"0\r\n" + trailers + b"\r\n")
    assert err.value.status == 431


def test_field_line_grammar() -> None:
    assert http1.field_line_ok(b"A: b")
    assert http1.field_line_ok(b"A:")
    assert not http1.field_line_ok(b"A b")
    assert not http1.field_line_ok(b" A: b")
    assert not http1.field_line_ok(b"A: \x7f")


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


def test_transfer_encoding_wins_over_content_length_and_the_connection_closes() -> None:
    """RFC 9112 6.1, and Triton's server accepts such a request: the body is read as chunked,
    and the connection is not kept alive after the answer (no smuggling of a next request)."""
    parsed = http1.parse_head(
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n")
    assert parsed is not None
    head, _ = parsed
    assert head.chunked and head.content_length is None and not head.keep_alive

"""HTTP/1.1 on the wire, sans I/O: parse request heads and bodies, build response heads.

Just what an inference server needs, strictly: request line and headers (RFC 9112),
``Content-Length`` and ``chunked`` bodies, keep-alive, ``Expect: 100-continue``. Anything
malformed raises :class:`HttpError` with the status to answer before closing the connection;
nothing else escapes (the fuzz targets in ``tests/property/test_fuzz_http1.py`` hold it to that).
Pure functions and small classes: the server in ``server.py`` does the I/O.

Why llhttp (through ``httptools``) parses the head. The head parser this module had was a
regular expression per header line whose lazy value group backtracked quadratically: one header
of a letter, 30,000 spaces and a letter took seconds of the server's only thread. The house rule
is a well-kept, fuzzed parser where one exists, unless it costs more than 5% of a request.
llhttp (Node.js's parser, generated from a declared grammar and fuzzed upstream) is linear by
construction (a state machine over the bytes) and strict by default: token methods and field
names, no control characters, no obs-fold, no bare LF, Content-Length digits only with overflow
and duplicates refused, Transfer-Encoding with Content-Length refused.

``python bench/http_parse.py`` on the 2-core machine (2026-11-24, µs per head, best of 7
interleaved rounds; the server spends about 200-300 µs of CPU per inference request at 2-5k
requests/s):

    head                                    regex (old)   httptools   linear hand parser
    tritonclient POST /v2/models/mlp/infer      5.6          4.1            5.0
    perf_analyzer POST /v2/models/mlp/infer     6.0          4.3            5.6
    curl GET /v2/health/ready                   4.2          3.6            4.0
    "x: a" + 2,000 spaces + "b"              15,500          7             13
    "x: a" + 30,000 spaces + "b"          2,546,000         52            161

httptools is the cheapest of the three (under 2% of a request's CPU, and less than the
parser it replaces), so it parses every head here; the linear hand parser lives in the
benchmark only. A raw-socket A/B of the whole server (keep-alive add_sub inferences,
alternating rounds) put its CPU per request at or below the old server's.

Around llhttp this module adds only what it leaves to the application: the head is found and
bounded first (``MAX_HEAD`` bytes, ``MAX_HEADERS`` fields: 431), the request line must be
single-spaced, Content-Length is at most ``MAX_LENGTH_DIGITS`` digits, only HTTP/1.0 and 1.1
are served (505), a transfer coding other than ``chunked`` is 501, and ``Expect`` other than
``100-continue`` is 417. Chunked bodies are read by :class:`ChunkedReader` (llhttp cannot say
where a message ends inside a buffer, which pipelining needs): hex sizes of at most 16 digits,
bounded size lines, trailer lines and trailer count, every line a strict field line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httptools

MAX_HEAD = 64 * 1024  # request line + headers
MAX_HEADERS = 128
MAX_LENGTH_DIGITS = 19  # Content-Length: 10**19 bytes is beyond anything a limit allows
MAX_CHUNK_LINE = 4096  # a chunk-size line with its extensions, or one trailer field line
MAX_TRAILERS = 32
MAX_CHUNK_DIGITS = 16

REASONS = {
    100: b"Continue", 200: b"OK", 400: b"Bad Request", 401: b"Unauthorized",
    403: b"Forbidden", 404: b"Not Found", 422: b"Unprocessable Content",
    429: b"Too Many Requests",
    405: b"Method Not Allowed", 408: b"Request Timeout", 411: b"Length Required",
    417: b"Expectation Failed",
    413: b"Content Too Large", 431: b"Request Header Fields Too Large",
    500: b"Internal Server Error", 501: b"Not Implemented", 503: b"Service Unavailable",
    505: b"HTTP Version Not Supported",
}

_LEADING_CRLF = re.compile(rb"(?:\r\n)*")
# A field line (trailers): token ":" OWS value OWS, no control characters but HTAB. The
# three pieces are checked apart (partition, strip, one character class): linear by design.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE_CHAR = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# chunk-size [ chunk-ext ], RFC 9112 7.1.1: every repetition starts with its own delimiter
# (";" then "="), so the match cannot backtrack; lines are bounded before they reach it.
_TCHARS = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_QUOTED = rb'"(?:[^"\\\x00-\x08\x0a-\x1f\x7f]|\\[\t\x20-\x7e\x80-\xff])*"'
_CHUNK_LINE = re.compile(
    rb"([0-9A-Fa-f]{1,%d})" % MAX_CHUNK_DIGITS
    + rb"(?:[ \t]*;[ \t]*" + _TCHARS + rb"+(?:[ \t]*=[ \t]*(?:" + _TCHARS + rb"+|" + _QUOTED + rb"))?)*"
)


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class RequestHead:
    method: bytes
    target: bytes  # as sent: path and query, percent-encoded
    version: bytes  # b"1.1" or b"1.0"
    headers: list[tuple[bytes, bytes]]  # names lower-cased, values stripped
    content_length: int | None
    chunked: bool
    keep_alive: bool
    expect_continue: bool
    # header index -> its value as sent, for the few values with trailing whitespace (what
    # --http-header-forward-pattern forwards: Triton's parser keeps that whitespace)
    untrimmed: dict[int, bytes] | None = None

    def forwardable(self) -> list[tuple[bytes, bytes]]:
        """The headers with their values as sent (trailing whitespace kept)."""
        if not self.untrimmed:
            return self.headers
        return [(k, self.untrimmed.get(i, v)) for i, (k, v) in enumerate(self.headers)]

    @property
    def path(self) -> bytes:
        q = self.target.find(b"?")
        return self.target if q < 0 else self.target[:q]

    @property
    def query(self) -> bytes:
        q = self.target.find(b"?")
        return b"" if q < 0 else self.target[q + 1 :]

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


class _Fields:
    """llhttp's callbacks for one head: the request target and the header fields."""

    __slots__ = ("url", "headers", "untrimmed")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.untrimmed: dict[int, bytes] | None = None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # llhttp drops the leading OWS of a value and keeps the trailing one
        trimmed = value.rstrip(b" \t")
        if len(trimmed) != len(value):
            if self.untrimmed is None:
                self.untrimmed = {}
            self.untrimmed[len(self.headers)] = value
        self.headers.append((name.lower(), trimmed))


def head_end(buf: bytes | bytearray, search_from: int = 0) -> int:
    """The offset just past the head's final empty line, or -1 while it is not complete.

    ``search_from`` is where an earlier call on the same growing buffer stopped looking (its
    length then): each byte is searched once however the head is split across reads.
    """
    end = buf.find(b"\r\n\r\n", max(search_from - 3, 0))
    if end < 0:
        if len(buf) > MAX_HEAD:
            raise HttpError(431, "request head too large")
        return -1
    if end > MAX_HEAD:
        raise HttpError(431, "request head too large")
    return end + 4


def parse_head(buf: bytes | bytearray, search_from: int = 0) -> tuple[RequestHead, int] | None:
    """Parse a request head from the start of ``buf``.

    Returns ``(head, bytes consumed)``, or None when the head is not complete yet. Empty lines
    before the request line are skipped (RFC 9112 2.2); they count towards ``MAX_HEAD``.
    """
    start = _LEADING_CRLF.match(buf).end()  # type: ignore[union-attr]  # matches always
    end = head_end(buf, max(search_from, start))
    if end < 0:
        return None
    raw = bytes(buf[start:end])
    if raw.count(b"\r\n") > MAX_HEADERS + 2:  # request line, fields, final empty line
        raise HttpError(431, "too many request headers")
    fields = _Fields()
    parser = httptools.HttpRequestParser(fields)
    # a head with both Transfer-Encoding and Content-Length is read by the transfer coding
    # alone and its connection closes after the answer (RFC 9112 6.1), as Triton's server
    # accepts such requests (L0_http's test_content_encoding_chunked_manually sends one)
    parser.set_dangerous_leniencies(lenient_chunked_length=True)
    try:
        parser.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass  # Upgrade / CONNECT: the head is complete; Upgrade is ignored (RFC 9110 7.8)
    except httptools.HttpParserError as exc:
        raise HttpError(400, f"malformed request: {exc}") from None
    method = parser.get_method()
    if method == b"CONNECT":
        raise HttpError(501, "CONNECT is not supported")
    version = parser.get_http_version()
    if version == "1.1":
        version_bytes = b"1.1"
    elif version == "1.0":
        version_bytes = b"1.0"
    else:
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are supported")
    target = fields.url
    # llhttp tolerates runs of spaces between the parts of the request line; RFC 9112 3 has one
    after_method = len(method) + 1
    if not (target and raw.startswith(target, after_method)
            and raw.startswith(b" HTTP/", after_method + len(target))):
        raise HttpError(400, "malformed request line")
    if target[:1] != b"/" and target != b"*":  # absolute form: keep the path
        scheme_end = target.find(b"://")
        if scheme_end <= 0:
            raise HttpError(400, "malformed request target")
        slash = target.find(b"/", scheme_end + 3)
        target = target[slash:] if slash >= 0 else b"/"
    content_length: int | None = None
    chunked = False
    expect = False
    keep_alive = version_bytes == b"1.1"
    close = False
    for name, value in fields.headers:
        if name == b"content-length":
            # llhttp checked the digits, a single header and no overflow past 2**64
            if len(value) > MAX_LENGTH_DIGITS:
                raise HttpError(400, "invalid Content-Length")
            content_length = int(value)
        elif name == b"transfer-encoding":
            codings = [c.strip(b" \t").lower() for c in value.split(b",")]
            if codings[-1] != b"chunked":  # the length cannot be known: RFC 9112 6.1 says 400
                raise HttpError(400, "malformed request: chunked is not the final coding")
            if any(c not in (b"chunked", b"identity") for c in codings):
                raise HttpError(501, "unsupported Transfer-Encoding")
            chunked = True
        elif name == b"connection":
            # (llhttp's should_keep_alive() forgets the header once a message without a body
            # is complete, so the tokens are read here)
            tokens = [t.strip(b" \t").lower() for t in value.split(b",")]
            close = close or b"close" in tokens
            keep_alive = not close and (keep_alive or b"keep-alive" in tokens)
        elif name == b"expect" and value:  # an empty list of expectations asks nothing
            if value.lower() != b"100-continue":
                raise HttpError(417, "unsupported Expect header")
            expect = True
    if chunked and content_length is not None:  # RFC 9112 6.1: the coding wins, then close
        content_length = None
        keep_alive = False
    head = RequestHead(method, target, version_bytes, fields.headers, content_length, chunked,
                       keep_alive, expect, fields.untrimmed)
    return head, end


def field_line_ok(line: bytes) -> bool:
    """True when ``line`` is ``field-name ":" OWS field-value OWS`` (RFC 9112 5), checked in
    linear time."""
    name, colon, value = line.partition(b":")
    return (bool(colon) and _TOKEN.fullmatch(name) is not None
            and _BAD_VALUE_CHAR.search(value) is None)


# Triton's cap on the chunks of one chunked body (kMaxChunkedChunks, http_server.cc): each
# chunk is a separate buffer there, and a body of a million one-byte chunks costs memory
# out of all proportion to its size; empty chunks are not counted
MAX_CHUNKS = 1 << 16
TOO_MANY_CHUNKS = (f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty chunks. "
                   "Send fewer or larger HTTP chunks.")


class ChunkedReader:
    """Decodes a chunked body fed in pieces; ``feed`` returns True once the body is complete.

    Every size is checked against ``limit`` before its data is taken; a size line, a trailer
    line and the trailer section are bounded (``MAX_CHUNK_LINE``, ``MAX_TRAILERS``), so the
    reader holds at most ``limit`` bytes of body plus one bounded line whatever it is fed.
    More than ``MAX_CHUNKS`` non-empty chunks: 400 with Triton's message.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.body = bytearray()
        self._buf = bytearray()
        self._need = -1  # bytes of chunk data still to take; -1 = expecting a size line
        self._trailers = -1  # trailer lines seen; -1 = not in the trailer section yet
        self.chunks = 0  # non-empty chunks taken
        self.done = False
        self.leftover = b""

    def feed(self, data: bytes | bytearray) -> bool:
        buf = self._buf
        buf += data
        while not self.done:
            if self._trailers >= 0:
                line = self._line()
                if line is None:
                    return False
                if not line:
                    self.done = True
                    self.leftover = bytes(buf)
                    buf.clear()
                    break
                self._trailers += 1
                if self._trailers > MAX_TRAILERS:
                    raise HttpError(431, "too many trailer fields")
                if not field_line_ok(line):
                    raise HttpError(400, "malformed trailer field")
                continue
            if self._need < 0:
                line = self._line()
                if line is None:
                    return False
                match = _CHUNK_LINE.fullmatch(line)
                if match is None:
                    raise HttpError(400, "malformed chunk size line")
                size = int(match.group(1), 16)
                if size == 0:
                    self._trailers = 0
                    continue
                if len(self.body) + size > self.limit:
                    raise HttpError(413, "request body too large")
                self.chunks += 1
                if self.chunks > MAX_CHUNKS:
                    raise HttpError(400, TOO_MANY_CHUNKS)
                self._need = size
            if len(buf) < self._need + 2:
                return False
            if buf[self._need : self._need + 2] != b"\r\n":
                raise HttpError(400, "malformed chunk: data not followed by CRLF")
            self.body += buf[: self._need]
            del buf[: self._need + 2]
            self._need = -1
        return True

    def _line(self) -> bytes | None:
        """The next CRLF-terminated line (taken from the buffer), None while incomplete."""
        buf = self._buf
        end = buf.find(b"\r\n", 0, MAX_CHUNK_LINE + 2)
        if end < 0:
            if len(buf) > MAX_CHUNK_LINE:
                raise HttpError(400, "chunk size or trailer line too long")
            return None
        line = bytes(buf[:end])
        del buf[: end + 2]
        return line


def response_head(status: int, headers: list[tuple[bytes, bytes]], length: int,
                  keep_alive: bool, version: bytes = b"1.1") -> bytes:
    parts = [b"HTTP/1.1 ", str(status).encode(), b" ", REASONS.get(status, b"Unknown"), b"\r\n"]
    for name, value in headers:
        parts += [name, b": ", value, b"\r\n"]
    parts += [b"content-length: ", str(length).encode(), b"\r\n"]
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    elif version == b"1.0":
        parts.append(b"connection: keep-alive\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def stream_head(status: int, headers: list[tuple[bytes, bytes]], keep_alive: bool,
                version: bytes = b"1.1") -> bytes:
    """The head of a response whose length is not known in advance: chunked on HTTP/1.1,
    delimited by the connection's close on HTTP/1.0."""
    parts = [b"HTTP/1.1 ", str(status).encode(), b" ", REASONS.get(status, b"Unknown"), b"\r\n"]
    for name, value in headers:
        parts += [name, b": ", value, b"\r\n"]
    if version == b"1.0":
        parts.append(b"connection: close\r\n")
    else:
        parts.append(b"transfer-encoding: chunked\r\n")
        if not keep_alive:
            parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (never empty: the empty chunk ends the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"

"""HTTP/1.1 on the wire, sans I/O: parse request heads and bodies, build response heads.

Just what an inference server needs, strictly: request line and headers (RFC 9112),
``Content-Length`` and ``chunked`` bodies, keep-alive, ``Expect: 100-continue``. Anything
malformed raises :class:`HttpError` with the status to answer before closing the connection.
Pure functions and small classes: the server in ``http_server.py`` does the I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_HEAD = 64 * 1024  # request line + headers
MAX_HEADERS = 128

REASONS = {
    100: b"Continue", 200: b"OK", 400: b"Bad Request", 403: b"Forbidden", 404: b"Not Found",
    405: b"Method Not Allowed", 408: b"Request Timeout", 411: b"Length Required",
    417: b"Expectation Failed",
    413: b"Content Too Large", 431: b"Request Header Fields Too Large",
    500: b"Internal Server Error", 501: b"Not Implemented", 503: b"Service Unavailable",
    505: b"HTTP Version Not Supported",
}
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# field-name ":" OWS field-value OWS (no obs-fold, no control characters in the value)
_HEADER = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*\Z")


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


def parse_head(buf: bytes | bytearray) -> tuple[RequestHead, int] | None:
    """Parse a request head from the start of ``buf``.

    Returns ``(head, bytes consumed)``, or None when the head is not complete yet.
    """
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD:
            raise HttpError(431, "request head too large")
        # tolerate leading empty lines (RFC 9112 2.2) without waiting forever on them
        return None
    if end > MAX_HEAD:
        raise HttpError(431, "request head too large")
    start = 0
    while buf.startswith(b"\r\n", start):
        start += 2
    lines = bytes(buf[start:end]).split(b"\r\n")
    request_line = lines[0]
    parts = request_line.split(b" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, proto = parts
    if not method or any(c not in _TOKEN for c in method):
        raise HttpError(400, "malformed request method")
    if not target or target[0:1] not in (b"/", b"*") and not target.startswith(b"http"):
        raise HttpError(400, "malformed request target")
    if proto == b"HTTP/1.1":
        version = b"1.1"
    elif proto == b"HTTP/1.0":
        version = b"1.0"
    elif proto.startswith(b"HTTP/"):
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are supported")
    else:
        raise HttpError(400, "malformed request line")
    if target.startswith(b"http"):  # absolute form: keep the path
        slash = target.find(b"/", target.find(b"//") + 2)
        target = target[slash:] if slash >= 0 else b"/"
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, "too many request headers")
    headers: list[tuple[bytes, bytes]] = []
    content_length: int | None = None
    chunked = False
    connection = b""
    expect = False
    for line in lines[1:]:
        m = _HEADER.match(line)
        if m is None:
            raise HttpError(400, "malformed request header")
        name = m.group(1).lower()
        value = m.group(2)
        if name == b"content-length":
            if not value.isdigit() or (content_length is not None and int(value) != content_length):
                raise HttpError(400, "invalid Content-Length")
            content_length = int(value)
        elif name == b"transfer-encoding":
            codings = [c.strip().lower() for c in value.split(b",")]
            if codings[-1:] != [b"chunked"] or any(c not in (b"chunked", b"identity") for c in codings):
                raise HttpError(501, "unsupported Transfer-Encoding")
            chunked = True
        elif name == b"connection":
            connection = value.lower()
        elif name == b"expect":
            if value.lower() != b"100-continue":
                raise HttpError(417, "unsupported Expect header")
            expect = True
        headers.append((name, value))
    if chunked and content_length is not None:
        raise HttpError(400, "both Content-Length and Transfer-Encoding given")
    if version == b"1.1":
        keep_alive = b"close" not in connection
    else:
        keep_alive = b"keep-alive" in connection
    head = RequestHead(method, target, version, headers, content_length, chunked, keep_alive,
                       expect)
    return head, end + 4


class ChunkedReader:
    """Decodes a chunked body fed in pieces; ``feed`` returns True once the body is complete."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.body = bytearray()
        self._buf = bytearray()
        self._need = -1  # bytes of chunk data still to take; -1 = expecting a size line
        self._trailers = False
        self.done = False
        self.leftover = b""

    def feed(self, data: bytes | bytearray) -> bool:
        buf = self._buf
        buf += data
        while not self.done:
            if self._trailers:
                end = buf.find(b"\r\n")
                if end < 0:
                    return self._check_buffer()
                line = bytes(buf[:end])
                del buf[: end + 2]
                if not line:
                    self.done = True
                    self.leftover = bytes(buf)
                    buf.clear()
                continue
            if self._need < 0:
                end = buf.find(b"\r\n")
                if end < 0:
                    return self._check_buffer()
                size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[: end + 2]
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise HttpError(400, "malformed chunk size") from None
                if size < 0:
                    raise HttpError(400, "malformed chunk size")
                if size == 0:
                    self._trailers = True
                    continue
                if len(self.body) + size > self.limit:
                    raise HttpError(413, "request body too large")
                self._need = size
            if len(buf) < self._need + 2:
                return False
            if buf[self._need : self._need + 2] != b"\r\n":
                raise HttpError(400, "malformed chunk")
            self.body += buf[: self._need]
            del buf[: self._need + 2]
            self._need = -1
        return True

    def _check_buffer(self) -> bool:
        if len(self._buf) > 4096:
            raise HttpError(400, "malformed chunked body")
        return False


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

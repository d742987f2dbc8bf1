#!/usr/bin/env python3
"""What parsing one HTTP/1.1 request head costs: the regex parser nursery had, llhttp through
``httptools`` (what ``nursery/protocol/http/http1.py`` uses now) and a linear hand parser.

    python bench/http_parse.py [--n 20000] [--repeat 7]

Prints µs per head (best of ``--repeat`` runs of ``--n`` parses) for the heads that real
clients send to the inference port (tritonclient's and perf_analyzer's POST .../infer, a GET),
then the time of one parse of the hostile head of issue 21 (a header of a letter, N spaces and
a letter), which grows with N squared for the regex parser. Compare with the server's CPU per
inference request, about 200-300 µs on the 2-core machine at 2-5k requests/s: the head parser
is chosen in ``http1.py``'s docstring from these figures. In-process, a few seconds.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's nursery

from nursery.protocol.http import http1
from nursery.protocol.http.http1 import HttpError, RequestHead  # noqa: E402

# as captured from tritonclient.http 2.x (geventhttpclient), binary tensors, MLP 1x16 FP32
TRITONCLIENT_POST = (
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nuser-agent: python/gevent-http-client-2.0.2\r\n"
    b"inference-header-content-length: 165\r\nhost: 127.0.0.1:8000\r\n"
    b"content-length: 229\r\n\r\n"
)
# perf_analyzer's C++ HTTP client (libcurl): curl's default headers and the ones it adds
# (its "Expect:" removes curl's 100-continue header rather than sending an empty one)
PERF_ANALYZER_POST = (
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: localhost:8000\r\nAccept: */*\r\n"
    b"Inference-Header-Content-Length: 171\r\n"
    b"Content-Type: application/octet-stream\r\nContent-Length: 235\r\n\r\n"
)
CURL_GET = (
    b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost:8000\r\nUser-Agent: curl/7.88.1\r\n"
    b"Accept: */*\r\n\r\n"
)
HEADS = {
    "tritonclient POST .../mlp/infer": TRITONCLIENT_POST,
    "perf_analyzer POST .../mlp/infer": PERF_ANALYZER_POST,
    "curl GET /v2/health/ready": CURL_GET,
}


# ---- the parser nursery had until issue 21 (kept here only to measure it) -----------------

_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_HEADER = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*\Z")


def regex_parse_head(buf: bytes | bytearray) -> tuple[RequestHead, int] | None:
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > http1.MAX_HEAD:
            raise HttpError(431, "request head too large")
        # tolerate leading empty lines (RFC 9112 2.2) without waiting forever on them
        return None
    if end > http1.MAX_HEAD:
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
    if len(lines) - 1 > http1.MAX_HEADERS:
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


# ---- a linear hand parser: partition, strip and character classes, no nested repetition ---

_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([^\x00-\x20\x7f]+) HTTP/1\.([01])")


def hand_parse_head(buf: bytes) -> tuple[RequestHead, int] | None:
    start = http1._LEADING_CRLF.match(buf).end()  # type: ignore[union-attr]
    end = http1.head_end(buf, start)
    if end < 0:
        return None
    lines = buf[start : end - 4].split(b"\r\n")
    if len(lines) > http1.MAX_HEADERS + 1:
        raise HttpError(431, "too many request headers")
    m = _REQUEST_LINE.fullmatch(lines[0])
    if m is None:
        raise HttpError(400, "malformed request line")
    method, target, minor = m.groups()
    if target[:1] != b"/" and target != b"*":
        scheme_end = target.find(b"://")
        if scheme_end <= 0:
            raise HttpError(400, "malformed request target")
        slash = target.find(b"/", scheme_end + 3)
        target = target[slash:] if slash >= 0 else b"/"
    headers = []
    content_length = None
    chunked = expect = False
    connection = b""
    for line in lines[1:]:
        if not http1.field_line_ok(line):
            raise HttpError(400, "malformed request header")
        name, _, value = line.partition(b":")
        name = name.lower()
        value = value.strip(b" \t")
        if name == b"content-length":
            if (not value.isdigit() or len(value) > http1.MAX_LENGTH_DIGITS
                    or content_length is not None):
                raise HttpError(400, "invalid Content-Length")
            content_length = int(value)
        elif name == b"transfer-encoding":
            codings = [c.strip(b" \t").lower() for c in value.split(b",")]
            if codings[-1:] != [b"chunked"]:
                raise HttpError(400, "invalid Transfer-Encoding")
            if any(c not in (b"chunked", b"identity") for c in codings):
                raise HttpError(501, "unsupported Transfer-Encoding")
            chunked = True
        elif name == b"connection":
            connection = value.lower()
        elif name == b"expect" and value:
            if value.lower() != b"100-continue":
                raise HttpError(417, "unsupported Expect header")
            expect = True
        headers.append((name, value))
    if chunked and content_length is not None:
        raise HttpError(400, "both Content-Length and Transfer-Encoding given")
    version = b"1." + minor
    keep_alive = b"close" not in connection if minor == b"1" else b"keep-alive" in connection
    return RequestHead(method, target, version, headers, content_length, chunked, keep_alive,
                       expect), end


PARSERS: dict[str, Callable[[bytes], object]] = {
    "regex (old)": regex_parse_head,
    "httptools": http1.parse_head,
    "linear hand parser": hand_parse_head,
}


def per_call_us(parse: Callable[[bytes], object], raw: bytes, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        parse(raw)
    return (time.perf_counter() - start) / n * 1e6


def best_of(raw: bytes, names: list[str], n: int, repeat: int) -> list[float]:
    """µs per parse for each parser, the best of ``repeat`` rounds; the parsers take turns
    within each round, so that a noisy neighbour on the machine slows them alike."""
    best = [float("inf")] * len(names)
    for _ in range(repeat):
        for i, name in enumerate(names):
            best[i] = min(best[i], per_call_us(PARSERS[name], raw, n))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    for raw in HEADS.values():  # the three agree on what they parse
        heads = [p(raw)[0] for p in PARSERS.values()]  # type: ignore[index]
        assert len({(h.method, h.path, h.content_length, h.keep_alive) for h in heads}) == 1
    names = list(PARSERS)
    print(f"{'µs per head':<40}" + "".join(f"{n:>20}" for n in names))
    for label, raw in HEADS.items():
        cells = best_of(raw, names, args.n, args.repeat)
        print(f"{label:<40}" + "".join(f"{c:>20.2f}" for c in cells))
    print("\none hostile head 'x: a' + N spaces + 'b' (µs, one parse; the regex takes seconds)")
    for spaces in (2_000, 8_000, 30_000):
        raw = b"GET / HTTP/1.1\r\nx: a" + b" " * spaces + b"b\r\n\r\n"
        cells = [min(per_call_us(PARSERS[n], raw, 1) for _ in range(1 if n == "regex (old)" else 5))
                 for n in names]
        print(f"{'N = ' + format(spaces, ','):<40}" + "".join(f"{c:>20,.0f}" for c in cells))


if __name__ == "__main__":
    main()

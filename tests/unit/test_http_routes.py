"""The HTTP route table (nursery/protocol/http/routes.py): matching, 404 and 405, HEAD, and the
same answers from nursery's own router and from the design card's quart-trio app
(``quart_app.py``), both called in-process as the servers call them."""

from __future__ import annotations

from typing import Any

import pytest

from nursery.actors.directory import Directory
from nursery.core import Core
from nursery.protocol.http import http1
from nursery.protocol.http.quart_app import build_quart_app
from nursery.protocol.http.routes import (
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    ROUTES,
    build_routes_app,
    find_route,
    no_route,
)
from nursery.protocol.http.server import call_asgi


def test_patterns_match_one_segment_each() -> None:
    found = find_route("/v2/models/add_sub/versions/3/ready", "GET")
    assert found is not None
    route, params = found
    assert route.pattern == "/v2/models/<model>/versions/<version>/ready"
    assert params == {"model": "add_sub", "version": "3"}
    assert find_route("/v2/models/a/b/ready", "GET") is None  # '/' is not part of a name
    assert find_route("/v2/", "GET") is None and find_route("//v2", "GET") is None


def test_a_static_segment_wins() -> None:
    found = find_route("/v2/models/stats", "GET")
    assert found is not None and found[0].pattern == "/v2/models/stats"
    found = find_route("/v2/models/other", "GET")
    assert found is not None and found[1] == {"model": "other"}


def test_unknown_path_is_404_and_wrong_method_405() -> None:
    assert find_route("/v2/nothing/here", "GET") is None
    assert no_route("/v2/nothing/here") == NOT_FOUND
    assert find_route("/v2/models/m/infer", "GET") is None
    assert no_route("/v2/models/m/infer") == METHOD_NOT_ALLOWED
    assert find_route("/v2/health/live", "OPTIONS") is None
    assert no_route("/v2/health/live") == METHOD_NOT_ALLOWED


def test_head_goes_where_get_goes() -> None:
    assert find_route("/v2", "HEAD") is not None
    assert find_route("/v2/repository/index", "HEAD") is None  # POST only


def test_every_pattern_is_unique() -> None:
    patterns = [(route.pattern, method) for route in ROUTES for method in route.methods]
    assert len(patterns) == len(set(patterns))


# (method, path, body): each answered by both apps
REQUESTS = [
    ("GET", "/v2/health/live", b""),
    ("GET", "/v2/health/ready", b""),
    ("HEAD", "/v2/health/live", b""),
    ("GET", "/v2", b""),
    ("HEAD", "/v2", b""),
    ("GET", "/v2/", b""),
    ("GET", "/v2//health/live", b""),
    ("OPTIONS", "/v2", b""),
    ("DELETE", "/v2", b""),
    ("GET", "/v2/models/nope/ready", b""),
    ("GET", "/v2/models/nope/versions/2/ready", b""),
    ("GET", "/v2/models/nope", b""),
    ("POST", "/v2/models/nope", b"{}"),
    ("GET", "/v2/models/nope/versions/1", b""),
    ("GET", "/v2/models/nope/config", b""),
    ("GET", "/v2/models/nope/stats", b""),
    ("GET", "/v2/models/a%20b/config", b""),
    ("GET", "/v2/models/nope/infer", b""),
    ("PUT", "/v2/models/nope/versions/1/infer", b""),
    ("GET", "/v2/nothing/here", b""),
    ("POST", "/v2/repository/models/m/load", b""),
    ("POST", "/v2/repository/other/models/m/load", b""),
    ("POST", "/v2/repository/models/m/load", b"{not json"),
    ("POST", "/v2/repository/models/m/unload", b'{"parameters": {"unload_dependents": 1}}'),
    ("POST", "/v2/repository/index", b'{"ready": "yes"}'),
    ("GET", "/v2/trace/setting", b""),
    ("POST", "/v2/trace/setting", b'{"trace_rate": "5"}'),
    ("GET", "/v2/models/nope/trace/setting", b""),
    ("GET", "/v2/logging", b""),
    ("GET", "/v2/systemsharedmemory/status", b""),
    ("GET", "/v2/systemsharedmemory/region/r/status", b""),
    ("POST", "/v2/systemsharedmemory/region/r/register", b'{"key": 1}'),
    ("POST", "/v2/systemsharedmemory/region/r/register", b'{"key": "/k"}'),
    ("POST", "/v2/systemsharedmemory/unregister", b""),
    ("GET", "/v2/cudasharedmemory/status", b""),
    ("POST", "/v2/cudasharedmemory/region/r/register", b"{}"),
    ("POST", "/v2/cudasharedmemory/region/r/unregister", b""),
]


def _head(method: str, path: str, body: bytes) -> http1.RequestHead:
    raw = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
           .encode())
    parsed = http1.parse_head(raw)
    assert parsed is not None
    return parsed[0]


def _headers(headers: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    return {k: v for k, v in headers if k in (b"content-type", b"allow")}


async def _answers(app: Any, requests: list[tuple[str, str, bytes]]) -> list[Any]:
    out = []
    for method, path, body in requests:
        status, headers, payload = await call_asgi(app, _head(method, path, body), body,
                                                   ("127.0.0.1", 1), ("127.0.0.1", 2))
        out.append((method, path, status, _headers(headers), payload))
    return out


@pytest.mark.parametrize("ready", [False, True])
async def test_nursery_router_and_quart_app_answer_the_same(ready: bool) -> None:
    def core() -> Core:  # one each: a trace setting changed through one app stays there
        made = Core.over(Directory(), control_mode="explicit")
        made.lifecycle.accepting = ready
        return made

    ours = await _answers(build_routes_app(core()), REQUESTS)
    theirs = await _answers(build_quart_app(core()), REQUESTS)
    for mine, card in zip(ours, theirs, strict=True):
        assert mine == card
    by_request = {(m, p): (s, h, b) for m, p, s, h, b in ours}
    assert by_request[("GET", "/v2/health/ready")][0] == (200 if ready else 400)
    assert by_request[("GET", "/v2/health/live")] == (200, {}, b"")
    assert by_request[("GET", "/v2")][1] == {b"content-type": b"application/json"}
    assert by_request[("OPTIONS", "/v2")][0] == 405
    assert by_request[("GET", "/v2/nothing/here")] == (
        404, {b"content-type": b"application/json"}, b'{"error":"Not Found"}')
    assert by_request[("GET", "/v2/models/nope/infer")][2] == b'{"error":"Method Not Allowed"}'

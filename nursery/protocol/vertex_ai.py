"""Google Vertex AI's custom-container contract on its own port, as Triton's Vertex AI server
(``src/vertex_ai_server.cc``) serves it.

On with ``--allow-vertex-ai=true``, or by default when ``AIP_MODE=PREDICTION`` (then the HTTP
and gRPC ports are off by default). The port is ``--vertex-ai-port``, else ``AIP_HTTP_PORT``,
else 8080; ``AIP_STORAGE_URI`` is the model repository when no ``--model-repository`` is
given. Served by nursery's HTTP/1.1 server with this module's handler, under the HTTP port's
limits, deadlines and connection cap; ``--http-restricted-api`` and ``--http-max-input-size``
apply here too, as in Triton. The routes (``AIP_PREDICT_ROUTE`` and ``AIP_HEALTH_ROUTE`` are
regular expressions matched against the whole path):

- the health route: the server's readiness (``GET``; 200 or 400, empty body).
- the predict route, ``POST``: the KServe v2 inference request for the default model
  (``--vertex-ai-default-model``, else the repository's one ready model). The content type
  ``application/vnd.vertex-ai-triton.binary+json;json-header-size=N`` says where the JSON
  header ends and binary tensor data begins; answers are KServe's (binary outputs announced
  by ``Inference-Header-Content-Length``).
- the predict route with ``X-Vertex-Ai-Triton-Redirect: <endpoint>`` (``POST`` only, else
  405): the KServe endpoint named, read-only ones only: ``metrics``, ``v2``,
  ``v2/health/{live,ready}``, ``v2/models/stats``, ``v2/models/<m>[/versions/<v>]`` with
  nothing, ``/ready``, ``/config``, ``/stats`` or ``/infer`` after it, shared-memory
  ``.../status`` and ``v2/repository[/<r>]/index``. Registering shared memory and loading or
  unloading models through a redirect: 403, empty body.
- anything else: 400, empty body.

The start-up checks (routes defined, default model ready) fail the start with Triton's
words. The pure parts (routing, the default model) are functions with their own tests.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from nursery.core import Core
from nursery.errors import InvalidArgument, NurseryError
from nursery.observability.exposition import CONTENT_TYPE
from nursery.protocol.access import Restrictions, http_group
from nursery.protocol.codecs import binary_tensor
from nursery.protocol.http import http1
from nursery.protocol.http.infer import (
    AfterSend,
    Response,
    category_refusal,
    error_response,
    infer_response,
    typed_body_limit,
)
from nursery.protocol.http.metrics import MetricsText
from nursery.protocol.http.routes import RouteRequest, answer, find_route, no_route

log = logging.getLogger("nursery.vertex_ai")

BINARY_TYPE = b"application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT = b"x-vertex-ai-triton-redirect"
_JSON = [(b"content-type", b"application/json")]
# Triton's HTTP endpoint patterns, matched against the redirect's whole endpoint
_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
                    r"(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?")
_SERVER = re.compile(r"/v2(?:/health/(live|ready))?")
_SHARED_MEMORY = re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?"
                            r"/(status|register|unregister)")
_REPOSITORY = re.compile(r"/v2/repository(?:/[^/]+)?/(index|models/[^/]+/(?:load|unload))")
_NEVER = re.compile(r"(?!)")


@dataclass(frozen=True, slots=True)
class Target:
    """What a request asks. ``kind``: ``health`` (the health route), ``infer`` (``model``,
    ``version``; "" model: the default one), ``metrics``, ``route`` (the KServe route of
    ``path`` under ``method``), ``forbidden`` (403), ``method`` (405) or ``bad`` (400)."""

    kind: str
    path: str = ""
    method: str = "GET"
    model: str = ""
    version: str = ""


def compile_route(pattern: str) -> re.Pattern[str]:
    """An ``AIP_*_ROUTE`` as the regular expression Triton makes of it; one Python cannot
    read matches nothing (RE2 fails every match of a pattern it cannot compile)."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        log.warning("Vertex AI route '%s' is not a regular expression (%s); nothing matches it",
                    pattern, exc)
        return _NEVER


def target(method: bytes, path: str, redirect: str | None, predict: re.Pattern[str],
           health: re.Pattern[str]) -> Target:
    """The target of a request (its path without the query; the redirect header's value),
    as Triton's ``VertexAiAPIServer::Handle`` picks it."""
    if health.fullmatch(path):
        return Target("health", "/v2/health/ready", method.decode("latin-1"))
    if not predict.fullmatch(path):
        return Target("bad")
    if redirect is None:
        return Target("infer") if method == b"POST" else Target("method")
    if method != b"POST":
        return Target("method")
    endpoint = "/" + redirect
    if endpoint == "/metrics":
        return Target("metrics")
    if endpoint == "/v2/models/stats":
        return Target("route", endpoint)
    match = _MODEL.fullmatch(endpoint)
    if match is not None:
        model, version, kind = match.group(1), match.group(2) or "", match.group(3) or ""
        if kind == "infer":
            return Target("infer", model=model, version=version)
        if kind in ("", "ready", "config", "stats"):
            return Target("route", endpoint)
    if _SERVER.fullmatch(endpoint):  # "/v2" and the health endpoints
        return Target("route", endpoint)
    match = _SHARED_MEMORY.fullmatch(endpoint)
    if match is not None:  # only the read-only status goes through
        return Target("route", endpoint) if match.group(1) == "status" else Target("forbidden")
    match = _REPOSITORY.fullmatch(endpoint)
    if match is not None:  # only the index; loads and unloads need the HTTP port
        return Target("route", endpoint, "POST") if match.group(1) == "index" else Target(
            "forbidden")
    return Target("bad")


def default_model(given: str, ready: Sequence[str]) -> str:
    """The model the predict route serves without a redirect: ``given`` when it is among the
    ready models (one name per ready version, as Triton's ready index lists them), else the
    one ready model when ``given`` is empty; refused in Triton's words."""
    if not given:
        if len(ready) != 1:
            raise InvalidArgument("Expect the model repository contains only a single model "
                                  "if default model is not specified")
        return ready[0]
    if given not in ready:
        raise InvalidArgument(f"Expect the default model '{given}' is loaded")
    return given


def check_routes(predict_route: str, health_route: str) -> None:
    """Both routes must be set (Triton's words, its misspelling of the first included)."""
    if not predict_route:
        raise InvalidArgument("API_PREDICT_ROUTE is not defined for Vertex AI endpoint")
    if not health_route:
        raise InvalidArgument("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")


def as_kserve(headers: list[tuple[bytes, bytes]], length: int | None,
              ) -> list[tuple[bytes, bytes]]:
    """A predict request's headers as the KServe inference route reads them: the Vertex AI
    content type's header size is the only one (Triton's Vertex AI server reads no
    ``Inference-Header-Content-Length``)."""
    kept = [(k, v) for k, v in headers if k != binary_tensor.HEADER_LOWER]
    if length is not None:
        kept.append((binary_tensor.HEADER_LOWER, str(length).encode()))
    return kept


class VertexAiFrontend:
    """The Vertex AI port's handler (``HttpServer(handler=...)``)."""

    def __init__(self, core: Core, predict_route: str, health_route: str, model: str,
                 restrictions: Restrictions, max_input_size: int, max_body_size: int,
                 metrics: MetricsText | None) -> None:
        self.core = core
        self.predict = compile_route(predict_route)
        self.health = compile_route(health_route)
        self.model = model  # the default model (resolved at start-up)
        self.restrictions = restrictions  # --http-restricted-api, as on the HTTP port
        self.max_input_size = max_input_size
        self.max_body_size = max_body_size
        self.metrics = metrics  # None with --allow-metrics=false: the redirect answers 400

    def body_limit(self, head: http1.RequestHead) -> int:
        return typed_body_limit(head, BINARY_TYPE, self.max_input_size, self.max_body_size)

    async def handle(self, head: http1.RequestHead, body: bytes,
                     after: AfterSend | None = None) -> Response:
        path = head.path.decode("latin-1")
        log.debug("Vertex AI request: %s %s", head.method.decode("latin-1"), path)
        redirect = head.header(REDIRECT)
        where = target(head.method, path, None if redirect is None else redirect.decode(
            "latin-1"), self.predict, self.health)
        if where.kind == "infer":
            return await self._infer(head, body, where, after)
        if where.kind in ("health", "route"):
            return await self._route(head, body, where)
        if where.kind == "metrics":
            if self.metrics is None:
                return 400, [], b""
            text = await self.metrics()
            return 200, [(b"content-type", CONTENT_TYPE)], text
        if where.kind == "forbidden":
            log.debug("Vertex AI redirect blocked: /%s", (redirect or b"").decode("latin-1"))
            return 403, [], b""
        if where.kind == "method":
            return 405, [], b""
        log.debug("Vertex AI error: %s %s - 400", head.method.decode("latin-1"), path)
        return 400, [], b""

    async def _route(self, head: http1.RequestHead, body: bytes, where: Target) -> Response:
        refused = category_refusal(self.restrictions, http_group(where.path), head.headers)
        if refused is not None:
            return refused
        found = find_route(where.path, where.method)
        if found is None:
            status, payload = no_route(where.path)
        else:
            route, params = found
            status, payload = await answer(self.core, route,
                                           RouteRequest(where.method, params, body))
        return status, (list(_JSON) if payload else []), payload

    async def _infer(self, head: http1.RequestHead, body: bytes, where: Target,
                     after: AfterSend | None) -> Response:
        refused = category_refusal(self.restrictions, "inference", head.headers)
        if refused is not None:
            return refused
        try:
            length = binary_tensor.header_size_in_type(head.header(b"content-type"), len(body),
                                                       BINARY_TYPE)
        except NurseryError as error:
            return error_response(error)
        return await infer_response(self.core, where.model or self.model, where.version,
                                    as_kserve(head.headers, length), body, self.max_input_size,
                                    after=after)

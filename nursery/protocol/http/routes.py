"""KServe v2 HTTP/REST routes plus Triton's extensions, with no web framework.

Every route but inference is a :class:`Route`: a path pattern (``<name>`` stands for one path
segment), the methods it answers and a handler of a few lines that calls the core and returns
an :data:`Answer`. :func:`build_routes_app` serves the table as an ASGI application for
nursery's own HTTP server, which answers inference itself (``infer.py``); the design card's
quart-trio app (``quart_app.py``, ``--http-server hypercorn``) registers the same table, so
both servers answer the same. Errors are ``{"error": "..."}`` with the status from
``protocol/codecs/status.py``; unknown routes are 404 ``{"error":"Not Found"}`` and wrong methods 405
``{"error":"Method Not Allowed"}``, as Triton answers. A route that answers GET answers HEAD.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from nursery.config.json_form import ConfigJsonError, config_from_json
from nursery.core import Core
from nursery.errors import InvalidArgument, NurseryError, Unavailable, Unsupported
from nursery.protocol.codecs import deep_json
from nursery.protocol.codecs import stats as stats_codec
from nursery.protocol.codecs.json_tensors import dumps
from nursery.protocol.codecs.status import error_body, http_error

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

# ``POST /v2/models/{m}[/versions/{v}]/infer``, matched on the raw path by the servers
INFER_PATH = re.compile(rb"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")

# (status, body): a non-empty body is JSON, an empty one has no content type
Answer = tuple[int, bytes]
NOT_FOUND: Answer = (404, error_body("Not Found"))
METHOD_NOT_ALLOWED: Answer = (405, error_body("Method Not Allowed"))
JSON_TYPE = "application/json"


@dataclass(frozen=True)
class RouteRequest:
    """What a route handler reads: the method, the path's segments by name and the body."""

    method: str
    params: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def param(self, name: str) -> str:
        return self.params.get(name, "")


Handler = Callable[[Core, RouteRequest], Awaitable[Answer]]


@dataclass(frozen=True)
class Route:
    pattern: str  # "/v2/models/<model>/ready": <name> is one path segment
    methods: frozenset[str]
    handler: Handler
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = re.split(r"<(\w+)>", self.pattern)
        regex = "".join(f"(?P<{part}>[^/]+)" if i % 2 else re.escape(part)
                        for i, part in enumerate(parts))
        object.__setattr__(self, "regex", re.compile(regex))

    def allows(self, method: str) -> bool:
        return method in self.methods or (method == "HEAD" and "GET" in self.methods)


def _json(obj: Any, status: int = 200) -> Answer:
    return status, dumps(obj)


def _parse_object(body: bytes) -> dict[str, Any]:
    """A request's JSON object, however deeply nested, as Triton's parser takes it (its
    deepest containers read as ``deep_json.TOO_DEEP``, which no handler takes for a value it
    wants). A body nested past ``deep_json.FAST_DEPTH`` is parsed in Python: see
    ``_json_body``."""
    try:
        data = deep_json.loads(body, stdlib=True)
    except ValueError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return data


async def _json_body(body: bytes) -> dict[str, Any]:
    """``_parse_object``, off the event loop when the body is deep (a parse in Python)."""
    if deep_json.shallow(body):
        return _parse_object(body)
    return await trio.to_thread.run_sync(_parse_object, body)


def _load_parameters(body: bytes | dict[str, Any]) -> tuple[Any, dict[str, bytes] | None]:
    """A load request's ``config`` override and ``file:`` contents (base64 over HTTP), from
    its body or its parsed JSON object."""
    if not body:
        return None, None
    request = _parse_object(body) if isinstance(body, bytes) else body
    params = request.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidArgument("'parameters' must be a JSON object")
    config = None
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if not isinstance(value, str):
            raise InvalidArgument(f"parameter '{key}' must be a string")
        if key == "config":
            try:
                config = config_from_json(value)
            except ConfigJsonError as exc:
                raise InvalidArgument(f"failed to parse the 'config' override: {exc}") from None
        elif key.startswith("file:"):
            try:
                files[key[len("file:"):]] = base64.b64decode(value, validate=True)
            except ValueError:
                raise InvalidArgument(f"parameter '{key}' is not valid base64") from None
        else:
            raise InvalidArgument(f"unrecognized load parameter '{key}'")
    return config, files or None


# -- the handlers ----------------------------------------------------------------------------

async def health_live(core: Core, req: RouteRequest) -> Answer:
    return 200 if core.server_live() else 400, b""


async def health_ready(core: Core, req: RouteRequest) -> Answer:
    return 200 if await core.server_ready() else 400, b""


async def server_metadata(core: Core, req: RouteRequest) -> Answer:
    return _json(core.server_metadata())


async def model_ready(core: Core, req: RouteRequest) -> Answer:
    if await core.model_ready(req.param("model"), req.param("version")):
        return 200, b""
    return 400, error_body("Model version not ready")


async def model_metadata(core: Core, req: RouteRequest) -> Answer:
    return _json(core.model_metadata(req.param("model"), req.param("version")))


async def model_config(core: Core, req: RouteRequest) -> Answer:
    return _json(core.model_config(req.param("model"), req.param("version")))


async def infer_elsewhere(core: Core, req: RouteRequest) -> Answer:
    # POSTs never get here (the servers send them to the inference handler first); the route
    # exists so that other methods on this path get Triton's 405.
    raise Unsupported("inference is served by the inference handler")


async def model_stats(core: Core, req: RouteRequest) -> Answer:
    entries = await core.model_statistics(req.param("model"), req.param("version"))
    return _json(stats_codec.to_json(entries))


async def repository_index(core: Core, req: RouteRequest) -> Answer:
    ready = False
    if req.body:
        ready = (await _json_body(req.body)).get("ready", False)
        if not isinstance(ready, bool):  # Triton's words (HandleRepositoryIndex)
            raise InvalidArgument("Invalid value for 'ready': expected a boolean")
    entries = await core.repository_index(ready)
    return _json([e.as_json() for e in entries])


async def repository_load(core: Core, req: RouteRequest) -> Answer:
    if req.param("repo"):
        raise Unsupported("'repository_name' specification is not supported")
    config, files = _load_parameters(await _json_body(req.body) if req.body else b"")
    await core.load_model(req.param("model"), config, files)
    return 200, b""


async def repository_unload(core: Core, req: RouteRequest) -> Answer:
    if req.param("repo"):
        raise Unsupported("'repository_name' specification is not supported")
    dependents = False
    if req.body:
        params = (await _json_body(req.body)).get("parameters") or {}
        dependents = params.get("unload_dependents", False)
        if not isinstance(dependents, bool):  # Triton's words (TritonJson's AsBool)
            raise InvalidArgument("Unable to parse 'unload_dependents': attempt to access "
                                  "JSON non-boolean as boolean")
    await core.unload_model(req.param("model"), dependents)
    return 200, b""


async def trace_setting(core: Core, req: RouteRequest) -> Answer:
    model = req.param("model")
    if model:
        await core.check_trace_model(model)
    if req.method != "POST":
        return _json(core.tracer.settings(model).to_json())
    changes = (await _json_body(req.body)) if req.body else {}
    return _json(core.tracer.update(model, changes).to_json())


async def log_settings(core: Core, req: RouteRequest) -> Answer:
    if core.log_manager is None:
        raise Unavailable("the server does not support dynamic logging")
    if req.method != "POST":
        return _json(core.log_manager.settings.to_json())
    changes = (await _json_body(req.body)) if req.body else {}
    return _json(core.log_manager.update(changes).to_json())


async def system_shm_status(core: Core, req: RouteRequest) -> Answer:
    return _json(core.shm.status(req.param("region"), "system"))


async def system_shm_register(core: Core, req: RouteRequest) -> Answer:
    core.shm.check_client_allowed()  # before the body is read, as Triton
    data = await _json_body(req.body)
    key = data.get("key")
    if not isinstance(key, str):
        raise InvalidArgument("Unable to parse 'key': attempt to access JSON non-string as "
                              "string" if "key" in data else
                              "Unable to parse 'key': attempt to access non-existing object "
                              "member 'key'")
    sizes = []
    for name in ("offset", "byte_size"):
        value = data.get(name, 0 if name == "offset" else None)
        if type(value) is not int or value < 0:
            raise InvalidArgument(
                f"Unable to parse '{name}': attempt to access JSON non-unsigned-integer as "
                "unsigned-integer" if name in data else
                f"Unable to parse '{name}': attempt to access non-existing object member "
                f"'{name}'")
        sizes.append(value)
    core.shm.register_system(req.param("region"), key, sizes[0], sizes[1])
    return 200, b""


async def system_shm_unregister(core: Core, req: RouteRequest) -> Answer:
    core.shm.check_client_allowed()  # before the body is read, as Triton
    core.shm.unregister(req.param("region"), "system")  # no region: every region
    return 200, b""


async def cuda_shm_status(core: Core, req: RouteRequest) -> Answer:
    return _json(core.shm.status(req.param("region"), "cuda"))


async def cuda_shm_register(core: Core, req: RouteRequest) -> Answer:
    core.shm.check_client_allowed()  # before the body is read, as Triton
    data = await _json_body(req.body)
    raw = data.get("raw_handle")
    b64 = raw.get("b64") if isinstance(raw, dict) else None
    if not isinstance(b64, str):
        raise InvalidArgument("Unable to parse 'raw_handle': expected an object with a "
                              "base64 string 'b64'")
    try:
        handle = base64.b64decode(b64, validate=True)
    except ValueError:
        raise InvalidArgument("Unable to parse 'raw_handle': 'b64' is not base64") from None
    device_id, byte_size = data.get("device_id", 0), data.get("byte_size")
    for name, value in (("device_id", device_id), ("byte_size", byte_size)):
        if type(value) is not int or value < 0:
            raise InvalidArgument(f"Unable to parse '{name}': attempt to access JSON "
                                  "non-unsigned-integer as unsigned-integer")
    assert isinstance(device_id, int) and isinstance(byte_size, int)  # checked just above
    core.shm.register_cuda(req.param("region"), handle, device_id, byte_size)
    return 200, b""


async def cuda_shm_unregister(core: Core, req: RouteRequest) -> Answer:
    core.shm.check_client_allowed()  # before the body is read, as Triton
    core.shm.unregister(req.param("region"), "cuda")  # no region: every region
    return 200, b""


def _routes(methods: str, handler: Handler, *patterns: str) -> list[Route]:
    allowed = frozenset(methods.split(","))
    return [Route(pattern, allowed, handler) for pattern in patterns]


# In matching order: where two patterns fit a path, the first wins ("/v2/models/stats" before
# "/v2/models/<model>", as a static segment wins in quart's router).
ROUTES: tuple[Route, ...] = (
    *_routes("GET", health_live, "/v2/health/live"),
    *_routes("GET", health_ready, "/v2/health/ready"),
    *_routes("GET", server_metadata, "/v2"),
    *_routes("GET", model_stats, "/v2/models/stats", "/v2/models/<model>/stats",
             "/v2/models/<model>/versions/<version>/stats"),
    *_routes("GET", model_ready, "/v2/models/<model>/ready",
             "/v2/models/<model>/versions/<version>/ready"),
    *_routes("GET", model_metadata, "/v2/models/<model>", "/v2/models/<model>/versions/<version>"),
    *_routes("GET", model_config, "/v2/models/<model>/config",
             "/v2/models/<model>/versions/<version>/config"),
    *_routes("POST", infer_elsewhere, "/v2/models/<model>/infer",
             "/v2/models/<model>/versions/<version>/infer"),
    *_routes("POST", repository_index, "/v2/repository/index", "/v2/repository/<repo>/index"),
    *_routes("POST", repository_load, "/v2/repository/models/<model>/load",
             "/v2/repository/<repo>/models/<model>/load"),
    *_routes("POST", repository_unload, "/v2/repository/models/<model>/unload",
             "/v2/repository/<repo>/models/<model>/unload"),
    *_routes("GET,POST", trace_setting, "/v2/trace/setting", "/v2/models/<model>/trace/setting"),
    *_routes("GET,POST", log_settings, "/v2/logging"),
    *_routes("GET", system_shm_status, "/v2/systemsharedmemory/status",
             "/v2/systemsharedmemory/region/<region>/status"),
    *_routes("POST", system_shm_register, "/v2/systemsharedmemory/region/<region>/register"),
    *_routes("POST", system_shm_unregister, "/v2/systemsharedmemory/unregister",
             "/v2/systemsharedmemory/region/<region>/unregister"),
    *_routes("GET", cuda_shm_status, "/v2/cudasharedmemory/status",
             "/v2/cudasharedmemory/region/<region>/status"),
    *_routes("POST", cuda_shm_register, "/v2/cudasharedmemory/region/<region>/register"),
    *_routes("POST", cuda_shm_unregister, "/v2/cudasharedmemory/unregister",
             "/v2/cudasharedmemory/region/<region>/unregister"),
)


def find_route(path: str, method: str) -> tuple[Route, dict[str, str]] | None:
    """The route that takes a request, with its path segments by name; None when none does."""
    for route in ROUTES:
        match = route.regex.fullmatch(path)
        if match is not None and route.allows(method):
            return route, match.groupdict()
    return None


def no_route(path: str) -> Answer:
    """The answer when no route takes a request: 405 when some route has its path, else 404."""
    known = any(route.regex.fullmatch(path) for route in ROUTES)
    return METHOD_NOT_ALLOWED if known else NOT_FOUND


async def answer(core: Core, route: Route, request: RouteRequest) -> Answer:
    """A route's answer; the core's errors become their status and ``{"error": ...}`` body."""
    try:
        return await route.handler(core, request)
    except NurseryError as error:
        return http_error(error)


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def build_routes_app(core: Core) -> ASGIApp:
    """Every route of :data:`ROUTES` as an ASGI application (nursery's own HTTP server)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return  # nothing to start or stop (lifespan)
        found = find_route(scope["path"], scope["method"])
        if found is None:
            status, body = no_route(scope["path"])
        else:
            route, params = found
            request = RouteRequest(scope["method"], params, await _read_body(receive))
            status, body = await answer(core, route, request)
        headers = [(b"content-type", JSON_TYPE.encode())] if body else []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app

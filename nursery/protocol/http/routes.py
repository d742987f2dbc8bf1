"""KServe v2 HTTP/REST routes plus Triton's extensions.

:func:`build_http_app` returns the ASGI callable hypercorn serves: the inference route goes
straight to the lean handler in ``infer.py``; every other route is a quart-trio view of a few
lines that calls the core and encodes its answer. Errors are ``{"error": "..."}`` with the
status from ``protocol/codecs/status.py``; unknown routes are 404 ``{"error":"Not Found"}`` and wrong
methods 405 ``{"error":"Method Not Allowed"}``, as Triton answers.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from quart import Response, request
from quart_trio import QuartTrio

from nursery.config.json_form import ConfigJsonError, config_from_json
from nursery.core import Core
from nursery.errors import InvalidArgument, NurseryError, Unavailable, Unsupported
from nursery.messages import IndexEntry
from nursery.protocol.codecs import stats as stats_codec
from nursery.protocol.codecs.json_tensors import dumps
from nursery.protocol.codecs.status import error_body, http_error
from nursery.protocol.http.infer import handle_infer

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

_INFER_PATH = re.compile(rb"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")


def _json(obj: Any, status: int = 200) -> Response:
    return Response(dumps(obj), status=status, content_type="application/json")


def _error(error: NurseryError) -> Response:
    status, body = http_error(error)
    return Response(body, status=status, content_type="application/json")


def _empty(status: int) -> Response:
    return Response(b"", status=status)


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    except RecursionError:
        raise InvalidArgument("failed to parse the request JSON buffer: nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return data


def _load_parameters(body: bytes) -> tuple[Any, dict[str, bytes] | None]:
    """A load request's ``config`` override and ``file:`` contents (base64 over HTTP)."""
    if not body:
        return None, None
    params = _json_body(body).get("parameters") or {}
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


def _index_entry(entry: IndexEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"name": entry.name}
    if entry.version is not None:
        out["version"] = str(entry.version)
    if entry.state is not None:
        out["state"] = entry.state
    if entry.reason:
        out["reason"] = entry.reason
    return out


def build_quart_app(core: Core) -> QuartTrio:
    app = QuartTrio("nursery")
    app.config["MAX_CONTENT_LENGTH"] = None

    @app.errorhandler(NurseryError)
    async def nursery_error(error: NurseryError) -> Response:
        return _error(error)

    @app.errorhandler(404)
    async def not_found(_: Any) -> Response:
        return Response(error_body("Not Found"), status=404, content_type="application/json")

    @app.errorhandler(405)
    async def bad_method(_: Any) -> Response:
        return Response(error_body("Method Not Allowed"), status=405,
                        content_type="application/json")

    @app.get("/v2/health/live")
    async def health_live() -> Response:
        return _empty(200 if core.server_live() else 400)

    @app.get("/v2/health/ready")
    async def health_ready() -> Response:
        return _empty(200 if core.server_ready() else 400)

    @app.get("/v2")
    async def server_metadata() -> Response:
        return _json(core.server_metadata())

    @app.get("/v2/models/<model>/ready")
    @app.get("/v2/models/<model>/versions/<version>/ready")
    async def model_ready(model: str, version: str = "") -> Response:
        if core.model_ready(model, version):
            return _empty(200)
        return Response(error_body("Model version not ready"), status=400,
                        content_type="application/json")

    @app.get("/v2/models/<model>")
    @app.get("/v2/models/<model>/versions/<version>")
    async def model_metadata(model: str, version: str = "") -> Response:
        return _json(core.model_metadata(model, version))

    @app.get("/v2/models/<model>/config")
    @app.get("/v2/models/<model>/versions/<version>/config")
    async def model_config(model: str, version: str = "") -> Response:
        return _json(core.model_config(model, version))

    @app.route("/v2/models/<model>/infer", methods=["POST"])
    @app.route("/v2/models/<model>/versions/<version>/infer", methods=["POST"])
    async def infer_elsewhere(model: str, version: str = "") -> Response:
        # POSTs never get here (build_http_app routes them to the lean handler); the rule
        # exists so that other methods on this path get Triton's 405.
        return _error(Unsupported("inference is served by the lean handler"))

    @app.get("/v2/models/stats")
    @app.get("/v2/models/<model>/stats")
    @app.get("/v2/models/<model>/versions/<version>/stats")
    async def model_stats(model: str = "", version: str = "") -> Response:
        return _json(stats_codec.to_json(await core.model_statistics(model, version)))

    @app.post("/v2/repository/index")
    @app.post("/v2/repository/<repo>/index")
    async def repository_index(repo: str = "") -> Response:
        body = await request.get_data()
        ready = False
        if body:
            data = _json_body(body)
            ready = data.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidArgument("'ready' must be a boolean")
        entries = await core.repository_index(ready)
        return _json([_index_entry(e) for e in entries])

    @app.post("/v2/repository/models/<model>/load")
    @app.post("/v2/repository/<repo>/models/<model>/load")
    async def repository_load(model: str, repo: str = "") -> Response:
        if repo:
            raise Unsupported("'repository_name' specification is not supported")
        config, files = _load_parameters(await request.get_data())
        await core.load_model(model, config, files)
        return _empty(200)

    @app.post("/v2/repository/models/<model>/unload")
    @app.post("/v2/repository/<repo>/models/<model>/unload")
    async def repository_unload(model: str, repo: str = "") -> Response:
        if repo:
            raise Unsupported("'repository_name' specification is not supported")
        body = await request.get_data()
        dependents = False
        if body:
            params = _json_body(body).get("parameters") or {}
            dependents = params.get("unload_dependents", False)
            if not isinstance(dependents, bool):
                raise InvalidArgument("'unload_dependents' must be a boolean")
        await core.unload_model(model, dependents)
        return _empty(200)

    @app.route("/v2/trace/setting", methods=["GET", "POST"])
    @app.route("/v2/models/<model>/trace/setting", methods=["GET", "POST"])
    async def trace_setting(model: str = "") -> Response:
        if model:
            core.resolve(model)  # unknown models: Triton's NOT_FOUND
        if request.method == "GET":
            return _json(core.tracer.settings(model).to_json())
        body = await request.get_data()
        changes = _json_body(body) if body else {}
        return _json(core.tracer.update(model, changes).to_json())

    @app.route("/v2/logging", methods=["GET", "POST"])
    async def log_settings() -> Response:
        if core.log_manager is None:
            raise Unavailable("the server does not support dynamic logging")
        if request.method == "GET":
            return _json(core.log_manager.settings.to_json())
        body = await request.get_data()
        changes = _json_body(body) if body else {}
        return _json(core.log_manager.update(changes).to_json())

    @app.get("/v2/systemsharedmemory/status")
    @app.get("/v2/systemsharedmemory/region/<region>/status")
    async def system_shm_status(region: str = "") -> Response:
        return _json(core.shm.status(region, "system"))

    @app.post("/v2/systemsharedmemory/region/<region>/register")
    async def system_shm_register(region: str) -> Response:
        data = _json_body(await request.get_data())
        key = data.get("key")
        if not isinstance(key, str):
            raise InvalidArgument("Unable to parse 'key': attempt to access JSON non-string as "
                                  "string" if "key" in data else
                                  "Unable to parse 'key': attempt to access non-existing object "
                                  "member 'key'")
        sizes = []
        for field in ("offset", "byte_size"):
            value = data.get(field, 0 if field == "offset" else None)
            if type(value) is not int or value < 0:
                raise InvalidArgument(
                    f"Unable to parse '{field}': attempt to access JSON non-unsigned-integer as "
                    "unsigned-integer" if field in data else
                    f"Unable to parse '{field}': attempt to access non-existing object member "
                    f"'{field}'")
            sizes.append(value)
        core.shm.register_system(region, key, sizes[0], sizes[1])
        return _empty(200)

    @app.post("/v2/systemsharedmemory/unregister")
    @app.post("/v2/systemsharedmemory/region/<region>/unregister")
    async def system_shm_unregister(region: str = "") -> Response:
        core.shm.unregister(region, "system")  # no region: every region
        return _empty(200)

    @app.get("/v2/cudasharedmemory/status")
    @app.get("/v2/cudasharedmemory/region/<region>/status")
    async def cuda_shm_status(region: str = "") -> Response:
        return _json(core.shm.status(region, "cuda"))

    @app.post("/v2/cudasharedmemory/region/<region>/register")
    async def cuda_shm_register(region: str) -> Response:
        data = _json_body(await request.get_data())
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
        for field, value in (("device_id", device_id), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidArgument(f"Unable to parse '{field}': attempt to access JSON "
                                      "non-unsigned-integer as unsigned-integer")
        core.shm.register_cuda(region, handle, device_id, byte_size)
        return _empty(200)

    @app.post("/v2/cudasharedmemory/unregister")
    @app.post("/v2/cudasharedmemory/region/<region>/unregister")
    async def cuda_shm_unregister(region: str = "") -> Response:
        core.shm.unregister(region, "cuda")  # no region: every region
        return _empty(200)

    return app


def build_http_app(core: Core, *, max_input_size: int) -> ASGIApp:
    """The ASGI callable for the HTTP port: lean inference path first, quart for the rest."""
    quart_app = build_quart_app(core)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _INFER_PATH.match(scope.get("raw_path") or scope["path"].encode())
            if match is not None:
                model = unquote(match.group(1).decode("latin-1"))
                version = match.group(2).decode() if match.group(2) else ""
                await handle_infer(core, scope, receive, send, model, version, max_input_size)
                return
        await quart_app(scope, receive, send)

    return app

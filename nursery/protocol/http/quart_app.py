"""The design card's HTTP server: the routes as a quart-trio app, served by hypercorn.

Selected with ``--http-server hypercorn`` and installed with the 'card-servers' extra
(``pip install "nursery[card-servers]"``); nothing imports this module unless that flag selects
it (``nursery/protocol/card_servers.py``). The quart app registers the route table of
``routes.py``, the one nursery's own server answers from, so both servers answer the same;
inference goes to the lean ASGI handler of ``infer.py`` ahead of quart.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from quart import Response, request
from quart_trio import QuartTrio

from nursery.core import Core
from nursery.protocol.access import NO_FORWARD, OPEN, HeaderForward, Restrictions
from nursery.protocol.http.infer import handle_infer, restricted, send_response
from nursery.protocol.http.routes import (
    INFER_PATH,
    JSON_TYPE,
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    ROUTES,
    Answer,
    ASGIApp,
    Route,
    RouteRequest,
    answer,
)
from nursery.settings import DEFAULT_HTTP_MAX_BODY_SIZE, Settings


def _response(result: Answer) -> Response:
    status, body = result
    response = Response(body, status=status, content_type=JSON_TYPE)
    if not body:  # no content type on an empty answer, as nursery's own server sends it
        del response.headers["Content-Type"]
    return response


def _view(core: Core, route: Route) -> Any:
    async def view(**params: str) -> Response:
        body = await request.get_data(as_text=False)
        assert isinstance(body, bytes)  # as_text=False
        return _response(await answer(core, route, RouteRequest(request.method, params, body)))

    return view


def build_quart_app(core: Core) -> QuartTrio:
    """Every route of ``routes.ROUTES`` as a quart-trio view; inference POSTs excepted (see
    :func:`build_card_app`)."""
    app = QuartTrio("nursery")
    app.config["MAX_CONTENT_LENGTH"] = None
    app.url_map.merge_slashes = False  # "/v2//health/live" is unknown (404), not a redirect

    @app.errorhandler(404)
    async def not_found(_: Any) -> Response:
        return _response(NOT_FOUND)

    @app.errorhandler(405)
    async def bad_method(_: Any) -> Response:
        return _response(METHOD_NOT_ALLOWED)

    for i, route in enumerate(ROUTES):
        # no automatic OPTIONS answer: an OPTIONS request gets 405, as from nursery's server
        app.add_url_rule(route.pattern, f"route{i}", _view(core, route),
                         provide_automatic_options=False, methods=sorted(route.methods))
    return app


def build_card_app(core: Core, *, max_input_size: int,
                   max_body_size: int = DEFAULT_HTTP_MAX_BODY_SIZE,
                   restrictions: Restrictions = OPEN,
                   forward: HeaderForward = NO_FORWARD) -> ASGIApp:
    """The ASGI callable hypercorn serves: the restricted groups' check, then the lean
    inference handler, quart for the rest."""
    quart_app = build_quart_app(core)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and restrictions:
            refused = restricted(restrictions, scope.get("raw_path") or scope["path"].encode(),
                                 scope["headers"])
            if refused is not None:
                await send_response(send, refused)
                return
        if scope["type"] == "http" and scope["method"] == "POST":
            match = INFER_PATH.match(scope.get("raw_path") or scope["path"].encode())
            if match is not None:
                model = unquote(match.group(1).decode("latin-1"))
                version = match.group(2).decode() if match.group(2) else ""
                await handle_infer(core, scope, receive, send, model, version, max_input_size,
                                   max_body_size, forward)
                return
        await quart_app(scope, receive, send)  # type: ignore[arg-type]  # ASGI dict scope

    return app


def hypercorn_config(address: str, port: int, graceful: float) -> HypercornConfig:
    config = HypercornConfig()
    host = f"[{address}]" if ":" in address else address
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("nursery.http")
    config.keep_alive_timeout = 75.0
    config.graceful_timeout = graceful
    config.backlog = 1024
    config.include_server_header = False
    return config


async def serve_hypercorn(
    core: Core, settings: Settings, shutdown: trio.Event,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The HTTP port on hypercorn; once ``shutdown`` is set it stops accepting and lets the
    requests in flight finish (for at most ``--exit-timeout-secs``)."""
    app = build_card_app(core, max_input_size=settings.http_max_input_size,
                         max_body_size=settings.http_max_body_size,
                         restrictions=settings.http_restrictions, forward=settings.http_forward)
    config = hypercorn_config(settings.http_address, settings.http_port,
                              settings.exit_timeout_secs)
    if settings.http_tls is not None:  # --http-ssl-cert / --http-ssl-key
        config.certfile = settings.http_tls.cert
        config.keyfile = settings.http_tls.key
    await hypercorn_serve(app, config, shutdown_trigger=shutdown.wait,  # type: ignore[arg-type]
                          task_status=task_status)

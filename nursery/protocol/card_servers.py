"""The design card's servers, an optional extra: hypercorn + quart-trio for the HTTP port
(``--http-server hypercorn``, ``http/quart_app.py``) and grpclib on a trio-asyncio loop for the
gRPC port (``--grpc-server grpclib``, ``grpc/grpclib_server.py``).

``pip install "nursery[card-servers]"`` installs their packages; the default servers (nursery's
own HTTP/1.1 and HTTP/2 servers) need none of them. Their modules are imported here, when a
flag selects them, and only here; without the extra, start-up stops with one line that names it.
"""

from __future__ import annotations

from types import ModuleType
from typing import NoReturn

from nursery.settings import Settings

EXTRA = "card-servers"


class MissingExtra(Exception):
    """A flag selects a card server whose packages are not installed."""


def _missing(flag: str, exc: ModuleNotFoundError) -> NoReturn:
    """Turn a third-party package that cannot be imported into :class:`MissingExtra`; a nursery
    module that cannot be imported is a bug, not a missing extra, and is raised as it is."""
    if exc.name is None or exc.name.split(".")[0] == "nursery":
        raise exc
    raise MissingExtra(f"{flag} needs the '{EXTRA}' extra: pip install \"nursery[{EXTRA}]\"") \
        from None


def hypercorn_server() -> ModuleType:
    """``nursery.protocol.http.quart_app``, or :class:`MissingExtra`."""
    try:
        from nursery.protocol.http import quart_app
    except ModuleNotFoundError as exc:
        _missing("--http-server hypercorn", exc)
    return quart_app


def grpclib_server() -> ModuleType:
    """``nursery.protocol.grpc.grpclib_server``, or :class:`MissingExtra`."""
    try:
        from nursery.protocol.grpc import grpclib_server
    except ModuleNotFoundError as exc:
        _missing("--grpc-server grpclib", exc)
    return grpclib_server


class NotServed(Exception):
    """A flag asks for something the selected card server does not do."""


def check_selected(settings: Settings) -> None:
    """Import the card servers the settings select for a port that is on, before anything
    starts: :class:`MissingExtra` names the extra to install, :class:`NotServed` a flag the
    card server cannot honour (a door it would leave open is refused, not ignored)."""
    if settings.allow_http and settings.http_server == "hypercorn":
        hypercorn_server()
    if settings.allow_grpc and settings.grpc_server == "grpclib":
        if settings.grpc_restrictions:
            raise NotServed("--grpc-restricted-protocol is served by --grpc-server nursery only")
        grpclib_server()

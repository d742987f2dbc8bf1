"""Triton's ``tritonfrontend`` package, served by nursery: the KServe HTTP and gRPC
frontends and the metrics port, opened on an in-process ``tritonserver.Server``.

``KServeHttp(server, KServeHttp.Options(port=8000)).start()`` serves that server over HTTP
until ``stop()`` (or the server's ``stop()``); ``KServeGrpc`` and ``Metrics`` alike. The
options are Triton's, checked when made (a port out of range or a setting of the wrong type
raises); those nursery's frontends have no use for (thread counts, the gRPC allocation pool,
compression) are accepted and have no effect, as the command line's flags of the same names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from tritonserver import AlreadyExistsError, InvalidArgumentError, Server
from tritonserver._errors import triton_error


def _check(options: Any) -> None:
    for f in fields(options):
        value = getattr(options, f.name)
        kind = f.type if isinstance(f.type, type) else _KINDS.get(str(f.type))
        if kind is None:
            continue
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{f.name} must be int, got {type(value).__name__}")
        if kind is not int and not isinstance(value, kind):
            raise TypeError(f"{f.name} must be {kind.__name__}, got {type(value).__name__}")
    port = getattr(options, "port", 0)
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in [0, 65535], got {port}")
    for name in getattr(options, "_positive", ()):
        if getattr(options, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(options, name)}")
    for name in getattr(options, "_non_negative", ()):
        if getattr(options, name) < 0:
            raise ValueError(f"{name} must be non-negative, got {getattr(options, name)}")


_KINDS: dict[str, type] = {"str": str, "int": int, "bool": bool}


class _Frontend:
    kind: ClassVar[str]
    Options: ClassVar[type]

    def __init__(self, server: Server, options: Any = None) -> None:
        if options is None:
            options = self.Options()
        if not isinstance(options, self.Options):
            raise InvalidArgumentError(
                "Incorrect type for options. options argument must be of type "
                f"{type(self).__name__}.Options")
        self.server = server
        self.options: Any = options
        self._handle: Any = None

    def start(self) -> None:
        """Open the port and serve until :meth:`stop`."""
        if self._handle is not None and self._handle.running:
            raise AlreadyExistsError("server is already running.")
        embedded = self.server._embedded()
        try:
            self._handle = embedded.start_frontend(self.kind, self.options.port,
                                                   self.options.address)
        except Exception as exc:  # nursery's error, or the bind's OSError
            raise triton_error(exc) from None

    def stop(self) -> None:
        """Close the port, once its connections have drained (at most the server's exit
        timeout)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.stop()

    def __enter__(self) -> _Frontend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class KServeHttp(_Frontend):
    """KServe v2 over HTTP, with Triton's extensions."""

    kind = "http"

    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8000
        reuse_port: bool = False
        thread_count: int = 8
        header_forward_pattern: str = ""
        restricted_protocols: list[Any] = field(default_factory=list)
        _positive: ClassVar[tuple[str, ...]] = ("thread_count",)

        def __post_init__(self) -> None:
            _check(self)


class KServeGrpc(_Frontend):
    """KServe v2 over gRPC, with Triton's extensions."""

    kind = "grpc"

    class Grpc_compression_level(enum.IntEnum):  # noqa: N801 - Triton's name
        NONE = 0
        LOW = 1
        MED = 2
        HIGH = 3
        COUNT = 4

    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8001
        reuse_port: bool = False
        use_ssl: bool = False
        server_cert: str = ""
        server_key: str = ""
        root_cert: str = ""
        use_mutual_auth: bool = False
        keepalive_time_ms: int = 7_200_000
        keepalive_timeout_ms: int = 20_000
        keepalive_permit_without_calls: bool = False
        http2_max_pings_without_data: int = 2
        http2_min_recv_ping_interval_without_data_ms: int = 300_000
        http2_max_ping_strikes: int = 2
        max_connection_age_ms: int = 0
        max_connection_age_grace_ms: int = 0
        infer_compression_level: Any = 0
        infer_allocation_pool_size: int = 8
        forward_header_pattern: str = ""
        restricted_protocols: list[Any] = field(default_factory=list)
        _non_negative: ClassVar[tuple[str, ...]] = (
            "keepalive_time_ms", "keepalive_timeout_ms", "http2_max_pings_without_data",
            "http2_min_recv_ping_interval_without_data_ms", "http2_max_ping_strikes",
            "max_connection_age_ms", "max_connection_age_grace_ms",
            "infer_allocation_pool_size")

        def __post_init__(self) -> None:
            _check(self)


class Metrics(_Frontend):
    """Prometheus metrics over HTTP."""

    kind = "metrics"

    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8002
        thread_count: int = 1
        _positive: ClassVar[tuple[str, ...]] = ("thread_count",)

        def __post_init__(self) -> None:
            _check(self)


__all__ = ["KServeGrpc", "KServeHttp", "Metrics"]

"""The gRPC port's flags: Triton's keepalive flags with gRPC core's defaults, nursery's own
limits, strict integers, and the seconds the HTTP/2 server gets from them."""

from __future__ import annotations

import math

import pytest

from nursery.protocol.codecs.grpc_wire import StrictProtoCodec
from nursery.protocol.grpc.lean import GrpcApp, h2_server_for
from nursery.settings import Settings, settings_from_args


def _settings(*flags: str) -> Settings:
    return settings_from_args(["--model-repository", "/tmp", *flags])


def test_defaults_are_triton_and_grpc_core_defaults() -> None:
    s = _settings()
    assert (s.grpc_keepalive_time, s.grpc_keepalive_timeout) == (7200000, 20000)
    assert s.grpc_keepalive_permit_without_calls is False
    assert (s.grpc_http2_max_pings_without_data, s.grpc_http2_min_recv_ping_interval_without_data,
            s.grpc_http2_max_ping_strikes) == (2, 300000, 2)
    assert s.http_max_input_size == 64 * 1024 * 1024
    assert s.grpc_max_input_size == 2**31 - 1  # Triton's MAX_GRPC_MESSAGE_SIZE (INT32_MAX)
    assert (s.grpc_max_connections, s.grpc_idle_timeout, s.grpc_handshake_timeout) == (1000, 300000, 10000)
    assert s.grpc_write_timeout == 60000


def test_flags_reach_the_server_in_seconds() -> None:
    s = _settings("--grpc-keepalive-time", "1500", "--grpc-keepalive-timeout", "250",
                  "--grpc-keepalive-permit-without-calls", "1", "--grpc-http2-max-ping-strikes", "0",
                  "--grpc-http2-min-recv-ping-interval-without-data", "10000",
                  "--grpc-http2-max-pings-without-data", "0", "--grpc-max-connections", "7",
                  "--grpc-idle-timeout", "0", "--grpc-handshake-timeout", "2000",
                  "--grpc-max-input-size", "1024", "--grpc-write-timeout", "30000")
    server = h2_server_for(GrpcApp([], StrictProtoCodec(), s.grpc_max_input_size), s)
    assert (server.keepalive_time, server.keepalive_timeout) == (1.5, 0.25)
    assert server.keepalive_permit_without_calls is True
    assert (server.max_ping_strikes, server.max_pings_without_data) == (0, 0)
    assert server.min_recv_ping_interval == 10.0
    assert server.max_connections == 7
    assert server.idle_timeout == math.inf  # 0: never
    assert server.handshake_timeout == 2.0
    assert server.write_timeout == 30.0
    assert server.app.max_input == 1024  # type: ignore[attr-defined]


@pytest.mark.parametrize(("flag", "value"), [
    ("--grpc-max-input-size", "0"), ("--grpc-max-input-size", "1" * 4000),
    ("--grpc-max-connections", "-1"), ("--grpc-idle-timeout", "1e3"),
    ("--grpc-keepalive-time", "-5"), ("--grpc-keepalive-permit-without-calls", "maybe"),
])
def test_bad_values_are_refused(flag: str, value: str) -> None:
    with pytest.raises(SystemExit):
        _settings(flag, value)

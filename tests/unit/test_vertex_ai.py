"""The Vertex AI frontend's pure parts: routing and redirects, the default model, the routes'
start-up check, the binary content type, the flags and the AIP_* environment
(src/vertex_ai_server.cc, command_line_parser.cc)."""

from __future__ import annotations

import re

import pytest

from nursery.errors import InvalidArgument
from nursery.protocol.codecs import binary_tensor
from nursery.protocol.vertex_ai import (
    BINARY_TYPE,
    Target,
    as_kserve,
    check_routes,
    compile_route,
    default_model,
    target,
)
from nursery.settings import FlagError, settings_from_args

PREDICT = re.compile("/predict")
HEALTH = re.compile("/health")


def _target(method: bytes, path: str, redirect: str | None = None) -> Target:
    return target(method, path, redirect, PREDICT, HEALTH)


@pytest.mark.parametrize(("method", "path", "expected"), [
    (b"GET", "/health", Target("health", "/v2/health/ready", "GET")),
    (b"POST", "/health", Target("health", "/v2/health/ready", "POST")),  # the route says 405
    (b"POST", "/predict", Target("infer")),
    (b"GET", "/predict", Target("method")),
    (b"POST", "/predict/", Target("bad")),  # the whole path must match
    (b"GET", "/v2/health/ready", Target("bad")),
    (b"POST", "/v2/models/m/infer", Target("bad")),
])
def test_routes_without_a_redirect(method: bytes, path: str, expected: Target) -> None:
    assert _target(method, path) == expected


@pytest.mark.parametrize(("redirect", "expected"), [
    ("metrics", Target("metrics")),
    ("v2/models/stats", Target("route", "/v2/models/stats")),
    ("v2/models/m/infer", Target("infer", model="m")),
    ("v2/models/m/versions/3/infer", Target("infer", model="m", version="3")),
    ("v2/models/m/ready", Target("route", "/v2/models/m/ready")),
    ("v2/models/m/versions/2/config", Target("route", "/v2/models/m/versions/2/config")),
    ("v2/models/m/stats", Target("route", "/v2/models/m/stats")),
    ("v2/models/m", Target("route", "/v2/models/m")),
    ("v2/models/m/versions/x/ready", Target("bad")),  # Triton's versions are digits
    ("v2/models/m/generate", Target("bad")),  # not served through a redirect
    ("v2/models/m/trace/setting", Target("bad")),
    ("v2", Target("route", "/v2")),
    ("v2/health/live", Target("route", "/v2/health/live")),
    ("v2/health/ready", Target("route", "/v2/health/ready")),
    ("v2/systemsharedmemory/status", Target("route", "/v2/systemsharedmemory/status")),
    ("v2/cudasharedmemory/region/r/status",
     Target("route", "/v2/cudasharedmemory/region/r/status")),
    ("v2/systemsharedmemory/region/r/register", Target("forbidden")),
    ("v2/cudasharedmemory/unregister", Target("forbidden")),
    ("v2/repository/index", Target("route", "/v2/repository/index", "POST")),
    ("v2/repository/r/index", Target("route", "/v2/repository/r/index", "POST")),
    ("v2/repository/models/m/load", Target("forbidden")),
    ("v2/repository/models/m/unload", Target("forbidden")),
    ("v2/logging", Target("bad")),
    ("v2/trace/setting", Target("bad")),
    ("/v2", Target("bad")),  # "//v2"
    ("", Target("bad")),
])
def test_redirects_are_triton_s(redirect: str, expected: Target) -> None:
    assert _target(b"POST", "/predict", redirect) == expected
    assert _target(b"GET", "/predict", redirect) == Target("method")  # POST only


def test_routes_are_regular_expressions() -> None:
    predict, health = compile_route("/v1/endpoints/[0-9]+:predict"), compile_route("/h.*")
    assert target(b"POST", "/v1/endpoints/12:predict", None, predict, health) == Target("infer")
    assert target(b"GET", "/hello", None, predict, health).kind == "health"
    never = compile_route("(")  # RE2 fails every match of a pattern it cannot read
    assert target(b"POST", "(", None, never, never) == Target("bad")


def test_the_default_model() -> None:
    assert default_model("", ["a"]) == "a"
    assert default_model("b", ["a", "b"]) == "b"
    with pytest.raises(InvalidArgument, match="Expect the model repository contains only a "
                       "single model if default model is not specified"):
        default_model("", ["a", "b"])
    with pytest.raises(InvalidArgument, match="single model"):
        default_model("", [])
    with pytest.raises(InvalidArgument, match="single model"):
        default_model("", ["a", "a"])  # two ready versions of one model, as Triton counts
    with pytest.raises(InvalidArgument, match="Expect the default model 'c' is loaded"):
        default_model("c", ["a", "b"])


def test_both_routes_are_required() -> None:
    check_routes("/predict", "/health")
    with pytest.raises(InvalidArgument,
                       match="^API_PREDICT_ROUTE is not defined for Vertex AI endpoint$"):
        check_routes("", "/health")
    with pytest.raises(InvalidArgument,
                       match="^AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint$"):
        check_routes("/predict", "")


def test_the_binary_content_type() -> None:
    def size(content_type: bytes | None, length: int = 10) -> int | None:
        return binary_tensor.header_size_in_type(content_type, length, BINARY_TYPE)

    assert size(None) is None
    assert size(b"application/json") is None
    assert size(BINARY_TYPE + b"7") == 7
    assert size(BINARY_TYPE + b" 7abc") == 7  # as stoi reads it
    for bad, words in [
        (b"additional-string/" + BINARY_TYPE + b"7", "expect MIME type for binary data starts"),
        (BINARY_TYPE + b"additional-string7", "Unable to parse inference header size, got"),
        (BINARY_TYPE + b"-123", "inference header size should be in range \\(0, 10\\)"),
        (BINARY_TYPE + b"12345", "inference header size should be in range"),
        (BINARY_TYPE + b"99999999999", "value is out of range"),
        (BINARY_TYPE + b"9" * 5000, "value is out of range"),  # no 5000-digit int()
    ]:
        with pytest.raises(InvalidArgument, match=words):
            size(bad)


def test_only_the_vertex_content_type_declares_the_header_size() -> None:
    headers = [(b"content-type", b"x"), (binary_tensor.HEADER_LOWER, b"3"),
               (b"content-encoding", b"gzip")]
    assert as_kserve(headers, None) == [(b"content-type", b"x"), (b"content-encoding", b"gzip")]
    assert as_kserve(headers, 5)[-1] == (binary_tensor.HEADER_LOWER, b"5")


def _clear_aip(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AIP_MODE", "AIP_HTTP_PORT", "AIP_PREDICT_ROUTE", "AIP_HEALTH_ROUTE",
                 "AIP_STORAGE_URI"):
        monkeypatch.delenv(name, raising=False)


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    _clear_aip(monkeypatch)
    plain = settings_from_args([])
    assert plain.vertex_ai is None and plain.allow_http and plain.allow_grpc
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/predict")
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/health")
    on = settings_from_args(["--allow-vertex-ai=true", "--vertex-ai-default-model=m",
                             "--vertex-ai-thread-count=4", "--http-address=127.0.0.1"])
    vertex = on.vertex_ai
    assert vertex is not None
    assert (vertex.port, vertex.address, vertex.default_model, vertex.predict_route,
            vertex.health_route) == (8080, "127.0.0.1", "m", "/predict", "/health")
    assert on.allow_http and on.allow_grpc
    assert "--allow-vertex-ai" not in on.inactive
    assert "--vertex-ai-thread-count" in on.inactive  # no thread pool to size
    monkeypatch.setenv("AIP_HTTP_PORT", "5234")
    assert settings_from_args(["--allow-vertex-ai"]).vertex_ai.port == 5234  # type: ignore[union-attr]
    assert settings_from_args(["--allow-vertex-ai", "--vertex-ai-port=9"]).vertex_ai.port == 9  # type: ignore[union-attr]
    # a Vertex AI container: the frontend on, HTTP and gRPC off unless asked for
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    aip = settings_from_args([])
    assert aip.vertex_ai is not None and not aip.allow_http and not aip.allow_grpc
    both = settings_from_args(["--allow-grpc=true", "--allow-vertex-ai=false"])
    assert both.vertex_ai is None and both.allow_grpc and not both.allow_http
    # AIP_STORAGE_URI is the repository unless --model-repository is given
    monkeypatch.setenv("AIP_STORAGE_URI", str(tmp_path))
    assert settings_from_args([]).model_repositories == (tmp_path,)
    given = settings_from_args([f"--model-repository={tmp_path / 'x'}"])
    assert given.model_repositories == (tmp_path / "x",)


def test_port_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_aip(monkeypatch)
    with pytest.raises(FlagError, match="The server cannot listen to HTTP requests and "
                       "Vertex AI requests at the same address and port 0.0.0.0:8000"):
        settings_from_args(["--allow-vertex-ai=true", "--vertex-ai-port=8000"],
                           raise_errors=True)
    monkeypatch.setenv("AIP_HTTP_PORT", "eighty")
    with pytest.raises(FlagError, match="AIP_HTTP_PORT"):
        settings_from_args(["--allow-vertex-ai=true"], raise_errors=True)


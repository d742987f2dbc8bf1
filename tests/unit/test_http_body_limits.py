"""Which bound a request body gets: ``--http-max-input-size`` for JSON (Triton's
EVBufferToJson / EVBufferToRawInput checks), the hard cap ``--http-max-body-size`` for binary
tensor data after an ``Inference-Header-Content-Length``."""

from __future__ import annotations

from pathlib import Path

from nursery.protocol.http.infer import body_limit, body_too_large, raw_too_large, too_large
from nursery.settings import DEFAULT_HTTP_MAX_BODY_SIZE, settings_from_args


def test_json_bodies_get_the_input_size() -> None:
    assert body_limit([(b"content-type", b"application/json")], 100, 10_000) == 100


def test_binary_tensor_bodies_get_the_hard_cap() -> None:
    headers = [(b"inference-header-content-length", b"40")]
    assert body_limit(headers, 100, 10_000) == 10_000
    assert body_limit(headers, 100_000, 10_000) == 100_000  # never below the input size


def test_the_default_cap_is_tritons_int32_content_length() -> None:
    assert DEFAULT_HTTP_MAX_BODY_SIZE == 2**31 - 1
    settings = settings_from_args(["--model-repository", str(Path.cwd())])
    assert settings.http_max_body_size == 2**31 - 1
    settings = settings_from_args(["--model-repository", str(Path.cwd()),
                                   "--http-max-body-size", "1000"])
    assert settings.http_max_body_size == 1000


def test_messages() -> None:
    assert too_large(5, 4).message == (
        "Request JSON size of 5 bytes exceeds the maximum allowed value of 4 bytes. Use "
        "--http-max-input-size to increase the limit.")
    assert raw_too_large(5, 4).message == (
        "Raw input has a byte_size (5 bytes) that exceeds the maximum allowed value of 4 bytes. "
        "Use --http-max-input-size to increase the limit.")
    assert "Use --http-max-body-size" in body_too_large(5, 4).message

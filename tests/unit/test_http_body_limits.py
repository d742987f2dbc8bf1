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
        "request JSON size of 5 bytes exceeds the maximum allowed input size of 4 bytes. Use "
        "--http-max-input-size to increase the limit.")
    assert raw_too_large(5, 4).message == (
        "Raw input has a byte_size (5 bytes) that exceeds the maximum allowed value of 4 bytes. "
        "Use --http-max-input-size to increase the limit.")
    assert "Use --http-max-body-size" in body_too_large(5, 4).message


def test_raw_inputs_that_cannot_be_deduced_are_refused_in_cores_words(tmp_path) -> None:
    """A raw binary body (Inference-Header-Content-Length: 0) for an input with two variable
    dimensions (L0_http test_multi_variable_dimensions), or a BYTES input not shaped [1]."""
    import pytest

    from nursery.backends.base import get_factory
    from nursery.config.model import read_model_config
    from nursery.errors import InvalidArgument
    from nursery.protocol.http.infer import _raw_request

    for name, dims, datatype, message in (
            ("two", "[-1, -1]", "TYPE_FP16", "The shape of the raw input 'INPUT0' can not be "
             "deduced because there are more than one variable-sized dimension"),
            ("text", "[2]", "TYPE_STRING", "For BYTE datatype raw input 'INPUT0', the model "
             "must have input shape [1]")):
        folder = tmp_path / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(
            f"platform: 'onnxruntime_onnx'\nmax_batch_size: 8\ninput [{{name: 'INPUT0' "
            f"data_type: {datatype} dims: {dims}}}]\noutput [{{name: 'OUTPUT0' "
            f"data_type: {datatype} dims: {dims}}}]\n")
        config, _ = read_model_config(folder, name, backends=get_factory, auto_complete=False)
        with pytest.raises(InvalidArgument) as refused:
            _raw_request(config, name, "", b"\0" * 8)
        assert refused.value.message == f"[request id: <id_unknown>] {message}"

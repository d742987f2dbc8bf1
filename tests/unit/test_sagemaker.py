"""The SageMaker frontend's pure parts: routing, the binary content type, the answer's
headers, the flags and Triton's port check (src/sagemaker_server.cc, command_line_parser.cc)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nursery.errors import InvalidArgument
from nursery.protocol.sagemaker import (
    BINARY_TYPE,
    Route,
    as_kserve,
    as_sagemaker,
    forbidden_url,
    header_length,
    model_layout,
    out_of_memory,
    parse_load,
    route,
)
from nursery.settings import FlagError, port_collision, settings_from_args


@pytest.mark.parametrize(("method", "path", "expected"), [
    (b"GET", "/ping", Route("ping")),
    (b"POST", "/ping", Route("ping")),  # the handler answers 405
    (b"POST", "/invocations", Route("invocations")),
    (b"GET", "/invocations", Route("invocations")),  # the handler answers 405
    (b"GET", "/models", Route("list")),
    (b"GET", "/models/", Route("list")),
    (b"GET", "/models/m1", Route("get", "m1")),
    (b"GET", "/models/m1/invoke", Route("get", "m1")),
    (b"GET", "/modelsm1", Route("get", "m1")),  # Triton's pattern: the "/" is optional
    (b"POST", "/models", Route("load")),
    (b"POST", "/models/m1", Route("load", "m1")),
    (b"POST", "/models/m1/invoke", Route("invoke", "m1")),
    (b"DELETE", "/models/m1", Route("unload", "m1")),
    (b"DELETE", "/models", Route("unload")),
    (b"PUT", "/models/m1", Route("bad")),
    (b"GET", "/models/a/b", Route("bad")),
    (b"GET", "/v2/health/ready", Route("bad")),
    (b"GET", "/pingx", Route("bad")),
    (b"GET", "/", Route("bad")),
])
def test_routes_are_triton_s(method: bytes, path: str, expected: Route) -> None:
    assert route(method, path) == expected


def test_header_length_of_the_binary_content_type() -> None:
    assert header_length(None, 10) is None
    assert header_length(b"application/json", 10) is None
    assert header_length(BINARY_TYPE + b"7", 10) == 7
    assert header_length(BINARY_TYPE + b"0", 10) == 0  # raw binary input
    assert header_length(BINARY_TYPE + b"10", 10) == 10
    assert header_length(BINARY_TYPE + b" +7abc", 10) == 7  # read as C++'s stoi reads


@pytest.mark.parametrize(("value", "message"), [
    (b"x/" + BINARY_TYPE + b"7", "expect MIME type for binary data starts with"),
    (BINARY_TYPE + b"abc7", "Unable to parse inference header size, got: abc7"),
    (BINARY_TYPE, "Unable to parse inference header size, got: "),
    (BINARY_TYPE + b"99999999999", "value is out of range, got: 99999999999"),
    (BINARY_TYPE + b"-123", "inference header size should be in range (0, 10), got: -123"),
    (BINARY_TYPE + b"11", "inference header size should be in range (0, 10), got: 11"),
])
def test_header_length_refusals_are_triton_s(value: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        header_length(value, 10)
    assert message in info.value.message


def test_headers_become_kserve_s_and_back() -> None:
    sent = [(b"content-type", BINARY_TYPE + b"5"), (b"content-encoding", b"gzip"),
            (b"accept-encoding", b"gzip"), (b"inference-header-content-length", b"99"),
            (b"traceparent", b"00-ab-cd-01")]
    assert as_kserve(sent, 5) == [(b"content-type", BINARY_TYPE + b"5"),
                                  (b"traceparent", b"00-ab-cd-01"),
                                  (b"inference-header-content-length", b"5")]
    assert as_kserve(sent, None)[-1] == (b"traceparent", b"00-ab-cd-01")
    json_only = (200, [(b"content-type", b"application/json")], b"{}")
    assert as_sagemaker(json_only) == json_only
    binary = (200, [(b"content-type", b"application/octet-stream"),
                    (b"inference-header-content-length", b"42")], b"...")
    assert as_sagemaker(binary) == (200, [(b"content-type", BINARY_TYPE + b"42")], b"...")


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_from_args([]).sagemaker is None
    monkeypatch.setenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "sm_model")
    monkeypatch.setenv("SAGEMAKER_TRITON_PING_MODE", "live")
    settings = settings_from_args(["--allow-sagemaker=true", "--sagemaker-port=8085",
                                   "--sagemaker-safe-port-range=8000-8090",
                                   "--sagemaker-thread-count=4"])
    sm = settings.sagemaker
    assert sm is not None
    assert (sm.port, sm.safe_range, sm.default_model, sm.ping_mode, sm.inference_type) == (
        8085, (8000, 8090), "sm_model", "live", "infer")
    assert "--allow-sagemaker" not in settings.inactive
    assert "--sagemaker-thread-count" in settings.inactive  # no thread pool to size
    monkeypatch.delenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")
    plain = settings_from_args(["--allow-sagemaker"]).sagemaker
    assert plain is not None and plain.port == 8080
    assert plain.default_model == "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
    for bad in (["--allow-sagemaker", "--sagemaker-safe-port-range=8000"],
                ["--allow-sagemaker", "--sagemaker-port=70000"]):
        with pytest.raises(FlagError):
            settings_from_args(bad, raise_errors=True)


def test_port_checks_are_triton_s() -> None:
    with pytest.raises(FlagError, match="The server cannot listen to HTTP requests at port "
                       "8000, allowed port range is \\[8081, 9000\\]"):
        settings_from_args(["--allow-sagemaker=true", "--sagemaker-safe-port-range=8081-9000"],
                           raise_errors=True)
    with pytest.raises(FlagError, match="The server cannot listen to HTTP requests and "
                       "SageMaker requests at the same address and port 0.0.0.0:8000"):
        settings_from_args(["--allow-sagemaker=true", "--sagemaker-port=8000"],
                           raise_errors=True)
    # SageMaker on HTTP's port is fine once HTTP is off (the serve script's way)
    assert settings_from_args(["--allow-sagemaker=true", "--sagemaker-port=8000",
                               "--allow-http=false"]).sagemaker is not None
    assert port_collision([("HTTP", "a", 1, None), ("GRPC", "b", 1, None)]) is None
    assert port_collision([("HTTP", "a", 5, None), ("SageMaker", "a", 9, (1, 9))]) is None


def test_log_verbose_takes_true_and_false() -> None:
    """SageMaker's serve script starts the server with --log-verbose=true (Triton reads an
    int or a boolean there)."""
    assert settings_from_args(["--log-verbose=true"]).log_verbose == 1
    assert settings_from_args(["--log-verbose=False"]).log_verbose == 0
    assert settings_from_args(["--log-verbose=2"]).log_verbose == 2
    with pytest.raises(FlagError):
        settings_from_args(["--log-verbose=yes"], raise_errors=True)


def test_load_requests() -> None:
    assert parse_load(b"") == ("", "")
    assert parse_load(b'{"model_name": "m", "url": "/opt/ml/models/h/model"}') == (
        "/opt/ml/models/h/model", "m")
    assert parse_load(b"[1]") == ("", "")
    for bad in (b"{", b'{"url": 5}', b'{"model_name": ["m"]}'):
        with pytest.raises(InvalidArgument):
            parse_load(bad)
    assert not forbidden_url("/proc")  # Triton looks for "/proc/" at the start
    assert forbidden_url("/proc/self/model")
    assert forbidden_url("/opt/../dev/shm/x")
    assert not forbidden_url("/opt/ml/models/h/model")


def test_model_layouts(tmp_path: Path) -> None:
    """config.pbtxt at the url: the hash folder is the repository, ``model`` the model;
    else the url is the repository and its ensemble (or its one model) the model."""
    root = tmp_path / "models"
    single = root / "h1" / "model"
    single.mkdir(parents=True)
    (single / "config.pbtxt").write_text('name: "m"')
    assert model_layout(str(single), str(root)) == (str(root / "h1"), "model")
    assert model_layout(str(single) + "/", str(root)) == (str(root / "h1"), "model")
    several = root / "h2" / "model"
    for folder, config in (("a", 'platform: "onnxruntime_onnx"'),
                           ("b_ens", 'platform:"ensemble"'), ("c", "")):
        (several / folder).mkdir(parents=True)
        (several / folder / "config.pbtxt").write_text(config)
    assert model_layout(str(several), str(root)) == (str(several), "b_ens")
    for bad in (str(tmp_path / "other" / "h1" / "model"), str(root / "h1" / "notmodel"),
                str(root / "h1" / "model" / "a" / "b")):
        with pytest.raises(InvalidArgument, match="expected a path of the form"):
            model_layout(bad, str(root))


def test_out_of_memory_errors_read_as_triton_reads_them() -> None:
    assert out_of_memory("onnxruntime: Failed to allocate memory for requested buffer")
    assert out_of_memory("CUDA out of memory. Tried to allocate 2 GiB")
    assert not out_of_memory("unexpected shape for input 'INPUT0'")


def test_load_parse_errors_read_as_triton_s() -> None:
    """sagemaker_request_many_chunks.py expects rapidjson's words for a body of 'A's."""
    for body, words in ((b"A" * 10, "Invalid value. at 0"),
                        (b"{} x", "The document root must not be followed by other values. at 3"),
                        (b"{1: 2}", "Missing a name for object member. at 1")):
        with pytest.raises(InvalidArgument) as info:
            parse_load(body)
        assert info.value.message == f"failed to parse the request JSON buffer: {words}"


def test_a_mapped_folder_is_the_model_of_its_name(tmp_path: Path) -> None:
    """A registered repository's mapped folder serves as its model even where another
    repository holds a model of that name (Triton looks up mappings first); its unmapped
    folders are models of their own names."""
    from nursery.config.repository import scan

    main = tmp_path / "main"
    (main / "simple").mkdir(parents=True)
    registered = tmp_path / "ml" / "models" / "h1"
    (registered / "model").mkdir(parents=True)
    (registered / "other").mkdir()
    found = scan([main, registered], {registered: {"model": "simple"}})
    assert found.models["simple"].path == registered / "model"
    assert found.models["other"].path == registered / "other"
    assert "model" not in found.models and not found.duplicates
    plain = scan([main, registered])
    assert plain.models["simple"].path == main / "simple"

"""The locked doors without a server (issue 25): the restriction flags as Triton parses them,
the group of every endpoint, forwarded headers, the chunk cap, client shared memory and file
uploads switched off. The e2e side is tests/e2e/test_security.py."""

from __future__ import annotations

import re

import pytest

from nursery.actors.directory import Directory
from nursery.core import Core
from nursery.errors import Unavailable, Unsupported
from nursery.protocol.access import (
    CATEGORIES,
    GRPC_GROUPS,
    GRPC_KEY_PREFIX,
    HeaderForward,
    ReservedHeader,
    compile_forward_pattern,
    http_group,
    parse_restrictions,
)
from nursery.protocol.grpc.service import Draining, HealthService, InferenceService
from nursery.protocol.http import http1
from nursery.protocol.http.infer import restricted
from nursery.protocol.http.routes import ROUTES
from nursery.settings import settings_from_args
from nursery.shm.system import CLIENT_SHM_DISABLED, SharedMemoryRegistry

# -- the flags ------------------------------------------------------------------------------


def test_restrictions_as_triton_parses_them() -> None:
    found = parse_restrictions(["model-repository:admin-key=admin-value",
                                "inference,metadata:infer-key=infer-value"],
                               "http-restricted-api", "api")
    assert found.rule("model-repository") == ("admin-key", "admin-value")
    assert found.rule("inference") == found.rule("metadata") == ("infer-key", "infer-value")
    assert found.rule("health") is None
    # a value may hold ':' and '=' after the first of each
    odd = parse_restrictions(["health:k=v=w:x"], "grpc-restricted-protocol", "protocol",
                             GRPC_KEY_PREFIX)
    assert odd.rule("health") == ("triton-grpc-protocol-k", "v=w:x")


@pytest.mark.parametrize(("entries", "message"), [
    (["model-repository,health:k1=v1", "metadata,health:k2=v2"],
     "restricted api 'health' can not be specified in multiple config groups"),
    (["model-reposit,health:k1=v1"], "unknown restricted api 'model-reposit'"),
    (["health,:k=v"], "unknown restricted api ''"),
    (["health"], "--http-restricted-api option format is '<config name>:<setting>=<value>'. "
                 "Got health"),
    (["health:k"], "option format"), (["health:=v"], "option format"),
    (["health:k="], "option format"), ([":k=v"], "option format"),
])
def test_malformed_restrictions(entries: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_restrictions(entries, "http-restricted-api", "api")


def test_door_flags_defaults_and_settings() -> None:
    plain = settings_from_args(["--model-repository", "/tmp"])
    assert not plain.allow_client_shm and not plain.allow_model_file_upload
    assert plain.grpc_tls is None and plain.http_tls is None
    assert not plain.http_restrictions and not plain.grpc_restrictions
    on = settings_from_args(["--model-repository", "/tmp", "--allow-client-shm",
                             "--allow-model-file-upload=true", "--grpc-use-ssl-mutual=1",
                             "--grpc-server-cert=c", "--grpc-server-key=k",
                             "--grpc-root-cert=r"])
    assert on.allow_client_shm and on.allow_model_file_upload
    assert on.grpc_tls is not None and on.grpc_tls.mutual and on.grpc_tls.root == "r"


# -- which endpoints each group holds -------------------------------------------------------

_BY_HANDLER = {
    "health_live": "health", "health_ready": "health", "model_ready": "health",
    "server_metadata": "metadata", "model_metadata": "metadata",
    "model_config": "model-config", "infer_elsewhere": "inference",
    "model_stats": "statistics", "repository_index": "model-repository",
    "repository_load": "model-repository", "repository_unload": "model-repository",
    "trace_setting": "trace", "log_settings": "logging",
}


def test_every_http_route_has_its_group() -> None:
    for route in ROUTES:
        path = re.sub(r"<(\w+)>", lambda m: "1" if m.group(1) == "version" else "m", route.pattern)
        name = route.handler.__name__
        expected = "shared-memory" if "shm" in name else _BY_HANDLER[name]
        assert http_group(path) == expected, (route.pattern, http_group(path))
    assert http_group("/v2/models/m/generate") == "inference"
    assert http_group("/v2/unknown") is None and http_group("/metrics") is None


def test_every_grpc_method_has_its_group() -> None:
    methods = {**InferenceService(None, Draining()).__mapping__(),  # type: ignore[arg-type]
               **HealthService(None).__mapping__()}  # type: ignore[arg-type]
    assert set(methods) == set(GRPC_GROUPS)
    assert set(GRPC_GROUPS.values()) == set(CATEGORIES)


def test_a_restricted_http_request() -> None:
    rules = parse_restrictions(["inference,metadata:infer-key=infer-value"],
                               "http-restricted-api", "api")
    headers = [(b"host", b"x"), (b"infer-key", b"infer-value")]
    assert restricted(rules, b"/v2/models/m/infer", headers) is None
    assert restricted(rules, b"/v2/health/live", []) is None  # a group not named
    refused = restricted(rules, b"/v2/models/m?q=1", [(b"infer-key", b"other")])
    assert refused is not None and refused[0] == 403
    assert refused[2] == b'{"error":"This API is restricted, expecting header \'infer-key\'"}'
    # an encoded slash in the model name: the inference route reads the raw path
    assert restricted(rules, b"/v2/models/m%2Fx/infer", []) is not None
    assert restricted(rules, b"/v2/models/m%2Fx/versions/1/infer", []) is not None


# -- forwarded headers ----------------------------------------------------------------------


def test_forward_pattern_is_case_insensitive_unless_told() -> None:
    forward = HeaderForward(compile_forward_pattern("MY_HEADER.*"))
    assert forward.parameters([("my_header_1", "a"), ("x-my_header", "b"), ("other", "c")]) \
        == {"my_header_1": "a", "x-my_header": "b"}  # RE2's PartialMatch: anywhere in the name
    strict = HeaderForward(compile_forward_pattern("(?-i)MY_HEADER.*"))
    assert strict.parameters([("my_header_1", "a"), ("MY_HEADER_2", "b")]) == {"MY_HEADER_2": "b"}
    assert HeaderForward(compile_forward_pattern("")).parameters([("a", "b")]) == {}


@pytest.mark.parametrize("name", ["sequence_id", "sequence_start", "sequence_end", "priority",
                                  "timeout", "headers", "binary_data_output", "triton_x"])
def test_reserved_headers_are_not_forwarded(name: str) -> None:
    with pytest.raises(ReservedHeader, match=f"Header '{name}' is reserved for Triton usage"):
        HeaderForward(compile_forward_pattern(".*")).parameters([(name, "1")])


# -- the chunk cap --------------------------------------------------------------------------


def test_chunk_cap() -> None:
    at = http1.ChunkedReader(limit=10**6)
    assert at.feed(b"1\r\nA\r\n" * http1.MAX_CHUNKS + b"0\r\n\r\n")
    assert len(at.body) == http1.MAX_CHUNKS
    over = http1.ChunkedReader(limit=10**6)
    with pytest.raises(http1.HttpError) as err:
        over.feed(b"1\r\nA\r\n" * (http1.MAX_CHUNKS + 1))
    assert err.value.status == 400
    assert err.value.message == ("Chunked request body exceeds maximum of 65536 non-empty "
                                 "chunks. Send fewer or larger HTTP chunks.")


# -- client shared memory and file uploads --------------------------------------------------


def test_client_shared_memory_switched_off() -> None:
    registry = SharedMemoryRegistry(allow_client=False)
    for call in (lambda: registry.register_system("r", "/k", 0, 8),
                 lambda: registry.register_cuda("r", b"h", 0, 8),
                 lambda: registry.unregister("r"), lambda: registry.unregister("", "cuda")):
        with pytest.raises(Unsupported, match=re.escape(CLIENT_SHM_DISABLED)):
            call()
    assert registry.status() == [] and registry.status(kind="cuda") == []


async def test_metadata_and_uploads_follow_the_switches() -> None:
    closed = Core.over(Directory(), shm=SharedMemoryRegistry(allow_client=False),
                       control_mode="explicit")
    assert not any("shared_memory" in e for e in closed.server_metadata()["extensions"])
    with pytest.raises(Unsupported, match="--allow-model-file-upload=true"):
        await closed.load_model("m", None, {"1/model.py": b"print('hi')"})
    opened = Core.over(Directory(), control_mode="explicit", allow_model_file_upload=True)
    assert "system_shared_memory" in opened.server_metadata()["extensions"]
    # past the switch the load goes to the manager (none here: UNAVAILABLE)
    with pytest.raises(Unavailable, match="shutting down"):
        await opened.load_model("m", None, {"1/model.py": b"print('hi')"})

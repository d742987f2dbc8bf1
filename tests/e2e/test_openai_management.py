"""The OpenAI port's model management, /metrics and restricted API groups, as Triton's OpenAI
frontend serves them (``POST /v1/models/{model}/load|unload`` in explicit mode,
``--openai-restricted-api <APIs> <header> <value>``), driven by the ``openai`` SDK and raw
HTTP against ``python -m nursery serve``."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ROOT, ServerProcess, running_server

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parents[1] / "models"
KEY = {"admin-key": "admin-value"}
SECRET = "admin-value"


def _repo(root: Path) -> Path:
    repo = root / "repo"
    for name in ("llm_plain", "llm_embed"):
        shutil.copytree(MODELS / name, repo / name)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = _repo(tmp_path_factory.mktemp("openai-mgmt"))
    with running_server(repo, "--model-control-mode", "explicit", "--load-model", "*",
                        "--openai-restricted-api", "inference,model-repository",
                        "admin-key", SECRET,
                        tmp_path_factory=tmp_path_factory, openai=True) as proc:
        yield proc


def _call(server: ServerProcess, method: str, path: str, headers: dict[str, str] | None = None,
          body: Any = None) -> tuple[int, Any]:
    assert server.openai_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", server.openai_port, timeout=60)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data,
                     headers={**(headers or {}), **({"content-type": "application/json"}
                                                     if data else {})})
        answer = conn.getresponse()
        raw = answer.read()
        kind = answer.getheader("content-type") or ""
        return answer.status, json.loads(raw) if "json" in kind and raw else raw
    finally:
        conn.close()


@pytest.mark.parametrize("headers", [None, {"admin-key": "wrong-value"},
                                     {"wrong-key": SECRET}, {"admin-key": SECRET.upper()}],
                         ids=["none", "wrong value", "wrong key", "value in capitals"])
def test_restricted_groups_want_their_header(server: ServerProcess,
                                             headers: dict[str, str] | None) -> None:
    chat = {"model": "llm_plain", "prompt": "hello"}
    for method, path, body in [("GET", "/v1/models", None), ("GET", "/v1/models/llm_plain", None),
                               ("HEAD", "/v1/models", None),
                               ("POST", "/v1/completions", chat),
                               ("POST", "/v1/chat/completions", chat),
                               ("POST", "/v1/embeddings", {"model": "llm_embed", "input": "x"}),
                               ("POST", "/v1/models/llm_plain/unload", None),
                               ("POST", "/v1/models/llm_plain/load", None),
                               ("POST", "/v1/completions/", chat),
                               ("POST", "/v1/%63ompletions", chat)]:
        status, answer = _call(server, method, path, headers, body)
        assert status == 401, (method, path, status, answer)
        if method != "HEAD":
            assert answer == {"error": {
                "message": "This API is restricted, expecting header 'admin-key' with valid "
                           "value", "type": "authentication_error", "code": "invalid_auth"}}
    # the group left open
    assert _call(server, "GET", "/health/ready", headers)[0] == 200
    # a header's name in any case (HTTP's), its value as configured
    assert _call(server, "GET", "/v1/models", {"ADMIN-KEY": SECRET})[0] == 200


def test_the_sdk_with_the_header_and_without(server: ServerProcess) -> None:
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0,
                       default_headers=KEY) as client:
        assert {m.id for m in client.models.list()} >= {"llm_plain", "llm_embed"}
        answer = client.completions.create(model="llm_plain", prompt="quiet words")
        assert answer.choices[0].text == "QUIET WORDS"
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            client.completions.create(model="llm_plain", prompt="quiet words")
        assert "expecting header 'admin-key'" in str(caught.value)


def test_metrics_and_health_on_the_openai_port(server: ServerProcess) -> None:
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0,
                       default_headers=KEY) as client:
        client.completions.create(model="llm_plain", prompt="counted")
    status, text = _call(server, "GET", "/metrics")
    assert status == 200
    assert b'nv_inference_request_success{model="llm_plain",version="1"}' in text
    assert _call(server, "GET", "/health/ready")[0] == 200


def test_load_and_unload(server: ServerProcess) -> None:
    def listed() -> set[str]:
        status, answer = _call(server, "GET", "/v1/models", KEY)
        assert status == 200
        return {m["id"] for m in answer["data"]}

    status, answer = _call(server, "POST", "/v1/models/llm_embed/unload", KEY)
    assert (status, answer) == (200, {"status": "success", "model": "llm_embed"})
    assert "llm_embed" not in listed()
    assert _call(server, "GET", "/v1/models/llm_embed", KEY)[0] == 404
    status, answer = _call(server, "POST", "/v1/models/llm_embed/unload", KEY)
    assert (status, answer) == (400, {"detail": "Unknown model: llm_embed"})

    status, answer = _call(server, "POST", "/v1/models/llm_embed/load", KEY)
    assert status == 200 and answer["id"] == "llm_embed" and answer["object"] == "model"
    assert answer["owned_by"] == "Triton Inference Server" and answer["created"] > 0
    assert "llm_embed" in listed()
    status, answer = _call(server, "POST", "/v1/models/llm_embed/load", KEY)
    assert (status, answer) == (400, {"detail": "Model 'llm_embed' is already loaded"})
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0,
                       default_headers=KEY) as client:
        assert len(client.embeddings.create(model="llm_embed", input="back").data) == 1


def test_load_refusals(server: ServerProcess) -> None:
    status, answer = _call(server, "POST", "/v1/models/no_such_model/load", KEY)
    assert status == 500 and "failed to poll from model repository" in answer["detail"]
    assert answer["detail"].startswith("Failed to load model 'no_such_model': ")
    for name, expected in [("..", 400), ("%20%20", 400), ("%0A%09", 400),
                           ("../../etc", 404), ("model/..", 404), ("model/subdir", 404),
                           ("model/", 404), ("", 404)]:
        for action in ("load", "unload"):
            status, answer = _call(server, "POST", f"/v1/models/{name}/{action}", KEY)
            assert status == expected, (name, action, status, answer)


def test_load_and_unload_need_explicit_mode(tmp_path: Path, start_server: type) -> None:
    proc = start_server(_repo(tmp_path), openai=True)
    for action in ("load", "unload"):
        status, answer = _call(proc, "POST", f"/v1/models/llm_plain/{action}")
        assert (status, answer) == (
            400, {"detail": "Model load/unload requires --model-control-mode=explicit"})
    assert b"API restrictions enabled" not in proc.log().encode()


@pytest.mark.parametrize(("groups", "message"), [
    ([["unknown-endpoint", "k", "v"]], "Unknown API 'unknown-endpoint'. Available APIs: "
                                       "['inference', 'model-repository', 'metrics', 'health']"),
    ([["inference,unknown", "k", "v"]], "Unknown API 'unknown'"),
    ([["inference,inference", "k", "v"]],
     "restricted api 'inference' can not be specified in multiple config groups"),
    ([["inference", "k1", "v1"], ["model-repository", "k2", "v2"], ["inference", "k3", "v3"]],
     "restricted api 'inference' can not be specified in multiple config groups"),
])
def test_malformed_restrictions_stop_the_start(tmp_path: Path, start_server: type,
                                               groups: list[list[str]], message: str) -> None:
    flags = [word for group in groups for word in ("--openai-restricted-api", *group)]
    proc = start_server(_repo(tmp_path), *flags, openai=True, wait=False)
    assert proc.wait_exit() != 0
    assert message in proc.log()


def test_the_start_up_line_names_the_header_not_its_value(server: ServerProcess) -> None:
    log = server.log()
    assert "API restrictions enabled. Restricted API endpoints: " in log
    assert "'inference': 'admin-key'" in log and SECRET not in log


# -- Triton's OpenAI frontend's own command line ---------------------------------------------------

def _frontend(repo: Path, *flags: str, kserve: bool = False
              ) -> Callable[[ServerProcess], list[str]]:
    """``python -m nursery openai`` with the frontend's flags, on the process's free ports."""
    def command(proc: ServerProcess) -> list[str]:
        argv = [sys.executable, "-m", "nursery", "openai", "--model-repository", str(repo),
                "--host", "127.0.0.1", "--openai-port", str(proc.openai_port), *flags]
        if kserve:
            argv += ["--enable-kserve-frontends", "--kserve-http-port", str(proc.http_port),
                     "--kserve-grpc-port", str(proc.grpc_port)]
        return argv
    return command


def test_the_frontends_command_line(tmp_path: Path, start_server: type) -> None:
    repo = _repo(tmp_path)
    proc = start_server(repo, openai=True, wait=False, command=_frontend(
        repo, "--model-control-mode", "explicit", "--load-model", "llm_plain",
        "--tritonserver-log-verbose-level", "1", "--uvicorn-log-level", "warning",
        "--openai-restricted-api", "metrics", "m-key", "m-value"))
    _wait(proc)
    with openai.OpenAI(base_url=proc.openai_url, api_key="unused", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["llm_plain"]
        assert client.completions.create(model="llm_plain", prompt="hi there").choices[0].text \
            == "HI THERE"
    assert _call(proc, "GET", "/metrics")[0] == 401
    assert _call(proc, "GET", "/metrics", {"m-key": "m-value"})[0] == 200
    assert _call(proc, "POST", "/v1/models/llm_embed/load")[0] == 200
    log = proc.log()
    # no KServe ports and no metrics port unless asked for, as Triton's frontend
    assert "Started HTTPService" not in log and "Started GRPCInferenceService" not in log
    assert "Started Metrics Service" not in log


def test_the_frontends_kserve_ports(tmp_path: Path, start_server: type) -> None:
    repo = _repo(tmp_path)
    proc = start_server(repo, openai=True, wait=False, command=_frontend(repo, kserve=True))
    proc.wait_ready()  # the KServe HTTP port
    with httpclient.InferenceServerClient(proc.url) as client:
        assert client.is_model_ready("llm_plain")
    with grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc_port}") as client:
        assert client.is_server_live()
    assert _call(proc, "GET", "/health/ready")[0] == 200


@pytest.mark.parametrize(("flags", "message"), [
    (["--load-model", "llm_plain"],
     "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
    (["--openai-restricted-api", "inference,inference", "k", "v"],
     "[ERROR] Failed to initialize FastAPI frontend: restricted api 'inference' can not be "
     "specified in multiple config groups"),
])
def test_the_frontends_refusals(tmp_path: Path, flags: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "nursery", "openai", "--model-repository",
                           str(_repo(tmp_path)), *flags], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 1 and message in done.stderr


def _wait(proc: ServerProcess, timeout: float = 60.0) -> None:
    """Until the OpenAI port answers /health/ready (the frontend opens no KServe port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, proc.log()
        try:
            if _call(proc, "GET", "/health/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(proc.log())

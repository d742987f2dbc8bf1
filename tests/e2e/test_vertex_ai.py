"""The Vertex AI frontend end to end: ``python -m nursery serve --allow-vertex-ai=true`` (or
``AIP_MODE=PREDICTION``) on a free port, driven as Triton's qa/L0_vertex_ai drives it
(requests, with tritonclient building the bodies)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.conftest import ADD_SUB_DATA, ROOT, ServerProcess, add_sub_body, free_port

REPO = ROOT / "model_repository"
BINARY = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT = "X-Vertex-Ai-Triton-Redirect"
DATA = ADD_SUB_DATA


def _routes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AIP_MODE", "AIP_HTTP_PORT", "AIP_STORAGE_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/predict")
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/health")


def _start(start_server: type[ServerProcess], *extra: str) -> tuple[ServerProcess, str]:
    port = free_port()
    server = start_server(REPO, "--model-control-mode=explicit", "--load-model=add_sub",
                          "--allow-vertex-ai=true", f"--vertex-ai-port={port}", *extra)
    return server, f"http://127.0.0.1:{port}"


def _post(url: str, redirect: str | None = None, **headers: str) -> requests.Response:
    if redirect is not None:
        headers[REDIRECT] = redirect
    return requests.post(f"{url}/predict", headers=headers, timeout=30)


def test_predict_health_and_redirects(start_server: type[ServerProcess],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _routes(monkeypatch)
    server, url = _start(start_server)
    assert f"Started Vertex AI HTTPService at 127.0.0.1:{url.rsplit(':', 1)[1]}" in server.log()
    health = requests.get(f"{url}/health", timeout=10)
    assert (health.status_code, health.content) == (200, b"")
    assert requests.post(f"{url}/health", timeout=10).status_code == 405

    # the default model (the one ready model), plain JSON
    body, _ = add_sub_body(False, False)
    r = requests.post(f"{url}/predict", data=body, headers={"Content-Type": "application/json"},
                      timeout=30)
    assert r.status_code == 200, r.text
    result = httpclient.InferenceServerClient.parse_response_body(r.content)
    assert result.as_numpy("OUTPUT0").tolist() == (DATA * 2).tolist()
    assert requests.get(f"{url}/predict", timeout=10).status_code == 405

    # a binary input, its JSON header's size in Vertex AI's content type
    body, length = add_sub_body(True, False)
    r = requests.post(f"{url}/predict", data=body, headers={"Content-Type": f"{BINARY}{length}"},
                      timeout=30)
    assert r.status_code == 200, r.text
    result = httpclient.InferenceServerClient.parse_response_body(r.content)
    assert result.as_numpy("OUTPUT1").tolist() == [[0.0] * 16]
    # ... and Inference-Header-Content-Length is not Vertex AI's: the whole body is read as
    # JSON, which the binary block makes unparseable (Triton's status for that: 500)
    r = requests.post(f"{url}/predict", data=body,
                      headers={"Inference-Header-Content-Length": str(length)}, timeout=30)
    assert r.status_code == 500
    assert r.json()["error"].startswith("failed to parse the request JSON buffer")

    # a binary output: announced as on the KServe port
    body, _ = add_sub_body(False, True)
    r = requests.post(f"{url}/predict", data=body, timeout=30)
    assert r.status_code == 200, r.text
    result = httpclient.InferenceServerClient.parse_response_body(
        r.content, header_length=int(r.headers["Inference-Header-Content-Length"]))
    assert result.as_numpy("OUTPUT0").tolist() == (DATA * 2).tolist()

    # malformed content types: 400 with Triton's words, and the server stays up
    body, length = add_sub_body(True, False)
    for content_type, words in [
        (f"additional-string/{BINARY}{length}", "expect MIME type for binary data starts with"),
        (f"{BINARY}additional-string{length}", "Unable to parse inference header size"),
        (f"{BINARY}-123", "inference header size should be in range"),
        (f"{BINARY}12345", "inference header size should be in range"),
        (f"{BINARY}99999999999", "value is out of range"),
    ]:
        r = requests.post(f"{url}/predict", data=body, headers={"Content-Type": content_type},
                          timeout=30)
        assert r.status_code == 400, content_type
        assert words in r.json()["error"]
    assert requests.get(f"{url}/health", timeout=10).status_code == 200

    # redirects to the KServe endpoints
    body, _ = add_sub_body(False, False)
    r = requests.post(f"{url}/predict", data=body, headers={REDIRECT: "v2/models/add_sub/infer"},
                      timeout=30)
    assert r.status_code == 200 and r.json()["model_name"] == "add_sub"
    r = requests.post(f"{url}/predict", data=body,
                      headers={REDIRECT: "v2/models/add_sub/versions/1/infer"}, timeout=30)
    assert r.status_code == 200 and r.json()["model_version"] == "1"
    r = _post(url, "metrics")
    assert r.status_code == 200 and "nv_inference_request_success" in r.text
    r = _post(url, "v2/models/stats")
    assert r.status_code == 200 and "model_stats" in r.text and "add_sub" in r.text
    r = _post(url, "v2/models/add_sub/stats")
    assert r.status_code == 200 and r.json()["model_stats"][0]["name"] == "add_sub"
    assert _post(url, "v2/health/live").status_code == 200
    assert _post(url, "v2/models/add_sub/ready").status_code == 200
    assert _post(url, "v2/models/mlp/ready").status_code == 400  # not loaded
    r = _post(url, "v2")
    assert r.status_code == 200 and "extensions" in r.json()
    r = _post(url, "v2/models/add_sub")
    assert r.status_code == 200 and "platform" in r.json()
    r = _post(url, "v2/models/add_sub/config")
    assert r.status_code == 200 and "version_policy" in r.json()
    for shm in ("systemsharedmemory", "cudasharedmemory"):
        r = _post(url, f"v2/{shm}/status")
        assert (r.status_code, r.json()) == (200, [])
        assert _post(url, f"v2/{shm}/region/test/register").status_code == 403
    r = _post(url, "v2/repository/index")
    assert r.status_code == 200
    assert {m["name"]: m.get("state") for m in r.json()}["add_sub"] == "READY"
    # loads and unloads need the HTTP port
    assert _post(url, "v2/repository/models/add_sub/unload").status_code == 403
    assert _post(url, "v2/repository/models/mlp/load").status_code == 403
    assert requests.get(f"http://{server.url}/v2/models/add_sub/ready",
                        timeout=10).status_code == 200  # still loaded
    r = requests.get(f"{url}/predict", headers={REDIRECT: "v2"}, timeout=10)
    assert (r.status_code, r.content) == (405, b"")
    assert _post(url, "v2/logging").status_code == 400
    r = requests.get(f"{url}/elsewhere", timeout=10)
    assert (r.status_code, r.content) == (400, b"")


def test_restricted_apis_and_input_size(start_server: type[ServerProcess],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """--http-restricted-api and --http-max-input-size hold on the Vertex AI port too."""
    _routes(monkeypatch)
    _, url = _start(start_server, "--http-max-input-size=400",
                    "--http-restricted-api=metadata,model-config,model-repository,statistics,"
                    "shared-memory:X-Vertex-Restricted=secret")
    body, _ = add_sub_body(False, False)  # about 330 bytes
    assert requests.post(f"{url}/predict", data=body, timeout=30).status_code == 200
    large = np.arange(64, dtype=np.float32).reshape(1, 64)
    big = httpclient.InferInput("INPUT0", [1, 64], "FP32")
    big.set_data_from_numpy(large, binary_data=False)
    payload, _ = httpclient.InferenceServerClient.generate_request_body([big, big])
    assert requests.post(f"{url}/predict", data=payload, timeout=30).status_code == 400
    endpoints = ["v2", "v2/models/add_sub/config", "v2/repository/index",
                 "v2/systemsharedmemory/status", "v2/cudasharedmemory/status",
                 "v2/models/add_sub/stats"]
    for endpoint in endpoints:
        r = _post(url, endpoint)
        assert r.status_code == 403, endpoint
        assert r.json()["error"] == "This API is restricted, expecting header 'X-Vertex-Restricted'"
        assert _post(url, endpoint, **{"X-Vertex-Restricted": "invalid"}).status_code == 403
        assert _post(url, endpoint, **{"X-Vertex-Restricted": "secret"}).status_code == 200
    for blocked in ("v2/systemsharedmemory/region/test/register",
                    "v2/repository/models/add_sub/load", "v2/repository/models/add_sub/unload"):
        assert _post(url, blocked, **{"X-Vertex-Restricted": "secret"}).status_code == 403
    assert _post(url, "v2/health/ready").status_code == 200  # health is not restricted here


def _run_to_exit(args: list[str], env: dict[str, str], tmp_path: Path,
                 timeout: float = 60.0) -> tuple[int, str]:
    log = tmp_path / f"exit{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        proc = subprocess.run([sys.executable, "-m", "nursery", "serve", *args], stdout=out,
                              stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout,
                              check=False)
    return proc.returncode, log.read_text(errors="replace")


def test_start_up_refusals(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}
    env["PYTHONUNBUFFERED"] = "1"
    base = ["--model-repository", str(REPO), "--model-control-mode=explicit",
            "--load-model=add_sub", "--http-address=127.0.0.1", f"--http-port={free_port()}",
            f"--grpc-port={free_port()}", f"--metrics-port={free_port()}",
            "--allow-vertex-ai=true", f"--vertex-ai-port={free_port()}"]
    code, log = _run_to_exit(base, {**env, "AIP_HEALTH_ROUTE": "/health"}, tmp_path)
    assert code == 1
    assert ("failed to start Vertex AI service: Invalid argument - API_PREDICT_ROUTE is not "
            "defined for Vertex AI endpoint") in log
    routes = {**env, "AIP_HEALTH_ROUTE": "/health", "AIP_PREDICT_ROUTE": "/predict"}
    code, log = _run_to_exit([*base, "--vertex-ai-default-model=mlp"], routes, tmp_path)
    assert code == 1 and "Expect the default model 'mlp' is loaded" in log
    code, log = _run_to_exit([*base, "--load-model=mlp"], routes, tmp_path)
    assert code == 1 and ("Expect the model repository contains only a single model if "
                          "default model is not specified") in log


def test_a_vertex_ai_container(tmp_path: Path) -> None:
    """AIP_MODE=PREDICTION: the Vertex AI port alone, at AIP_HTTP_PORT, serving the models
    of AIP_STORAGE_URI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}
    port = free_port()
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "add_sub").symlink_to(REPO / "add_sub")
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=path, AIP_MODE="PREDICTION", AIP_HTTP_PORT=str(port),
               AIP_PREDICT_ROUTE="/predict", AIP_HEALTH_ROUTE="/health",
               AIP_STORAGE_URI=str(repo))
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "nursery", "serve",
                                 "--http-address=127.0.0.1", f"--metrics-port={free_port()}"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        body, _ = add_sub_body(False, False)
        r = requests.post(f"{url}/predict", data=body, timeout=30)
        assert r.status_code == 200 and r.json()["model_name"] == "add_sub"
        text = log_path.read_text()
        assert "Started HTTPService" not in text and "Started GRPCInferenceService" not in text
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, log_path.read_text()

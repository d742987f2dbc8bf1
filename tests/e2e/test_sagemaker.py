"""The SageMaker frontend end to end: ``python -m nursery serve --allow-sagemaker=true`` on a
free port, driven as Triton's qa/L0_sagemaker drives it (requests, with tritonclient building
the bodies)."""

from __future__ import annotations

import json
import shutil
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
BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="
DATA = ADD_SUB_DATA


def _start(start_server: type[ServerProcess], monkeypatch: pytest.MonkeyPatch, *extra: str,
           model: str | None = "add_sub") -> tuple[ServerProcess, str]:
    if model is not None:
        monkeypatch.setenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", model)
    else:
        monkeypatch.delenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", raising=False)
    port = free_port()
    server = start_server(REPO, "--model-control-mode=explicit", "--load-model=add_sub",
                          "--allow-sagemaker=true", f"--sagemaker-port={port}", *extra)
    return server, f"http://127.0.0.1:{port}"


def test_ping_and_invocations(start_server: type[ServerProcess],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    server, url = _start(start_server, monkeypatch)
    assert f"Started Sagemaker HTTPService at 127.0.0.1:{url.rsplit(':', 1)[1]}" in server.log()
    ping = requests.get(f"{url}/ping", timeout=10)
    assert (ping.status_code, ping.content) == (200, b"")
    assert requests.post(f"{url}/ping", timeout=10).status_code == 405

    # plain JSON, as the KServe route takes it
    body, _ = add_sub_body(False, False)
    r = requests.post(f"{url}/invocations", data=body,
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    answer = r.json()
    assert answer["model_name"] == "add_sub"
    assert answer["outputs"][0]["data"] == (DATA * 2).ravel().tolist()
    assert answer["outputs"][1]["data"] == [0.0] * 16

    # a binary input, its JSON header's size in SageMaker's content type
    body, length = add_sub_body(True, False)
    r = requests.post(f"{url}/invocations", data=body,
                      headers={"Content-Type": f"{BINARY}{length}"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == (DATA * 2).ravel().tolist()

    # a binary output: the answer's content type says where its JSON header ends
    body, _ = add_sub_body(False, True)
    r = requests.post(f"{url}/invocations", data=body,
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(BINARY)
    result = httpclient.InferenceServerClient.parse_response_body(
        r.content, header_length=int(r.headers["content-type"][len(BINARY):]))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA * 2)

    # malformed content types cost their own request (400), not the server
    body, length = add_sub_body(True, False)
    for content_type in (f"additional-string/{BINARY}{length}", f"{BINARY}abc{length}",
                         f"{BINARY}-123", f"{BINARY}12345"):
        r = requests.post(f"{url}/invocations", data=body,
                          headers={"Content-Type": content_type}, timeout=30)
        assert r.status_code == 400, content_type
        assert "error" in r.json()
    assert requests.get(f"{url}/invocations", timeout=10).status_code == 405
    # unknown routes: 400; the multi-model table is empty
    assert requests.get(f"{url}/v2/health/ready", timeout=10).status_code == 400
    models = requests.get(f"{url}/models", timeout=10)
    assert (models.status_code, models.json()) == (200, {"models": []})
    assert requests.get(f"{url}/models/add_sub", timeout=10).status_code == 404
    assert requests.delete(f"{url}/models/add_sub", timeout=10).status_code == 404
    assert requests.post(f"{url}/models/add_sub/invoke", data=body, timeout=10).status_code == 404
    # the KServe port still serves beside it
    assert requests.get(f"http://{server.url}/v2/health/ready", timeout=10).status_code == 200


def test_default_model_unset(start_server: type[ServerProcess],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Without SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, /invocations names Triton's placeholder."""
    _, url = _start(start_server, monkeypatch, model=None)
    r = requests.post(f"{url}/invocations", data=b"dummy", timeout=10)
    assert r.status_code != 200
    assert ("Request for unknown model: 'unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME' is "
            "not found") in r.text


def test_restricted_api_applies(start_server: type[ServerProcess],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--http-restricted-api guards the SageMaker port's groups as the HTTP port's."""
    _, url = _start(start_server, monkeypatch,
                    "--http-restricted-api=model-repository:X-SM-Auth=secret",
                    "--http-restricted-api=inference:X-Auth=secret")
    assert requests.get(f"{url}/ping", timeout=10).status_code == 200
    for method, path in (("GET", "/models"), ("GET", "/models/add_sub"),
                         ("POST", "/models"), ("DELETE", "/models/add_sub")):
        r = requests.request(method, f"{url}{path}", timeout=10)
        assert r.status_code == 403 and "This API is restricted" in r.text, path
    assert requests.get(f"{url}/models", headers={"X-SM-Auth": "secret"},
                        timeout=10).status_code == 200
    assert requests.get(f"{url}/models", headers={"X-SM-Auth": "wrong"},
                        timeout=10).status_code == 403
    body, _ = add_sub_body(False, False)
    assert requests.post(f"{url}/invocations", data=body, timeout=30).status_code == 403
    # the multi-model invoke: a model not in the table is 404 before the restriction
    assert requests.post(f"{url}/models/x/invoke", data=body, timeout=30).status_code == 404
    r = requests.post(f"{url}/invocations", data=body, headers={"X-Auth": "secret"}, timeout=30)
    assert r.status_code == 200, r.text


def test_safe_port_range_refuses_other_ports() -> None:
    """A --sagemaker-safe-port-range that the HTTP port lies outside stops the start-up with
    Triton's words."""
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "nursery", "serve", "--model-repository", str(REPO),
         "--http-address", "127.0.0.1", "--http-port", "8000", "--allow-grpc=false",
         "--allow-metrics=false", "--allow-sagemaker=true", f"--sagemaker-port={port}",
         "--sagemaker-safe-port-range=8081-9000"],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0
    assert ("The server cannot listen to HTTP requests at port 8000, allowed port range is "
            "[8081, 9000]") in proc.stderr


def test_invocations_body_past_the_limit(start_server: type[ServerProcess],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A JSON body past --http-max-input-size is refused unread; the server goes on."""
    _, url = _start(start_server, monkeypatch, "--http-max-input-size=4096")
    r = requests.post(f"{url}/invocations", data=json.dumps({"pad": "x" * 10000}),
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400
    body, _ = add_sub_body(False, False)
    assert requests.post(f"{url}/invocations", data=body, timeout=30).status_code == 200


def test_multi_model_endpoint(start_server: type[ServerProcess],
                              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Load from a url under the models root, list, get, invoke, unload, as Triton's
    sagemaker_multi_model_test.py drives it."""
    root = tmp_path / "ml" / "models"
    model = root / "123456789abcdefghi" / "model"
    # its config.pbtxt still says "add_sub": a mapped folder serves under the mapped name
    shutil.copytree(REPO / "add_sub", model)
    broken = root / "987654321broken" / "model"
    broken.mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "mme_broken"\nplatform: "nonsense"\n')
    monkeypatch.setenv("NURSERY_SAGEMAKER_MODELS_ROOT", str(root))
    _, url = _start(start_server, monkeypatch)
    load = {"model_name": "mme_add", "url": str(model)}
    r = requests.post(f"{url}/models", data=json.dumps(load), timeout=60)
    assert (r.status_code, r.content) == (200, b""), r.text
    r = requests.post(f"{url}/models", data=json.dumps(load), timeout=60)
    assert r.status_code == 409 and "error" in r.json()
    entry = {"modelName": "mme_add", "modelUrl": str(model.parent)}
    assert requests.get(f"{url}/models", timeout=10).json() == {"models": [entry]}
    assert requests.get(f"{url}/models/mme_add", timeout=10).json() == entry

    body, _ = add_sub_body(False, True)
    r = requests.post(f"{url}/models/mme_add/invoke", data=body,
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    result = httpclient.InferenceServerClient.parse_response_body(
        r.content, header_length=int(r.headers["content-type"][len(BINARY):]))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA * 2)
    # a bad request to a loaded model: 400 with the error, as every MME invoke failure
    r = requests.post(f"{url}/models/mme_add/invoke", data=b'{"inputs": []}', timeout=30)
    assert r.status_code == 400 and "error" in r.json()

    # urls outside the models root, or into /proc: refused, nothing registered
    for bad in (str(tmp_path / "elsewhere" / "model"), "/proc/self/model"):
        r = requests.post(f"{url}/models", data=json.dumps({"model_name": "x", "url": bad}),
                          timeout=30)
        assert r.status_code == 400, bad
    # a model that fails to load: 400 with the error, its repository unregistered again
    r = requests.post(f"{url}/models", timeout=60,
                      data=json.dumps({"model_name": "mme_broken", "url": str(broken)}))
    assert r.status_code == 400 and "error" in r.json()
    r = requests.post(f"{url}/models", timeout=60,
                      data=json.dumps({"model_name": "mme_broken", "url": str(broken)}))
    assert r.status_code == 400  # not 409: the failed load left nothing registered
    assert requests.get(f"{url}/models", timeout=10).json() == {"models": [entry]}

    r = requests.delete(f"{url}/models/mme_add", timeout=60)
    assert r.status_code == 200, r.text
    assert requests.delete(f"{url}/models/mme_add", timeout=10).status_code == 404
    assert requests.get(f"{url}/models/mme_add", timeout=10).status_code == 404
    assert requests.post(f"{url}/models/mme_add/invoke", data=body,
                         timeout=10).status_code == 404
    assert requests.get(f"{url}/models", timeout=10).json() == {"models": []}
    # unloaded and unregistered: it loads again
    r = requests.post(f"{url}/models", data=json.dumps(load), timeout=60)
    assert r.status_code == 200, r.text
    # a name the server's repository holds too: the mapped folder is that model now (Triton
    # looks a load's name up in the mappings first; L0_trace loads its `simple` so)
    shadow = root / "555shadow" / "model"
    shutil.copytree(REPO / "add_sub", shadow)
    r = requests.post(f"{url}/models", timeout=60,
                      data=json.dumps({"model_name": "add_sub", "url": str(shadow)}))
    assert r.status_code == 200, r.text
    r = requests.post(f"{url}/models/add_sub/invoke", data=body, timeout=30)
    assert r.status_code == 200, r.text


def test_trace_context_propagates(start_server: type[ServerProcess],
                                  monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A `traceparent` on /invocations and on an MME invoke parents the request's spans, as
    on the HTTP port (Triton's L0_trace SageMaker cases), the send's end included."""
    from tests.e2e.test_observability import _Collector

    root = tmp_path / "ml" / "models"
    shutil.copytree(REPO / "add_sub", root / "123456789abcdefghi" / "model")
    monkeypatch.setenv("NURSERY_SAGEMAKER_MODELS_ROOT", str(root))
    collector = _Collector()
    try:
        _, url = _start(start_server, monkeypatch,
                        "--trace-config", "mode=opentelemetry", "--trace-config",
                        "level=TIMESTAMPS", "--trace-config", "rate=1000",
                        "--trace-config", f"opentelemetry,url={collector.url}",
                        "--trace-config", "opentelemetry,bsp_schedule_delay=100")
        r = requests.post(f"{url}/models", timeout=60, data=json.dumps(
            {"model_name": "mme_add", "url": str(root / "123456789abcdefghi" / "model")}))
        assert r.status_code == 200, r.text
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        body, _ = add_sub_body(False, False)
        for path, span in (("/invocations", "00f067aa0ba902b7"),
                           ("/models/mme_add/invoke", "00f067aa0ba902b8")):
            r = requests.post(f"{url}{path}", data=body, timeout=30, headers={
                "Content-Type": "application/json",
                "traceparent": f"00-{trace_id}-{span}-01"})
            assert r.status_code == 200, r.text
        deadline = time.monotonic() + 20
        while len(collector.spans) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        tops = {s.parent_span_id.hex(): s for _, s in collector.spans
                if s.name == "InferRequest"}
        assert sorted(tops) == ["00f067aa0ba902b7", "00f067aa0ba902b8"]
        for top in tops.values():
            assert top.trace_id.hex() == trace_id
            assert [e.name for e in top.events] == [
                "HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE",
                "HTTP_SEND_START", "HTTP_SEND_END"]
        assert sorted(s.name for _, s in collector.spans) == sorted(
            ["InferRequest", "InferRequest", "add_sub", "mme_add", "compute", "compute"])
    finally:
        collector.close()

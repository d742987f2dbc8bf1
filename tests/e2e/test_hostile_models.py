"""Careless models and hostile repository calls cost their own request, never the server.

Each test is a regression test for a trigger of issue 21: a model whose ``execute`` never
returns (its unload used to hang, and every repository call behind it, and SIGTERM never
finished), a ``file:`` override naming one path as a file and as a folder, and a model name
longer than a file system allows (both used to end the process); issue 22 adds ``file:``
paths longer than the file system allows.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, make_models, wait_for_file
from tests.e2e.test_http_tritonclient import _raw

pytestmark = pytest.mark.e2e


def _fp32(value: float) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
    return [tensor]


def _metric(server: ServerProcess, name: str, unit: str) -> float:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{unit="{unit}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {unit} not in the metrics:\n{text}")


def test_hung_model_does_not_hold_up_the_server(tmp_path: Path,
                                                start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "models" / "py_hang", repo / "py_hang")
    marker = tmp_path / "hanging"
    with (repo / "py_hang" / "config.pbtxt").open("a") as config:
        config.write(f'parameters {{ key: "hang_marker" value {{ string_value: "{marker}" }} }}\n')
    make_models.write_add_sub(repo)
    make_models.write_mlp(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=py_hang",
                          "--model-unload-timeout-secs=2", "--exit-timeout-secs=5")
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    np.testing.assert_array_equal(client.infer("py_hang", _fp32(1.0)).as_numpy("OUTPUT0"),
                                  np.ones((1, 4), np.float32))

    hung: list[BaseException | None] = []

    def hang() -> None:
        try:
            with httpclient.InferenceServerClient(server.url, network_timeout=120) as c:
                c.infer("py_hang", _fp32(-1.0))
            hung.append(None)
        except BaseException as exc:  # noqa: BLE001 - the answer is the point
            hung.append(exc)

    worker = threading.Thread(target=hang)
    worker.start()
    wait_for_file(marker)
    marker.unlink()
    # while the model hangs, the repository API serves other models at once
    assert {"name": "add_sub"} in client.get_model_repository_index()
    client.load_model("add_sub")
    assert client.is_model_ready("add_sub")
    # the unload of the hung model returns: its instance is abandoned after the timeout
    client.unload_model("py_hang")
    worker.join(60)
    assert not worker.is_alive()
    assert isinstance(hung[0], InferenceServerException)
    assert "did not return within the unload timeout and was abandoned" in str(hung[0])
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["py_hang"]["state"] == "UNAVAILABLE"
    # the hung thread stays behind, but the model loads again and serves
    client.load_model("py_hang")
    assert client.infer("py_hang", _fp32(2.0)).as_numpy("OUTPUT0")[0, 0] == 2.0
    # a second hang, then SIGTERM: the shutdown finishes (exit code 0) instead of waiting
    worker = threading.Thread(target=hang)
    worker.start()
    wait_for_file(marker)
    client.load_model("mlp")
    assert server.stop(timeout=60) == 0, server.log()
    worker.join(60)
    assert hung[1] is not None  # an error answer, or the connection closed at the exit
    assert "abandoned its thread" in server.log()


def test_repository_load_with_file_and_folder_of_one_path(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--allow-model-file-upload=true")
    config = (repo / "add_sub" / "config.pbtxt").read_text()
    model = (repo / "add_sub" / "1" / "model.onnx").read_bytes()
    body = {"parameters": {
        "config": json.dumps({"name": "copy", "backend": "onnxruntime"}),
        "file:1/model.onnx": base64.b64encode(model).decode(),
        "file:1/model.onnx/inner": base64.b64encode(b"x").decode(),
    }}
    status, answer = _raw(server, "POST", "/v2/repository/models/copy/load",
                          json.dumps(body).encode())
    assert status == 500, answer  # Triton's status for a load that fails to poll
    assert b"cannot be written" in answer
    # the same load in the other order: the folder first, then a file over it
    body["parameters"] = dict(reversed(list(body["parameters"].items())))
    status, answer = _raw(server, "POST", "/v2/repository/models/copy/load",
                          json.dumps(body).encode())
    assert status == 500 and b"cannot be written" in answer
    assert config  # the server still serves what it has
    status, _ = _raw(server, "GET", "/v2/health/live")
    assert status == 200
    http = httpclient.InferenceServerClient(server.url)
    http.load_model("add_sub")
    assert http.is_model_ready("add_sub")


def test_model_name_longer_than_a_file_name(tmp_path: Path,
                                            start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--allow-model-file-upload=true")
    name = "m" * 300
    status, answer = _raw(server, "POST", f"/v2/repository/models/{name}/load", b"{}")
    assert status == 500 and b"longer than 255 bytes" in answer, answer
    body = {"parameters": {"config": json.dumps({"name": name, "backend": "onnxruntime"}),
                           "file:1/model.onnx": base64.b64encode(b"x").decode()}}
    status, answer = _raw(server, "POST", f"/v2/repository/models/{name}/load",
                          json.dumps(body).encode())
    assert status == 500 and b"longer than 255 bytes" in answer, answer
    status, _ = _raw(server, "POST", f"/v2/repository/models/{name}/unload", b"{}")
    assert status in (200, 400)
    # a file: override whose path is too long: one part over 255 bytes, or the whole path
    # over the system's limit (issue 22): that load fails, the server goes on
    for path in ("1/" + "p" * 300 + "/model.onnx", "/".join(["d" * 200] * 30) + "/model.onnx"):
        body = {"parameters": {"config": json.dumps({"name": "long", "backend": "onnxruntime"}),
                               f"file:{path}": base64.b64encode(b"x").decode()}}
        status, answer = _raw(server, "POST", "/v2/repository/models/long/load",
                              json.dumps(body).encode())
        assert status == 500 and b"cannot be written: File name too long" in answer, answer
    status, _ = _raw(server, "GET", "/v2/health/live")
    assert status == 200
    assert _metric(server, "nursery_internal_errors_total", "manager") == 0

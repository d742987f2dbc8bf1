"""Models that come and go with demand (issue 28, explicit mode, opt-in): a request loads a
model that is not loaded, concurrent requests share one load, ``--model-load-budget`` unloads
the least recently used idle model, ``--model-load-pin`` keeps one; the metrics count it."""

from __future__ import annotations

import re
import shutil
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, make_models, wait_for_file

pytestmark = pytest.mark.e2e


def _wait(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def _add_sub(client: httpclient.InferenceServerClient, model: str = "add_sub") -> None:
    a = np.full((1, 16), 1.5, np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
              httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUTPUT0"), 2 * a)


def _metric(server: ServerProcess, family: str, model: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    match = re.search(rf'^{family}{{model="{model}"[^}}]*}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else None


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for name in ("add_sub", "add_sub_b", "add_sub_c"):
        make_models.write_add_sub(repo, name=name)
    return repo


def test_a_request_loads_its_model_once(tmp_path: Path,
                                        start_server: type[ServerProcess]) -> None:
    server = start_server(_repo(tmp_path), "--model-control-mode=explicit",
                          "--model-load-on-demand")
    http = httpclient.InferenceServerClient(server.url, concurrency=8)
    assert not http.is_model_ready("add_sub")
    _add_sub(http)  # loaded by the request
    assert http.is_model_ready("add_sub")
    # concurrent first requests over HTTP and gRPC wait for one load
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            if i % 2:
                with httpclient.InferenceServerClient(server.url) as http_client:
                    _add_sub(http_client, "add_sub_b")  # closed here, not by a collector
            else:
                grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
                a = np.full((1, 16), 1.0, np.float32)
                inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
                          grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
                for x in inputs:
                    x.set_data_from_numpy(a)
                out = grpc.infer("add_sub_b", inputs).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(out, 2 * a)
                grpc.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert _metric(server, "nursery_model_demand_loads", "add_sub_b") == 1
    assert _metric(server, "nursery_model_demand_loads", "add_sub") == 1
    load = _metric(server, "nv_model_load_duration_secs", "add_sub_b")
    assert load is not None and load > 0
    # a model that no repository holds: Triton's unknown-model answer, as without the flag
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        http.infer("nothing_here", [httpclient.InferInput("INPUT0", [1, 16], "FP32")
                                    .set_data_from_numpy(np.zeros((1, 16), np.float32))])


def test_budget_unloads_the_least_recently_used(tmp_path: Path,
                                                start_server: type[ServerProcess]) -> None:
    server = start_server(_repo(tmp_path), "--model-control-mode=explicit",
                          "--model-load-on-demand", "--model-load-budget=models=2")
    http = httpclient.InferenceServerClient(server.url)
    _add_sub(http, "add_sub")
    _add_sub(http, "add_sub_b")
    _add_sub(http, "add_sub")  # add_sub is now the most recently used
    _add_sub(http, "add_sub_c")  # over the budget: add_sub_b goes
    _wait(lambda: not http.is_model_ready("add_sub_b"))
    assert http.is_model_ready("add_sub") and http.is_model_ready("add_sub_c")
    assert _metric(server, "nursery_model_budget_unloads", "add_sub_b") == 1
    _add_sub(http, "add_sub_b")  # back on demand; add_sub (least recently used) goes
    _wait(lambda: not http.is_model_ready("add_sub"))
    assert http.is_model_ready("add_sub_b") and http.is_model_ready("add_sub_c")
    # a load through the repository API counts against the budget too
    http.load_model("add_sub")
    _wait(lambda: not http.is_model_ready("add_sub_c"))
    assert http.is_model_ready("add_sub") and http.is_model_ready("add_sub_b")


def test_a_pinned_model_stays(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    server = start_server(_repo(tmp_path), "--model-control-mode=explicit",
                          "--load-model=add_sub", "--model-load-on-demand",
                          "--model-load-budget=models=1", "--model-load-pin=add_sub")
    http = httpclient.InferenceServerClient(server.url)
    _add_sub(http, "add_sub_b")
    _add_sub(http, "add_sub_c")  # add_sub_b goes; add_sub is pinned
    _wait(lambda: not http.is_model_ready("add_sub_b"))
    assert http.is_model_ready("add_sub") and http.is_model_ready("add_sub_c")
    _add_sub(http, "add_sub")
    assert http.is_model_ready("add_sub")


def test_flags_need_explicit_mode(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    server = start_server(_repo(tmp_path), "--model-load-on-demand", wait=False)
    assert server.wait_exit() != 0
    assert "only take effect with --model-control-mode=explicit" in server.log()


def test_a_busy_model_is_never_unloaded(tmp_path: Path,
                                        start_server: type[ServerProcess]) -> None:
    repo = _repo(tmp_path)
    shutil.copytree(ROOT / "tests" / "models" / "py_hang", repo / "py_hang")
    marker = tmp_path / "hanging"
    with (repo / "py_hang" / "config.pbtxt").open("a") as config:
        config.write(f'parameters {{ key: "hang_marker" value {{ string_value: "{marker}" }} }}\n')
    server = start_server(repo, "--model-control-mode=explicit", "--model-load-on-demand",
                          "--model-load-budget=models=1", "--model-unload-timeout-secs=2",
                          "--exit-timeout-secs=5")
    http = httpclient.InferenceServerClient(server.url)
    answers: list[BaseException | None] = []

    def hang() -> None:
        data = np.full((1, 4), -1.0, np.float32)
        inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(data)
        try:
            with httpclient.InferenceServerClient(server.url, network_timeout=120) as c:
                c.infer("py_hang", inputs)
            answers.append(None)
        except BaseException as exc:  # noqa: BLE001 - the answer is the point
            answers.append(exc)

    worker = threading.Thread(target=hang)
    worker.start()
    wait_for_file(marker)  # loaded on demand, and its request is in flight
    _add_sub(http)  # over the budget, but the only other model is busy: it stays
    assert http.is_model_ready("py_hang") and http.is_model_ready("add_sub")
    _add_sub(http, "add_sub_b")  # the idle add_sub goes, never the busy py_hang
    _wait(lambda: not http.is_model_ready("add_sub"))
    assert http.is_model_ready("py_hang") and http.is_model_ready("add_sub_b")
    assert server.stop() == 0  # the hung request is answered at shutdown
    worker.join(60)
    assert answers and answers[0] is not None

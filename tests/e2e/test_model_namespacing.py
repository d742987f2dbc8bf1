"""``--model-namespacing=true``: two repositories that hold Python models of the same name,
served side by side and driven by ``tritonclient`` (Triton's qa/L0_model_namespacing, in
both control modes): each ensemble's step takes the model of its own repository, a request
for the shared name is refused as ambiguous, and a step takes the other repository's model
while its own is away."""

from __future__ import annotations

import shutil
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            first, second = a {op} b, a {other} b
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", first),
                                                   pb_utils.Tensor("OUTPUT1", second)]))
        return out
'''

IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""

ENSEMBLE = 'platform: "ensemble"\nmax_batch_size: 0\n' + IO + """
ensemble_scheduling { step [ { model_name: "composing_model" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" }
} ] }
"""

X = np.arange(4, dtype=np.int32)
Y = np.full(4, 10, dtype=np.int32)
ADDSUB, SUBADD = "addsub", "subadd"


def _repositories(tmp_path: Path) -> tuple[Path, Path]:
    """Triton's test_duplication: addsub_repo holds composing_model (OUTPUT0 = sum) and the
    ensemble simple_addsub over it; subadd_repo holds its own composing_model (OUTPUT0 =
    difference) and simple_subadd."""
    repos = []
    for repo_name, ensemble, op, other in (("addsub_repo", "simple_addsub", "+", "-"),
                                           ("subadd_repo", "simple_subadd", "-", "+")):
        repo = tmp_path / repo_name
        model = repo / "composing_model"
        (model / "1").mkdir(parents=True)
        (model / "1" / "model.py").write_text(MODEL.format(op=op, other=other))
        (model / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 0\n' + IO)
        (repo / ensemble / "1").mkdir(parents=True)
        (repo / ensemble / "config.pbtxt").write_text(ENSEMBLE)
        repos.append(repo)
    return repos[0], repos[1]


Client = httpclient.InferenceServerClient | grpcclient.InferenceServerClient


def _behaviour(client: Client, name: str) -> str:
    """Which composing_model answered a request for ``name``: "addsub" or "subadd"."""
    kind = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    inputs = [kind.InferInput("INPUT0", [4], "INT32"), kind.InferInput("INPUT1", [4], "INT32")]
    inputs[0].set_data_from_numpy(X)
    inputs[1].set_data_from_numpy(Y)
    result = client.infer(name, inputs)
    first, second = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    if np.array_equal(first, X + Y):
        np.testing.assert_array_equal(second, X - Y)
        return ADDSUB
    np.testing.assert_array_equal(first, X - Y)
    np.testing.assert_array_equal(second, X + Y)
    return SUBADD


def _refused(client: Client, name: str) -> str:
    """The message of the error a request for ``name`` gets."""
    with pytest.raises(InferenceServerException) as caught:
        _behaviour(client, name)
    return str(caught.value.message())


def _until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except InferenceServerException:
            pass
        time.sleep(0.2)
    raise AssertionError("the server never reached the expected state")


def test_poll_mode_serves_both_and_follows_a_model_that_leaves_and_returns(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    addsub, subadd = _repositories(tmp_path)
    server = start_server([addsub, subadd], "--model-namespacing=true",
                          "--model-control-mode=poll", "--repository-poll-secs=1")
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert http.is_server_ready()
    for client in (http, grpc):
        assert _behaviour(client, "simple_addsub") == ADDSUB
        assert _behaviour(client, "simple_subadd") == SUBADD
        message = _refused(client, "composing_model")
        assert message == ("There are 2 identifiers of model 'composing_model' in global map, "
                           "model namespace must be provided to resolve ambiguity.")
    assert not http.is_model_ready("composing_model")
    with pytest.raises(InferenceServerException, match="ambiguity"):
        http.get_model_metadata("composing_model")
    index = http.get_model_repository_index()
    assert sorted((m["name"], m["state"]) for m in index) == [
        ("composing_model", "READY"), ("composing_model", "READY"),
        ("simple_addsub", "READY"), ("simple_subadd", "READY")]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as answer:
        text = answer.read().decode()
    for repo in (addsub, subadd):  # one series per model, told apart as Triton does
        assert (f'nv_inference_request_success{{model="composing_model",namespace="{repo}",'
                'version="1"}') in text, text

    shutil.move(addsub / "composing_model", tmp_path / "composing_model")
    _until(lambda: _behaviour(http, "composing_model") == SUBADD)
    assert _behaviour(http, "simple_addsub") == SUBADD  # its own step is gone
    assert _behaviour(grpc, "simple_subadd") == SUBADD

    shutil.move(tmp_path / "composing_model", addsub / "composing_model")
    _until(lambda: _behaviour(http, "simple_addsub") == ADDSUB)
    assert _behaviour(grpc, "simple_subadd") == SUBADD
    assert "ambiguity" in _refused(grpc, "composing_model")
    assert server.stop() == 0


def test_explicit_mode_loads_every_repositorys_model_of_a_name(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """A load by name loads the model of that name in every repository (an ensemble's steps
    with it); an ensemble loaded again once its own step is back takes it; an unload by name
    unloads every repository's model of that name."""
    addsub, subadd = _repositories(tmp_path)
    shutil.move(addsub / "composing_model", tmp_path / "composing_model")
    server = start_server([addsub, subadd], "--model-namespacing=true",
                          "--model-control-mode=explicit")
    http = httpclient.InferenceServerClient(server.url)
    for name in ("simple_addsub", "simple_subadd"):
        http.load_model(name)
    for name in ("simple_addsub", "simple_subadd", "composing_model"):
        assert _behaviour(http, name) == SUBADD

    shutil.move(tmp_path / "composing_model", addsub / "composing_model")
    http.load_model("simple_addsub")  # unchanged itself: its new step loads with it
    assert _behaviour(http, "simple_addsub") == ADDSUB
    assert _behaviour(http, "simple_subadd") == SUBADD
    assert "ambiguity" in _refused(http, "composing_model")

    http.unload_model("composing_model")
    assert "Request for unknown model: 'composing_model' is not found" in _refused(
        http, "composing_model")
    http.load_model("composing_model")  # both come back
    assert "ambiguity" in _refused(http, "composing_model")
    assert _behaviour(http, "simple_addsub") == ADDSUB
    assert server.stop() == 0

"""A Python model loads, unloads and asks after other models (``pb_utils.load_model``,
``unload_model``, ``is_model_ready``: Triton's Python-backend model management, its qa
L0_backend_python/bls ``bls_model_loading``), in a stub process and on a thread, from
``initialize`` (while the server is loading the model itself) and from ``execute``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # as Triton's bls_model_loading: the work runs while the server loads this model
        self.seen = [pb_utils.is_model_ready("add_sub")]
        pb_utils.load_model("add_sub")
        self.seen.append(pb_utils.is_model_ready("add_sub"))
        pb_utils.unload_model("add_sub")
        self.seen.append(pb_utils.is_model_ready("add_sub"))

    def execute(self, requests):
        seen = list(self.seen)
        pb_utils.load_model("add_sub", config=json.dumps(
            {"backend": "onnxruntime", "max_batch_size": 2}))
        seen.append(pb_utils.is_model_ready("add_sub"))
        seen.append(pb_utils.is_model_ready("add_sub", "1"))
        seen.append(pb_utils.is_model_ready("add_sub", "7"))
        seen.append(pb_utils.is_model_ready("no_such_model"))
        try:
            pb_utils.load_model("add_sub", config='{"backend": ')  # not JSON
            seen.append("loaded a broken config")
        except pb_utils.TritonModelException as exc:
            seen.append("failed to parse the 'config' override" in exc.message())
        seen.append(pb_utils.is_model_ready("add_sub"))  # the failed load changed nothing
        try:
            pb_utils.load_model("no_such_model")
            seen.append("loaded a model that is not there")
        except pb_utils.TritonModelException as exc:
            seen.append(bool(exc.message()))
        out = np.array([json.dumps(seen).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", out)]) for _ in requests]
'''


def _repo(tmp_path: Path, extra: str = "") -> Path:
    """The bundled add_sub, and the "manager" model that loads it (``extra``: config lines)."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository" / "add_sub", repo / "add_sub")
    (repo / "manager" / "1").mkdir(parents=True)
    (repo / "manager" / "1" / "model.py").write_text(MODEL)
    (repo / "manager" / "config.pbtxt").write_text(
        'name: "manager"\nbackend: "python"\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]\n' + extra)
    return repo


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_python_model_manages_other_models(tmp_path: Path, start_server, mode: str) -> None:
    repo = _repo(tmp_path, f'parameters {{ key: "nursery_instance_mode" value {{ '
                           f'string_value: "{mode}" }} }}\n')
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=manager")
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    assert client.is_model_ready("manager") and not client.is_model_ready("add_sub")
    item = httpclient.InferInput("IN", [1], "FP32")
    item.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    seen = json.loads(client.infer("manager", [item]).as_numpy("SEEN")[0])
    assert seen == [False, True, False,  # initialize: before, loaded, unloaded
                    True, True, False, False,  # execute: loaded with an override
                    True, True, True]  # a broken config fails and changes nothing
    assert client.get_model_config("add_sub")["max_batch_size"] == 2
    assert server.stop() == 0, server.log()


def test_model_management_from_a_model_needs_explicit_mode(tmp_path: Path,
                                                           start_server) -> None:
    """As a client's load: in polling or none mode a model's load_model is refused in
    Triton's words (and the model's initialize, here, fails its load with them)."""
    server = start_server(_repo(tmp_path), "--exit-on-error=false", "--strict-readiness=false")
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    assert not client.is_model_ready("manager")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "explicit model load / unload is not allowed if polling is enabled" in \
        index["manager"]["reason"], index["manager"]
    assert client.is_model_ready("add_sub")

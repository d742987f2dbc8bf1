"""Instance-group updates in place, end to end (Triton's UpdateInstanceGroup, the behaviour
Triton's qa/L0_model_update checks): a reload that changes only ``instance_group`` keeps the
instances whose settings did not change and adds or removes just the others; a change to
anything else (or to the model's files) loads the version anew. A Python model counts its
``initialize`` and ``finalize`` calls in files, which prove which instances lived."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e

MODEL = '''
import os
import triton_python_backend_utils as pb_utils

COUNTS = {counts!r}


def _bump(kind):
    with open(os.path.join(COUNTS, kind), "a") as f:
        f.write("x")


class TritonPythonModel:
    def initialize(self, args):
        _bump("initialize")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]

    def finalize(self):
        _bump("finalize")
'''

CONFIG = '''name: "counted"
backend: "python"
max_batch_size: {batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{extra}
instance_group [ {groups} ]
'''


class Counted:
    """The model's folder and its counts."""

    def __init__(self, tmp_path: Path) -> None:
        self.repo = tmp_path / "repo"
        self.counts = tmp_path / "counts"
        self.counts.mkdir()
        (self.repo / "counted" / "1").mkdir(parents=True)
        (self.repo / "counted" / "1" / "model.py").write_text(
            MODEL.format(counts=str(self.counts)))
        self.configure("{ count: 1 kind: KIND_CPU }")

    def configure(self, groups: str, batch: int = 0, extra: str = "") -> None:
        (self.repo / "counted" / "config.pbtxt").write_text(
            CONFIG.format(groups=groups, batch=batch, extra=extra))

    def count(self, kind: str) -> int:
        path = self.counts / kind
        return len(path.read_text()) if path.exists() else 0

    def counts_are(self, initialize: int, finalize: int, wait: bool = False) -> None:
        deadline = time.monotonic() + (30 if wait else 0)
        while wait and time.monotonic() < deadline and self.count("finalize") < finalize:
            time.sleep(0.05)
        assert (self.count("initialize"), self.count("finalize")) == (initialize, finalize)


def _infer(client: grpcclient.InferenceServerClient, **sequence: object) -> None:
    data = np.ones(4, np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32")]
    inputs[0].set_data_from_numpy(data)
    result = client.infer("counted", inputs, **sequence)  # type: ignore[arg-type]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def _serve(start_server: type[ServerProcess], model: Counted,
           *flags: str) -> tuple[ServerProcess, grpcclient.InferenceServerClient]:
    server = start_server(model.repo, "--model-control-mode=explicit", *flags)
    return server, grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def test_instances_added_and_removed_in_place(tmp_path: Path,
                                              start_server: type[ServerProcess]) -> None:
    model = Counted(tmp_path)
    model.configure("{ count: 3 kind: KIND_CPU }")
    server, client = _serve(start_server, model)
    client.load_model("counted")
    model.counts_are(3, 0)
    model.configure("{ count: 4 kind: KIND_CPU }")  # one more
    client.load_model("counted")
    model.counts_are(4, 0)
    _infer(client)
    model.configure("{ count: 2 kind: KIND_CPU }")  # two fewer: finalized before the answer
    client.load_model("counted")
    model.counts_are(4, 2)
    _infer(client)
    assert client.get_model_config("counted").config.instance_group[0].count == 2
    # names and the order of the groups do not matter; kind (and device, resources, ...) do
    model.configure('{ name: "a" count: 1 kind: KIND_CPU }, { name: "b" count: 1 kind: KIND_CPU }')
    client.load_model("counted")
    model.counts_are(4, 2)
    model.configure('{ name: "g" count: 1 kind: KIND_GPU }, { name: "c" count: 1 kind: KIND_CPU }')
    client.load_model("counted")
    model.counts_are(5, 3)
    _infer(client)
    # a count of 0 means 1, as in Triton
    model.configure("{ count: 0 kind: KIND_GPU }")
    client.load_model("counted")
    model.counts_are(5, 4)
    client.unload_model("counted")
    model.counts_are(5, 5, wait=True)
    assert "1 instance(s) added, 1 removed, 1 kept" in server.log()


def test_other_changes_load_the_version_anew(tmp_path: Path,
                                             start_server: type[ServerProcess]) -> None:
    model = Counted(tmp_path)
    model.configure("{ count: 2 kind: KIND_CPU }")
    _, client = _serve(start_server, model)
    client.load_model("counted")
    model.counts_are(2, 0)
    # max_batch_size changed: every instance anew, the old ones finalized after
    model.configure("{ count: 2 kind: KIND_CPU }", batch=2)
    client.load_model("counted")
    model.counts_are(4, 2, wait=True)
    # the model file changed: anew too, even with the instance groups unchanged
    with open(model.repo / "counted" / "1" / "model.py", "a") as f:
        f.write("\n# changed\n")
    model.configure("{ count: 3 kind: KIND_CPU }", batch=2)
    client.load_model("counted")
    model.counts_are(7, 4, wait=True)
    # a config given with the load request, differing in the count only: in place
    config = client.get_model_config("counted", as_json=True)["config"]
    config["instance_group"][0]["count"] += 1
    client.load_model("counted", config=json.dumps(config))
    model.counts_are(8, 4)
    # an invalid config fails the load and leaves the version serving as it was
    (model.repo / "counted" / "config.pbtxt").write_text("--- not a config ---")
    with pytest.raises(InferenceServerException):
        client.load_model("counted")
    assert client.is_model_ready("counted")
    model.counts_are(8, 4)


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 4 }"])
def test_an_instance_holding_a_sequence_stays_until_it_ends(
        tmp_path: Path, start_server: type[ServerProcess], strategy: str) -> None:
    model = Counted(tmp_path)
    sequencing = ("sequence_batching { " + strategy + " "
                  "max_sequence_idle_microseconds: 60000000 }")
    model.configure("{ count: 3 kind: KIND_CPU }", extra=sequencing)
    _, client = _serve(start_server, model)
    client.load_model("counted")
    _infer(client, sequence_id=1, sequence_start=True)
    _infer(client, sequence_id=2, sequence_start=True)
    # every CPU instance goes: the one holding no sequence at once, the others at their END
    model.configure("{ count: 1 kind: KIND_GPU }", extra=sequencing)
    client.load_model("counted")
    model.counts_are(4, 1)
    _infer(client, sequence_id=1)
    _infer(client, sequence_id=3, sequence_start=True)  # on the new instance
    model.counts_are(4, 1)
    _infer(client, sequence_id=1, sequence_end=True)
    model.counts_are(4, 2, wait=True)
    _infer(client, sequence_id=2, sequence_end=True)
    model.counts_are(4, 3, wait=True)
    _infer(client, sequence_id=3, sequence_end=True)
    client.unload_model("counted")
    model.counts_are(4, 4, wait=True)


def test_rate_limited_resources_follow_the_update(tmp_path: Path,
                                                  start_server: type[ServerProcess]) -> None:
    model = Counted(tmp_path)

    def needing(count: int) -> str:
        return ('{ count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R1" count: '
                f'{count} }} ] }} }}')

    model.configure(needing(2))
    server, client = _serve(start_server, model, "--rate-limit=execution_count",
                            "--rate-limit-resource=R1:10", "--log-verbose=1")
    client.load_model("counted")
    model.counts_are(1, 0)
    model.configure(needing(32))  # more than there is: refused, the old instance serves on
    with pytest.raises(InferenceServerException, match="limited to 10"):
        client.load_model("counted")
    model.counts_are(1, 0)  # refused before its model was initialized
    _infer(client)
    model.configure(needing(8))  # another resource need: another instance
    client.load_model("counted")
    model.counts_are(2, 1)
    for _ in range(4):
        _infer(client)
    assert "Resource: R1\\t Count: 10" in server.log()  # Triton's pool map, escaped

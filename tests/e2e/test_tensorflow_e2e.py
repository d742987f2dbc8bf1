"""TensorFlow models served end to end (CPU): a SavedModel with its serving signature, one
whose only signature has another name, a signature named by TF_SIGNATURE_DEF, a frozen
GraphDef, and auto-complete from the signature, asked over HTTP and gRPC with tritonclient
and compared with the model's own arithmetic; a SavedModel without a serving signature and a
corrupt GraphDef fail alone with a reason that names the model, the file and the cause."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import tensorflow_models as tfm
from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e
Http = httpclient.InferenceServerClient
Grpc = grpcclient.InferenceServerClient
GRAPH_NAMES = ("x", "Identity", "Identity_1")


@pytest.fixture(scope="module")
def tf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("tf_repo")
    tfm.write(repo, "tf_dense", tfm.tf_config(
        "tf_dense", params={"TF_NUM_INTRA_THREADS": "1", "MAX_SESSION_SHARE_COUNT": "2"},
        extra="dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
              "instance_group [{ kind: KIND_CPU count: 2 }]"), tfm.save_savedmodel)
    tfm.write(repo, "tf_other_sig", tfm.tf_config("tf_other_sig"),
              partial(tfm.save_savedmodel, signatures="predict"))
    tfm.write(repo, "tf_named_sig", tfm.tf_config("tf_named_sig",
                                                  params={"TF_SIGNATURE_DEF": "predict"}),
              partial(tfm.save_savedmodel, signatures="predict"))
    tfm.write(repo, "tf_auto", 'backend: "tensorflow"\n', tfm.save_savedmodel)
    tfm.write(repo, "tf_graphdef", tfm.tf_config("tf_graphdef", "tensorflow_graphdef",
                                                 names=GRAPH_NAMES),
              tfm.save_graphdef, "model.graphdef")
    # broken ones
    tfm.write(repo, "bad_tf_nosig", tfm.tf_config("bad_tf_nosig"),
              partial(tfm.save_savedmodel, signatures=""))
    tfm.write(repo, "bad_tf_wrongsig", tfm.tf_config(
        "bad_tf_wrongsig", params={"TF_SIGNATURE_DEF": "classify"}), tfm.save_savedmodel)
    tfm.write(repo, "bad_tf_graphdef", tfm.tf_config("bad_tf_graphdef", "tensorflow_graphdef",
                                                     names=GRAPH_NAMES),
              lambda p: p.write_bytes(b"\x0a\xff\xff not a graph"), "model.graphdef")
    make_models.write_add_sub(repo)  # an ONNX Runtime model beside them
    with running_server(repo, "--exit-on-error=false", "--strict-readiness=false",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(tf_server: ServerProcess) -> Iterator[Http]:
    client = httpclient.InferenceServerClient(tf_server.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(tf_server: ServerProcess) -> Iterator[Grpc]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{tf_server.grpc_port}")
    yield client
    client.close()


def _infer(client: Http | Grpc, model: str, x: np.ndarray,
           names: tuple[str, str, str] = ("x", "dense", "total")) -> dict[str, np.ndarray]:
    module = httpclient if isinstance(client, Http) else grpcclient
    inp = module.InferInput(names[0], list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    return {"dense": result.as_numpy(names[1]), "total": result.as_numpy(names[2])}


def _rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, tfm.WIDTH)).astype(np.float32)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["tf_dense", "tf_other_sig", "tf_named_sig", "tf_auto",
                                   "tf_graphdef"])
def test_answers_match_the_model(http: Http, grpc: Grpc, protocol: str, model: str) -> None:
    client = http if protocol == "http" else grpc
    names = GRAPH_NAMES if model == "tf_graphdef" else ("x", "dense", "total")
    for n in (1, 4):
        x = _rows(n, seed=n)
        got = _infer(client, model, x, names)
        want = tfm.expected(x)
        for key in ("dense", "total"):
            assert got[key].shape == want[key].shape
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6)


def test_auto_complete_from_the_signature(http: Http) -> None:
    config = http.get_model_config("tf_auto")
    assert config["platform"] == "tensorflow_savedmodel"
    assert config["default_model_filename"] == "model.savedmodel"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [tfm.WIDTH])]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [
        ("dense", [tfm.UNITS]), ("total", [1])]
    assert len(config["instance_group"]) == 1 and config["instance_group"][0]["count"] == 2
    assert http.get_model_metadata("tf_graphdef")["platform"] == "tensorflow_graphdef"


def test_dynamic_batching_over_shared_instances(grpc: Grpc) -> None:
    x = _rows(32, seed=9)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: _infer(grpc, "tf_dense", x[i:i + 1])["dense"],
                                range(32)))
    np.testing.assert_allclose(np.concatenate(answers), tfm.expected(x)["dense"], rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize(("model", "words"), [
    ("bad_tf_nosig", ["bad_tf_nosig", "expected 'serving_default' signature",
                      "model.savedmodel"]),
    ("bad_tf_wrongsig", ["bad_tf_wrongsig", "expected 'classify' signature",
                         "model.savedmodel", "serving_default"]),
    ("bad_tf_graphdef", ["bad_tf_graphdef", "model.graphdef", "not a TensorFlow GraphDef"]),
])
def test_broken_model_fails_alone(http: Http, model: str, words: list[str]) -> None:
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index[model]["state"] == "UNAVAILABLE"
    for word in words:
        assert word in index[model]["reason"], index[model]["reason"]
    assert http.is_model_ready("tf_dense") and http.is_model_ready("add_sub")
    a = np.ones((1, 16), dtype=np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        inp = httpclient.InferInput(name, [1, 16], "FP32")
        inp.set_data_from_numpy(a)
        inputs.append(inp)
    assert http.infer("add_sub", inputs).as_numpy("OUTPUT0") is not None

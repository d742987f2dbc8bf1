"""Python backend end to end: Triton-style model.py files (tests/models) served by
``python -m nursery serve`` and called with tritonclient over HTTP and gRPC: plain models,
auto-complete, errors, BLS (sync and async), decoupled streaming, ensembles."""

from __future__ import annotations

import queue
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

MODELS = ROOT / "tests" / "models"
PY_MODELS = ["py_add_sub", "py_split", "py_string_identity", "py_identity_fp32", "py_bls", "py_bls_async",
             "py_repeat", "py_bls_decoupled", "py_bls_stream", "py_error", "ens_add_sub_py"]


def copy_model(repo: Path, name: str) -> None:
    shutil.copytree(MODELS / name, repo / name)
    (repo / name / "1").mkdir(exist_ok=True)


def write_ensemble(repo: Path, name: str, io: str, steps: str, max_batch_size: int = 0) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n{io}\n'
        f"ensemble_scheduling {{ step [ {steps} ] }}\n")


ERROR_IO = ('input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]')


def build_python_repo(repo: Path) -> Path:
    make_models.write_add_sub(repo, max_batch_size=64)
    for name in PY_MODELS:
        copy_model(repo, name)
    write_ensemble(repo, "ens_error", ERROR_IO,
                   '{ model_name: "py_error" input_map { key: "INPUT0" value: "X" } '
                   'output_map { key: "OUTPUT0" value: "Y" } }')
    write_ensemble(repo, "ens_repeat", REPEAT_IO + DECOUPLED, REPEAT_STEPS)
    return repo


# a decoupled ensemble: py_repeat answers once per element of IN; each answer runs py_error
REPEAT_IO = ('input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
             'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }, '
             '{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]')
DECOUPLED = "\nmodel_transaction_policy { decoupled: true }"
REPEAT_STEPS = ('{ model_name: "py_repeat" input_map { key: "IN" value: "IN" } '
                'output_map { key: "OUT" value: "T" } output_map { key: "IDX" value: "IDX" } }, '
                '{ model_name: "py_error" input_map { key: "INPUT0" value: "T" } '
                'output_map { key: "OUTPUT0" value: "Y" } }')


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Every test runs against both instance modes: the model on the server's instance thread,
    and in a stub process of its own (``--backend-config=python,nursery-instance-mode=...``)."""
    repo = build_python_repo(tmp_path_factory.mktemp("pyrepo"))
    with running_server(repo, f"--backend-config=python,nursery-instance-mode={request.param}",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def http_input(name: str, array: np.ndarray, datatype: str) -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array)
    return item


def grpc_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    item = grpcclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array)
    return item


def pair(rows: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.random((rows, 16), dtype=np.float32), rng.random((rows, 16), dtype=np.float32))


def test_add_sub_over_http_and_grpc(server: ServerProcess) -> None:
    a, b = pair()
    client = httpclient.InferenceServerClient(server.url)
    result = client.infer("py_add_sub", [http_input("INPUT0", a, "FP32"),
                                         http_input("INPUT1", b, "FP32")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    # only the requested output comes back
    result = client.infer("py_add_sub", [http_input("INPUT0", a, "FP32"),
                                         http_input("INPUT1", b, "FP32")],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    result = g.infer("py_add_sub", [grpc_input("INPUT0", a, "FP32"),
                                    grpc_input("INPUT1", b, "FP32")], request_id="7")
    assert result.get_response().id == "7"
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    meta = client.get_model_metadata("py_add_sub")
    assert meta["platform"] == "python"


def test_auto_complete_config_and_strings(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("py_string_identity")
    assert config["max_batch_size"] == 8
    assert "dynamic_batching" in config
    assert [i["name"] for i in config["input"]] == ["INPUT0"]
    assert config["input"][0]["data_type"] == "TYPE_STRING"
    words = np.array([[b"hello", b"", "ünï".encode()]], dtype=object)
    result = client.infer("py_string_identity", [http_input("INPUT0", words, "BYTES")])
    assert result.as_numpy("OUTPUT0").tolist() == words.tolist()


def test_classification_of_python_outputs(server: ServerProcess) -> None:
    """The classification extension applies to a Python model's answer as to any backend's
    (Triton classifies in its frontends): top-K strings as BYTES; a BYTES output or one of
    more than a million elements per batch entry fails its own request with Triton's words."""
    client = httpclient.InferenceServerClient(server.url)
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = np.array([[0.5, 3.0, 1.0, 2.0]], dtype=np.float32)
    got = client.infer("py_identity_fp32", [http_input("INPUT0", x, "FP32")], outputs=[
        httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert got.get_output("OUTPUT0")["datatype"] == "BYTES"
    assert got.as_numpy("OUTPUT0").tolist() == [[b"3.000000:1", b"2.000000:3"]]
    got = g.infer("py_identity_fp32", [grpc_input("INPUT0", x, "FP32")], outputs=[
        grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert got.get_output("OUTPUT0").datatype == "BYTES"
    assert got.as_numpy("OUTPUT0").tolist() == [[b"3.000000:1", b"2.000000:3"]]

    words = np.array([[b"a", b"b"]], dtype=object)
    with pytest.raises(InferenceServerException,
                       match="class result not available for output due to unsupported type "
                             "'BYTES'") as err:
        client.infer("py_string_identity", [http_input("INPUT0", words, "BYTES")],
                     outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=1)])
    assert err.value.status() == "400"
    big = np.ones((1, 1_000_001), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="classification output tensor too large"):
        g.infer("py_identity_fp32", [grpc_input("INPUT0", big, "FP32")],
                outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=5)])
    # the model still serves plain requests
    np.testing.assert_array_equal(
        client.infer("py_identity_fp32", [http_input("INPUT0", x, "FP32")]).as_numpy("OUTPUT0"), x)


def test_errors_are_per_request_and_the_model_keeps_serving(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)

    def call(value: int) -> np.ndarray:
        return client.infer("py_error", [http_input(
            "INPUT0", np.array([value], dtype=np.int32), "INT32")]).as_numpy("OUTPUT0")

    def counts() -> tuple[int, int]:
        stats = client.get_inference_statistics("py_error")["model_stats"][0]["inference_stats"]
        return int(stats["success"]["count"]), int(stats["fail"]["count"])

    before = counts()
    with pytest.raises(InferenceServerException) as raised:
        call(0)
    assert counts() == (before[0], before[1] + 1)  # an exception: the request failed
    message = raised.value.message()
    assert message.startswith("Failed to process the request(s) for model 'py_error_0', "
                              "message: TritonModelException: zero is not allowed")
    assert "model.py(" in message and "): execute" in message  # the model's own frame
    before = counts()
    with pytest.raises(InferenceServerException) as raised:
        call(1)
    # an error response: the model executed and answered; Triton counts it a success
    assert counts() == (before[0] + 1, before[1])
    assert raised.value.message() == "one is refused"
    assert raised.value.status() == "400"  # TritonError.INVALID_ARG
    assert call(5).tolist() == [5]
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    with pytest.raises(InferenceServerException) as raised:
        g.infer("py_error", [grpc_input("INPUT0", np.array([1], dtype=np.int32), "INT32")])
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert call(6).tolist() == [6]


def _add_sub_inferences(client: httpclient.InferenceServerClient) -> int:
    stats = client.get_inference_statistics("add_sub")["model_stats"][0]
    return int(stats["inference_count"])


def test_bls_calls_the_onnx_model_through_its_scheduler(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    before = _add_sub_inferences(client)
    a, b = pair(3, seed=1)
    names = np.array([[b"add_sub"]] * 3, dtype=object)
    result = client.infer("py_bls", [http_input("MODEL_NAME", names, "BYTES"),
                                     http_input("INPUT0", a, "FP32"),
                                     http_input("INPUT1", b, "FP32")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    assert _add_sub_inferences(client) == before + 3  # counted by add_sub's own scheduler
    # a BLS call to a Python model, and to a model that does not exist (error returned, the
    # model raises it)
    names = np.array([[b"py_add_sub"]] * 3, dtype=object)
    result = client.infer("py_bls", [http_input("MODEL_NAME", names, "BYTES"),
                                     http_input("INPUT0", a, "FP32"),
                                     http_input("INPUT1", b, "FP32")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    names = np.array([[b"missing_model"]] * 3, dtype=object)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("py_bls", [http_input("MODEL_NAME", names, "BYTES"),
                                http_input("INPUT0", a, "FP32"), http_input("INPUT1", b, "FP32")])
    assert re.match(  # Triton's words (py_bls has two instances: py_bls_0_0, py_bls_0_1)
        r"Failed to process the request\(s\) for model 'py_bls_0_[01]', message: "
        r"TritonModelException: Model missing_model - Error when running inference: Request "
        r"for unknown model: 'missing_model' is not found\n\nAt:\n",
        raised.value.message())


def test_bls_from_async_execute(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    a, b = pair(2, seed=2)
    result = client.infer("py_bls_async", [http_input("INPUT0", a, "FP32"),
                                           http_input("INPUT1", b, "FP32")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), 2 * (a + b), rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), 2 * (a - b), rtol=1e-6, atol=1e-6)


def test_bls_and_ensemble_under_concurrent_load(server: ServerProcess) -> None:
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        client = httpclient.InferenceServerClient(server.url)
        try:
            for i in range(10):
                a, b = pair(1 + (seed + i) % 3, seed=seed * 100 + i)
                names = np.array([[b"add_sub"]] * a.shape[0], dtype=object)
                result = client.infer("py_bls", [http_input("MODEL_NAME", names, "BYTES"),
                                                 http_input("INPUT0", a, "FP32"),
                                                 http_input("INPUT1", b, "FP32")])
                np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
                result = client.infer("ens_add_sub_py", [http_input("A", a, "FP32"),
                                                         http_input("B", b, "FP32")])
                np.testing.assert_allclose(result.as_numpy("TWICE_A"), 2 * a, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(result.as_numpy("TWICE_B"), 2 * b, rtol=1e-5, atol=1e-6)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:  # its sockets closed here, not by a collector on another thread (a warning)
            client.close()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]


def _stream(server: ServerProcess, requests: list[tuple[str, np.ndarray]],
            empty_final: bool, model: str = "py_repeat") -> list[tuple[Any, Any]]:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for request_id, values in requests:
            client.async_stream_infer(model, [grpc_input("IN", values, "INT32")],
                                      request_id=request_id,
                                      enable_empty_final_response=empty_final)
        expected = sum(len(v) + (1 if empty_final else 0) for _, v in requests)
        got = [results.get(timeout=10) for _ in range(expected)]
        with pytest.raises(queue.Empty):
            results.get(timeout=0.3)  # nothing more
    finally:
        client.stop_stream()
    return got


def test_decoupled_model_streams_its_responses_over_grpc(server: ServerProcess) -> None:
    got = _stream(server, [("a", np.array([4, 5, 6], dtype=np.int32)),
                           ("b", np.array([10, 11], dtype=np.int32))], empty_final=True)
    by_id: dict[str, list[tuple[list[int], list[int], bool]]] = {"a": [], "b": []}
    for result, error in got:
        assert error is None
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        out = result.as_numpy("OUT")
        idx = result.as_numpy("IDX")
        by_id[response.id].append(([] if out is None else out.tolist(),
                                   [] if idx is None else idx.tolist(), final))
    assert by_id["a"] == [([4], [0], False), ([5], [1], False), ([6], [2], False), ([], [], True)]
    assert by_id["b"] == [([10], [0], False), ([11], [1], False), ([], [], True)]


def test_decoupled_errors_and_no_empty_final(server: ServerProcess) -> None:
    got = _stream(server, [("c", np.array([1, -1, 3], dtype=np.int32))], empty_final=False)
    assert got[0][0].as_numpy("OUT").tolist() == [1]
    assert got[1][0] is None and "negative value at 1" in str(got[1][1])
    assert got[2][0].as_numpy("OUT").tolist() == [3]
    # zero responses, then only the final flag: nothing is sent without the empty final
    got = _stream(server, [("d", np.array([], dtype=np.int32))], empty_final=True)
    assert len(got) == 1 and got[0][0].get_response().parameters[
        "triton_final_response"].bool_param


def test_bls_to_a_decoupled_model(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    values = np.array([3, 4, 5, 6], dtype=np.int32)
    result = client.infer("py_bls_decoupled", [http_input("IN", values, "INT32")])
    assert result.as_numpy("SUM").tolist() == [18] and result.as_numpy("COUNT").tolist() == [4]
    with pytest.raises(InferenceServerException) as raised:  # py_repeat sends an error
        client.infer("py_bls_decoupled", [http_input("IN", np.array([2, -1], np.int32), "INT32")])
    assert "negative value at 1" in raised.value.message()


def test_decoupled_pipeline_forwards_a_bls_stream(server: ServerProcess) -> None:
    got = _stream(server, [("p", np.array([1, 2, -3, 4], dtype=np.int32))], empty_final=False,
                  model="py_bls_stream")
    assert [None if r is None else r.as_numpy("DOUBLED").tolist() for r, _ in got] == [
        [2], [4], None, [8]]
    assert "negative value at 2" in str(got[2][1])


def test_decoupled_model_refused_by_unary_endpoints(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("py_repeat", [http_input("IN", np.array([1], dtype=np.int32), "INT32")])
    assert "doesn't support models with decoupled transaction policy" in raised.value.message()
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    with pytest.raises(InferenceServerException) as raised:
        g.infer("py_repeat", [grpc_input("IN", np.array([1], dtype=np.int32), "INT32")])
    assert raised.value.message() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy")


def test_non_decoupled_models_over_the_stream(server: ServerProcess) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    a, b = pair(1, seed=3)
    try:
        client.async_stream_infer("py_add_sub", [grpc_input("INPUT0", a, "FP32"),
                                                 grpc_input("INPUT1", b, "FP32")])
        result, error = results.get(timeout=10)
    finally:
        client.stop_stream()
    assert error is None
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)


def test_initialize_failure_fails_the_load(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_model(repo, "py_init_fail")
    copy_model(repo, "py_error")
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "py_error")
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("py_init_fail")
    assert "ValueError: no weights in" in raised.value.message()
    index = {m["name"]: m for m in client.get_model_repository_index()}
    reason = index["py_init_fail"]["reason"]
    assert index["py_init_fail"]["state"] == "UNAVAILABLE"
    assert reason.startswith("Internal: ValueError: no weights in ")  # as Triton 2.51 says
    assert reason.endswith("\n\nAt:\n  " + str(repo / "py_init_fail" / "1" / "model.py")
                           + "(3): initialize\n")
    assert client.is_model_ready("py_error")


def test_ensemble_over_grpc_and_step_errors(server: ServerProcess) -> None:
    a, b = pair(3, seed=4)
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    result = g.infer("ens_add_sub_py", [grpc_input("A", a, "FP32"), grpc_input("B", b, "FP32")],
                     outputs=[grpcclient.InferRequestedOutput("TWICE_B")])
    np.testing.assert_allclose(result.as_numpy("TWICE_B"), 2 * b, rtol=1e-5, atol=1e-6)
    assert result.as_numpy("TWICE_A") is None
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_model_metadata("ens_add_sub_py")["platform"] == "ensemble"
    with pytest.raises(InferenceServerException) as raised:
        client.infer("ens_error", [http_input("X", np.array([0], dtype=np.int32), "INT32")])
    assert raised.value.message().startswith(
        "in ensemble 'ens_error', Failed to process the request(s) for model "
        "'py_error_0', message: TritonModelException: zero is not allowed")
    with pytest.raises(InferenceServerException) as raised:
        client.infer("ens_error", [http_input("X", np.array([1], dtype=np.int32), "INT32")])
    assert raised.value.message() == "in ensemble 'ens_error', step 0 (model 'py_error'): one is refused"
    assert raised.value.status() == "400"
    ok = client.infer("ens_error", [http_input("X", np.array([9], dtype=np.int32), "INT32")])
    assert ok.as_numpy("Y").tolist() == [9]
    stats = client.get_inference_statistics("ens_error")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert stats["inference_stats"]["fail"]["count"] >= 2


def _stream_until_final(server: ServerProcess, model: str, values: np.ndarray,
                        request_id: str) -> list[tuple[Any, Any]]:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    got = []
    try:
        client.async_stream_infer(model, [grpc_input("IN", values, "INT32")],
                                  request_id=request_id, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=10)
            got.append((result, error))
            if error is not None or result.get_response().parameters[
                    "triton_final_response"].bool_param:
                break
        with pytest.raises(queue.Empty):
            results.get(timeout=0.3)  # nothing after the final response
    finally:
        client.stop_stream()
    return got


def test_decoupled_ensemble_streams_one_answer_per_step_response(server: ServerProcess) -> None:
    """As Triton's ensemble scheduler: each response of the decoupled step runs the next step
    once more, and the ensemble answers each time its outputs are complete; the final flag
    comes when no step is left running."""
    got = _stream_until_final(server, "ens_repeat", np.array([4, 5, 6], dtype=np.int32), "r")
    answers = sorted((r.as_numpy("IDX").tolist(), r.as_numpy("Y").tolist())
                     for r, e in got if e is None and r.as_numpy("Y") is not None)
    assert answers == [([0], [4]), ([1], [5]), ([2], [6])]
    assert all(r.get_response().id == "r" for r, _ in got)
    # a step's error ends the request with the ensemble's error
    got = _stream_until_final(server, "ens_repeat", np.array([7, 1, 9], dtype=np.int32), "s")
    result, error = got[-1]
    assert result is None and "in ensemble 'ens_repeat'" in str(error)
    assert "one is refused" in str(error)
    # zero responses from the decoupled step: only the final flag
    got = _stream_until_final(server, "ens_repeat", np.array([], dtype=np.int32), "t")
    assert len(got) == 1 and got[0][0].as_numpy("Y") is None
    # a decoupled ensemble is refused by the unary endpoints, as a decoupled model is
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("ens_repeat", [http_input("IN", np.array([1], dtype=np.int32), "INT32")])
    assert "doesn't support models with decoupled transaction policy" in raised.value.message()
    assert client.is_server_live()


def test_ensembles_validate_at_load(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    make_models.write_add_sub(repo, max_batch_size=64)
    for name in ("py_add_sub", "ens_add_sub_py", "py_error", "py_repeat"):
        copy_model(repo, name)
    write_ensemble(repo, "ens_undeclared", REPEAT_IO, REPEAT_STEPS)
    write_ensemble(repo, "ens_declared", ERROR_IO + DECOUPLED,
                   '{ model_name: "py_error" input_map { key: "INPUT0" value: "X" } '
                   'output_map { key: "OUTPUT0" value: "Y" } }')
    # Y descends from the ensemble input X, IDX from py_repeat's responses: never paired
    write_ensemble(repo, "ens_mixed",
                   'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, '
                   '{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                   'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }, '
                   '{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]',
                   '{ model_name: "py_repeat" input_map { key: "IN" value: "IN" } '
                   'output_map { key: "IDX" value: "IDX" } },'
                   ' { model_name: "py_error" input_map { key: "INPUT0" value: "X" } '
                   'output_map { key: "OUTPUT0" value: "Y" } }')
    write_ensemble(repo, "ens_unknown", ERROR_IO,
                   '{ model_name: "nope" input_map { key: "INPUT0" value: "X" } '
                   'output_map { key: "OUTPUT0" value: "Y" } }')
    write_ensemble(repo, "ens_unmapped", ERROR_IO,
                   '{ model_name: "py_error" input_map { key: "INPUT0" value: "Z" } '
                   'output_map { key: "OUTPUT0" value: "Y" } }')
    write_ensemble(repo, "ens_wrong_io", ERROR_IO,
                   '{ model_name: "py_error" input_map { key: "IN" value: "X" } '
                   'output_map { key: "OUTPUT0" value: "Y" } }')
    write_ensemble(repo, "ens_cycle", ERROR_IO,
                   '{ model_name: "py_error" input_map { key: "INPUT0" value: "T" } '
                   'output_map { key: "OUTPUT0" value: "Y" } }, '
                   '{ model_name: "py_error" input_map { key: "INPUT0" value: "Y" } '
                   'output_map { key: "OUTPUT0" value: "T" } }')
    server = start_server(repo, "--model-control-mode", "explicit")
    client = httpclient.InferenceServerClient(server.url)
    # loading an ensemble loads the models it is made of
    client.load_model("ens_add_sub_py")
    assert client.is_model_ready("add_sub") and client.is_model_ready("py_add_sub")
    a, b = pair(1)
    result = client.infer("ens_add_sub_py", [http_input("A", a, "FP32"), http_input("B", b, "FP32")])
    np.testing.assert_allclose(result.as_numpy("TWICE_A"), 2 * a, rtol=1e-5, atol=1e-6)
    for name, message in [
        # Triton's dependency graph: a step model no repository holds
        ("ens_unknown", "ensemble ens_unknown contains models that are not available or "
                        "ambiguous: nope"),
        # Triton's ValidateEnsembleSchedulingConfig words: its data-flow check finds the
        # ensemble input nothing reads first
        ("ens_unmapped", "ensemble input 'X' for ensemble ens_unmapped' is not used"),
        ("ens_wrong_io", "model 'py_error' has no input 'IN'"),
        ("ens_cycle", "ensemble input 'X' for ensemble ens_cycle' is not used"),
        ("ens_mixed", "in ensemble ens_mixed, step of model 'ens_mixed' receives inputs "
                      "originated from different decoupled models"),
    ]:
        with pytest.raises(InferenceServerException) as raised:
            client.load_model(name)
        assert message in raised.value.message(), raised.value.message()
    assert client.is_server_live()
    # Triton decides an ensemble's transaction policy from its steps: with a decoupled step
    # the ensemble is decoupled (it streams) though its config does not say so ...
    client.load_model("ens_undeclared")
    config = client.get_model_config("ens_undeclared")
    assert config["model_transaction_policy"] == {"decoupled": True}
    with pytest.raises(InferenceServerException) as raised:
        client.infer("ens_undeclared", [http_input("IN", np.array([1], dtype=np.int32), "INT32")])
    assert "doesn't support models with decoupled transaction policy" in raised.value.message()
    got = _stream_until_final(server, "ens_undeclared", np.array([4, 5], dtype=np.int32), "u")
    assert sorted(r.as_numpy("Y").tolist() for r, e in got
                  if e is None and r.as_numpy("Y") is not None) == [[4], [5]]
    # ... and without one it answers once, though its config says decoupled
    client.load_model("ens_declared")
    assert not client.get_model_config("ens_declared").get("model_transaction_policy", {}).get(
        "decoupled", False)
    result = client.infer("ens_declared", [http_input("X", np.array([4], dtype=np.int32), "INT32")])
    assert result.as_numpy("Y").tolist() == [4]


def test_answers_match_triton_2_51(server: ServerProcess) -> None:
    """Every Python-backend conformance case answers what Triton 2.51's Python backend did."""
    import json

    from tests.conformance import python_cases

    repo = server.args[server.args.index("--model-repository") + 1]
    recorded = json.loads((Path(python_cases.__file__).parent / "triton_2_51_python.json")
                          .read_text())
    got = python_cases.run("127.0.0.1", server.http_port, server.grpc_port, repo)
    assert sorted(got) == sorted(recorded)
    for case, answer in recorded.items():
        for old, new in python_cases.CHANGED_SINCE_2_51.get(case, ()):
            answer = json.loads(json.dumps(answer).replace(old, new))
        assert got[case] == answer, case


def test_stateful_python_model_under_the_sequence_batcher(tmp_path: Path,
                                                          start_server: Any) -> None:
    """A Triton-style stateful model.py: controls, correlation ID and implicit state arrive as
    inputs; interleaved sequences keep their own sums, and the state output is never sent."""
    repo = tmp_path / "repo"
    copy_model(repo, "py_seq_accumulate")
    server = start_server(repo)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    steps = 4
    for wave in ((11, 22, 33, 44), (55, 66)):  # 4 slots: a second wave reuses freed slots
        sums = dict.fromkeys(wave, 0)
        for step in range(steps):
            for seq in wave:  # interleaved
                value = seq + step
                sums[seq] += value
                inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                inp.set_data_from_numpy(np.array([[value]], np.int32))
                result = client.infer("py_seq_accumulate", [inp], sequence_id=seq,
                                      sequence_start=step == 0, sequence_end=step == steps - 1)
                assert result.as_numpy("OUTPUT")[0, 0] == sums[seq]
                assert result.as_numpy("OUTPUT_STATE") is None
    client.close()


OPTIONAL_IO = ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
               '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]\n'
               'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]')
STRICT_IO = ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, '
             '{ name: "B" data_type: TYPE_FP32 dims: [ 16 ] optional: true } ]\n'
             'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]')


def test_ensemble_without_its_optional_input(start_server: Any, tmp_path: Path) -> None:
    """Issue 22: a request that leaves out an optional ensemble input used to fail INTERNAL
    (a KeyError in the ensemble scheduler). As in Triton, the steps that read it run without
    it; a step whose model requires it fails with that model's own error; a step may leave an
    optional input of its model unmapped, a required one fails the ensemble's load."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("py_optional_bias", "py_add_sub"):
        copy_model(repo, name)
    write_ensemble(repo, "ens_optional", OPTIONAL_IO,
                   '{ model_name: "py_optional_bias" input_map { key: "INPUT0" value: "A" } '
                   'input_map { key: "BIAS" value: "B" } output_map { key: "OUTPUT0" value: "T" } '
                   '}, { model_name: "py_optional_bias" input_map { key: "INPUT0" value: "T" } '
                   'output_map { key: "OUTPUT0" value: "Y" } }', max_batch_size=8)
    write_ensemble(repo, "ens_optional_strict", STRICT_IO,
                   '{ model_name: "py_add_sub" input_map { key: "INPUT0" value: "A" } '
                   'input_map { key: "INPUT1" value: "B" } '
                   'output_map { key: "OUTPUT0" value: "SUM" } }', max_batch_size=8)
    write_ensemble(repo, "ens_required_unmapped", STRICT_IO,
                   '{ model_name: "py_add_sub" input_map { key: "INPUT0" value: "A" } '
                   'output_map { key: "OUTPUT0" value: "SUM" } }', max_batch_size=8)
    server = start_server(repo, "--exit-on-error=false", "--strict-readiness=false")
    client = httpclient.InferenceServerClient(server.url)
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 10, dtype=np.float32)
    for _ in range(2):  # the first request without B must not spoil the next ones
        got = client.infer("ens_optional", [http_input("A", a, "FP32")])
        np.testing.assert_array_equal(got.as_numpy("Y"), a)
        got = client.infer("ens_optional", [http_input("A", a, "FP32"),
                                            http_input("B", b, "FP32")])
        np.testing.assert_array_equal(got.as_numpy("Y"), a + b)
        got = g.infer("ens_optional", [grpc_input("A", a, "FP32")])
        np.testing.assert_array_equal(got.as_numpy("Y"), a)
    # the step's model requires the input: its own request check fails the ensemble request
    a16, b16 = pair(1)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("ens_optional_strict", [http_input("A", a16, "FP32")])
    assert raised.value.status() == "400"
    assert raised.value.message().startswith("in ensemble 'ens_optional_strict', ")
    assert ("expected 2 inputs but got 1 inputs for model 'py_add_sub'"
            in raised.value.message()), raised.value.message()
    got = client.infer("ens_optional_strict", [http_input("A", a16, "FP32"),
                                               http_input("B", b16, "FP32")])
    np.testing.assert_allclose(got.as_numpy("SUM"), a16 + b16, rtol=1e-6)
    # Triton's load checks: its data-flow check finds the ensemble input B that no step
    # reads before the step check (a required input of a step's model must be mapped)
    assert not client.is_model_ready("ens_required_unmapped")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert ("ensemble input 'B' for ensemble ens_required_unmapped' is not used"
            in index["ens_required_unmapped"]["reason"]), index["ens_required_unmapped"]
    assert _internal_errors(server) == 0


def _internal_errors(server: ServerProcess) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("nursery_internal_errors_total{"))


def test_a_model_split_over_files_imports_relatively(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    data = np.array([1.0, 2.5], dtype=np.float32)
    got = client.infer("py_split", [http_input("INPUT0", data, "FP32")]).as_numpy("OUTPUT0")
    assert got.tolist() == [2.0, 5.0]

"""Python-backend requests whose answers must match real Triton's, case by case.

``python tests/conformance/python_cases.py HOST HTTP_PORT GRPC_PORT REPO OUT.json`` runs every
case with tritonclient against a server serving the models of ``tests/models`` (py_add_sub,
py_error, py_repeat, py_bls, py_bls_decoupled, py_string_identity) and the ensemble
``ens_error`` (py_error behind one step), and writes ``{case: answer}`` with the repository path
replaced by ``<repo>``. The answers of Triton 2.51 (the tritonserver and Python backend of the
nvidia-pytriton 0.7.0 wheel) are recorded in ``triton_2_51_python.json`` beside this file.

Known, deliberate differences are not cases: a ``TritonError`` from an ensemble step names the
step in nursery (Triton: only the message); a decoupled model's error response reaches a BLS
caller as an error in nursery (Triton 2.51 drops it); Triton adds sequence parameters to an
ensemble's response.

Where Triton's own words changed after 2.51, nursery answers with today's (those Triton's qa
suite asserts) and :data:`CHANGED_SINCE_2_51` says what changed: the recorded answer with
those replacements is what is compared.
"""

from __future__ import annotations

import json
import queue
import re
import sys
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

# case -> (2.51's words, today's) replacements in its recorded answer: a BLS call to an unknown
# model is refused by the core's lookup since (python_backend's request_executor, Triton's qa
# L0_backend_python/bls test_bls_sync asserts "Request for unknown model: ... is not found")
CHANGED_SINCE_2_51: dict[str, tuple[tuple[str, str], ...]] = {
    "bls to a missing model": ((
        "Failed for execute the inference request. Model 'no_such_model' is not ready.",
        "Request for unknown model: 'no_such_model' is not found"),),
}


def _http_input(name: str, array: np.ndarray, datatype: str) -> Any:
    item = httpclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array)
    return item


def _grpc_input(name: str, array: np.ndarray, datatype: str) -> Any:
    item = grpcclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array)
    return item


def run(host: str, http_port: int, grpc_port: int, repo: str) -> dict[str, Any]:
    with httpclient.InferenceServerClient(f"{host}:{http_port}") as http, \
            grpcclient.InferenceServerClient(f"{host}:{grpc_port}") as grpc:
        return _run(http, grpc, repo)


def _run(http: Any, grpc: Any, repo: str) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def case(name: str, fn: Any) -> None:
        try:
            answer: Any = ["ok", fn()]
        except InferenceServerException as exc:
            answer = ["error", exc.status(), exc.message()]
        text = json.dumps(answer).replace(repo.rstrip("/"), "<repo>")
        out[name] = json.loads(re.sub(r"py_bls_0_[0-9]", "py_bls_0_N", text))

    def i32(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int32)

    for v in (0, 1, 7):
        case(f"http py_error {v}", lambda v=v: http.infer("py_error", [_http_input(
            "INPUT0", i32([v]), "INT32")]).as_numpy("OUTPUT0").tolist())
        case(f"grpc py_error {v}", lambda v=v: grpc.infer("py_error", [_grpc_input(
            "INPUT0", i32([v]), "INT32")]).as_numpy("OUTPUT0").tolist())
    case("http ens_error 0", lambda: http.infer("ens_error", [_http_input(
        "X", i32([0]), "INT32")]).as_numpy("Y").tolist())
    case("grpc ens_error 0", lambda: grpc.infer("ens_error", [_grpc_input(
        "X", i32([0]), "INT32")]).as_numpy("Y").tolist())
    case("http decoupled model", lambda: http.infer("py_repeat", [_http_input(
        "IN", i32([1]), "INT32")]).get_response())
    case("grpc ModelInfer decoupled model", lambda: grpc.infer("py_repeat", [_grpc_input(
        "IN", i32([1]), "INT32")]).as_numpy("OUT").tolist())
    a = np.ones((1, 16), np.float32)
    names = np.array([[b"no_such_model"]], dtype=object)
    case("bls to a missing model", lambda: http.infer("py_bls", [
        _http_input("MODEL_NAME", names, "BYTES"), _http_input("INPUT0", a, "FP32"),
        _http_input("INPUT1", a, "FP32")]).get_response())
    case("bls to a decoupled model", lambda: http.infer("py_bls_decoupled", [_http_input(
        "IN", i32([2, 3, 4]), "INT32")]).get_response())
    case("requested output only", lambda: http.infer(
        "py_add_sub", [_http_input("INPUT0", a, "FP32"), _http_input("INPUT1", a, "FP32")],
        outputs=[httpclient.InferRequestedOutput("OUTPUT1")]).get_response())
    words = np.array([[b"a", b"", b"bc"]], dtype=object)
    case("strings", lambda: http.infer("py_string_identity", [_http_input(
        "INPUT0", words, "BYTES")]).as_numpy("OUTPUT0").astype(str).tolist())
    case("auto-completed config", lambda: http.get_model_config("py_string_identity"))
    case("python model metadata", lambda: http.get_model_metadata("py_error"))
    case("ensemble metadata", lambda: http.get_model_metadata("ens_error"))
    for empty in (True, False):
        answers: queue.Queue[Any] = queue.Queue()
        grpc.start_stream(callback=lambda result, error, answers=answers: answers.put(
            (result, error)))
        grpc.async_stream_infer("py_repeat", [_grpc_input("IN", i32([5, -1, 6]), "INT32")],
                                request_id="s1", enable_empty_final_response=empty)
        got = []
        while True:
            try:
                result, error = answers.get(timeout=1.5)
            except queue.Empty:
                break
            got.append(["error", str(error)] if error is not None else
                       ["ok", json_format.MessageToDict(result.get_response())])
        grpc.stop_stream()
        out[f"decoupled stream, empty final {empty}"] = got
    return out


def main() -> None:
    host, http_port, grpc_port, repo, path = sys.argv[1:6]
    with open(path, "w") as f:
        json.dump(run(host, int(http_port), int(grpc_port), repo), f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()

"""Parts of Triton's Python-backend API checked end to end in both instance modes (the model on
the server's thread and in a stub process): the response sender's rules with Triton's
messages (the cases of Triton's qa/L0_backend_python/response_sender), response parameters,
the ``is_ready()`` hook, cancelling a BLS stream, Python-based backends and
``auto_complete_config`` in a stub."""

from __future__ import annotations

import json
import queue
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, running_server

pytestmark = pytest.mark.e2e

MODELS = ROOT / "tests" / "models"
DECOUPLED = "model_transaction_policy { decoupled: true }\n"
ASYNC = 'parameters { key: "use_async" value { string_value: "1" } }\n'


def _copy(repo: Path, model: str, name: str | None = None, extra: str = "") -> None:
    name = name or model
    shutil.copytree(MODELS / model, repo / name)
    config = repo / name / "config.pbtxt"
    text = config.read_text().replace(f'name: "{model}"', f'name: "{name}"')
    config.write_text(text + extra)


def build_repo(repo: Path) -> Path:
    _copy(repo, "py_sender")
    _copy(repo, "py_sender", "py_sender_decoupled", DECOUPLED)
    _copy(repo, "py_sender", "py_sender_async", ASYNC)
    _copy(repo, "py_sender", "py_sender_decoupled_async", DECOUPLED + ASYNC)
    _copy(repo, "py_response_params")
    _copy(repo, "py_response_params", "py_response_params_decoupled", DECOUPLED)
    _copy(repo, "py_response_params_bls")
    _copy(repo, "py_ready")
    _copy(repo, "py_until_cancelled")
    _copy(repo, "py_bls_cancel")
    _copy(repo, "py_ready", "py_ready_async",
          'parameters { key: "async_is_ready" value { string_value: "1" } }\n')
    return repo


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = build_repo(tmp_path_factory.mktemp("apirepo"))
    with running_server(repo, f"--backend-config=python,nursery-instance-mode={request.param}",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


# -- the response sender --------------------------------------------------------------------

def _sender_inputs(module: Any, pre: int = 0, pre_final: bool = False, ret: bool = False,
                   post: int = 0, post_final: bool = False) -> list[Any]:
    inputs = []
    for name, value, datatype in (("PRE", np.uint8(pre), "UINT8"),
                                  ("PRE_FINAL", np.bool_(pre_final), "BOOL"),
                                  ("RETURN", np.bool_(ret), "BOOL"),
                                  ("POST", np.uint8(post), "UINT8"),
                                  ("POST_FINAL", np.bool_(post_final), "BOOL")):
        item = module.InferInput(name, [1], datatype)
        item.set_data_from_numpy(np.array([value]))
        inputs.append(item)
    return inputs


def _stream(server: ServerProcess, model: str, **case: Any) -> list[tuple[list[int], str]]:
    """One request over ModelStreamInfer: each answer as (INDEX values, error text), up to
    the final one (the empty final response is asked for and left out)."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    got: list[tuple[list[int], str]] = []
    try:
        client.async_stream_infer(model, _sender_inputs(grpcclient, **case),
                                  enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=20)
            if error is not None:
                got.append(([], error.message()))
                final = True  # an error ends the request
            else:
                index = result.as_numpy("INDEX")
                if index is not None:
                    got.append((index.tolist(), ""))
                params = result.get_response().parameters
                final = "triton_final_response" not in params or params[
                    "triton_final_response"].bool_param
            if final:
                break
        with pytest.raises(queue.Empty):
            results.get(timeout=0.5)  # nothing after the final answer (post-return sends too)
    finally:
        client.stop_stream()
        client.close()
    return got


@pytest.mark.parametrize("model", ["py_sender", "py_sender_async"])
def test_non_decoupled_sender_rules(server: ServerProcess, model: str) -> None:
    assert _stream(server, model, ret=True) == [([0], "")]
    assert _stream(server, model, pre=1, pre_final=True) == [([1000], "")]
    assert _stream(server, model, post=1, post_final=True) == [([2000], "")]
    # the final flag before any response raises in execute: the request fails with it
    ((values, error),) = _stream(server, model, pre_final=True)
    assert values == [] and error.startswith(
        f"Failed to process the request(s) for model '{model}_0_0', message: "
        "TritonModelException: Unable to send response. Non-decoupled model cannot send "
        "complete final before sending a response.\n\nAt:\n"), error
    # a second response raises in execute; the first one was the answer
    assert _stream(server, model, pre=2, pre_final=True) == [([1000], "")]
    # sent, then returned: the sent one is the answer (the return is refused, quietly)
    assert _stream(server, model, pre=1, pre_final=True, ret=True) == [([1000], "")]
    # returned, then sent after the return: the send raises in the model's thread
    assert _stream(server, model, ret=True, post=1, post_final=True) == [([0], "")]
    _wait_in_log(server, "post-return send refused: Unable to send response. Non-decoupled "
                         "model cannot send more than one response.")
    # the final flag alone after the return: Triton would leave the request waiting; here it
    # gets the error the model's send raised
    ((values, error),) = _stream(server, model, post_final=True)
    assert error == ("Unable to send response. Non-decoupled model cannot send complete "
                     "final before sending a response.")
    # a request that nothing answers (None returned, sender never taken) fails at once
    ((values, error),) = _stream(server, model)
    assert "returned no response for a request" in error


def test_non_decoupled_sender_over_http(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    for case, index in (({"ret": True}, 0), ({"pre": 1, "pre_final": True}, 1000),
                        ({"post": 1, "post_final": True}, 2000),
                        ({"pre": 2, "pre_final": True}, 1000)):
        result = client.infer("py_sender", _sender_inputs(httpclient, **case))
        assert result.as_numpy("INDEX").tolist() == [index], case
    with pytest.raises(InferenceServerException) as raised:
        client.infer("py_sender", _sender_inputs(httpclient, pre_final=True))
    assert "Non-decoupled model cannot send complete final before sending a response" in (
        raised.value.message())


@pytest.mark.parametrize("model", ["py_sender_decoupled", "py_sender_decoupled_async"])
def test_decoupled_sender_rules(server: ServerProcess, model: str) -> None:
    assert _stream(server, model, pre_final=True) == []
    assert _stream(server, model, post_final=True) == []
    assert _stream(server, model, pre=1, pre_final=True) == [([1000], "")]
    assert _stream(server, model, post=2, post_final=True) == [([2000], ""), ([2001], "")]
    assert _stream(server, model, pre=1, post=3, post_final=True) == [
        ([1000], ""), ([2000], ""), ([2001], ""), ([2002], "")]
    # returning a response from a decoupled model's execute fails the request
    message = (f"Failed to process the request(s) for model '{model}_0_0', message: "
               f"Python model '{model}_0_0' is using the decoupled mode and the "
               "execute function must return None.")
    assert _stream(server, model, ret=True) == [([], message)]
    # ... but not one its sender already closed: only the sent response arrives
    assert _stream(server, model, pre=1, pre_final=True, ret=True) == [([1000], "")]
    # returned, then sent: the error ends the request and the later send raises
    assert _stream(server, model, ret=True, post=1, post_final=True) == [([], message)]
    _wait_in_log(server, "post-return send refused: Unable to send response. Response sender "
                         "has been closed.")


def _wait_in_log(server: ServerProcess, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.log():
        assert time.monotonic() < deadline, f"not in the server log: {text}"
        time.sleep(0.05)


# -- response parameters ----------------------------------------------------------------------

def _params_input(module: Any, name: str, value: Any) -> Any:
    item = module.InferInput(name, [1], "BYTES")
    item.set_data_from_numpy(np.array([json.dumps(value).encode()], dtype=np.object_))
    return item


def _grpc_parameters(result: Any) -> dict[str, Any]:
    out = {}
    for key, value in result.get_response().parameters.items():
        out[key] = getattr(value, value.WhichOneof("parameter_choice"))
    return out


GOOD_PARAMETERS = [{}, {"many_elements": False}, {"bool": True, "str": "Hello World!", "int": 1024},
                   {"a": "1", "b": "2", "c": 3, "d": False, "e": 5, "f": ""}]
BAD_PARAMETERS = [
    ([], "Expect dict, got <class 'list'>"),
    ({"1": "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
    ({"int": 2, "float": 0.5},
     "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
    ({"bool": True, "null": None},
     "Expect parameters values to have type bool/int/str, found type <class 'NoneType'>"),
    ({"str": "", "list": ["variable"]},
     "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
]


def test_response_parameters_reach_the_client(server: ServerProcess) -> None:
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    h = httpclient.InferenceServerClient(server.url)
    for params in GOOD_PARAMETERS:
        result = g.infer("py_response_params", [_params_input(grpcclient, "PARAMS", params)])
        assert _grpc_parameters(result) == params
        assert json.loads(result.as_numpy("OUTPUT")[0]) == params
        result = h.infer("py_response_params", [_params_input(httpclient, "PARAMS", params)])
        assert result.get_response().get("parameters", {}) == params
    for params, message in BAD_PARAMETERS:  # refused when the model builds the response
        with pytest.raises(InferenceServerException) as raised:
            g.infer("py_response_params", [_params_input(grpcclient, "PARAMS", params)])
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert message in raised.value.message()
        with pytest.raises(InferenceServerException) as raised:
            h.infer("py_response_params", [_params_input(httpclient, "PARAMS", params)])
        assert raised.value.status() == "400" and message in raised.value.message()


def test_response_parameters_of_a_decoupled_model(server: ServerProcess) -> None:
    params = [{"bool": False, "int": 2048}, {"str": "Hello World!"}]
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("py_response_params_decoupled",
                                  [_params_input(grpcclient, "PARAMS", params)])
        got = [results.get(timeout=20) for _ in params]
    finally:
        client.stop_stream()
        client.close()
    for (result, error), expected in zip(got, params, strict=True):
        assert error is None
        # the final flag comes apart from the responses: each says it is not the last
        assert _grpc_parameters(result) == {**expected, "triton_final_response": False}


def test_response_parameters_of_bls_responses(server: ServerProcess) -> None:
    params = {"bool": False, "int": 2048, "str": "Hello World!"}
    decoupled = [{}, {"bool": True, "int": 10000}, {"str": "?"}]
    client = httpclient.InferenceServerClient(server.url)
    result = client.infer("py_response_params_bls", [
        _params_input(httpclient, "PARAMS", params),
        _params_input(httpclient, "PARAMS_DECOUPLED", decoupled)])
    assert json.loads(result.as_numpy("OUTPUT")[0]) == [params, *decoupled]


# -- is_ready() ---------------------------------------------------------------------------------

def test_is_ready_hook_decides_model_and_server_readiness(server: ServerProcess) -> None:
    """python_backend's is_ready() (Triton's TRITONBACKEND_ModelInstanceReady): asked by the
    model's and the (strict) server's readiness; False, an exception, a non-bool or no answer
    within 5 s: not ready. Inference goes on meanwhile, as in Triton; a check while a call
    is still in flight waits for that call (no second one) and shares its answer."""
    repo = Path(server.args[server.args.index("--model-repository") + 1])
    h = httpclient.InferenceServerClient(server.url, network_timeout=60)
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    data = np.array([1.5, 2.5], dtype=np.float32)
    for model in ("py_ready", "py_ready_async"):
        state = repo / model / "ready_state"
        assert h.is_model_ready(model) and g.is_model_ready(model) and h.is_server_ready()
        for answer in ("false", "raise", "number"):
            state.write_text(answer)
            assert not h.is_model_ready(model), answer
            assert not g.is_model_ready(model), answer
            assert not h.is_server_ready() and not g.is_server_ready(), answer
            item = httpclient.InferInput("INPUT0", [2], "FP32")
            item.set_data_from_numpy(data)
            assert h.infer(model, [item]).as_numpy("OUTPUT0").tolist() == data.tolist()
        if model == "py_ready":  # no answer within the time limit (once: it costs 5 s)
            state.write_text("slow")
            assert not h.is_model_ready(model)
            item = httpclient.InferInput("INPUT0", [2], "FP32")
            item.set_data_from_numpy(data)
            assert h.infer(model, [item]).as_numpy("OUTPUT0").tolist() == data.tolist()
            assert g.is_model_ready(model)  # the slow call in flight answers ready at last
        state.write_text("true")
        deadline = time.monotonic() + 30  # a slow check given up on must end first
        while not h.is_model_ready(model):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert g.is_model_ready(model) and h.is_server_ready()
    assert h.is_model_ready("py_sender")  # no hook: ready as long as the instance is


# -- cancelling a BLS stream ------------------------------------------------------------------

def test_bls_stream_cancel_cancels_the_downstream_request(server: ServerProcess) -> None:
    """python_backend's ResponseIterator.cancel(): the called model sees is_cancelled() and
    ends its stream with a CANCELLED response; a cancel() after the end does nothing."""
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    inputs = []
    for name, value in (("IN", 2), ("MAX_SUM", 10)):
        item = httpclient.InferInput(name, [1], "INT32")
        item.set_data_from_numpy(np.array([value], dtype=np.int32))
        inputs.append(item)
    for _ in range(2):
        result = client.infer("py_bls_cancel", inputs)
        assert result.as_numpy("IS_CANCELLED").tolist() == [True]
        total = int(result.as_numpy("SUM")[0])
        assert 10 <= total < 2 * 500  # stopped by the cancellation, not by the model's limit
        assert result.as_numpy("AFTER_END").tolist() == [b""]


# -- Python-based backends, auto_complete_config in a stub ------------------------------------

BACKENDS = ROOT / "tests" / "python_backends"


def _based_repo(repo: Path) -> None:
    for name, operation, versions in (("add", "add", (1, 2)), ("sub", "sub", (1,))):
        for version in versions:
            folder = repo / name / str(version)
            folder.mkdir(parents=True)
            (folder / "model.json").write_text(json.dumps({"operation": operation}))
        (repo / name / "config.pbtxt").write_text('backend: "add_sub"\n')
    (repo / "nothing").mkdir()
    (repo / "nothing" / "1").mkdir()
    (repo / "nothing" / "config.pbtxt").write_text('backend: "no_such_backend"\n')


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_python_based_backend(mode: str, tmp_path: Path, start_server: Any) -> None:
    """Triton's Python-based backends: backend "add_sub" is <backend directory>/add_sub/
    model.py; each model naming it has its own folder (get_model_dir()), its configuration
    completed by the backend's auto_complete_config, in a stub process in process mode."""
    repo = tmp_path / "repo"
    _based_repo(repo)
    server = start_server(repo, "--model-control-mode=explicit",
                          f"--backend-directory={BACKENDS}",
                          f"--backend-config=python,nursery-instance-mode={mode}")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.load_model(
        "add", config='{"backend":"add_sub","version_policy":{"latest":{"num_versions":2}}}')
    client.load_model("sub")
    a = np.random.default_rng(0).random(4, dtype=np.float32)
    b = np.random.default_rng(1).random(4, dtype=np.float32)
    for model, version, expected in (("add", "1", a + b), ("add", "2", a + b),
                                     ("sub", "1", a - b)):
        assert client.is_model_ready(model, model_version=version)
        inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"),
                  grpcclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer(model, inputs, model_version=version,
                              outputs=[grpcclient.InferRequestedOutput("OUTPUT")])
        np.testing.assert_allclose(result.as_numpy("OUTPUT"), expected, rtol=1e-6)
    config = httpclient.InferenceServerClient(server.url).get_model_config("sub")
    assert config["backend"] == "add_sub" and config["runtime"] == "model.py"
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    metadata = client.get_model_metadata("sub", as_json=True)
    assert metadata["platform"] == "add_sub"
    completed_in = int((repo / "sub" / "1" / "autocomplete_pid").read_text())
    if mode == "process":  # the server never imported the backend's model.py
        assert completed_in != server.proc.pid
    else:
        assert completed_in == server.proc.pid
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("nothing")
    assert "backend 'no_such_backend' is not available" in raised.value.message()
    assert f"{BACKENDS / 'no_such_backend' / 'model.py'}" in raised.value.message()
    client.close()

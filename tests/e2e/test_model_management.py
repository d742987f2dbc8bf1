"""Model management end to end: explicit load/unload/reload over HTTP and gRPC, config and
file overrides, path traversal, poll mode, version policies, warm-up, reloads under load."""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, make_models
from tests.e2e.test_http_tritonclient import _raw

pytestmark = pytest.mark.e2e


def _add_sub_inputs(batch: int = 1) -> tuple[list[httpclient.InferInput], np.ndarray]:
    a = np.full((batch, 16), 2.0, np.float32)
    inputs = [httpclient.InferInput("INPUT0", [batch, 16], "FP32"),
              httpclient.InferInput("INPUT1", [batch, 16], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return inputs, a


def _wait(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def test_explicit_load_unload_reload(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    make_models.write_mlp(repo)
    server = start_server(repo, "--model-control-mode=explicit")
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert http.get_model_repository_index() == [{"name": "add_sub"}, {"name": "mlp"}]
    assert not http.is_model_ready("add_sub")
    http.load_model("add_sub")
    assert http.is_model_ready("add_sub")
    inputs, a = _add_sub_inputs()
    np.testing.assert_array_equal(http.infer("add_sub", inputs).as_numpy("OUTPUT0"), 2 * a)
    grpc.load_model("mlp")
    index = grpc.get_model_repository_index(as_json=True)["models"]
    assert {"name": "mlp", "version": "1", "state": "READY"} in index
    status, body = _raw(server, "POST", "/v2/repository/index", b'{"ready": true}')
    assert status == 200 and {m["name"] for m in json.loads(body)} == {"add_sub", "mlp"}
    # a 'ready' or 'unload_dependents' that is not a boolean: 400 in Triton's words
    status, body = _raw(server, "POST", "/v2/repository/index", b'{"ready": [true]}')
    assert status == 400
    assert json.loads(body)["error"] == "Invalid value for 'ready': expected a boolean"
    status, body = _raw(server, "POST", "/v2/repository/models/mlp/unload",
                        b'{"parameters": {"unload_dependents": "yes"}}')
    assert status == 400 and json.loads(body)["error"] == (
        "Unable to parse 'unload_dependents': attempt to access JSON non-boolean as boolean")
    # config override: forces a reload with the given configuration
    config = http.get_model_config("add_sub")
    config["max_batch_size"] = 2
    http.load_model("add_sub", config=json.dumps(config))
    assert http.get_model_config("add_sub")["max_batch_size"] == 2
    with pytest.raises(InferenceServerException, match="batch-size must be <= 2"):
        http.infer("add_sub", _add_sub_inputs(3)[0])
    grpc.unload_model("add_sub")
    assert not http.is_model_ready("add_sub")
    assert {"name": "add_sub", "version": "1", "state": "UNAVAILABLE",
            "reason": "unloaded"} in http.get_model_repository_index()
    with pytest.raises(InferenceServerException, match="has no available versions"):
        http.infer("add_sub", inputs)
    http.load_model("add_sub")  # back from disk (max_batch_size 8 again)
    assert http.get_model_config("add_sub")["max_batch_size"] == 8


def test_load_errors(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
        http.load_model("nope")
    with pytest.raises(InferenceServerException) as err:
        grpc.load_model("nope")
    assert err.value.status() == "StatusCode.INTERNAL"  # as Triton answers
    http.unload_model("never_loaded")  # unloading what is not loaded succeeds, as in Triton
    # Triton's check of a load's model name (white space trimmed): blank, or a path
    for name in ("", " ", "\t\n", " \v\f\r "):
        with pytest.raises(InferenceServerException) as err:
            grpc.load_model(name)
        assert err.value.message() == ("Model name cannot be empty. Please enter a valid name "
                                       "to deploy.")
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    for name in ("../etc", "a/../b", "..", " ..", "/etc/passwd", "model/"):
        with pytest.raises(InferenceServerException) as err:
            grpc.load_model(name)
        assert err.value.message() == (f"invalid model name '{name}', model name must not "
                                       "contain path traversal characters")
        grpc.unload_model(name)  # an unload's name is not checked so
    for name in ("...", "..my_model", "model..1"):  # not paths: not in the repository
        with pytest.raises(InferenceServerException, match="failed to poll from model"):
            grpc.load_model(name)
    with pytest.raises(InferenceServerException, match="unknown field 'bogus'"):
        http.load_model("add_sub", config=json.dumps({"bogus": 1}))
    with pytest.raises(InferenceServerException, match="failed to parse the 'config' override"):
        http.load_model("add_sub", config="{not json")
    # a broken reload leaves the old version serving
    (repo / "add_sub" / "config.pbtxt").write_text("max_batch_size: [")
    with pytest.raises(InferenceServerException, match="config.pbtxt:1:17"):
        http.load_model("add_sub")
    assert http.is_model_ready("add_sub")
    inputs, a = _add_sub_inputs()
    np.testing.assert_array_equal(http.infer("add_sub", inputs).as_numpy("OUTPUT0"), 2 * a)


@pytest.mark.parametrize("path", ["../escape/model.onnx", "1/../../escape.onnx", "/../escape.onnx",
                                  "1/../../../tmp/x", "", "/"])
def test_file_override_path_traversal(tmp_path: Path, start_server: type[ServerProcess],
                                      path: str) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub",
                          "--allow-model-file-upload=true")
    http = httpclient.InferenceServerClient(server.url)
    config = http.get_model_config("add_sub")
    with pytest.raises(InferenceServerException, match="must stay within model directory"):
        http.load_model("add_sub", config=json.dumps(config), files={f"file:{path}": b"x"})
    assert not (tmp_path / "escape").exists() and not (tmp_path / "escape.onnx").exists()
    assert http.is_model_ready("add_sub")


def test_file_override_serves_the_given_model(tmp_path: Path,
                                              start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--allow-model-file-upload=true")
    http = httpclient.InferenceServerClient(server.url)
    onnx_bytes = (repo / "add_sub" / "1" / "model.onnx").read_bytes()
    config = {"name": "fresh", "platform": "onnxruntime_onnx", "max_batch_size": 4,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                         {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}]}
    http.load_model("fresh", config=json.dumps(config),
                    files={"file:1/model.onnx": onnx_bytes})
    inputs, a = _add_sub_inputs()
    np.testing.assert_array_equal(http.infer("fresh", inputs).as_numpy("OUTPUT1"), 0 * a)
    # over gRPC the files travel as bytes
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    config["name"] = "fresh2"
    grpc.load_model("fresh2", config=json.dumps(config),
                    files={"file:1/model.onnx": onnx_bytes})
    assert http.is_model_ready("fresh2")
    assert base64.b64encode(b"ok")  # the HTTP client base64-encodes files itself


def test_file_override_keys_with_a_leading_slash(tmp_path: Path,
                                                 start_server: type[ServerProcess]) -> None:
    """Triton joins a ``file:`` key to the model folder (``JoinPath``), so a leading slash
    (or several) and ``..`` that stays inside are accepted (core's model_repository_manager)."""
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--allow-model-file-upload=true")
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    onnx_bytes = (repo / "add_sub" / "1" / "model.onnx").read_bytes()
    config = {"platform": "onnxruntime_onnx", "max_batch_size": 4,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                         {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}]}
    inputs, a = _add_sub_inputs()
    keys = ["file:/1/model.onnx", "file://1/model.onnx", "file:/2/../1/model.onnx"]
    for i, key in enumerate(keys):
        name = f"slash{i}"
        client = http if i % 2 == 0 else grpc
        client.load_model(name, config=json.dumps({**config, "name": name}),
                          files={key: onnx_bytes, "file:/etc/notes.txt": b"kept inside"})
        np.testing.assert_array_equal(http.infer(name, inputs).as_numpy("OUTPUT0"), 2 * a)
    assert not Path("/etc/notes.txt").exists()


def test_none_mode_refuses_changes(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo)
    http = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as err:
        http.load_model("add_sub")
    assert err.value.status() == "503"
    assert "explicit model load / unload is not allowed" in err.value.message()
    assert http.get_model_repository_index() == [{"name": "add_sub", "version": "1",
                                                 "state": "READY"}]


def test_poll_mode_follows_the_repository(tmp_path: Path,
                                          start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--model-control-mode=poll", "--repository-poll-secs=1")
    http = httpclient.InferenceServerClient(server.url)
    # an added model
    make_models.write_mlp(repo)
    _wait(lambda: http.is_model_ready("mlp"))
    # a changed config
    config_path = repo / "add_sub" / "config.pbtxt"
    config_path.write_text(config_path.read_text().replace("max_batch_size: 8",
                                                           "max_batch_size: 3"))
    _wait(lambda: http.get_model_config("add_sub")["max_batch_size"] == 3)
    # a new version (latest policy: it replaces version 1)
    shutil.copytree(repo / "add_sub" / "1", repo / "add_sub" / "2")
    _wait(lambda: http.is_model_ready("add_sub", "2") and not http.is_model_ready("add_sub", "1"))
    inputs, a = _add_sub_inputs()
    assert http.infer("add_sub", inputs).get_response()["model_version"] == "2"
    # a removed model
    shutil.rmtree(repo / "mlp")
    _wait(lambda: not http.is_model_ready("mlp"))
    # load/unload API refused in poll mode
    with pytest.raises(InferenceServerException, match="not allowed if polling is enabled"):
        http.unload_model("add_sub")


def test_warmup_runs_before_ready(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    folder = make_models.write_add_sub(repo)
    (folder / "warmup").mkdir()
    (folder / "warmup" / "in0").write_bytes(np.ones(16, np.float32).tobytes())
    config = folder / "config.pbtxt"
    config.write_text(config.read_text() + (
        'model_warmup [{ name: "w" batch_size: 4 count: 3 inputs { key: "INPUT0" value: { '
        'data_type: TYPE_FP32 dims: [16] input_data_file: "in0" } } inputs { key: "INPUT1" '
        'value: { data_type: TYPE_FP32 dims: [16] random_data: true } } }]\n'))
    server = start_server(repo)
    assert httpclient.InferenceServerClient(server.url).is_model_ready("add_sub")
    broken = make_models.write_add_sub(tmp_path / "repo2")
    cfg = broken / "config.pbtxt"
    cfg.write_text(cfg.read_text() + (
        'model_warmup [{ name: "bad" batch_size: 1 inputs { key: "INPUT0" value: { '
        'data_type: TYPE_FP32 dims: [16] input_data_file: "../../etc/passwd" } } }]\n'))
    bad = start_server(tmp_path / "repo2", wait=False)
    assert bad.wait_exit(60) == 1
    assert "model_warmup 'bad'" in bad.log() and "must be a file inside" in bad.log()


def test_warmup_of_a_sequence_model_gives_its_control_inputs(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """A sequence model's warmup sample may give the inputs the sequence batcher provides
    (L0_warmup gives START and READY): they reach the model with the sample, which then
    loads and serves; a name that is neither an input nor a control still stops the load."""
    repo = tmp_path / "repo"
    folder = make_models.write_sequence_controls(repo, "seq")
    config = folder / "config.pbtxt"
    samples = "".join(
        f'inputs {{ key: "{name}" value: {{ data_type: {kind} dims: [1] zero_data: true }} }} '
        for name, kind in (("INPUT", "TYPE_INT32"), ("START", "TYPE_INT32"),
                           ("END", "TYPE_INT32"), ("READY", "TYPE_INT32"),
                           ("CORRID", "TYPE_UINT64")))
    config.write_text(config.read_text() + (
        f'model_warmup [{{ name: "sequence sample" count: 2 batch_size: 4 {samples}}}]\n'))
    server = start_server(repo, "--log-verbose=1")
    for iteration in (1, 2):  # Triton's line, per instance and iteration
        assert (f"model 'seq' instance seq_0_0 is running warmup sample 'sequence sample' for "
                f"iteration {iteration}") in server.log()
    client = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[5]], np.int32))
    got = client.infer("seq", [inp], sequence_id=9, sequence_start=True, sequence_end=True)
    assert int(got.as_numpy("OUTPUT")[0, 0]) == 5
    assert int(got.as_numpy("START_OUT")[0, 0]) == 1
    client.close()
    config.write_text(config.read_text().replace('key: "END"', 'key: "FINISH"'))
    bad = start_server(repo, wait=False)
    assert bad.wait_exit(60) == 1
    assert "'FINISH' is not an input of the model" in bad.log()


def test_reload_and_unload_under_load(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """While a client sends requests continuously, the model is reloaded and unloaded: every
    request gets a correct answer or a clear UNAVAILABLE/NOT_FOUND error; none is lost."""
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    admin = httpclient.InferenceServerClient(server.url)
    outcomes: list[str] = []
    stop = threading.Event()

    def client() -> None:
        # closed in this thread: a client left to the garbage collector (an error's
        # traceback makes a cycle) is finalised on another thread, where gevent cannot
        # close its pooled socket, and the suite fails on the ResourceWarning
        with httpclient.InferenceServerClient(server.url) as c:
            inputs, a = _add_sub_inputs()
            while not stop.is_set():
                try:
                    out = c.infer("add_sub", inputs).as_numpy("OUTPUT0")
                    outcomes.append("ok" if np.array_equal(out, 2 * a) else "WRONG")
                except InferenceServerException as exc:
                    outcomes.append("unavailable" if exc.status() in ("503", "404") else
                                    f"ERROR {exc.status()} {exc.message()}")

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    config = admin.get_model_config("add_sub")
    for i in range(4):
        time.sleep(0.2)
        config["max_batch_size"] = 4 + i
        admin.load_model("add_sub", config=json.dumps(config))
    time.sleep(0.2)
    admin.unload_model("add_sub")
    time.sleep(0.2)
    admin.load_model("add_sub")
    time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join()
    assert outcomes.count("ok") > 10
    assert all(o in ("ok", "unavailable") for o in outcomes), set(outcomes)


def test_backend_failure_message_and_cli_checks(tmp_path: Path,
                                                start_server: type[ServerProcess]) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    repo = tmp_path / "repo"
    folder = make_models.write_add_sub(repo)
    (folder / "1" / "model.onnx").write_bytes(b"not onnx")
    server = start_server(repo, "--model-control-mode=explicit")
    http = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as err:
        http.load_model("add_sub")
    assert err.value.status() == "400"
    assert err.value.message().startswith(
        "load failed for model 'add_sub': version 1 is at UNAVAILABLE state: ")
    index = http.get_model_repository_index()
    assert index[0]["state"] == "UNAVAILABLE" and "onnx runtime failed" in index[0]["reason"]
    proc = subprocess.run([sys.executable, "-m", "nursery", "serve", "--model-repository",
                           str(repo), "--load-model=add_sub"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "--load-model only takes effect with --model-control-mode=explicit" in proc.stderr


def test_a_reload_never_interrupts_the_version_it_replaces(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """While version 1 reloads (a config override), the old instance keeps answering: no
    request sees 'no available versions' or any other error, as in Triton."""
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    admin = httpclient.InferenceServerClient(server.url)
    config = admin.get_model_config("add_sub")
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def client() -> None:
        c = httpclient.InferenceServerClient(server.url)
        inputs, a = _add_sub_inputs()
        while not stop.is_set():
            try:
                out = c.infer("add_sub", inputs).as_numpy("OUTPUT0")
                np.testing.assert_allclose(out, a + a)
                answered[0] += 1
            except Exception as exc:  # every one of these is a failure of the test
                failures.append(repr(exc))
        c.close()

    thread = threading.Thread(target=client)
    thread.start()
    try:
        for batch in (4, 6, 8):
            config["max_batch_size"] = batch
            admin.load_model("add_sub", config=json.dumps(config))  # reloads version 1
            assert admin.get_model_config("add_sub")["max_batch_size"] == batch
    finally:
        stop.set()
        thread.join(30)
    admin.close()
    assert not failures, failures[:3]
    assert answered[0] > 0


def _chain(repo: Path, name: str, steps: list[str]) -> None:
    """An ensemble that runs add_sub-shaped models one after another (A, B -> X, Y)."""
    tensors = [("A", "B")] + [(f"S{i}", f"D{i}") for i in range(len(steps) - 1)] + [("X", "Y")]
    body = "".join(
        f'{{ model_name: "{m}" model_version: -1 '
        f'input_map {{ key: "INPUT0" value: "{tensors[i][0]}" }} '
        f'input_map {{ key: "INPUT1" value: "{tensors[i][1]}" }} '
        f'output_map {{ key: "OUTPUT0" value: "{tensors[i + 1][0]}" }} '
        f'output_map {{ key: "OUTPUT1" value: "{tensors[i + 1][1]}" }} }},'
        for i, m in enumerate(steps)).rstrip(",")
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] }, '
        '{ name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        f"ensemble_scheduling {{ step [ {body} ] }}\n")


def test_unload_dependents_takes_the_models_loaded_with_an_ensemble(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """Triton's unload_dependents: unloading an ensemble also unloads the models that were
    loaded only along with it, but never one asked for by name or one another loaded
    ensemble still uses."""
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo, name="first")
    make_models.write_add_sub(repo, name="second")
    _chain(repo, "ens_both", ["first", "second"])
    _chain(repo, "ens_second", ["second"])
    server = start_server(repo, "--model-control-mode=explicit")
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")

    def ready() -> set[str]:
        return {m["name"] for m in http.get_model_repository_index()
                if m.get("state") == "READY"}

    assert "model_repository(unload_dependents)" in http.get_server_metadata()["extensions"]
    http.load_model("ens_both")  # loads first and second along with it
    http.load_model("ens_second")
    assert ready() == {"ens_both", "ens_second", "first", "second"}
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("A", "B")]
    for i in inputs:
        i.set_data_from_numpy(np.full((1, 16), 3.0, np.float32))
    np.testing.assert_array_equal(http.infer("ens_both", inputs).as_numpy("X"),
                                  np.full((1, 16), 6.0, np.float32))  # (3+3) + (3-3)
    # without unload_dependents the composing models stay
    http.unload_model("ens_second")
    assert ready() == {"ens_both", "first", "second"}
    http.load_model("ens_second")
    # with it: 'first' goes, 'second' stays for ens_second
    http.unload_model("ens_both", unload_dependents=True)
    assert ready() == {"ens_second", "second"}
    assert {"name": "first", "version": "1", "state": "UNAVAILABLE",
            "reason": "unloaded"} in http.get_model_repository_index()
    # over gRPC; now nothing else uses 'second'
    grpc.unload_model("ens_second", unload_dependents=True)
    assert ready() == set()
    # a model asked for by name is not a dependent, even when an ensemble uses it
    http.load_model("first")
    http.load_model("ens_both")
    http.unload_model("ens_both", unload_dependents=True)
    assert ready() == {"first"}
    # Triton's answers to a parameter of the wrong type
    status, body = _raw(server, "POST", "/v2/repository/models/first/unload",
                        b'{"parameters": {"unload_dependents": "yes"}}')
    assert status == 400 and b"unload_dependents" in body
    assert ready() == {"first"}

"""Python models in stub processes of their own (issue 24): a model that exits, segfaults or
hangs costs its own requests, never the server; the stub is started again; a hung stub is
killed at unload and at shutdown; every instance has its own process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, make_models, wait_for_file

pytestmark = pytest.mark.e2e

MODELS = ROOT / "tests" / "models"
PROCESS = 'parameters { key: "nursery_instance_mode" value { string_value: "process" } }\n'


def _fp32(*values: float) -> list[httpclient.InferInput]:
    array = np.array([values], dtype=np.float32)
    item = httpclient.InferInput("INPUT0", list(array.shape), "FP32")
    item.set_data_from_numpy(array)
    return [item]


def _ended(pid: int) -> bool:
    """The process has ended: reaped, or a zombie whose every thread has exited. (An exiting
    process's cmdline reads empty a moment before it ends, and its main thread shows as a
    zombie while its other threads still exit: until then its parent cannot see it end.)"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X") and len(tasks) <= 1


def _stubs(server: ServerProcess) -> set[int]:
    """The server's stub processes (its children running the stub module)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server.proc.pid and b"triton_python_backend_stub" in cmdline:
            found.add(int(entry.name))
    return found


def test_a_crashing_model_costs_its_requests_only(tmp_path: Path,
                                                  start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_crash", repo / "py_crash")
    make_models.write_add_sub(repo)
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    first = client.infer("py_crash", _fp32(1.0, 0.0)).as_numpy("OUTPUT0")
    assert first[0, 0] == 1.0
    pid = int(first[0, -1])
    assert _stubs(server) == {pid}

    for value, how in ((-1.0, "exit code 3"), (-2.0, "killed by signal 11")):
        with pytest.raises(InferenceServerException) as failed:
            client.infer("py_crash", _fp32(value))
        assert "Stub process 'py_crash_0_0' is not healthy" in str(failed.value)
        assert how in str(failed.value)
        # the server and its other models never noticed
        assert client.is_server_live()
        add = np.ones((1, 16), np.float32)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            item = httpclient.InferInput(name, [1, 16], "FP32")
            item.set_data_from_numpy(add)
            inputs.append(item)
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"),
                                      add * 2)
        # the next request starts a fresh stub (initialize runs again) and is served
        again = client.infer("py_crash", _fp32(7.0, 0.0)).as_numpy("OUTPUT0")
        assert again[0, 0] == 7.0 and int(again[0, -1]) != pid
        pid = int(again[0, -1])
    assert server.stop() == 0, server.log()


def test_a_hung_stub_is_killed_at_unload_and_at_shutdown(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_hang", repo / "py_hang")
    marker = tmp_path / "hanging"
    with (repo / "py_hang" / "config.pbtxt").open("a") as config:
        config.write(PROCESS)
        config.write(f'parameters {{ key: "hang_marker" value {{ string_value: "{marker}" }} }}\n')
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=py_hang",
                          "--model-unload-timeout-secs=2", "--exit-timeout-secs=5")
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    assert client.infer("py_hang", _fp32(1.0)).as_numpy("OUTPUT0")[0, 0] == 1.0
    (stub,) = _stubs(server)
    answers: list[BaseException | None] = []

    def hang() -> None:
        try:
            with httpclient.InferenceServerClient(server.url, network_timeout=120) as c:
                c.infer("py_hang", _fp32(-1.0))
            answers.append(None)
        except BaseException as exc:  # noqa: BLE001 - the answer is the point
            answers.append(exc)

    worker = threading.Thread(target=hang)
    worker.start()
    wait_for_file(marker, timeout=30)
    marker.unlink()
    client.unload_model("py_hang")  # returns: the stub is killed after the timeout
    worker.join(60)
    assert isinstance(answers[0], InferenceServerException)
    assert not Path(f"/proc/{stub}").exists() or stub not in _stubs(server)
    assert _stubs(server) == set()
    client.load_model("py_hang")
    assert client.infer("py_hang", _fp32(2.0)).as_numpy("OUTPUT0")[0, 0] == 2.0
    worker = threading.Thread(target=hang)
    worker.start()
    wait_for_file(marker, timeout=30)
    stubs = _stubs(server)
    assert server.stop(timeout=60) == 0, server.log()
    worker.join(60)
    for pid in stubs:  # nothing left behind
        assert not Path(f"/proc/{pid}").exists() or b"stub" not in Path(
            f"/proc/{pid}/cmdline").read_bytes()


def test_each_instance_has_its_own_process(tmp_path: Path,
                                           start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_crash", repo / "py_crash")
    config = repo / "py_crash" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", "count: 2"))
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url, concurrency=4, network_timeout=60)
    assert len(_stubs(server)) == 2
    seen = set()
    for _ in range(40):
        pending = [client.async_infer("py_crash", _fp32(1.0, 0.0)) for _ in range(4)]
        seen |= {int(p.get_result().as_numpy("OUTPUT0")[0, -1]) for p in pending}
    assert seen <= _stubs(server) and len(seen) >= 1
    assert server.stop() == 0, server.log()


def test_readiness_follows_the_stub(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """A dead stub makes its model (and the strict server readiness) not ready, with Triton's
    reason at --log-verbose 1, until the next request starts a new stub (as in Triton, the
    readiness endpoints alone never start one)."""
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_crash", repo / "py_crash")
    server = start_server(repo, "--log-verbose=1")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    assert client.is_model_ready("py_crash") and client.is_server_ready()
    (before,) = _stubs(server)
    with pytest.raises(InferenceServerException, match="is not healthy"):
        client.infer("py_crash", _fp32(-1.0))
    for _ in range(3):
        assert not client.is_model_ready("py_crash")
        assert not client.is_server_ready()
    assert _stubs(server) == set()
    assert server.log().count("Model 'py_crash' version 1 is not ready: Stub process "
                              "'py_crash_0_0' is not healthy.") == 3
    assert client.infer("py_crash", _fp32(3.0, 0.0)).as_numpy("OUTPUT0")[0, 0] == 3.0
    (after,) = _stubs(server)
    assert after != before
    assert client.is_model_ready("py_crash") and client.is_server_ready()
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("signal_number", [signal.SIGSEGV, signal.SIGKILL])
def test_a_stub_found_by_its_name_and_killed(tmp_path: Path, start_server: type[ServerProcess],
                                             signal_number: int) -> None:
    """The stub is found as Triton's is (``pgrep -f triton_python_backend_stub``, as Triton's
    L0_backend_python/model_readiness does); killed with a signal, its model reads not ready
    over HTTP and gRPC, and the next request is served by a new stub."""
    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_crash", repo / "py_crash")
    server = start_server(repo)
    found = subprocess.run(["pgrep", "-P", str(server.proc.pid), "-f",
                            "triton_python_backend_stub"], capture_output=True, text=True,
                           check=False)
    (stub,) = (int(pid) for pid in found.stdout.split())
    assert _stubs(server) == {stub}
    cmdline = Path(f"/proc/{stub}/cmdline").read_bytes().split(b"\0")
    assert b"py_crash_0_0" in cmdline  # who it serves shows in ps, as in Triton
    os.kill(stub, signal_number)
    http = httpclient.InferenceServerClient(server.url, network_timeout=60)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    deadline = time.monotonic() + 60
    while not _ended(stub):  # until it is gone or a zombie the server reaps
        assert time.monotonic() < deadline, "the stub outlived its signal"
        time.sleep(0.05)
    assert not http.is_model_ready("py_crash")
    assert not grpc.is_model_ready("py_crash")
    assert http.infer("py_crash", _fp32(5.0, 0.0)).as_numpy("OUTPUT0")[0, 0] == 5.0
    assert http.is_model_ready("py_crash") and grpc.is_model_ready("py_crash")
    assert stub not in _stubs(server)
    grpc.close()
    assert server.stop() == 0, server.log()


def test_model_code_sees_the_argv_of_tritons_stub(tmp_path: Path,
                                                  start_server: type[ServerProcess]) -> None:
    """``sys.argv`` in a stub is ``['']``, as in Triton's, so a model that runs
    ``unittest.main("model", exit=False)`` inside ``execute`` runs its own tests."""
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_argv", repo / "py_argv")
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    item = httpclient.InferInput("IN", [1], "FP32")
    item.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    result = client.infer("py_argv", [item])
    assert result.as_numpy("ARGV").tolist() == [b""]
    assert result.as_numpy("PASSED").tolist() == [True]
    assert server.stop() == 0, server.log()


IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""


def test_model_names_a_shell_would_read_are_refused(tmp_path: Path,
                                                    start_server: type[ServerProcess]) -> None:
    """A Python model whose name holds a character Triton's Python backend refuses in a stub
    name (``;|&$`<>()[]{}\\"'*?~#!``) fails to load with Triton's message; others load."""
    import base64
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    repo = tmp_path / "repo"
    repo.mkdir()
    server = start_server(repo, "--model-control-mode=explicit", "--allow-model-file-upload=true")

    def load(name: str) -> tuple[int, str]:
        # the model's file names it, as Triton's test writes it: with a quote in the name it
        # does not even compile, and Triton refuses the name before it would run
        source = f"print('Hello from model {name}')\n" + IDENTITY_MODEL
        code = base64.b64encode(source.encode()).decode()
        config = {"name": name, "backend": "python", "max_batch_size": 4,
                  "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                  "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
        body = json.dumps({"parameters": {"config": json.dumps(config),
                                          "file:1/model.py": code}}).encode()
        url = (f"http://{server.url}/v2/repository/models/"
               f"{urllib.parse.quote(name, safe='')}/load")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body, method="POST")) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    for name in ("model;test", "model|test", "model&test", "model$test", "model`test`",
                 "model<test>", "model(test)", "model[test]", "model{test}", "model\\test",
                 'model"test"', "model'test'", "model*test", "model?test", "model~test",
                 "model#test", "model!test"):
        status, text = load(name)
        assert status == 400, (name, status, text)
        assert "Invalid stub name: contains invalid characters" in text, (name, text)
        assert text.startswith('{"error":"load failed for model'), text
    for name in ("TestModel123", "model-with-hyphens", "model_with_underscores"):
        assert load(name)[0] == 200, name
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        assert client.infer(name, _fp32(4.0)).as_numpy("OUTPUT0")[0, 0] == 4.0
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_custom_metrics_from_model_py(tmp_path: Path, start_server: type[ServerProcess],
                                      mode: str) -> None:
    """pb_utils.MetricFamily counters, gauges and histograms, on the metrics port."""
    import urllib.request

    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_metrics", repo / "py_metrics")
    server = start_server(repo, f"--backend-config=python,nursery-instance-mode={mode}")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)

    def one(value: float) -> httpclient.InferInput:
        item = httpclient.InferInput("INPUT0", [1], "FP32")
        item.set_data_from_numpy(np.array([value], dtype=np.float32))
        return item

    for value, total in ((0.5, 1.0), (5.0, 2.0), (50.0, 3.0)):
        assert client.infer("py_metrics", [one(value)]).as_numpy("OUTPUT0")[0] == total
    with pytest.raises(InferenceServerException, match="'set' is not supported for a counter"):
        client.infer("py_metrics", [one(-1.0)])
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    labels = 'model="py_metrics",version="1"'
    for line in ("# TYPE py_metrics_requests counter",
                 f"py_metrics_requests{{{labels}}} 3",
                 "# HELP py_metrics_last_input The last input seen",
                 f"py_metrics_last_input{{{labels}}} 50",
                 "# TYPE py_metrics_inputs histogram",
                 # `le` after the series' labels, as prometheus-cpp (Triton) writes it
                 f'py_metrics_inputs_bucket{{{labels},le="1"}} 1',
                 f'py_metrics_inputs_bucket{{{labels},le="10"}} 2',
                 f'py_metrics_inputs_bucket{{{labels},le="+Inf"}} 3',
                 f"py_metrics_inputs_count{{{labels}}} 3"):
        assert line in text, f"{line!r} not in:\n{text}"
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_is_cancelled_sees_the_client_leave(tmp_path: Path, start_server: type[ServerProcess],
                                            mode: str) -> None:
    """``request.is_cancelled()`` turns true once the client is gone, in both modes."""
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_cancel", repo / "py_cancel")
    marker = tmp_path / "cancelled"
    with (repo / "py_cancel" / "config.pbtxt").open("a") as config:
        config.write(f'parameters {{ key: "cancel_marker" value {{ string_value: "{marker}" }} }}\n')
    server = start_server(repo, f"--backend-config=python,nursery-instance-mode={mode}")

    def one(value: float) -> list[httpclient.InferInput]:
        item = httpclient.InferInput("INPUT0", [1], "FP32")
        item.set_data_from_numpy(np.array([value], dtype=np.float32))
        return [item]

    impatient = httpclient.InferenceServerClient(server.url, network_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017, PT011 - the client's own timeout, any form
        impatient.infer("py_cancel", one(-1.0))
    impatient.close()
    wait_for_file(marker, timeout=20)
    assert time.monotonic() - started < 15  # seen well before the model's 30 s
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    assert client.infer("py_cancel", one(2.0)).as_numpy("OUTPUT0")[0] == 2.0
    assert server.stop() == 0, server.log()


ENV_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils
import envonly_module  # exists only in the model's EXECUTION_ENV_PATH environment


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", np.array([envonly_module.VALUE], dtype=np.float32))])
            for _ in requests]
'''


def _env_model(repo: Path, name: str, env_path: str | None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(ENV_MODEL)
    config = (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
              'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
              'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    if env_path is not None:
        config += ('parameters { key: "EXECUTION_ENV_PATH" value { string_value: '
                   f'"{env_path}" }} }}\n')
    (repo / name / "config.pbtxt").write_text(config)


def test_execution_env_path(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """EXECUTION_ENV_PATH: a model's own environment (a folder or a packed archive) runs its
    stub; a missing one fails that model's load only."""
    import subprocess
    import sys
    import tarfile

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    (site,) = env.glob("lib/python*/site-packages")
    (site / "envonly_module.py").write_text("VALUE = 42.0\n")
    repo = tmp_path / "repo"
    _env_model(repo, "in_folder", str(env))
    _env_model(repo, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    with tarfile.open(repo / "packed" / "env.tar.gz", "w:gz") as tar:
        tar.add(env, arcname=".")
    _env_model(repo, "missing_env", "$$TRITON_MODEL_DIRECTORY/nowhere.tar.gz")
    _env_model(repo, "no_env", None)  # the module is not on the server's path
    server = start_server(repo, "--exit-on-error=false", "--strict-readiness=false")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    item = httpclient.InferInput("INPUT0", [1], "FP32")
    item.set_data_from_numpy(np.array([0.0], dtype=np.float32))
    for name in ("in_folder", "packed"):
        assert client.infer(name, [item]).as_numpy("OUTPUT0")[0] == 42.0
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["missing_env"]["state"] == "UNAVAILABLE"
    assert "EXECUTION_ENV_PATH" in index["missing_env"]["reason"]
    assert "does not exist" in index["missing_env"]["reason"]
    assert index["no_env"]["state"] == "UNAVAILABLE"
    assert "envonly_module" in index["no_env"]["reason"]
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_model_with_no_inputs(tmp_path: Path, start_server: type[ServerProcess],
                                mode: str) -> None:
    """A model may declare no inputs (it makes its outputs from nothing), as in Triton."""
    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    (repo / "gen" / "1").mkdir(parents=True)
    (repo / "gen" / "config.pbtxt").write_text(
        'name: "gen"\nbackend: "python"\nmax_batch_size: 0\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')
    (repo / "gen" / "1" / "model.py").write_text(
        "import numpy as np\nimport triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n    def execute(self, requests):\n"
        "        return [pb_utils.InferenceResponse([pb_utils.Tensor(\n"
        "            'OUT', np.array([1.5, 2.5], np.float32))]) for _ in requests]\n")
    server = start_server(repo, f"--backend-config=python,nursery-instance-mode={mode}")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    assert client.get_model_metadata("gen")["inputs"] == []
    assert client.infer("gen", []).as_numpy("OUT").tolist() == [1.5, 2.5]
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert g.infer("gen", []).as_numpy("OUT").tolist() == [1.5, 2.5]
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_async_decoupled_answers_after_execute_returns(
        tmp_path: Path, start_server: type[ServerProcess], mode: str) -> None:
    """The model's event loop runs on after ``execute`` returns, as in Triton: responses its
    tasks send later arrive, and two requests' coroutines run at once."""
    import queue as queue_

    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_async_late", repo / "py_async_late")
    server = start_server(repo, f"--backend-config=python,nursery-instance-mode={mode}")
    got: queue_.Queue[object] = queue_.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: got.put(error or result))
    for value in (10.0, 20.0):
        item = grpcclient.InferInput("IN", [1], "FP32")
        item.set_data_from_numpy(np.array([value], dtype=np.float32))
        client.async_stream_infer("py_async_late", [item], request_id=str(value))
    values = sorted(float(got.get(timeout=30).as_numpy("OUT")[0]) for _ in range(6))
    client.stop_stream()
    assert values == [10.0, 11.0, 12.0, 20.0, 21.0, 22.0]
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_async_bls_streams_run_at_once(tmp_path: Path, start_server: type[ServerProcess],
                                       mode: str) -> None:
    """Four requests to a decoupled ``async def execute`` that forwards each with ``await
    async_exec(decoupled=True)``: the four calls reach the target together (it answers each
    with how many it saw in flight at once), as in Triton, where ``async_exec`` returns once
    the first response is in and the event loop serves the other requests meanwhile."""
    import queue as queue_

    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    for name in ("py_async_meet", "py_async_bls_meet"):
        shutil.copytree(MODELS / name, repo / name)
    server = start_server(repo, f"--backend-config=python,nursery-instance-mode={mode}")
    got: queue_.Queue[object] = queue_.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: got.put(error or result))
    for index in range(4):
        item = grpcclient.InferInput("IN", [1], "FP32")
        item.set_data_from_numpy(np.array([4.0], dtype=np.float32))
        client.async_stream_infer("py_async_bls_meet", [item], request_id=str(index))
    seen = [float(got.get(timeout=120).as_numpy("OUT")[0]) for _ in range(4)]  # type: ignore[attr-defined]
    client.stop_stream()
    assert seen == [4.0] * 4
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("model", ["py_bls_fork", "py_bls_thread"])
def test_bls_from_processes_and_threads_the_model_starts(
        tmp_path: Path, start_server: type[ServerProcess], model: str) -> None:
    """A model can call other models from processes it forks (``multiprocessing.Pool``: each
    child gets a channel of its own to the server) and from threads it starts, as in
    Triton."""
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / model, repo / model)
    make_models.write_add_sub(repo)
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    for value in (1.0, 10.0):
        item = httpclient.InferInput("IN", [1], "FP32")
        item.set_data_from_numpy(np.array([value], dtype=np.float32))
        out = client.infer(model, [item]).as_numpy("OUT")
        assert out.tolist() == [value + 1, value + 2, value + 3]
    assert len(_stubs(server)) == 1  # the children are gone; the stub serves on
    assert server.stop() == 0, server.log()


def _mib(value: int) -> list[httpclient.InferInput]:
    item = httpclient.InferInput("MIB", [1], "INT32")
    item.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [item]


def test_a_stub_past_its_memory_limit_is_killed_and_started_again(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """``nursery_memory_limit`` (the model's parameter): a stub whose resident memory passes
    it is killed; its request fails with the reason, the next one gets a fresh stub."""
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "py_leak", repo / "py_leak")
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    pid = int(client.infer("py_leak", _mib(8)).as_numpy("PID")[0])
    assert _stubs(server) == {pid}
    with pytest.raises(InferenceServerException) as failed:
        client.infer("py_leak", _mib(400))
    message = failed.value.message()
    assert message.startswith("Stub process 'py_leak_0_0' is not healthy (killed by signal 9): "
                              "its resident memory ("), message
    assert message.endswith("MiB) passed the limit of 200 MiB (nursery_memory_limit); it was "
                            "killed."), message
    again = int(client.infer("py_leak", _mib(8)).as_numpy("PID")[0])
    assert again != pid and client.is_model_ready("py_leak")
    assert "passed the limit of 200 MiB" in server.log()
    client.close()
    assert server.stop() == 0, server.log()

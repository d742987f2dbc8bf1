"""What Kubernetes and KServe ask of the server, against live processes: the `tritonserver`
command with KServe's spellings, the server as PID 1 of its own PID namespace handling
SIGTERM, the probes (ready only once the start-up models are loaded, not ready while the
shutdown drains, live throughout) and KServe's model-agent flow (files appear, then a load
with `{}`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ROOT, close_clients_of, free_port, make_models, wait_for_file

# a Python model whose execute waits (at most 60 s) for a file named by its input's path
GATED_MODEL = '''
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        gate = os.environ.get("NURSERY_TEST_LOAD_GATE")
        if gate:
            open(gate + ".loading", "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            gate = os.environ["NURSERY_TEST_GATE"]
            open(gate + ".started", "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
'''
GATED_CONFIG = '''name: "gated"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''
TRITONSERVER = "import sys; from nursery.__main__ import tritonserver; sys.exit(tritonserver())"


def _write_gated(repo: Path) -> None:
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "1" / "model.py").write_text(GATED_MODEL)
    (repo / "gated" / "config.pbtxt").write_text(GATED_CONFIG)


def _status(url: str, method: str = "GET", body: bytes | None = None) -> int | None:
    """The HTTP status of one request on a new connection (a kubelet probe's way); None
    when nothing listens."""
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


class Process:
    """`tritonserver <flags>` (optionally under `unshare`) with its log in a file."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str], prefix: list[str]):
        self.http_ports = [int(a.split("=", 1)[1]) for a in args if a.startswith("--http-port=")]
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([*prefix, sys.executable, "-c", TRITONSERVER, *args],
                                     stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **env})

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_status(self, url: str, want: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.log()}")
            if _status(url) == want:
                return
            time.sleep(0.05)
        raise AssertionError(f"{url} never answered {want}:\n{self.log()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            for port in self.http_ports:
                close_clients_of(port)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def tritonserver(tmp_path: Path):  # type: ignore[no-untyped-def]
    started: list[Process] = []

    def start(*args: str, env: dict[str, str] | None = None,
              prefix: list[str] | None = None) -> Process:
        proc = Process(list(args), tmp_path / f"server{len(started)}.log", env or {},
                       prefix or [])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def test_kserve_spellings_serve_http_and_grpc(tmp_path: Path, tritonserver) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "mnt" / "models"
    make_models.write_add_sub(repo)
    http, grpc, metrics = free_port(), free_port(), free_port()
    # the args of KServe's kserve-tritonserver runtime, ports moved to free ones
    server = tritonserver(f"--model-store={repo}", f"--grpc-port={grpc}",
                          f"--http-port={http}", "--allow-grpc=true", "--allow-http=true",
                          "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                          f"--metrics-port={metrics}")
    server.wait_status(f"http://127.0.0.1:{http}/v2/health/ready", 200)
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
    assert client.is_model_ready("add_sub")
    client.close()
    assert server.stop() == 0


def test_model_agent_flow(tmp_path: Path, tritonserver) -> None:  # type: ignore[no-untyped-def]
    """KServe's model agent (multi-model serving): the server starts on an empty repository
    in explicit mode, the agent writes a model's files, then asks for a load with `{}`."""
    repo = tmp_path / "models"
    repo.mkdir()
    http = free_port()
    server = tritonserver(f"--model-store={repo}", "--model-control-mode=explicit",
                          f"--http-port={http}", "--http-address=127.0.0.1",
                          "--allow-grpc=false", "--allow-metrics=false")
    base = f"http://127.0.0.1:{http}"
    server.wait_status(f"{base}/v2/health/ready", 200)
    assert _status(f"{base}/v2/repository/models/add_sub/load", "POST", b"{}") != 200
    staging = tmp_path / "staging"
    make_models.write_add_sub(staging)
    shutil.copytree(staging / "add_sub", repo / "add_sub")  # the agent's download
    assert _status(f"{base}/v2/repository/models/add_sub/load", "POST", b"{}") == 200
    assert _status(f"{base}/v2/models/add_sub/ready") == 200
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    a = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    a.set_data_from_numpy(np.ones((1, 16), np.float32))
    b = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    b.set_data_from_numpy(np.ones((1, 16), np.float32))
    assert client.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [[2.0] * 16]
    # and the agent's unload when the TrainedModel goes
    assert _status(f"{base}/v2/repository/models/add_sub/unload", "POST", b"{}") == 200
    assert _status(f"{base}/v2/models/add_sub/ready") == 400
    assert server.stop() == 0


def test_ready_only_once_the_startup_models_are_loaded(tmp_path: Path, tritonserver) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "models"
    make_models.write_add_sub(repo)
    _write_gated(repo)
    gate = tmp_path / "load-gate"
    http = free_port()
    server = tritonserver(f"--model-repository={repo}", "--model-control-mode=explicit",
                          "--load-model=add_sub", "--load-model=gated",
                          f"--http-port={http}", "--http-address=127.0.0.1",
                          "--allow-grpc=false", "--allow-metrics=false",
                          env={"NURSERY_TEST_LOAD_GATE": str(gate),
                               "NURSERY_TEST_GATE": str(tmp_path / "gate")})
    wait_for_file(Path(str(gate) + ".loading"))  # gated's initialize is running
    base = f"http://127.0.0.1:{http}"
    for _ in range(20):  # while a start-up model loads, nothing says ready
        assert _status(f"{base}/v2/health/ready") != 200
        assert server.proc.poll() is None
    gate.touch()
    server.wait_status(f"{base}/v2/health/ready", 200)
    assert _status(f"{base}/v2/models/gated/ready") == 200
    assert server.stop() == 0


def test_sigterm_drains_not_ready_but_live_as_pid_1(tmp_path: Path, tritonserver) -> None:  # type: ignore[no-untyped-def]
    """The image's situation: the server is PID 1 of its PID namespace (no init, no shell)
    and gets SIGTERM from outside. While the request in flight finishes, the probes (new
    connections, as the kubelet's) see live 200 and ready 400; new inference is refused;
    then the server exits 0."""
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                      capture_output=True).returncode != 0:
        pytest.fail("unshare --pid is not permitted here: the PID 1 check cannot run")
    repo = tmp_path / "models"
    _write_gated(repo)
    gate = tmp_path / "gate"
    http = free_port()
    server = tritonserver(f"--model-repository={repo}", f"--http-port={http}",
                          "--http-address=127.0.0.1", "--allow-grpc=false",
                          "--allow-metrics=false",
                          env={"NURSERY_TEST_GATE": str(gate)},
                          prefix=["unshare", "--pid", "--fork", "--mount-proc",
                                  "--kill-child"])
    base = f"http://127.0.0.1:{http}"
    server.wait_status(f"{base}/v2/health/ready", 200)
    # the server: unshare's child, PID 1 inside its namespace
    children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text()
    (pid,) = [int(p) for p in children.split()]
    nspid = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
             if line.startswith("NSpid:")][0].split()
    assert nspid[-1] == "1", nspid

    answers: list[object] = []

    def infer() -> None:
        body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1],
                                       "data": [7]}]}).encode()
        request = urllib.request.Request(f"{base}/v2/models/gated/infer", data=body,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                answers.append((r.status, json.loads(r.read())["outputs"][0]["data"]))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            answers.append(exc)

    thread = threading.Thread(target=infer)
    thread.start()
    wait_for_file(Path(str(gate) + ".started"))  # the request is in the model
    os.kill(pid, signal.SIGTERM)
    # the drain: not ready, still live, no new inference
    deadline = time.monotonic() + 30
    while _status(f"{base}/v2/health/ready") != 400 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _status(f"{base}/v2/health/ready") == 400
    assert _status(f"{base}/v2/health/live") == 200
    assert _status(f"{base}/v2/models/gated/infer", "POST", b"{}") == 503
    assert server.proc.poll() is None and not answers
    gate.touch()  # the request in flight finishes
    thread.join(60)
    assert answers == [(200, [7])], answers
    assert server.proc.wait(60) == 0, server.log()
    assert _status(f"{base}/v2/health/live") is None  # the port is closed
    assert "server stopped" in server.log()


def test_sigint_keeps_serving_a_live_connection_until_its_client_closes_it(
        tmp_path: Path, tritonserver) -> None:  # type: ignore[no-untyped-def]
    """Triton's HTTP stop (its L0_lifecycle `test_shutdown_with_live_connection`): after
    SIGINT, a keep-alive connection opened before it still serves inference; the log counts
    it down once ("Timeout 30: Found 1 HTTP service connections", never restarted); once its
    client closes it, the server goes on to unload and exits 0. A connection opened after the
    signal gets the probes only."""
    repo = tmp_path / "models"
    make_models.write_add_sub(repo)
    http = free_port()
    server = tritonserver(f"--model-repository={repo}", f"--http-port={http}",
                          "--http-address=127.0.0.1", "--allow-grpc=false",
                          "--allow-metrics=false")
    base = f"http://127.0.0.1:{http}"
    server.wait_status(f"{base}/v2/health/ready", 200)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
              httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(data)
    assert (client.infer("add_sub", inputs).as_numpy("OUTPUT0") == 2 * data).all()
    server.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 30
    while "Timeout 29: Found 1 HTTP service connections" not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    # the live connection: still served, and still kept alive
    assert (client.infer("add_sub", inputs).as_numpy("OUTPUT1") == 0 * data).all()
    assert (client.infer("add_sub", inputs).as_numpy("OUTPUT0") == 2 * data).all()
    # a new one: the probes only
    assert _status(f"{base}/v2/health/live") == 200
    assert _status(f"{base}/v2/health/ready") == 400
    assert _status(f"{base}/v2/models/add_sub/infer", "POST", b"{}") == 503
    assert server.proc.poll() is None
    client.close()
    assert server.proc.wait(30) == 0, server.log()
    log = server.log()
    assert log.count("Timeout 30: ") == 1, log
    assert "Waiting for in-flight requests to complete." in log
    assert "Timeout 25: " not in log, log  # it went on as soon as the client closed

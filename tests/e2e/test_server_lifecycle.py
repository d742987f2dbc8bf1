"""Start-up and shutdown of ``python -m nursery serve``: broken models, flags, signals."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ROOT, ServerProcess, make_models

pytestmark = pytest.mark.e2e


def _repo_with_broken_model(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    broken = repo / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    (broken / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
                                         'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\n'
                                         'output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n')
    typo = repo / "typo"
    (typo / "1").mkdir(parents=True)
    (typo / "config.pbtxt").write_text("max_batch_size: 8\ninput [ { nme: \"X\" } ]\n")
    return repo


def test_exit_on_error_stops_startup(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    server = start_server(_repo_with_broken_model(tmp_path), wait=False)
    assert server.wait_exit(60) == 1
    log = server.log()
    assert "error: creating server: Internal - failed to load all models" in log
    assert "failed to load 'broken' version 1" in log
    assert "model 'typo': config.pbtxt:2:11: unknown field 'nme' in ModelInput" in log


def test_exit_on_error_false_serves_the_rest(tmp_path: Path,
                                             start_server: type[ServerProcess]) -> None:
    server = start_server(_repo_with_broken_model(tmp_path), "--exit-on-error=false", wait=False)
    server.wait_ready(path="/v2/health/live")
    server.wait_ready(path="/v2/models/add_sub/ready")
    client = httpclient.InferenceServerClient(server.url)
    assert not client.is_server_ready()  # strict readiness: a model is unavailable
    assert not client.is_model_ready("broken")
    a = np.ones((1, 16), np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
              httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), 2 * a)
    assert server.stop() == 0


def test_strict_readiness_false(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    server = start_server(_repo_with_broken_model(tmp_path), "--exit-on-error=false",
                          "--strict-readiness=false")
    assert httpclient.InferenceServerClient(server.url).is_server_ready()


def test_explicit_mode_loads_only_named_models(tmp_path: Path,
                                               start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    make_models.write_string_identity(repo)
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=add_sub")
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("add_sub")
    assert not client.is_model_ready("string_identity")


def test_sigterm_finishes_in_flight_requests(tmp_path: Path,
                                             start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_mlp(repo, max_batch_size=64)
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url, concurrency=8,
                                              connection_timeout=60, network_timeout=60)
    x = np.ones((64, 784), np.float32)
    results: list[object] = []

    def hammer() -> None:
        inp = httpclient.InferInput("INPUT0", [64, 784], "FP32")
        inp.set_data_from_numpy(x)
        handles = [client.async_infer("mlp", [inp]) for _ in range(40)]
        for h in handles:
            try:
                results.append(h.get_result().as_numpy("OUTPUT0").shape)
            except Exception as exc:  # a request sent after the listener closed may fail
                results.append(exc)

    thread = threading.Thread(target=hammer)
    thread.start()
    deadline = time.monotonic() + 30
    while not results and time.monotonic() < deadline:  # traffic is flowing
        time.sleep(0.01)
    assert server.stop() == 0
    thread.join()
    answered = [r for r in results if r == (64, 10)]
    assert answered, results
    assert "server stopped" in server.log()
    # Triton's line, which its qa scripts (L0_logging) count once per shutdown
    assert server.log().count("Waiting for in-flight requests to complete.") == 1


def test_help_lists_triton_flags() -> None:
    out = subprocess.run([sys.executable, "-m", "nursery", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    for flag in ("--model-repository", "--http-port", "--grpc-port", "--metrics-port",
                 "--model-control-mode", "--repository-poll-secs", "--load-model",
                 "--strict-model-config", "--disable-auto-complete-config", "--exit-on-error",
                 "--exit-timeout-secs", "--log-verbose"):
        assert flag in out


def test_later_flags_are_accepted_and_reported(tmp_path: Path,
                                               start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--pinned-memory-pool-byte-size=1048576",
                          "--model-control-mode=poll", "--repository-poll-secs=5")
    log = server.log()
    assert "--pinned-memory-pool-byte-size is accepted but not active yet" in log


def test_sigterm_finishes_in_flight_grpc_requests(tmp_path: Path,
                                                  start_server: type[ServerProcess]) -> None:
    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    make_models.write_mlp(repo, max_batch_size=64)
    server = start_server(repo)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = np.ones((64, 784), np.float32)
    results: list[object] = []
    done = threading.Event()

    def callback(result: object, error: object) -> None:
        results.append(result if error is None else error)
        if len(results) == 40:
            done.set()

    inp = grpcclient.InferInput("INPUT0", [64, 784], "FP32")
    inp.set_data_from_numpy(x)
    for _ in range(40):
        client.async_infer("mlp", [inp], callback)
    deadline = time.monotonic() + 30
    while not results and time.monotonic() < deadline:  # traffic is flowing
        time.sleep(0.01)
    assert server.stop() == 0
    done.wait(30)
    answered = [r for r in results if not isinstance(r, Exception)]
    assert answered  # requests accepted before the signal were answered
    assert all(r.as_numpy("OUTPUT0").shape == (64, 10) for r in answered)  # type: ignore[attr-defined]


def test_sigterm_during_startup_exits_cleanly(tmp_path: Path,
                                              start_server: type[ServerProcess]) -> None:
    repo = tmp_path / "repo"
    folder = make_models.write_mlp(repo, max_batch_size=64)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text() + (  # a long warm-up keeps the model LOADING
        'model_warmup [{ name: "slow" batch_size: 64 count: 100000 inputs { key: "INPUT0" '
        'value: { data_type: TYPE_FP32 dims: [784] random_data: true } } }]\n'))
    server = start_server(repo, wait=False)
    deadline = time.monotonic() + 30
    while "loading: mlp:1" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert server.stop(timeout=60) == 0
    assert "shutdown during start-up" in server.log()


def test_missing_repository_with_exit_on_error_false_serves_the_rest(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """Issue 22: Triton with --exit-on-error=false logs a repository it cannot read and
    serves what the other repositories hold; in poll mode the repository is read again once
    it appears. Like Triton's server in its FAILED_TO_INITIALIZE state (L0_lifecycle's
    test_parse_error_noexit), it is then neither live nor ready."""
    missing = tmp_path / "missing"
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server([missing, repo], "--exit-on-error=false",
                          "--model-control-mode=poll", "--repository-poll-secs=1", wait=False)
    server.wait_ready(path="/v2/models/add_sub/ready")
    client = httpclient.InferenceServerClient(server.url)
    assert not client.is_server_live() and not client.is_server_ready()
    assert client.get_server_metadata()["name"] == "triton"
    assert client.is_model_ready("add_sub")
    assert [m["name"] for m in client.get_model_repository_index()] == ["add_sub"]
    assert f"failed to poll model repository '{missing}': failed to open directory" in server.log()
    make_models.write_string_identity(missing)
    deadline = time.monotonic() + 30
    while not client.is_model_ready("string_identity") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.is_model_ready("string_identity") and client.is_model_ready("add_sub")
    assert server.stop() == 0


def test_only_a_missing_repository_with_exit_on_error_false(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    server = start_server(tmp_path / "missing", "--exit-on-error=false", wait=False)
    server.wait_ready(path="/v2")  # server metadata answers
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_model_repository_index() == []
    assert not client.is_server_live() and not client.is_server_ready()  # failed to initialize
    assert server.stop() == 0


def test_missing_repository_stops_startup_with_one_line(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    missing = tmp_path / "missing"
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server([repo, missing], wait=False)
    assert server.wait_exit(60) == 1
    log = server.log()
    assert "Traceback" not in log, log
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert errors == [f"error: creating server: Internal - failed to load all models: failed to "
                      f"poll model repository '{missing}': failed to open directory {missing} "
                      "(No such file or directory)"], log


def test_verbose_logging_names_each_http_request_as_triton_does(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """At --log-verbose=1 Triton's HTTP server logs 'HTTP request: <evhtp method number>
    <path>' for each request (L0_logging counts the /v2/logging ones); at 0 it does not."""
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--log-verbose=1")
    client = httpclient.InferenceServerClient(server.url)
    client.get_log_settings()
    bad = httpclient.InferInput("NOT_AN_INPUT", [1, 16], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(Exception, match="NOT_AN_INPUT"):
        client.infer("add_sub", [bad])
    # and each failed inference, with its error, as Triton's HTTP frontend logs it
    assert "[request id: <id_unknown>] Infer failed: " in server.log()
    client.update_log_settings({"log_verbose_level": 0})
    client.get_log_settings()
    lines = [x for x in server.log().splitlines() if "HTTP request: " in x]
    assert [x.split("HTTP request: ")[1].rstrip('"') for x in lines
            if "/v2/logging" in x] == ["0 /v2/logging", "2 /v2/logging"]


def test_an_address_that_is_not_one_stops_startup_unless_its_service_is_off(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """L0_socket: --http-address -47 stops the start-up with one line, no traceback; with
    HTTP off the server starts (Triton's "allow illegal http address if disabled"), and the
    metrics port, which takes --http-address when --metrics-address is not given, is left
    out with a line that says why, while gRPC serves."""
    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    bad = start_server(repo, "--http-address", "-47", wait=False)
    assert bad.wait_exit(60) == 1
    assert "Traceback" not in bad.log(), bad.log()
    assert f"failed to start HTTP service: Invalid argument - cannot listen on " \
           f"'-47:{bad.http_port}'" in bad.log()
    off = start_server(repo, "--http-address", "-47", "--allow-http", "false",
                       "--metrics-address=", wait=False)
    deadline = time.monotonic() + 60
    with grpcclient.InferenceServerClient(f"127.0.0.1:{off.grpc_port}") as client:
        while True:
            try:
                if client.is_model_ready("add_sub"):
                    break
            except Exception:
                assert off.proc.poll() is None, off.log()
            assert time.monotonic() < deadline, off.log()
            time.sleep(0.2)
    assert "failed to start Metrics service: Invalid argument - cannot listen on '-47:" \
        in off.log()
    assert off.stop() == 0


def test_a_port_in_use_stops_startup_with_tritons_line(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    """L0_lifecycle's port-collision checks: the second server logs Triton's line for the
    frontend whose port is taken and exits 1, without a traceback."""
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    first = start_server(repo)
    for flag, service, port in (("--grpc-port", "GRPC", first.grpc_port),
                                ("--http-port", "HTTP", first.http_port)):
        second = start_server(repo, flag, str(port), wait=False)
        assert second.wait_exit(60) == 1
        log = second.log()
        assert "Traceback" not in log, log
        assert (f"failed to start {service} service: Unavailable - Socket '127.0.0.1:{port}' "
                "already in use") in log, log

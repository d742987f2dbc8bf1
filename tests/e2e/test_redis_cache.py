"""The Redis response cache (``--cache-config redis,host=... --cache-config redis,port=...``)
end to end: real redis-server, real nursery servers, tritonclient; as Triton's
L0_response_cache checks it (start-up failures in Triton's words) and as a fleet uses it (two
servers share one cache; a Redis that goes away costs the cache, never the answers).

And the ensemble's own response cache (``response_cache`` on the ensemble: its top-level
answer cached, hits and misses counted on the ensemble), with the local cache."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from scripts import make_models
from tests.cloud_servers import redis_server
from tests.conftest import ROOT, ServerProcess, free_port

pytestmark = pytest.mark.e2e

CACHED = "response_cache { enable: true }\n"
IO_IN = [("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])]
IO_OUT = [("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])]


def _repo(root: Path) -> Path:
    repo = root / "repo"
    make_models.write_model(repo, "add_sub_cached", make_models.build_add_sub(),
                            make_models.config_text("add_sub_cached", IO_IN, IO_OUT, 8, CACHED))
    return repo


def _infer(client: Any, module: Any, model: str, seed: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((1, 16)).astype(np.float32)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"),
              module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.ones_like(x))
    result = client.infer(model, inputs)
    return {"OUTPUT0": result.as_numpy("OUTPUT0"), "OUTPUT1": result.as_numpy("OUTPUT1"),
            "x": x}


def _cache_counts(client: httpclient.InferenceServerClient, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    return stats["cache_hit"]["count"], stats["cache_miss"]["count"]


def _redis_flags(port: int, *more: str) -> list[str]:
    flags = ["--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={port}"]
    for m in more:
        flags += ["--cache-config", f"redis,{m}"]
    return flags


def test_two_servers_share_one_redis_cache(tmp_path: Path, start_server: Any) -> None:
    repo = _repo(tmp_path)
    with redis_server(tmp_path / "redis") as port:
        first = start_server(repo, *_redis_flags(port))
        second = start_server(repo, *_redis_flags(port, "pool_size=2"))
        a = httpclient.InferenceServerClient(first.url)
        b = httpclient.InferenceServerClient(second.url)
        answer = _infer(a, httpclient, "add_sub_cached", 1)  # a miss, stored in Redis
        np.testing.assert_allclose(answer["OUTPUT0"], answer["x"] + 1, rtol=1e-6)
        assert _cache_counts(a, "add_sub_cached") == (0, 1)
        # the same request to the other server: answered from the shared cache
        with grpcclient.InferenceServerClient(f"127.0.0.1:{second.grpc_port}") as g:
            again = _infer(g, grpcclient, "add_sub_cached", 1)
        np.testing.assert_array_equal(again["OUTPUT0"], answer["OUTPUT0"])
        np.testing.assert_array_equal(again["OUTPUT1"], answer["OUTPUT1"])
        assert _cache_counts(b, "add_sub_cached") == (1, 0)
        other = _infer(b, httpclient, "add_sub_cached", 2)  # another input: a miss
        np.testing.assert_allclose(other["OUTPUT1"], other["x"] - 1, rtol=1e-6)
        assert _cache_counts(b, "add_sub_cached") == (1, 1)
        keys = subprocess.run(["redis-cli", "-p", str(port), "--raw", "KEYS", "*"],
                              capture_output=True, text=True, timeout=10).stdout.split()
        assert len(keys) == 2 and all(len(k) == 64 for k in keys)  # one hash per answer
        assert f"response cache: redis at 127.0.0.1:{port}" in first.log()


def test_a_redis_that_goes_away_costs_the_cache_not_the_answers(
        tmp_path: Path, start_server: Any) -> None:
    repo = _repo(tmp_path)
    port = free_port()
    with redis_server(tmp_path / "redis", port=port):
        server = start_server(repo, *_redis_flags(port, "wait_timeout=500"))
        client = httpclient.InferenceServerClient(server.url)
        _infer(client, httpclient, "add_sub_cached", 1)
        _infer(client, httpclient, "add_sub_cached", 1)
        assert _cache_counts(client, "add_sub_cached") == (1, 1)
    # Redis is gone: every request still answered, each a miss, each failure logged
    for seed in (1, 3):
        answer = _infer(client, httpclient, "add_sub_cached", seed)
        np.testing.assert_allclose(answer["OUTPUT0"], answer["x"] + 1, rtol=1e-6)
    assert _cache_counts(client, "add_sub_cached") == (1, 3)
    log = server.log()
    assert "Failed to retrieve key: " in log and "Connection refused" in log
    assert "into response cache: Failed to insert key: " in log
    # back on the same port (empty): the cache works again, with a new connection
    with redis_server(tmp_path / "redis2", port=port):
        _infer(client, httpclient, "add_sub_cached", 4)
        _infer(client, httpclient, "add_sub_cached", 4)
        assert _cache_counts(client, "add_sub_cached") == (2, 4)
        assert client.is_server_ready()


def _failed_start(repo: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    """Start a server that must not start; its output."""
    out = subprocess.run(
        [sys.executable, "-m", "nursery", "serve", "--model-repository", str(repo),
         "--http-port", str(free_port()), "--grpc-port", str(free_port()),
         "--metrics-port", str(free_port()), "--http-address", "127.0.0.1",
         "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})})
    assert out.returncode != 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def test_start_up_failures_in_tritons_words(tmp_path: Path, start_server: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path)
    closed = free_port()
    text = _failed_start(repo, *_redis_flags(closed))
    assert (f"Failed to initialize RedisCache: failed to connect to Redis "
            f"(127.0.0.1:{closed}): Connection refused") in text
    assert "Must at a minimum specify 'host' and 'port'" in _failed_start(
        repo, "--cache-config", "redis,port=6379")
    assert "found multiple cache configurations" in _failed_start(
        repo, "--cache-config", "local,size=8192", "--cache-config", "redis,key=value")
    assert "Incompatible flags --response-cache-byte-size and --cache-config" in _failed_start(
        repo, "--response-cache-byte-size=12345", "--cache-config=local,size=67890")
    with redis_server(tmp_path / "redis", password="redis123!") as port:
        assert "WRONGPASS" in _failed_start(repo, *_redis_flags(port, "password=wrong"))
        assert "NOAUTH Authentication required" in _failed_start(repo, *_redis_flags(port))
        assert "WRONGPASS" in _failed_start(
            repo, *_redis_flags(port), env={"TRITONCACHE_REDIS_PASSWORD": "wrong"})
        # the right password, on the command line or from the environment
        flagged = start_server(repo, *_redis_flags(port, "password=redis123!"))
        assert "redis123!" not in flagged.log()
        with monkeypatch.context() as env:  # the server process inherits them
            env.setenv("TRITONCACHE_REDIS_USERNAME", "default")
            env.setenv("TRITONCACHE_REDIS_PASSWORD", "redis123!")
            from_env = start_server(repo, *_redis_flags(port))
        for server in (flagged, from_env):
            client = httpclient.InferenceServerClient(server.url)
            _infer(client, httpclient, "add_sub_cached", 7)
        assert _cache_counts(httpclient.InferenceServerClient(from_env.url),
                             "add_sub_cached") == (1, 0)  # the first server's answer


def test_redis_over_tls_with_a_client_certificate(tmp_path: Path, start_server: Any) -> None:
    from tests.e2e.test_security import Authority

    pki = tmp_path / "pki"
    pki.mkdir()
    ca = Authority(pki, "redis-test-ca")
    served, client = ca.issue("redis", server=True), ca.issue("nursery", server=False)
    repo = _repo(tmp_path)
    tls = ("tls_enabled=true", f"cacert={ca.path}")
    with redis_server(tmp_path / "redis", tls=(served.cert, served.key, ca.path),
                      client_certs=True) as port:
        # no certificate of its own: Redis ends the handshake, and the start fails
        text = _failed_start(repo, *_redis_flags(port, *tls))
        assert "Failed to initialize RedisCache: the connection to Redis failed: " in text
        assert "certificate required" in text
        # without the CA, the server's certificate is not trusted
        assert "certificate verify failed" in _failed_start(
            repo, *_redis_flags(port, "tls_enabled=true"))
        # plain TCP to a TLS port: no PING answer, the connection closed
        assert "Failed to initialize RedisCache" in _failed_start(
            repo, *_redis_flags(port, "socket_timeout=2000"))
        server = start_server(repo, *_redis_flags(
            port, *tls, f"cert={client.cert}", f"key={client.key}"))
        http = httpclient.InferenceServerClient(server.url)
        first = _infer(http, httpclient, "add_sub_cached", 5)
        again = _infer(http, httpclient, "add_sub_cached", 5)
        np.testing.assert_array_equal(first["OUTPUT0"], again["OUTPUT0"])
        assert _cache_counts(http, "add_sub_cached") == (1, 1)
        assert "TLS" in server.log()


# -- the ensemble's own response cache (local) ----------------------------------------------


def _ensemble_repo(root: Path, ensemble_cached: bool, step_cached: bool,
                   step_decoupled: bool = False) -> Path:
    repo = root / "ens-repo"
    extra = (CACHED if step_cached else "") + (
        "model_transaction_policy { decoupled: true }\n" if step_decoupled else "")
    if step_decoupled:  # a decoupled step: a Python model
        (repo / "add_sub" / "1").mkdir(parents=True)
        (repo / "add_sub" / "1" / "model.py").write_text(
            "import triton_python_backend_utils as pb_utils\n\n\n"
            "class TritonPythonModel:\n"
            "    def execute(self, requests):\n"
            "        return None\n")
        (repo / "add_sub" / "config.pbtxt").write_text(
            make_models.config_text("add_sub", IO_IN, IO_OUT, 8, extra).replace(
                'platform: "onnxruntime_onnx"', 'backend: "python"'))
    else:
        make_models.write_model(repo, "add_sub", make_models.build_add_sub(),
                                make_models.config_text("add_sub", IO_IN, IO_OUT, 8, extra))
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(
        'name: "ens"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, '
        '{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, '
        '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "add_sub" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }'
        ' output_map { key: "OUTPUT0" value: "OUTPUT0" } '
        'output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }\n'
        + (CACHED if ensemble_cached else ""))
    return repo


@pytest.mark.parametrize("step_cached", [False, True])
def test_ensemble_top_level_answers_come_from_the_cache(
        tmp_path: Path, start_server: Any, step_cached: bool) -> None:
    server = start_server(_ensemble_repo(tmp_path, True, step_cached),
                          "--cache-config", "local,size=1048576")
    client = httpclient.InferenceServerClient(server.url)
    first = _infer(client, httpclient, "ens", 1)
    assert _cache_counts(client, "ens") == (0, 1)
    second = _infer(client, httpclient, "ens", 1)
    np.testing.assert_array_equal(first["OUTPUT0"], second["OUTPUT0"])
    assert _cache_counts(client, "ens") == (1, 1)
    ens = client.get_inference_statistics("ens")["model_stats"][0]["inference_stats"]
    assert ens["success"]["count"] == 2
    # the step ran once; with its own cache enabled it missed once and never hit
    step = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert step["inference_count"] == 1
    assert _cache_counts(client, "add_sub") == ((0, 1) if step_cached else (0, 0))


def test_ensemble_with_a_decoupled_step_refuses_its_response_cache(
        tmp_path: Path, start_server: Any) -> None:
    server: ServerProcess = start_server(
        _ensemble_repo(tmp_path, True, False, step_decoupled=True),
        "--cache-config", "local,size=1048576", wait=False)
    deadline = time.monotonic() + 60
    while "Response Cache does not currently support model 'ens'" not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    assert "with 'decoupled' transaction policy. Please disable the response cache." in \
        server.log()
    assert server.wait_exit(60) != 0  # a model failed to load: --exit-on-error ends the start

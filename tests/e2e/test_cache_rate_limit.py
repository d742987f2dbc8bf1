"""The response cache and the rate limiter end to end, with tritonclient."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

CACHED = "response_cache { enable: true }\n"


def _metrics(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    return {(s.name.removesuffix("_total"), tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture(scope="module")
def cache_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    make_models.write_model(
        repo, "mlp_cached", make_models.build_mlp(),
        make_models.config_text("mlp_cached", [("INPUT0", "FP32", [784])],
                                [("OUTPUT0", "FP32", [10])], 8, CACHED))
    make_models.write_model(
        repo, "add_sub_cached", make_models.build_add_sub(),
        make_models.config_text("add_sub_cached",
                                [("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])],
                                [("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])], 8,
                                CACHED + "dynamic_batching { }\n"))
    make_models.write_mlp(repo, max_batch_size=8)  # no cache
    with running_server(repo, "--cache-config", "local,size=8000", tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 784)).astype(np.float32)


def _mlp(client: Any, module: Any, model: str, x: np.ndarray) -> np.ndarray:
    inp = module.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out: np.ndarray = client.infer(model, [inp]).as_numpy("OUTPUT0")
    return out


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    entry: dict[str, Any] = client.get_inference_statistics(model)["model_stats"][0]
    return entry


def test_repeated_request_is_served_from_the_cache(cache_server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(cache_server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{cache_server.grpc_port}")
    x = _x(1)
    expected = _mlp(http, httpclient, "mlp", x)  # the same model, uncached
    before = _stats(http, "mlp_cached")
    first = _mlp(http, httpclient, "mlp_cached", x)
    second = _mlp(grpc, grpcclient, "mlp_cached", x)  # same request over gRPC: a hit
    np.testing.assert_allclose(first, expected, rtol=1e-5)
    np.testing.assert_array_equal(second, first)
    after = _stats(http, "mlp_cached")
    inf = after["inference_stats"]
    assert after["execution_count"] - before["execution_count"] == 1  # the hit never ran
    assert after["inference_count"] - before["inference_count"] == 1
    assert inf["cache_hit"]["count"] - before["inference_stats"]["cache_hit"]["count"] == 1
    assert inf["cache_miss"]["count"] - before["inference_stats"]["cache_miss"]["count"] == 1
    assert inf["success"]["count"] - before["inference_stats"]["success"]["count"] == 2
    assert inf["cache_hit"]["ns"] > 0 and inf["cache_miss"]["ns"] > 0
    # different inputs are not served from the cache
    other = _mlp(http, httpclient, "mlp_cached", _x(2))
    assert not np.array_equal(other, first)
    final = _stats(http, "mlp_cached")
    assert final["execution_count"] == after["execution_count"] + 1
    # the uncached model never reports cache figures
    plain = _stats(http, "mlp")["inference_stats"]
    assert plain["cache_hit"]["count"] == plain["cache_miss"]["count"] == 0
    m = _metrics(cache_server)
    mv = (("model", "mlp_cached"), ("version", "1"))
    assert m[("nv_cache_num_hits_per_model", mv)] == inf["cache_hit"]["count"]
    assert m[("nv_cache_num_misses_per_model", mv)] == final["inference_stats"]["cache_miss"][
        "count"]
    assert ("nv_cache_num_hits_per_model", (("model", "mlp"), ("version", "1"))) not in m
    http.close()
    grpc.close()


def test_requested_outputs_are_part_of_the_key(cache_server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(cache_server.url)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
              httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a + 1)
    only0 = [httpclient.InferRequestedOutput("OUTPUT0")]
    only1 = [httpclient.InferRequestedOutput("OUTPUT1")]
    r0 = http.infer("add_sub_cached", inputs, outputs=only0)
    r1 = http.infer("add_sub_cached", inputs, outputs=only1)  # not the cached OUTPUT0 answer
    assert r0.as_numpy("OUTPUT1") is None and r1.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(r1.as_numpy("OUTPUT1"), -np.ones((1, 16), np.float32))
    again = http.infer("add_sub_cached", inputs, outputs=only0)
    np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), a + a + 1)
    s = _stats(http, "add_sub_cached")["inference_stats"]
    assert (s["cache_hit"]["count"], s["cache_miss"]["count"]) == (1, 2)
    http.close()


def test_budget_holds_under_a_flood_and_concurrent_hits_are_right(
        cache_server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(cache_server.url, concurrency=16)
    for i in range(60):  # distinct requests: far more than 8,000 bytes of answers
        _mlp(http, httpclient, "mlp_cached", _x(100 + i))
    m = _metrics(cache_server)
    assert 0 < m[("nv_cache_util", ())] <= 1.0
    assert m[("nv_cache_num_evictions", ())] > 0
    assert m[("nv_cache_num_entries", ())] < 60
    # 16 identical requests at once, then 16 more: every answer is the model's answer
    x = _x(7)
    expected = _mlp(http, httpclient, "mlp", x)
    inp = httpclient.InferInput("INPUT0", [1, 784], "FP32")
    inp.set_data_from_numpy(x)
    for _ in range(2):
        handles = [http.async_infer("mlp_cached", [inp]) for _ in range(16)]
        for h in handles:
            np.testing.assert_allclose(h.get_result().as_numpy("OUTPUT0"), expected, rtol=1e-5)
    http.close()


def test_cache_config_errors(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    make_models.write_mlp(repo)
    bad = start_server(repo, "--cache-config", "memcached,host=x", wait=False)
    assert bad.wait_exit() == 2
    assert "cache implementation 'memcached' is not available" in bad.log()
    half = start_server(repo, "--cache-config", "redis,host=x", wait=False)  # no port
    assert half.wait_exit() == 2
    assert "Must at a minimum specify 'host' and 'port'" in half.log()


# -- rate limiter ------------------------------------------------------------------------------


def _slow_model(repo: Path, name: str, resources: str) -> None:
    make_models.write_model(
        repo, name, make_models.build_mlp((784, 1024, 1024, 10)),
        make_models.config_text(name, [("INPUT0", "FP32", [784])], [("OUTPUT0", "FP32", [10])],
                                64).replace(
            "instance_group [ { count: 1, kind: KIND_CPU } ]",
            "instance_group [ { count: 1, kind: KIND_CPU rate_limiter { " + resources + " } } ]"))


def test_shared_resource_executions_never_overlap(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    _slow_model(repo, "slow_a", 'resources [ { name: "R1" count: 1 } ] priority: 1')
    _slow_model(repo, "slow_b", 'resources [ { name: "R1" count: 1 } ] priority: 1')
    traces = tmp_path / "traces"
    traces.mkdir()
    server = start_server(
        repo, "--rate-limit", "execution_count", "--rate-limit-resource", "R1:1",
        "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
        "--trace-config", f"triton,file={traces / 'trace.json'}",
        "--trace-config", "triton,log-frequency=1")
    x = np.random.default_rng(0).standard_normal((32, 784)).astype(np.float32)
    errors: list[BaseException] = []

    def client(model: str) -> None:
        try:
            http = httpclient.InferenceServerClient(server.url)
            for _ in range(8):
                _mlp(http, httpclient, model, x)
            http.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(m,)) for m in
               ("slow_a", "slow_a", "slow_b", "slow_b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    spans: list[tuple[int, int, str]] = []
    models: dict[int, str] = {}
    # a trace is finished (and, with log-frequency=1, written) just after its answer is sent:
    # the last ones may land a moment after the clients are done
    deadline = time.monotonic() + 10
    while True:
        spans, models = [], {}
        for f in traces.glob("trace.json*"):
            for record in json.loads(f.read_text() or "[]"):
                if "model_name" in record:
                    models[record["id"]] = record["model_name"]
                elif "timestamps" in record:
                    stamps = {t["name"]: t["ns"] for t in record["timestamps"]}
                    spans.append((stamps["COMPUTE_START"], stamps["COMPUTE_END"],
                                  str(record["id"])))
        if len(spans) >= 32 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    named = sorted((start, end, models[int(i)]) for start, end, i in spans)
    assert [m for _, _, m in named].count("slow_a") == 16  # both models made progress
    assert [m for _, _, m in named].count("slow_b") == 16
    for (_, e1, m1), (s2, _, m2) in zip(named, named[1:], strict=False):
        if m1 != m2:
            assert e1 <= s2, f"{m1} and {m2} ran at the same time"


def test_asking_for_more_than_exists_fails_the_load(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    _slow_model(repo, "greedy", 'resources [ { name: "R1" count: 2 } ]')
    make_models.write_mlp(repo)
    server = start_server(repo, "--rate-limit", "execution_count",
                          "--rate-limit-resource", "R1:1", "--exit-on-error=false", wait=False)
    server.wait_ready(path="/v2/health/live")
    http = httpclient.InferenceServerClient(server.url)
    index = {e["name"]: e for e in http.get_model_repository_index()}
    assert index["greedy"]["state"] == "UNAVAILABLE"
    assert 'Resource count for "R1" is limited to 1' in index["greedy"]["reason"]
    assert http.is_model_ready("mlp")
    with pytest.raises(InferenceServerException):
        http.infer("greedy", [httpclient.InferInput("INPUT0", [1, 784], "FP32")])
    http.close()
    # the start-up table, as Triton's: the reason as it is, unescaped (L0_rate_limiter greps it)
    rows = [line for line in server.log().splitlines() if line.startswith("| ")]
    assert any(row.startswith("| greedy ") and 'Resource count for "R1" is limited to 1 which '
               "will prevent scheduling of one or more model instances, the minimum required "
               "count is 2" in row for row in rows), rows
    assert any(row.startswith("| mlp ") and "| READY " in row for row in rows), rows


def test_an_unnamed_resource_has_none_once_counts_are_given(tmp_path: Path,
                                                            start_server: Any) -> None:
    """With any --rate-limit-resource, a resource the flags do not name (or name for another
    device only) has no copies, and a resource listed as global by one model and per device
    by another is refused (L0_rate_limiter's load failures)."""
    repo = tmp_path / "repo"
    _slow_model(repo, "other_device", 'resources [ { name: "R1" count: 2 } ]')
    _slow_model(repo, "unnamed", 'resources [ { name: "R9" count: 1 } ]')
    server = start_server(repo, "--rate-limit", "execution_count",
                          "--rate-limit-resource", "R1:10:10", "--exit-on-error=false",
                          wait=False)
    server.wait_ready(path="/v2/health/live")
    http = httpclient.InferenceServerClient(server.url)
    index = {e["name"]: e for e in http.get_model_repository_index()}
    assert 'Resource count for "R1" is limited to 0' in index["other_device"]["reason"]
    assert 'Resource count for "R9" is limited to 0' in index["unnamed"]["reason"]
    http.close()

"""Observability end to end: after a known mix of requests (some batched, some failing in the
backend, some rejected by the queue policy) the statistics extension (HTTP and gRPC) and the
Prometheus text on the metrics port show exactly those counts; summaries, CPU metrics, the
logging extension and the trace extension (with a trace file) as Triton serves them."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.conftest import PERF_ANALYZER, ROOT, ServerProcess, make_models, running_server
from tests.e2e.test_cancellation import SLEEP_MODEL  # sleeps INPUT0 seconds, then echoes it

pytestmark = pytest.mark.e2e


def _build_repo(repo: Path) -> Path:
    make_models.write_add_sub(repo, max_batch_size=8)
    make_models.write_model(
        repo, "mlp_batched", make_models.build_mlp(),
        make_models.config_text("mlp_batched", [("INPUT0", "FP32", [784])],
                                [("OUTPUT0", "FP32", [10])], 32,
                                "dynamic_batching { max_queue_delay_microseconds: 50000 }\n"))
    # OUTPUT0 = reshape(INPUT0, [-1, 4]): fails in the backend when the length is not a
    # multiple of 4
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 4])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["INPUT0", "shape"], ["OUTPUT0"])], "fragile",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["m", 4])],
        initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    make_models.write_model(
        repo, "fragile", model,
        make_models.config_text("fragile", [("INPUT0", "FP32", [-1])],
                                [("OUTPUT0", "FP32", [-1, 4])], 0))
    # a lone request waits for the 10 s batching delay but times out after 20 ms
    make_models.write_model(
        repo, "impatient", make_models.build_identity("INT32", ["batch", 1]),
        make_models.config_text(
            "impatient", [("INPUT0", "INT32", [1])], [("OUTPUT0", "INT32", [1])], 8,
            "dynamic_batching { max_queue_delay_microseconds: 10000000 default_queue_policy "
            "{ timeout_action: REJECT default_timeout_microseconds: 20000 } }\n"))
    return repo


@pytest.fixture(scope="module")
def obs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = _build_repo(tmp_path_factory.mktemp("repo"))
    traces = tmp_path_factory.mktemp("traces")
    with running_server(
        repo, "--metrics-config", "summary_latencies=true",
        "--metrics-interval-ms", "200",
        "--trace-config", f"triton,file={traces / 'trace.json'}",
        "--trace-config", "triton,log-frequency=1", tmp_path_factory=tmp_path_factory) as proc:
        proc.trace_dir = traces  # type: ignore[attr-defined]
        yield proc


def _scrape(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name.removesuffix("_total"), tuple(sorted(s.labels.items())))] = s.value
    return out


def _mv(model: str, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"model": model, "version": "1", **extra}.items()))


def _add_sub_inputs(module: Any) -> list[Any]:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"),
              module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return inputs


def _vector(module: Any, name: str, values: np.ndarray, dtype: str) -> list[Any]:
    inp = module.InferInput(name, list(values.shape), dtype)
    inp.set_data_from_numpy(values)
    return [inp]


def test_statistics_and_metrics_count_exactly(obs_server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(obs_server.url, concurrency=16)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{obs_server.grpc_port}")
    for _ in range(4):
        http.infer("add_sub", _add_sub_inputs(httpclient))
    for _ in range(3):
        grpc.infer("add_sub", _add_sub_inputs(grpcclient))
    # the backend fails twice (length 3 cannot become [-1, 4]) and succeeds once
    for client, module in ((http, httpclient), (grpc, grpcclient)):
        with pytest.raises(InferenceServerException):
            client.infer("fragile", _vector(module, "INPUT0", np.ones(3, np.float32), "FP32"))
    http.infer("fragile", _vector(httpclient, "INPUT0", np.ones(8, np.float32), "FP32"))
    # the queue policy rejects two requests
    for client, module in ((http, httpclient), (grpc, grpcclient)):
        with pytest.raises(InferenceServerException, match="Request timeout expired"):
            client.infer("impatient", _vector(module, "INPUT0", np.ones((1, 1), np.int32),
                                              "INT32"))
    # 12 concurrent requests share executions
    x = np.ones((1, 784), np.float32)
    handles = [http.async_infer("mlp_batched", _vector(httpclient, "INPUT0", x, "FP32"))
               for _ in range(12)]
    for h in handles:
        h.get_result()

    def stat(model: str) -> dict[str, Any]:
        entry: dict[str, Any] = http.get_inference_statistics(model)["model_stats"][0]
        g = grpc.get_inference_statistics(model, as_json=True)["model_stats"][0]
        for key in ("inference_count", "execution_count"):
            assert int(g.get(key, 0)) == entry[key], (model, key)
        return entry

    add_sub, fragile, impatient, batched = (stat(m) for m in (
        "add_sub", "fragile", "impatient", "mlp_batched"))
    assert (add_sub["inference_count"], add_sub["execution_count"]) == (7, 7)
    assert add_sub["inference_stats"]["success"]["count"] == 7
    assert fragile["inference_stats"]["success"]["count"] == 1
    assert fragile["inference_stats"]["fail"]["count"] == 2
    assert fragile["execution_count"] == 3 and fragile["inference_count"] == 1
    assert impatient["inference_stats"]["fail"]["count"] == 2
    assert impatient["execution_count"] == 0
    assert batched["inference_count"] == 12 and batched["execution_count"] < 12

    m = _scrape(obs_server)
    assert m[("nv_inference_request_success", _mv("add_sub"))] == 7
    assert m[("nv_inference_count", _mv("add_sub"))] == 7
    assert m[("nv_inference_exec_count", _mv("add_sub"))] == 7
    assert m[("nv_inference_request_failure", _mv("fragile", reason="BACKEND"))] == 2
    assert m[("nv_inference_request_failure", _mv("impatient", reason="REJECTED"))] == 2
    assert m[("nv_inference_request_failure", _mv("add_sub", reason="OTHER"))] == 0
    assert m[("nv_inference_request_success", _mv("mlp_batched"))] == 12
    assert m[("nv_inference_count", _mv("mlp_batched"))] == 12
    assert m[("nv_inference_exec_count", _mv("mlp_batched"))] == batched["execution_count"]
    assert m[("nv_inference_pending_request_count", _mv("mlp_batched"))] == 0
    # durations: positive, each no more than the whole request's, and matching the
    # statistics extension (which counts nanoseconds; the metrics microseconds)
    request_us = m[("nv_inference_request_duration_us", _mv("add_sub"))]
    parts = [m[(f"nv_inference_{p}_duration_us", _mv("add_sub"))]
             for p in ("queue", "compute_input", "compute_infer", "compute_output")]
    assert all(p > 0 for p in parts) and sum(parts) <= request_us
    assert m[("nv_inference_compute_infer_duration_us", _mv("add_sub"))] == (
        add_sub["inference_stats"]["compute_infer"]["ns"] // 1000)
    # summaries (--metrics-config summary_latencies=true): count and sum agree with counters
    assert m[("nv_inference_request_summary_us_count", _mv("add_sub"))] == 7
    assert m[("nv_inference_queue_summary_us_count", _mv("mlp_batched"))] == 12
    assert m[("nv_inference_request_summary_us_sum", _mv("add_sub"))] == pytest.approx(
        request_us, rel=0.01, abs=2)
    assert 0 < m[("nv_inference_request_summary_us", _mv("add_sub", quantile="0.5"))] <= (
        m[("nv_inference_request_summary_us", _mv("add_sub", quantile="0.99"))])
    # CPU metrics (sampled every 200 ms here)
    assert 0.0 <= m[("nv_cpu_utilization", ())] <= 1.0
    assert m[("nv_cpu_memory_total_bytes", ())] >= m[("nv_cpu_memory_used_bytes", ())] > 0
    http.close()
    grpc.close()


def test_metrics_port_serves_only_metrics(obs_server: ServerProcess) -> None:
    base = f"http://127.0.0.1:{obs_server.metrics_port}"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{base}/v2/health/ready", timeout=5)
    assert err.value.code == 404
    err.value.close()
    req = urllib.request.Request(f"{base}/v2/models/add_sub/infer", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 404
    err.value.close()


def test_log_settings_change_at_run_time(obs_server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(obs_server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{obs_server.grpc_port}")
    initial = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
               "log_verbose_level": 0, "log_format": "default"}
    assert http.get_log_settings() == initial
    changed = http.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
    assert changed == {**initial, "log_verbose_level": 1, "log_format": "ISO8601"}
    g = grpc.get_log_settings(as_json=True)["settings"]
    assert g["log_verbose_level"] == {"uint32_param": 1}
    assert g["log_format"] == {"string_param": "ISO8601"}
    grpc.update_log_settings({"log_format": "default", "log_verbose_level": 0})
    assert http.get_log_settings() == initial
    with pytest.raises(InferenceServerException, match="log file location can not be updated"):
        http.update_log_settings({"log_file": "/tmp/elsewhere.log"})
    with pytest.raises(InferenceServerException, match="expect boolean for 'log_info'"):
        http.update_log_settings({"log_info": "yes"})
    with pytest.raises(InferenceServerException, match="invalid argument for log_format"):
        grpc.update_log_settings({"log_format": "fancy"})
    assert http.get_log_settings() == initial
    http.close()
    grpc.close()


def test_log_info_off_silences_info_lines(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    make_models.write_model(repo, "other", make_models.build_identity("INT32", ["batch", 1]),
                            make_models.config_text("other", [("INPUT0", "INT32", [1])],
                                                    [("OUTPUT0", "INT32", [1])], 4))
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "add_sub",
                          "--log-format", "ISO8601")
    http = httpclient.InferenceServerClient(server.url)
    assert http.get_log_settings()["log_format"] == "ISO8601"
    http.update_log_settings({"log_info": False})
    http.load_model("other")
    assert "successfully loaded 'other'" not in server.log()
    http.update_log_settings({"log_info": True})
    http.unload_model("other")
    http.load_model("other")
    log = server.log()
    assert "successfully loaded 'other'" in log
    line = next(x for x in log.splitlines() if "successfully loaded 'other'" in x)
    assert line[:4].isdigit() and line[10] == "T" and " I " in line  # ISO8601 form
    http.close()


def _trace_files(server: ServerProcess) -> list[Path]:
    return sorted(server.trace_dir.glob("trace.json*"))  # type: ignore[attr-defined]


def test_trace_settings_and_trace_file(obs_server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(obs_server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{obs_server.grpc_port}")
    trace_file = str(obs_server.trace_dir / "trace.json")  # type: ignore[attr-defined]
    initial = {"trace_file": trace_file, "trace_level": ["OFF"], "trace_rate": "1000",
               "trace_count": "-1", "log_frequency": "1", "trace_mode": "triton"}
    assert http.get_trace_settings() == initial
    assert http.get_trace_settings(model_name="add_sub") == initial
    # Triton's words and code (its trace handlers ask whether the model is ready)
    with pytest.raises(InferenceServerException) as err:
        http.get_trace_settings(model_name="does-not-exist")
    assert err.value.message() == "Request for unknown model : does-not-exist"
    assert err.value.status() == "400"
    with pytest.raises(InferenceServerException,
                       match="Request for unknown model : does-not-exist") as err:
        grpc.update_trace_settings(model_name="does-not-exist", settings={"trace_rate": "2"})
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
        http.update_trace_settings(model_name="add_sub", settings={"trace_file": "x.json"})
    with pytest.raises(InferenceServerException, match="trace level"):
        http.update_trace_settings(settings={"trace_level": ["LOUD"]})

    # trace every add_sub request; the rest stay untraced
    updated = http.update_trace_settings(model_name="add_sub", settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"})
    assert updated == {**initial, "trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                       "trace_count": "2"}
    assert http.get_trace_settings() == initial
    before = set(_trace_files(obs_server))
    http.infer("add_sub", _add_sub_inputs(httpclient))
    grpc.infer("add_sub", _add_sub_inputs(grpcclient))
    http.infer("add_sub", _add_sub_inputs(httpclient))  # past trace_count: not traced
    x = np.ones((1, 784), np.float32)
    http.infer("mlp_batched", _vector(httpclient, "INPUT0", x, "FP32"))
    assert http.get_trace_settings(model_name="add_sub")["trace_count"] == "0"
    new = sorted(set(_trace_files(obs_server)) - before)
    assert len(new) == 2  # log_frequency 1: one file per trace
    records = [r for f in new for r in json.loads(f.read_text())]
    heads = [r for r in records if "model_name" in r]
    assert [(h["model_name"], h["model_version"]) for h in heads] == [("add_sub", 1)] * 2
    stamps = [[t["name"] for t in r["timestamps"]] for r in records if "timestamps" in r]
    core = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
            "COMPUTE_OUTPUT_START", "COMPUTE_END", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]
    assert stamps[0] == ["HTTP_RECV_START", "HTTP_RECV_END", *core, "HTTP_SEND_START",
                         "HTTP_SEND_END"]
    assert stamps[1] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *core, "GRPC_SEND_START",
                         "GRPC_SEND_END"]
    for r in records:
        if "timestamps" in r:
            ns = [t["ns"] for t in r["timestamps"]]
            assert ns == sorted(ns) and ns[0] > 0  # stages in order

    # gRPC reads and clears per-model settings the same way
    g = grpc.get_trace_settings(model_name="add_sub", as_json=True)["settings"]
    assert g["trace_level"] == {"value": ["TIMESTAMPS"]}
    grpc.update_trace_settings(model_name="add_sub", settings={
        "trace_level": None, "trace_rate": None, "trace_count": None})
    assert http.get_trace_settings(model_name="add_sub") == initial
    http.close()
    grpc.close()


def test_metrics_flags(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    server = start_server(repo, "--allow-cpu-metrics=false", "--metrics-config",
                          "counter_latencies=false")
    m = _scrape(server)
    assert ("nv_inference_count", _mv("add_sub")) in m
    assert not any(k[0].startswith("nv_cpu") for k in m)
    assert not any(k[0] == "nv_inference_request_duration_us" for k in m)
    off = start_server(repo, "--allow-metrics=false")
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{off.metrics_port}/metrics", timeout=2)
    with urllib.request.urlopen(f"http://{off.url}/v2", timeout=5) as r:
        assert r.status == 200


def test_perf_analyzer_reads_server_side_stats(obs_server: ServerProcess) -> None:
    """perf_analyzer asks the statistics extension (and the metrics port with
    --collect-metrics) while it measures; both must satisfy it."""
    if not PERF_ANALYZER.exists():
        pytest.fail("perf_analyzer missing: run scripts/install_perf_analyzer.sh")
    started = time.monotonic()
    out = subprocess.run(
        [str(PERF_ANALYZER), "-m", "add_sub", "-u", obs_server.url, "--measurement-interval",
         "500", "--max-trials", "10", "--stability-percentage", "100", "--collect-metrics", "--metrics-url",
         f"127.0.0.1:{obs_server.metrics_port}/metrics", "--metrics-interval", "200",
         "--verbose-csv", "-f", "/dev/null"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Server:" in out.stdout and "Inference count" in out.stdout
    assert time.monotonic() - started < 120


class _Collector:
    """A minimal OTLP/HTTP receiver on loopback: keeps every exported span."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        spans: list[Any] = []
        self.spans = spans
        self.requests = 0  # export requests received
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.requests += 1
                message = ExportTraceServiceRequest()
                message.ParseFromString(body)
                for rs in message.resource_spans:
                    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        spans.extend((resource, s) for s in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("grpc_server", ["nursery", "grpclib"])
def test_opentelemetry_mode_exports_spans(tmp_path: Path, start_server: Any,
                                          grpc_server: str) -> None:
    import queue

    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    collector = _Collector()
    url_no_scheme = collector.url.removeprefix("http://")
    try:
        server = start_server(
            repo, "--grpc-server", grpc_server,
            "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=2", "--trace-config",
            # a URL without a scheme is http, as Triton's exporter reads it (L0_trace's)
            f"opentelemetry,url={collector.url if grpc_server == 'nursery' else url_no_scheme}",
            "--trace-config", "opentelemetry,resource=service.name=nursery-test",
            "--trace-config", "opentelemetry,bsp_schedule_delay=100")
        http = httpclient.InferenceServerClient(server.url)
        shown = http.get_trace_settings()
        assert shown["trace_mode"] == "opentelemetry"
        assert "trace_file" not in shown and "log_frequency" not in shown
        # the exporter's settings as given, and the batch span processor's defaults
        assert shown["url"] == (collector.url if grpc_server == "nursery" else url_no_scheme)
        assert shown["resource"] == "service.name=nursery-test"
        assert (shown["bsp_schedule_delay"], shown["bsp_max_queue_size"],
                shown["bsp_max_export_batch_size"]) == ("100", "2048", "512")
        # updated as in triton mode (Triton's L0_trace test_http_trace_triggered)
        assert http.update_trace_settings(settings={"trace_rate": "3"})["trace_rate"] == "3"
        assert http.get_trace_settings(model_name="add_sub")["trace_rate"] == "3"
        http.update_trace_settings(settings={"trace_rate": "2"})
        http.infer("add_sub", _add_sub_inputs(httpclient))  # rate 2: not sampled
        http.infer("add_sub", _add_sub_inputs(httpclient), request_id="sampled")
        # a propagated context is always traced, as a child of the caller's span
        parent_trace, parent_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        http.infer("add_sub", _add_sub_inputs(httpclient), request_id="propagated",
                   headers={"traceparent": f"00-{parent_trace}-{parent_span}-01"})
        http.close()
        # over gRPC the context comes as call metadata: a unary call, and a stream whose
        # metadata parents every request it carries
        grpc_span, stream_span = "00f067aa0ba902b8", "00f067aa0ba902b9"
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        grpc.infer("add_sub", _add_sub_inputs(grpcclient), request_id="grpc",
                   headers={"traceparent": f"00-{parent_trace}-{grpc_span}-01"})
        answers: queue.Queue[Any] = queue.Queue()
        grpc.start_stream(lambda result, error: answers.put((result, error)),
                          headers={"traceparent": f"00-{parent_trace}-{stream_span}-01"})
        grpc.async_stream_infer("add_sub", _add_sub_inputs(grpcclient), request_id="stream")
        result, error = answers.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0") is not None
        grpc.stop_stream()
        # a stream without a context: its requests are sampled by rate, the second of these
        # two (the fourth request counted), and traced from the stream's read to its write
        grpc.start_stream(lambda result, error: answers.put((result, error)))
        for request_id in ("stream-unsampled", "stream-sampled"):
            grpc.async_stream_infer("add_sub", _add_sub_inputs(grpcclient),
                                    request_id=request_id)
            assert answers.get(timeout=30)[1] is None
        grpc.stop_stream()
        grpc.close()
        deadline = time.monotonic() + 20
        while len(collector.spans) < 15 and time.monotonic() < deadline:
            time.sleep(0.1)
        spans = [s for _, s in collector.spans]
        assert sorted(s.name for s in spans) == sorted(["InferRequest", "add_sub", "compute"] * 5)
        assert {r["service.name"] for r, _ in collector.spans} == {"nursery-test"}
        by_id = {s.span_id: s for s in spans}
        for s in spans:
            attrs = {a.key: a.value for a in s.attributes}
            assert attrs["triton.model_name"].string_value == "add_sub"
            assert s.end_time_unix_nano >= s.start_time_unix_nano > 0
            if s.name == "compute":
                assert by_id[s.parent_span_id].name == "add_sub"
                assert [e.name for e in s.events] == ["COMPUTE_START", "COMPUTE_INPUT_END",
                                                      "COMPUTE_OUTPUT_START", "COMPUTE_END"]
            elif s.name == "add_sub":
                assert by_id[s.parent_span_id].name == "InferRequest"
                assert [e.name for e in s.events] == ["REQUEST_START", "QUEUE_START",
                                                      "REQUEST_END"]
        tops = {next(a.value.string_value for a in s.attributes
                     if a.key == "triton.request_id"): s
                for s in spans if s.name == "InferRequest"}
        assert tops["propagated"].trace_id.hex() == parent_trace
        assert tops["propagated"].parent_span_id.hex() == parent_span
        for request_id, span in (("grpc", grpc_span), ("stream", stream_span)):
            assert tops[request_id].trace_id.hex() == parent_trace, request_id
            assert tops[request_id].parent_span_id.hex() == span, request_id
        assert tops["sampled"].parent_span_id == tops["stream-sampled"].parent_span_id == b""
        # the top span's events: the frontend's, its send's end included (the trace ends
        # once the answer is written), in the order they happen, as Triton's
        http_top = ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE",
                    "HTTP_SEND_START", "HTTP_SEND_END"]
        grpc_top = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE",
                    "GRPC_SEND_START", "GRPC_SEND_END"]
        for request_id, names in (("sampled", http_top), ("propagated", http_top),
                                  ("grpc", grpc_top), ("stream", grpc_top),
                                  ("stream-sampled", grpc_top)):
            events = tops[request_id].events
            assert [e.name for e in events] == names, request_id
            stamps = [e.time_unix_nano for e in events]
            assert stamps == sorted(stamps), request_id
            assert tops[request_id].end_time_unix_nano == stamps[-1], request_id
    finally:
        collector.close()


def _bls_trace_repo(repo: Path) -> Path:
    """add_sub (ONNX), py_add_sub, the ensemble of both (ens_add_sub_py), py_bls (BLS without
    a trace) and py_bls_trace (BLS with ``trace=request.trace()``, Triton's bls_simple)."""
    make_models.write_add_sub(repo, max_batch_size=64)
    for name in ("py_add_sub", "ens_add_sub_py", "py_bls", "py_bls_trace"):
        shutil.copytree(ROOT / "tests" / "models" / name, repo / name)
        (repo / name / "1").mkdir(exist_ok=True)
    # ens_add_sub_py with add_sub's tensor names, as the BLS model calls it
    config = (repo / "ens_add_sub_py" / "config.pbtxt").read_text()
    for old, new in (('"A"', '"INPUT0"'), ('"B"', '"INPUT1"'), ('"TWICE_A"', '"OUTPUT0"'),
                     ('"TWICE_B"', '"OUTPUT1"')):
        config = config.replace(old, new)
    (repo / "ens_add_sub_py" / "config.pbtxt").write_text(config)
    return repo


def _bls_inputs(target: str, rows: int = 1) -> list[Any]:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    shape = [1, 16] if rows == 1 else [rows, 16]
    inputs = [httpclient.InferInput("MODEL_NAME", [1] if rows == 1 else [rows, 1], "BYTES"),
              httpclient.InferInput("INPUT0", shape, "FP32"),
              httpclient.InferInput("INPUT1", shape, "FP32")]
    names = np.array([target.encode()] * rows, dtype=np.object_)
    inputs[0].set_data_from_numpy(names if rows == 1 else names.reshape(rows, 1))
    inputs[1].set_data_from_numpy(np.repeat(a, rows, axis=0))
    inputs[2].set_data_from_numpy(np.repeat(a, rows, axis=0))
    return inputs


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_bls_and_ensemble_steps_trace_as_children(tmp_path: Path, start_server: Any,
                                                  mode: str) -> None:
    """Triton's L0_trace BLS check: a BLS request made with ``trace=request.trace()`` and the
    steps of an ensemble are traced as children of the request that made them (their own
    ids, ``parent_id`` naming the parent's), whatever the sampling rate; a BLS request made
    without it, and the steps of an untraced ensemble request, are never traced."""
    repo = _bls_trace_repo(tmp_path / "repo")
    trace_file = tmp_path / "bls_trace.json"
    server = start_server(repo, f"--backend-config=python,nursery-instance-mode={mode}",
                          "--trace-config", f"triton,file={trace_file}",
                          "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=2")
    http = httpclient.InferenceServerClient(server.url)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    for _ in range(2):  # rate 2: the second is traced
        result = http.infer("py_bls_trace", _bls_inputs("ens_add_sub_py"))
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), 2 * a)
        assert result.as_numpy("CONTEXT")[0] == b""  # triton mode: no OpenTelemetry context
    # the third request (untraced): an ensemble, whose steps are not sampled on their own
    http.infer("ens_add_sub_py", _add_sub_inputs(httpclient))
    # the fourth (traced): a BLS request made without trace=, which is not traced
    name = httpclient.InferInput("MODEL_NAME", [1, 1], "BYTES")
    name.set_data_from_numpy(np.array([[b"add_sub"]], dtype=np.object_))
    http.infer("py_bls", [name, *_add_sub_inputs(httpclient)])
    http.close()
    assert server.stop() == 0
    records = json.loads(trace_file.read_text())
    heads = {r["id"]: r for r in records if "model_name" in r}
    stamps = {r["id"]: [t["name"] for t in r["timestamps"]] for r in records if "timestamps" in r}
    by_model: dict[str, list[dict[str, Any]]] = {}
    for head in heads.values():
        by_model.setdefault(head["model_name"], []).append(head)
    assert sorted((m, len(h)) for m, h in by_model.items()) == [
        ("add_sub", 1), ("ens_add_sub_py", 1), ("py_add_sub", 1), ("py_bls", 1),
        ("py_bls_trace", 1)]
    bls = by_model["py_bls_trace"][0]
    assert "parent_id" not in bls and "parent_id" not in by_model["py_bls"][0]
    assert len(records) == 2 * len(heads)  # each trace: its head, its timestamps
    bls_child = by_model["ens_add_sub_py"][0]
    assert bls_child["parent_id"] == bls["id"]
    steps = sorted(h["model_name"] for h in heads.values() if h.get("parent_id") == bls_child["id"])
    assert steps == ["add_sub", "py_add_sub"]
    assert sum("parent_id" in h for h in heads.values()) == 3
    # a Python model's trace has the four compute stamps, as Triton's backend reports them
    for model in ("py_bls_trace", "py_add_sub", "py_bls"):
        assert {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                "COMPUTE_END"} <= set(stamps[by_model[model][0]["id"]])
    assert stamps[bls["id"]][0] == "HTTP_RECV_START"
    assert stamps[bls_child["id"]][:2] == ["REQUEST_START", "QUEUE_START"]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_bls_child_spans_and_context_in_opentelemetry_mode(tmp_path: Path, start_server: Any,
                                                           mode: str) -> None:
    """Triton's L0_trace BLS trace in OpenTelemetry mode: one trace of six spans
    (InferRequest > py_bls_trace > compute, and py_bls_trace > ens_add_sub_py > add_sub and
    py_add_sub, each > compute), under the caller's span when it sent one; the model sees
    its own span's context (``request.trace().get_context()``)."""
    repo = _bls_trace_repo(tmp_path / "repo")
    collector = _Collector()
    try:
        server = start_server(
            repo, f"--backend-config=python,nursery-instance-mode={mode}",
            "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1", "--trace-config", f"opentelemetry,url={collector.url}",
            "--trace-config", "opentelemetry,bsp_schedule_delay=100")
        http = httpclient.InferenceServerClient(server.url)
        caller_trace, caller_span = "0af7651916cd43dd8448eb211c12666c", "b7ad6b7169242424"
        result = http.infer("py_bls_trace", _bls_inputs("ens_add_sub_py"),
                            headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"})
        http.close()
        context = json.loads(result.as_numpy("CONTEXT")[0])
        deadline = time.monotonic() + 20
        while len(collector.spans) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        spans = [s for _, s in collector.spans]
        assert sorted(s.name for s in spans) == sorted(
            ["InferRequest", "py_bls_trace", "ens_add_sub_py", "add_sub", "py_add_sub"]
            + ["compute"] * 3)
        assert {s.trace_id.hex() for s in spans} == {caller_trace}
        by_id = {s.span_id: s for s in spans}
        children: dict[str, list[str]] = {}
        for s in spans:
            if s.parent_span_id in by_id:
                children.setdefault(by_id[s.parent_span_id].name, []).append(s.name)
            else:
                assert s.name == "InferRequest" and s.parent_span_id.hex() == caller_span
        assert {k: sorted(v) for k, v in children.items()} == {
            "InferRequest": ["py_bls_trace"], "py_bls_trace": ["compute", "ens_add_sub_py"],
            "ens_add_sub_py": ["add_sub", "py_add_sub"], "add_sub": ["compute"],
            "py_add_sub": ["compute"]}
        bls_span = next(s for s in spans if s.name == "py_bls_trace")
        assert context == {"traceparent": f"00-{caller_trace}-{bls_span.span_id.hex()}-01"}
    finally:
        collector.close()


def test_decoupled_response_stats_and_first_response_histogram(tmp_path: Path,
                                                                start_server: Any) -> None:
    import queue
    import shutil

    from tests.conftest import ROOT

    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "models" / "py_repeat", repo / "py_repeat")
    config = repo / "py_repeat" / "config.pbtxt"
    config.write_text(config.read_text() + (
        'model_metrics { metric_control [ { metric_identifier { family: '
        '"nv_inference_first_response_histogram_ms" } histogram_options { buckets: '
        '[ 0.001, 10000 ] } } ] }\n'))
    server = start_server(repo, "--metrics-config", "histogram_latencies=true")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    for values in ([1, 2, 3], [4, -5]):  # 3 responses; 1 response and 1 error
        grpc.async_stream_infer("py_repeat", _vector(grpcclient, "IN",
                                                     np.array(values, np.int32), "INT32"))
    got = [answers.get(timeout=20) for _ in range(5)]
    grpc.stop_stream()
    assert sum(1 for _, error in got if error is not None) == 1
    http = httpclient.InferenceServerClient(server.url)
    stats = http.get_inference_statistics("py_repeat")["model_stats"][0]["response_stats"]
    assert stats["0"]["success"]["count"] == 2 and stats["1"]["success"]["count"] == 1
    assert stats["1"]["fail"]["count"] == 1 and stats["2"]["success"]["count"] == 1
    assert stats["3"]["empty_response"]["count"] == 1  # the bare final flag of the first
    assert set(stats["0"]) == {"compute_infer", "compute_output", "success", "fail",
                               "empty_response", "cancel"}
    # (tritonclient 2.41's gRPC stubs predate response_stats: the proto form is checked in
    # tests/unit/test_observability.py)
    m = _scrape(server)
    fam = "nv_inference_first_response_histogram_ms"
    assert m[(f"{fam}_count", _mv("py_repeat"))] == 2
    assert m[(f"{fam}_bucket", _mv("py_repeat", le="0.001"))] == 0  # nothing is that fast
    assert m[(f"{fam}_bucket", _mv("py_repeat", le="10000"))] == 2
    assert m[(f"{fam}_bucket", _mv("py_repeat", le="+Inf"))] == 2
    assert m[(f"{fam}_sum", _mv("py_repeat"))] > 0
    http.close()
    grpc.close()


def test_cancelled_requests_traces_in_opentelemetry_mode(tmp_path: Path,
                                                         start_server: Any) -> None:
    """Triton's L0_trace cancellation cases: a gRPC call cancelled while its model computes
    keeps its trace open until the compute ends (the compute span is there), one cancelled in
    the queue has none; neither has the answer's events on its top span (no answer came)."""
    import queue

    repo = tmp_path / "repo"
    (repo / "sleepy" / "1").mkdir(parents=True)
    (repo / "sleepy" / "1" / "model.py").write_text(SLEEP_MODEL)
    (repo / "sleepy" / "config.pbtxt").write_text(
        'name: "sleepy"\nbackend: "python"\nmax_batch_size: 1\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\ndynamic_batching { }\n')
    collector = _Collector()
    try:
        server = start_server(
            repo, "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1", "--trace-config", f"opentelemetry,url={collector.url}",
            "--trace-config", "opentelemetry,bsp_schedule_delay=100")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")

        def inputs(seconds: float) -> list[Any]:
            return _vector(grpcclient, "INPUT0", np.array([[seconds]], np.float32), "FP32")

        answers: queue.Queue[Any] = queue.Queue()

        def put(result: Any, error: Any) -> None:
            answers.put(error)

        running = grpc.async_infer("sleepy", inputs(1.0), put, request_id="running")
        time.sleep(0.4)  # it computes
        running.cancel()
        assert "cancelled" in str(answers.get(timeout=5)).lower()
        grpc.async_infer("sleepy", inputs(1.0), put, request_id="blocker")
        time.sleep(0.4)
        queued = grpc.async_infer("sleepy", inputs(0.0), put, request_id="queued")
        time.sleep(0.2)  # it waits behind the blocker
        queued.cancel()
        assert "cancelled" in str(answers.get(timeout=5)).lower()
        assert answers.get(timeout=10) is None  # the blocker's answer
        grpc.close()
        deadline = time.monotonic() + 20
        while len(collector.spans) < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)  # nothing more comes
        spans = [s for _, s in collector.spans]
        traces: dict[str, dict[str, Any]] = {}
        for s in spans:
            request_id = next(a.value.string_value for a in s.attributes
                              if a.key == "triton.request_id")
            traces.setdefault(request_id, {})[s.name] = s
        assert {k: sorted(v) for k, v in traces.items()} == {
            "running": ["InferRequest", "compute", "sleepy"],
            "blocker": ["InferRequest", "compute", "sleepy"],
            "queued": ["InferRequest", "sleepy"]}
        for request_id in ("running", "queued"):
            assert [e.name for e in traces[request_id]["InferRequest"].events] == [
                "GRPC_WAITREAD_START", "GRPC_WAITREAD_END"], request_id
            assert [e.name for e in traces[request_id]["sleepy"].events] == [
                "REQUEST_START", "QUEUE_START", "REQUEST_END"], request_id
        assert [e.name for e in traces["running"]["compute"].events] == [
            "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
        assert [e.name for e in traces["blocker"]["InferRequest"].events] == [
            "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE",
            "GRPC_SEND_START", "GRPC_SEND_END"]
    finally:
        collector.close()


def test_batch_span_processor_settings_as_triton_takes_them(tmp_path: Path,
                                                           start_server: Any) -> None:
    """L0_trace's BatchSpanProcessor checks: a queue of one span (smaller than the default
    batch) drops spans with the warning Triton's SDK logs; a schedule delay of 0 (which the
    Python SDK refuses) exports; a batch of one span exports each span in its own request."""
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    common = ("--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
              "--trace-config", "rate=1")
    for setting, requests in (("bsp_max_queue_size=1", None), ("bsp_schedule_delay=0", 1),
                              ("bsp_max_export_batch_size=1", 3)):
        collector = _Collector()
        got: list[int] = []
        try:
            server = start_server(repo, *common, "--trace-config",
                                  f"opentelemetry,url={collector.url}",
                                  "--trace-config", f"opentelemetry,{setting}")
            http = httpclient.InferenceServerClient(server.url)
            assert http.get_trace_settings()[setting.split("=")[0]] == setting.split("=")[1]
            http.infer("add_sub", _add_sub_inputs(httpclient))
            http.close()
            if requests is None:  # three spans at once into a queue of one
                deadline = time.monotonic() + 20
                while ("BatchSpanProcessor queue is full - dropping span." not in server.log()
                       and time.monotonic() < deadline):
                    time.sleep(0.1)
                assert "BatchSpanProcessor queue is full - dropping span." in server.log()
                continue
            deadline = time.monotonic() + 20
            while len(collector.spans) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            got.append(len(collector.spans))
            assert got == [3], setting
            assert collector.requests >= requests, setting
        finally:
            collector.close()

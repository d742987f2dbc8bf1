"""Pure parts of observability: metric text, trace settings and sampling, log settings,
/proc readings, latency summaries."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nursery.errors import InvalidArgument, Unsupported
from nursery.observability import metrics, stats
from nursery.observability.logs import LogManager, LogSettings
from nursery.observability.stats import BatchReport, StatsAccumulator
from nursery.observability.system import GpuSample, SystemSample, cpu_utilization, read_cpu_times, read_memory
from nursery.observability.tracing import (
    ChildOf,
    Trace,
    TraceLink,
    TraceManager,
    TraceSettings,
    child_of,
    settings_from_config,
)


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _report(n: int, *, ok: bool = True, size: int | None = None) -> BatchReport:
    return BatchReport(batch_size=size or n, requests=n, succeeded=ok, queue_ns=1000 * n,
                       request_ns=5000 * n, compute_input_ns=100, compute_infer_ns=2000,
                       compute_output_ns=300, finished_ms=1, enqueued_ns=tuple([0] * n),
                       started_ns=1000, ended_ns=5000)


# -- metrics text ------------------------------------------------------------------------------


def test_render_parses_with_triton_names_and_labels() -> None:
    acc = StatsAccumulator()
    acc.record_batch(_report(3))
    acc.record_batch(_report(1, ok=False))
    acc.record_failure("REJECTED", 2)
    text = metrics.render([("m", "1", acc.snapshot(pending=4))],
                          SystemSample(0.25, 1000, 400, (GpuSample("GPU-1", 0.5, 10, 5, 70.0,
                                                                   300.0, 12.5),)),
                          metrics.MetricsOptions())
    fams = _families(text)
    assert fams["nv_inference_request_success"].type == "counter"
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in fams.values() for s in f.samples}
    mv = (("model", "m"), ("version", "1"))
    assert values[("nv_inference_request_success_total", mv)] == 3
    assert values[("nv_inference_count_total", mv)] == 3
    assert values[("nv_inference_exec_count_total", mv)] == 2
    assert values[("nv_inference_request_failure_total",
                   (("model", "m"), ("reason", "BACKEND"), ("version", "1")))] == 1
    assert values[("nv_inference_request_failure_total",
                   (("model", "m"), ("reason", "REJECTED"), ("version", "1")))] == 2
    assert values[("nv_inference_request_failure_total",
                   (("model", "m"), ("reason", "CANCELED"), ("version", "1")))] == 0
    assert values[("nv_inference_pending_request_count", mv)] == 4
    assert values[("nv_inference_queue_duration_us_total", mv)] == 3  # 3 x 1000 ns
    assert values[("nv_cpu_utilization", ())] == 0.25
    assert values[("nv_gpu_power_usage", (("gpu_uuid", "GPU-1"),))] == 70.0
    assert values[("nv_energy_consumption_total", (("gpu_uuid", "GPU-1"),))] == 12.5
    # Triton's counters carry no _total suffix on the wire
    assert "nv_inference_count{" in text and "_total{" not in text


def test_counter_latencies_off_and_cpu_off() -> None:
    options = metrics.MetricsOptions.from_config([("counter_latencies", "false")], cpu=False)
    text = metrics.render([("m", "1", stats.StatsSnapshot())], SystemSample(0.5, 10, 5), options)
    assert "nv_inference_request_duration_us" not in text
    assert "nv_inference_count" in text and "nv_cpu" not in text


def test_summaries_follow_samples_and_quantile_config() -> None:
    acc = StatsAccumulator(summaries=True)
    for _ in range(4):
        acc.record_batch(_report(2))
    options = metrics.MetricsOptions.from_config(
        [("summary_latencies", "true"), ("summary_quantiles", "0.5:0.05,0.99:0.001")])
    assert options.summary_quantiles == (0.5, 0.99)
    text = metrics.render([("m", "1", acc.snapshot())], SystemSample(), options)
    fams = _families(text)
    queue = fams["nv_inference_queue_summary_us"]
    assert queue.type == "summary"
    by_name = {(s.name, s.labels.get("quantile")): s.value for s in queue.samples}
    assert by_name[("nv_inference_queue_summary_us_count", None)] == 8
    assert by_name[("nv_inference_queue_summary_us_sum", None)] == pytest.approx(8.0)
    assert by_name[("nv_inference_queue_summary_us", "0.5")] == pytest.approx(1.0)
    request = {(s.name, s.labels.get("quantile")): s.value
               for s in fams["nv_inference_request_summary_us"].samples}
    assert request[("nv_inference_request_summary_us", "0.99")] == pytest.approx(5.0)


def test_empty_summary_is_nan() -> None:
    text = metrics.render([("m", "1", StatsAccumulator(summaries=True).snapshot())], SystemSample(),
                          metrics.MetricsOptions(summary_latencies=True))
    values = [s.value for s in _families(text)["nv_inference_compute_infer_summary_us"].samples
              if "quantile" in s.labels]
    assert values and all(math.isnan(v) for v in values)


# -- /proc readings ----------------------------------------------------------------------------


def test_proc_readings() -> None:
    before = read_cpu_times("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    after = read_cpu_times("cpu  200 0 200 1400 0 0 0 0 0 0\n")
    assert before == (200, 1000) and after == (400, 1800)
    assert cpu_utilization(before, after) == pytest.approx(0.25)
    assert read_memory("MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 600 kB\n") == (
        1024000, 409600)
    assert read_memory("MemTotal: 1000 kB\n") is None
    real = read_cpu_times()
    assert real is not None and real[1] >= real[0] >= 0


# -- trace settings ----------------------------------------------------------------------------


def _startup() -> TraceSettings:
    return settings_from_config(("triton,file=global.log", "level=TIMESTAMPS", "rate=1"))


def test_trace_config_flags() -> None:
    s = _startup()
    assert s.to_json() == {"trace_file": "global.log", "trace_level": ["TIMESTAMPS"],
                           "trace_rate": "1", "trace_count": "-1", "log_frequency": "0",
                           "trace_mode": "triton"}
    with pytest.raises(ValueError, match="unknown trace setting"):
        settings_from_config(("bogus=1",))
    with pytest.raises(ValueError, match="invalid value for trace level option: loud"):
        settings_from_config(("level=LOUD",))


@pytest.mark.parametrize(("given", "level"), [
    ("MIN", ("TIMESTAMPS",)), ("max", ("TIMESTAMPS",)), ("on", ("TIMESTAMPS",)),
    ("true", ("TIMESTAMPS",)), ("Tensors", ("TENSORS",)), ("off", ("OFF",)),
    ("false", ("OFF",))])
def test_command_line_trace_levels_read_as_triton(given: str, level: tuple[str, ...]) -> None:
    """Triton's command line reads a level case-insensitively, with its older spellings
    (L0_batcher starts the server with --trace-level=MIN)."""
    assert settings_from_config((f"level={given}",)).trace_level == level


def test_model_settings_follow_global_until_set_and_clear_as_triton() -> None:
    """Triton's qa/L0_trace trace_endpoint_test sequences, adapted to 2.51 (the trace file
    cannot change over the network)."""
    tm = TraceManager(_startup())
    assert tm.settings("simple") == tm.settings()
    tm.update("simple", {"trace_rate": "12", "log_frequency": "34"})
    tm.update("", {"trace_rate": "56", "trace_count": "78", "trace_level": ["OFF"]})
    # clearing global settings goes back to the command line's
    assert tm.update("", {"trace_rate": None, "trace_count": None}).to_json()["trace_rate"] == "1"
    model = tm.settings("simple").to_json()
    assert (model["trace_rate"], model["log_frequency"], model["trace_level"]) == (
        "12", "34", ["OFF"])
    # clearing a model setting goes back to the global one
    cleared = tm.update("simple", {"trace_rate": None, "trace_level": None}).to_json()
    assert (cleared["trace_rate"], cleared["log_frequency"], cleared["trace_level"]) == (
        "1", "34", ["OFF"])
    with pytest.raises(Unsupported, match="trace file location can not be updated"):
        tm.update("simple", {"trace_file": "other.log"})
    with pytest.raises(InvalidArgument):
        tm.update("", {"trace_rate": "zero"})
    with pytest.raises(InvalidArgument):
        tm.update("", {"trace_level": ["LOUD"]})
    with pytest.raises(InvalidArgument):
        tm.update("", {"trace_rate": "-1"})
    # past a C int, as Triton reads them (L0_trace's "out of range value" checks)
    for key, top in (("trace_count", "2147483647"), ("trace_rate", "4294967295"),
                     ("log_frequency", "4294967295")):
        with pytest.raises(InvalidArgument, match=rf"'{key}', value is out of range \[ -?[01], "
                           rf"{top} \], got: 10000000000"):
            tm.update("simple", {key: "10000000000"})
    assert tm.update("", {"trace_rate": "2147483647"}).trace_rate == 2**31 - 1


def test_rate_zero_samples_no_request_by_rate() -> None:
    """Triton accepts ``rate=0`` (its way, in OpenTelemetry mode, to trace only the requests
    that carry a trace context): no request is sampled by rate."""
    settings = settings_from_config(("level=TIMESTAMPS", "rate=0"))
    assert settings.to_json()["trace_rate"] == "0"
    tm = TraceManager(settings)
    assert all(tm.start("m") is None for _ in range(5))
    tm.update("", {"trace_rate": "1"})
    assert tm.start("m") is not None


def test_sampling_rate_count_and_file(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tm = TraceManager(TraceSettings(trace_file=str(path), trace_level=("TIMESTAMPS",),
                                    trace_rate=2, trace_count=3, log_frequency=2))
    traces = [tm.start("m") for _ in range(10)]
    taken = [t for t in traces if t is not None]
    assert [traces.index(t) for t in taken] == [1, 3, 5]  # every 2nd, 3 in all
    assert tm.settings().trace_count == 0
    for t in taken:
        t.stamp("REQUEST_START", 1)
        t.stamp("REQUEST_END", 2)
        t.finish()
    first = json.loads((tmp_path / "trace.json.0").read_text())
    assert [r["id"] for r in first] == [taken[0].id] * 2 + [taken[1].id] * 2
    assert first[1]["timestamps"] == [{"name": "REQUEST_START", "ns": 1},
                                      {"name": "REQUEST_END", "ns": 2}]
    tm.close()  # the third trace is written at shutdown
    assert json.loads((tmp_path / "trace.json.1").read_text())[0]["id"] == taken[2].id


def test_a_trace_finished_while_an_instance_holds_it_is_written_when_released(
        tmp_path: Path) -> None:
    """A request whose client left while its model computes: the trace is written once the
    instance is done with it, compute stamps included (Triton's trace lives until its request
    is released)."""
    path = tmp_path / "trace.json"
    tm = TraceManager(TraceSettings(trace_file=str(path), trace_level=("TIMESTAMPS",),
                                    trace_rate=1, log_frequency=1))
    t = tm.start("m")
    assert t is not None
    t.stamp("REQUEST_START", 1)
    t.hold()  # an instance took it
    t.stamp("REQUEST_END", 2)
    t.finish()  # its client left
    assert not (tmp_path / "trace.json.0").exists()
    t.stamp("COMPUTE_END", 3)
    t.release()
    written = json.loads((tmp_path / "trace.json.0").read_text())
    assert [s["name"] for s in written[1]["timestamps"]] == [
        "REQUEST_START", "REQUEST_END", "COMPUTE_END"]
    u = tm.start("m")  # released before it finished: written at finish, once
    assert u is not None
    u.hold()
    u.release()
    assert not (tmp_path / "trace.json.1").exists()
    u.finish()
    assert json.loads((tmp_path / "trace.json.1").read_text())[0]["id"] == u.id
    tm.close()
    assert not (tmp_path / "trace.json.2").exists()


def test_tensor_level_records_tensors(tmp_path: Path) -> None:
    import numpy as np

    tm = TraceManager(TraceSettings(trace_file=str(tmp_path / "t.json"),
                                    trace_level=("TIMESTAMPS", "TENSORS"), trace_rate=1))
    t = tm.start("m")
    assert t is not None
    t.tensor("TENSOR_QUEUE_INPUT", "INPUT0", "INT32", np.array([[1, 2]], np.int32))
    t.finish()
    tm.close()
    records = json.loads((tmp_path / "t.json").read_text())
    assert records[-1]["tensor"] == {"name": "INPUT0", "data": "1,2", "shape": "1,2",
                                     "dtype": "INT32"}


def test_child_traces_share_the_file_and_the_opentelemetry_trace(tmp_path: Path) -> None:
    """A child trace has an id of its own and names its parent's (``parent_id``), goes to
    the parent's file, and is not counted by the sampler; in OpenTelemetry mode it is in the
    parent's trace, under the parent's span, whose context the parent's request shows."""
    tm = TraceManager(settings_from_config(("level=TIMESTAMPS", "rate=2", "count=1",
                                            f"triton,file={tmp_path / 't.json'}")))
    assert tm.start("m") is None
    parent = tm.start("m")
    assert parent is not None and parent.context() is None  # triton mode: no context
    child = tm.spawn(ChildOf(parent), "step")
    grandchild = tm.spawn(ChildOf(TraceLink(child.id)), "leaf")  # type: ignore[union-attr]
    assert isinstance(child, Trace) and isinstance(grandchild, Trace)
    assert (child.parent_id, grandchild.parent_id) == (parent.id, child.id)
    assert tm.settings().trace_count == 0  # the children took nothing from the count
    for t in (grandchild, child, parent):
        t.stamp("REQUEST_START")
        t.finish()
    tm.close()
    heads = [r for r in json.loads((tmp_path / "t.json").read_text()) if "model_name" in r]
    assert [(h["model_name"], h.get("parent_id")) for h in heads] == [
        ("leaf", child.id), ("step", parent.id), ("m", None)]
    assert child_of(None) is False and child_of(False) is False
    # with log_frequency, a request's trace and its children count as one (Triton writes a
    # request's trace with its children's)
    tm = TraceManager(settings_from_config(("level=TIMESTAMPS", "rate=1", "log_frequency=1",
                                            f"triton,file={tmp_path / 'f.json'}")))
    parent = tm.start("m")
    assert parent is not None
    child = tm.spawn(ChildOf(parent), "step")
    assert isinstance(child, Trace)
    child.finish()
    assert not (tmp_path / "f.json.0").exists()
    parent.finish()
    heads = [r for r in json.loads((tmp_path / "f.json.0").read_text()) if "model_name" in r]
    assert [h["model_name"] for h in heads] == ["step", "m"]

    otel = TraceSettings(trace_level=("TIMESTAMPS",), trace_rate=1, trace_mode="opentelemetry")
    tm = TraceManager(otel)
    try:
        caller = "0af7651916cd43dd8448eb211c12666c"
        root = tm.start("m", f"00-{caller}-b7ad6b7169242424-01")
        assert root is not None and f"{root.otel_trace_id:032x}" == caller
        assert json.loads(root.context() or "") == {
            "traceparent": f"00-{caller}-{root.span_id:016x}-01"}
        kid = tm.spawn(ChildOf(root), "step")
        assert isinstance(kid, Trace)
        assert (kid.otel_trace_id, kid.parent_span_id) == (root.otel_trace_id, root.span_id)
        assert kid.span_id not in (0, root.span_id)
    finally:
        tm.close()


def test_tracing_off_costs_nothing() -> None:
    tm = TraceManager(TraceSettings())
    assert not tm.active and tm.start("m") is None
    tm.update("m", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert tm.active and tm.start("m") is not None and tm.start("other") is None


# -- log settings ------------------------------------------------------------------------------


def test_log_settings_update_and_triton_errors() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        manager = LogManager(LogSettings())
        assert manager.update({"log_info": False, "log_verbose_level": 2}).log_info is False
        assert manager.settings.to_json()["log_verbose_level"] == 2
        assert root.level == logging.DEBUG
        with pytest.raises(Unsupported, match="log file location can not be updated"):
            manager.update({"log_file": ""})
        with pytest.raises(InvalidArgument, match="expect boolean for 'log_error'"):
            manager.update({"log_error": "yes"})
        with pytest.raises(InvalidArgument, match="invalid argument for log_format, got: x"):
            manager.update({"log_format": "x"})
        with pytest.raises(InvalidArgument, match="log_verbose_level"):
            manager.update({"log_verbose_level": -1})
        assert manager.settings.log_error is True  # nothing changed on an error
        manager.update({"log_format": "ISO8601"})
        record = logging.LogRecord("nursery.x", logging.WARNING, "f", 1, "hello", None, None)
        line = manager.handler.format(record)
        assert line.split(" ")[1] == "W" and line.endswith(' f:1] "hello"')
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_grafana_dashboard_uses_only_metrics_we_serve() -> None:
    import re

    acc = StatsAccumulator(summaries=True)
    acc.record_batch(_report(1))
    text = metrics.render(
        [("m", "1", acc.snapshot())],
        SystemSample(0.1, 10, 5, (GpuSample("GPU-1", 0.5, 10, 5, 70.0, 300.0, 1.0),)),
        metrics.MetricsOptions(summary_latencies=True))
    served = {f.name for f in text_string_to_metric_families(text)}
    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana" /
                            "nursery-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\bnv_[a-z_]+", target["expr"])}
    assert used and used <= served, used - served


def test_response_stats_in_both_shapes() -> None:
    from nursery.protocol.codecs import stats as stats_codec
    from nursery.schema import inference as pb

    acc = StatsAccumulator()
    acc.record_response(0, "success", 2000, 5_000_000, (1.0, 10.0))
    acc.record_response(1, "fail", 1000, 0, (1.0, 10.0))
    acc.record_response(0, "success", 4000, 500_000, (1.0, 10.0))
    snap = acc.snapshot()
    assert snap.first_response is not None
    assert snap.first_response.counts == (1, 2) and snap.first_response.count == 2
    as_json = stats_codec.to_json([("m", "1", snap)])["model_stats"][0]["response_stats"]
    assert as_json["0"]["success"] == {"count": 2, "ns": 6000}
    assert as_json["0"]["compute_infer"] == {"count": 2, "ns": 6000}
    assert as_json["1"]["fail"] == {"count": 1, "ns": 1000}
    wire = bytes(stats_codec.to_proto([("m", "1", snap)]))
    back = pb.ModelStatisticsResponse().parse(wire).model_stats[0].response_stats
    assert back["0"].success.count == 2 and back["1"].fail.ns == 1000
    text = metrics.render([("m", "1", snap)], SystemSample(),
                          metrics.MetricsOptions(histogram_latencies=True),
                          histograms={("m", "1"): (1.0, 10.0)})
    fam = _families(text)["nv_inference_first_response_histogram_ms"]
    assert fam.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in fam.samples if s.name.endswith("_bucket")}
    assert buckets == {"1": 1, "10": 2, "+Inf": 2}  # as prometheus-cpp writes bounds


def test_a_used_up_trace_count_writes_its_traces_at_once(tmp_path: Path) -> None:
    """Triton's L0_trace global_count check: a settings holder whose trace_count is used up
    writes its traces to the next indexed part of the file as soon as the last one finishes
    (before shutdown); the other holders' traces go to the file itself at shutdown."""
    def heads(name: str) -> list[str]:
        return [r["model_name"] for r in json.loads((tmp_path / name).read_text())
                if "model_name" in r]

    tm = TraceManager(settings_from_config(("level=TIMESTAMPS", "rate=1",
                                            f"triton,file={tmp_path / 'c.json'}")))
    for _ in range(3):
        trace = tm.start("other")
        assert trace is not None
        trace.finish()
    tm.update("simple", {"trace_count": "2"})
    first, second = tm.start("simple"), tm.start("simple")
    assert first is not None and second is not None and tm.start("simple") is None
    first.finish()
    assert not (tmp_path / "c.json.0").exists()
    second.finish()
    assert heads("c.json.0") == ["simple", "simple"]
    assert not (tmp_path / "c.json").exists()
    tm.close()
    assert heads("c.json") == ["other"] * 3


def test_trace_files_are_compact_json_as_tritons(tmp_path: Path) -> None:
    # L0_cmdline_trace greps the file for {"id":1,"model_name":"simple",...}
    tm = TraceManager(settings_from_config(("level=TIMESTAMPS", "rate=1",
                                            f"triton,file={tmp_path / 't.json'}")))
    trace = tm.start("simple")
    assert trace is not None
    trace.finish()
    tm.close()
    text = (tmp_path / "t.json").read_text()
    assert '{"id":1,"model_name":"simple"' in text and ", " not in text and ": " not in text


def test_opentelemetry_batch_settings_and_their_environment_in_tritons_words() -> None:
    from nursery.observability.otel import OtelSettings

    assert OtelSettings.from_entries([], {"OTEL_BSP_SCHEDULE_DELAY": "7"}).bsp_schedule_delay == 7
    # the command line's value wins over the environment's
    assert OtelSettings.from_entries([("bsp_schedule_delay", "9")],
                                     {"OTEL_BSP_SCHEDULE_DELAY": "bad"}).bsp_schedule_delay == 9
    for key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
        with pytest.raises(ValueError, match=f'Bad option: "OTEL_{key.upper()}"'):
            OtelSettings.from_entries([], {f"OTEL_{key.upper()}": "bad_value"})
        with pytest.raises(ValueError,
                           match=f'Bad option: "--trace-config opentelemetry,{key}"'):
            OtelSettings.from_entries([(key, "bad_value")], {})


def test_deprecated_trace_flags_warn_as_triton_does() -> None:
    from nursery.settings import settings_from_args

    settings = settings_from_args(["--trace-file=/tmp/t.json", "--trace-rate=100",
                                   "--trace-level=TIMESTAMPS", "--trace-log-frequency=50",
                                   "--trace-count=100"])
    for flag in ("--trace-file", "--trace-rate", "--trace-level", "--trace-log-frequency",
                 "--trace-count"):
        assert sum(f"Warning: '{flag}' has been deprecated" in w
                   for w in settings.cli_warnings) == 1, settings.cli_warnings


def test_a_non_decoupled_models_answers_are_its_first_responses() -> None:
    # Triton counts every model's first response into the histogram (L0_metrics)
    acc = StatsAccumulator(first_response=(1.0, 10.0))
    acc.record_batch(BatchReport(batch_size=2, requests=2, succeeded=True, queue_ns=0,
                                 request_ns=0, compute_input_ns=0, compute_infer_ns=0,
                                 compute_output_ns=0, finished_ms=1,
                                 enqueued_ns=(0, 9_000_000), started_ns=9_000_000,
                                 ended_ns=12_000_000))
    first = acc.snapshot().first_response
    assert first is not None
    assert (first.bounds, first.counts, first.count) == ((1.0, 10.0), (0, 1), 2)
    assert first.sum_ms == pytest.approx(15.0)
    # a failed batch answers with errors: no response counted
    acc.record_batch(_report(1, ok=False))
    assert acc.snapshot().first_response.count == 2  # type: ignore[union-attr]
    # the cache's lookups are summarised per model when summaries are on
    cached = StatsAccumulator(summaries=True)
    cached.record_cache(True, 2_000, 5_000)
    cached.record_cache(False, 4_000, 0)
    summaries = cached.snapshot().summaries
    assert (summaries["cache_hit"].count, summaries["cache_miss"].count) == (1, 1)

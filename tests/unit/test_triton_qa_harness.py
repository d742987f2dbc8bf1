"""scripts/triton_qa (the harness that runs Triton's own qa/ groups against nursery): the
tritonserver stand-in's flag mapping, the prepared tree, and the case recording, on a tiny
qa tree made here (CI has no Triton checkout)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QA = ROOT / "scripts" / "triton_qa"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"triton_qa_{name}", QA / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


standin = _load("standin")
run = _load("run")


def _prepared(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The prepared tree of the fake checkout, and the environment its scripts run in."""
    work = tmp_path / "work"
    run.prepare(_fake_triton(tmp_path), work)
    return work, run.environment(work, work / "r.jsonl", "")


def test_flags_pass_through_unchanged():
    argv = ["--model-repository=/m", "--log-verbose", "1", "--backend-config=python,x=1",
            "--exit-timeout-secs=120", "--http-thread-count=4", "--allow-model-file-upload=0"]
    assert standin.map_flags(argv) == (argv, [])


def test_file_uploads_are_allowed_as_tritons_default_unless_the_flag_is_given():
    out, notes = standin.map_flags(["--model-repository=/m"])
    assert out == ["--model-repository=/m", "--allow-model-file-upload=true"]
    assert "Triton accepts 'file:' load parameters" in notes[0]


def test_allow_client_shm_reaches_nursery_unchanged():
    """nursery takes --allow-client-shm itself (off by default, as Triton 2.68)."""
    for argv in (["--allow-client-shm=true", "--model-repository", "m"],
                 ["--allow-client-shm", "--log-verbose=1"], ["--allow-client-shm=false"]):
        argv = [*argv, "--allow-model-file-upload"]
        assert standin.map_flags(argv) == (argv, [])


def test_python_mode_added_unless_the_command_line_chooses_one():
    out, notes = standin.map_flags(["--model-repository=m"], "process")
    assert out[-1] == "--backend-config=python,nursery-instance-mode=process" and notes
    chosen = ["--backend-config", "python,nursery-instance-mode=thread",
              "--allow-model-file-upload"]
    assert standin.map_flags(chosen, "process") == (chosen, [])


def test_server_env_puts_the_project_first_and_drops_the_recording_hooks():
    hooks = str(QA / "hooks")
    env = standin.server_env({"PYTHONPATH": os.pathsep.join([hooks, "/x"]),
                              "NURSERY_QA_ROOT": "/proj", "NURSERY_QA_RECORD": "/r",
                              "PYTEST_PLUGINS": "nursery_qa_pytest"})
    assert env["PYTHONPATH"] == os.pathsep.join(["/proj", "/x", hooks + "/numpy1"])
    assert "NURSERY_QA_RECORD" not in env and "PYTEST_PLUGINS" not in env


def _fake_triton(tmp_path: Path) -> Path:
    triton = tmp_path / "server"
    (triton / "qa" / "common").mkdir(parents=True)
    (triton / "qa" / "common" / "util.sh").write_text("SERVER_LOG=./server.log\n")
    group = triton / "qa" / "L0_fake"
    group.mkdir()
    (group / "test.sh").write_text(
        "SERVER=/opt/tritonserver/bin/tritonserver\n"
        "test -f $SERVER || exit 3\n"
        "pip3 uninstall -y torch || exit 4\n"
        "git clone https://example.invalid/x && exit 5\n"
        "git clone --depth=1 -b main https://example.invalid/org/lib.git here || exit 6\n"
        "test -f here/README || exit 7\n"
        "git clone https://example.invalid/org/lib -b || exit 8\n"  # an empty tag variable
        "test -f lib/README || exit 9\n"
        "python3 -m unittest fake_test >client.log 2>&1\n"
        "python3 -m pytest -q fake_test.py >>client.log 2>&1\n"
        "MODEL_NAME=m1 python3 -m pytest -q fake_test.py -k test_ok >>client.log 2>&1\n"
        "exit 0\n")
    (group / "fake_test.py").write_text(
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self):\n        pass\n"
        "    def test_bad(self):\n        self.assertEqual(1, 2)\n"
        "    @unittest.skip('no')\n    def test_skip(self):\n        pass\n"
        "    def test_data(self):\n"
        "        self.assertNotIn('/data/inferenceserver', '/data/inferenceserver/x')\n"
        "    def test_sub(self):\n"
        "        for i in range(3):\n"
        "            with self.subTest(i=i):\n                self.assertLess(i, 2)\n")
    return triton


def test_a_group_runs_in_the_prepared_tree_and_its_cases_are_counted(tmp_path):
    triton = _fake_triton(tmp_path)
    work = tmp_path / "work"
    run.prepare(triton, work)
    script = (work / "qa" / "L0_fake" / "test.sh").read_text()
    assert f"SERVER={work}/opt/tritonserver/bin/tritonserver" in script
    assert "SERVER=/opt/tritonserver/" in (triton / "qa" / "L0_fake" / "test.sh").read_text()
    assert os.access(work / "opt" / "tritonserver" / "bin" / "tritonserver", os.X_OK)
    checkouts = tmp_path / "checkouts"
    (checkouts / "lib").mkdir(parents=True)
    (checkouts / "lib" / "README").write_text("a local checkout\n")
    out = run.run_group(work, "L0_fake", "process", timeout=120, netns=False,
                        checkouts=checkouts)
    assert out["exit"] == 0, (work / "results" / "L0_fake.log").read_text()
    outcomes = sorted((c["test"].rsplit(".", 1)[-1].rsplit(":", 1)[-1], c["outcome"])
                      for c in out["cases"])
    # the same five cases, once through unittest and once through pytest; a failing sub-test
    # fails its test and is not a case of its own
    assert outcomes == sorted([("test_ok", "passed"), ("test_bad", "failed"),
                               ("test_skip", "skipped"), ("test_data", "failed"),
                               ("test_sub", "failed")] * 2 + [("test_ok[m1]", "passed")])
    assert out["summary"] == {"run": 9, "passed": 3, "failed": 6, "skipped": 2, "runs": 11}
    saved = json.loads((work / "results" / "L0_fake.json").read_text())
    assert saved["summary"] == out["summary"]
    log = (work / "results" / "L0_fake.log").read_text()
    assert "skipped: pip3 uninstall -y torch" in log and "refused: git clone" in log


def test_the_stand_in_script_runs_nursery_with_the_mapped_flags(tmp_path):
    """The stand-in execs `python -m nursery serve`; `--help` shows it arrived there."""
    work, env = _prepared(tmp_path)
    proc = subprocess.run([str(work / "opt" / "tritonserver" / "bin" / "tritonserver"),
                           "--allow-client-shm=true", "--help"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "python -m nursery serve" in proc.stdout
    assert "nursery-qa: added --backend-directory=" in proc.stderr


def test_a_case_run_several_times_passes_only_if_every_run_passed():
    cases = [{"test": "a", "outcome": "passed"}, {"test": "a", "outcome": "failed"},
             {"test": "a", "outcome": "passed"}, {"test": "b", "outcome": "passed"},
             {"test": "b", "outcome": "passed"}, {"test": "c", "outcome": "skipped"}]
    assert run.summarize(cases) == {"run": 2, "passed": 1, "failed": 1, "skipped": 1, "runs": 6}


def test_shell_checked_groups_count_each_check_of_their_client_log():
    text = ("Test on cli_messages/a\nFound \"x\"\n"
            "Test platform onnx on noautofill_platform/b\nNot found \"y\"\nNot found \"z\"\n"
            "*** FAILED: platform onnx noautofill_platform/b\n"
            "Test autofill_noplatform_success/c\nsome client output\n")
    cases = run.shell_cases(text)
    assert [(c["test"], c["outcome"]) for c in cases] == [
        ("test.sh::on cli_messages/a", "passed"),
        ("test.sh::platform onnx on noautofill_platform/b", "failed"),
        ("test.sh::autofill_noplatform_success/c", "passed"),
    ]
    assert cases[1]["message"].splitlines() == [
        'Not found "y"', 'Not found "z"', "*** FAILED: platform onnx noautofill_platform/b"]
    assert run.summarize(cases)["failed"] == 1


def test_the_densenet_stand_in_has_the_example_models_inputs_and_outputs(tmp_path):
    import numpy as np
    import onnxruntime

    run.standin_densenet(tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    (out,) = session.run(None, {"data_0": np.ones((1, 3, 224, 224), np.float32)})
    assert out.shape == (1, 1000, 1, 1)


def test_stand_in_backends_are_python_based_backends():
    """Each stand-in for one of Triton's C++ test backends is <name>/model.py, the layout of a
    Python-based backend in --backend-directory."""
    backends = sorted(p.name for p in (QA / "backends").iterdir())
    assert backends == ["dyna_sequence", "identity", "iterative_sequence", "repeat", "sequence",
                        "square"]
    assert all((QA / "backends" / b / "model.py").is_file() for b in backends)


def test_the_c_plus_plus_simple_clients_are_the_python_examples_and_shebangs_are_fixed(
        tmp_path):
    """L0_trace runs ../clients/simple_http_infer_client (a C++ program of Triton's SDK) under
    set -e, and ../common/trace_summary.py by its #!/usr/bin/python line."""
    triton = _fake_triton(tmp_path)
    (triton / "qa" / "common" / "trace_summary.py").write_text(
        "#!/usr/bin/python\nprint('summary')\n")
    examples = tmp_path / "checkouts" / "client" / "src" / "python" / "examples"
    examples.mkdir(parents=True)
    for name in ("simple_http_infer_client", "simple_grpc_infer_client"):
        (examples / f"{name}.py").write_text(
            f"import sys\nprint('{name}', sys.argv[1:])\n")
    work = tmp_path / "work"
    run.prepare(triton, work, tmp_path / "checkouts")
    summary = work / "qa" / "common" / "trace_summary.py"
    assert summary.read_text().startswith("#!/usr/bin/env python3\n")
    for name in ("simple_http_infer_client", "simple_grpc_infer_client"):
        out = subprocess.run([str(work / "qa" / "clients" / name), "-v", "-u", "h:1"],
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == f"{name} ['-v', '-u', 'h:1']"


def test_cases_recorded_after_the_groups_time_ran_out_are_dropped(tmp_path):
    triton = _fake_triton(tmp_path)
    (triton / "qa" / "L0_fake" / "test.sh").write_text(
        "python3 -m unittest fake_test.T.test_ok >client.log 2>&1\n"
        "sleep 30\n")
    work = tmp_path / "work"
    run.prepare(triton, work)
    out = run.run_group(work, "L0_fake", "process", timeout=8, netns=False)
    assert out["timed_out"] and out["dropped_after_timeout"] == 0
    assert out["summary"]["passed"] == 1  # recorded in time: kept


def test_tritons_default_backend_directory_is_the_trees_unless_one_is_given():
    out, notes = standin.map_flags(["--model-repository=m", "--allow-model-file-upload"],
                                   backend_dir="/t/backends")
    assert out == ["--model-repository=m", "--allow-model-file-upload",
                   "--backend-directory=/t/backends"]
    assert "Triton's default backend directory" in notes[0]
    argv = ["--backend-directory", "/x", "--model-repository=m", "--allow-model-file-upload"]
    assert standin.map_flags(argv, backend_dir="/t/backends") == (argv, [])


def test_go_install_of_the_health_probe_gets_the_stand_in(tmp_path):
    """L0_grpc's `go install .../grpc-health-probe@latest`: the shim writes the harness's
    probe to $GOPATH/bin, which answers like the Go tool when nothing listens."""
    work, env = _prepared(tmp_path)
    proc = subprocess.run(
        ["bash", "-c", "go install github.com/grpc-ecosystem/grpc-health-probe@latest && "
                       "$GOPATH/bin/grpc-health-probe -addr=127.0.0.1:9; echo rc=$?; "
                       "go build x; echo rc=$?"],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == [
        'timeout: failed to connect service "127.0.0.1:9" within 1s', "rc=2", "rc=1"]


def test_cp_of_a_model_that_cannot_be_generated_here_is_skipped(tmp_path):
    """A script's `cp` (under `set -e`) of a TensorRT / OpenVINO / TensorFlow model from data/
    is skipped with a log line, the other sources are copied, and any other missing source
    still fails as cp fails."""
    work, env = _prepared(tmp_path)
    data = work / "data" / "inferenceserver" / "nursery" / "qa_model_repository"
    (data / "onnx_int32").mkdir(parents=True)
    (data / "onnx_int32" / "config.pbtxt").write_text("x")
    out = tmp_path / "models"
    out.mkdir()
    proc = subprocess.run(
        ["bash", "-c", f"set -e; cp -r {data}/plan_int32 {data}/onnx_int32 {out}/.; "
                       f"cp -r {data}/openvino_int32 {data}/simple_plan_int32 {out}/.; "
                       "echo copied; "
                       f"cp -r {data}/onnx_missing {out}/. || echo refused"],
        env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == ["copied", "refused"]
    assert (out / "onnx_int32" / "config.pbtxt").read_text() == "x"
    assert sorted(p.name for p in out.iterdir()) == ["onnx_int32"]
    assert proc.stderr.count("nursery-qa: skipped: cp") == 3


def test_clients_see_the_version_the_server_reports(tmp_path):
    """Triton's image sets TRITON_SERVER_VERSION; L0_lifecycle compares metadata with it."""
    from nursery.runtime.about import VERSION

    assert run.environment(tmp_path, tmp_path / "r", "")["TRITON_SERVER_VERSION"] == VERSION


def _client_python(tmp_path, code: str, **env: str) -> subprocess.CompletedProcess:
    """A Python started as the harness starts Triton's clients (its hooks on PYTHONPATH)."""
    return subprocess.run(
        ["python", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(QA / "hooks"), "NURSERY_QA_RECORD": "", **env})


def test_a_pytest_case_that_waits_for_ever_fails_at_the_case_limit(tmp_path):
    """A client waiting on a queue for an answer that never comes fails at --case-limit, and
    the cases after it run."""
    # the case's clean-up waits too, on a thread that never ends (as a gRPC client's close()
    # joins a stream reader the server never releases): interrupted as well, and the
    # process still exits
    (tmp_path / "test_wait.py").write_text(
        "import queue, threading\n\n"
        "def test_waits():\n"
        "    reader = threading.Thread(target=queue.Queue().get)\n"
        "    reader.start()\n"
        "    try:\n        queue.Queue().get()\n    finally:\n        reader.join()\n\n"
        "def test_after():\n    pass\n")
    record = tmp_path / "cases.jsonl"
    done = _client_python(tmp_path, "import pytest, sys; sys.exit(pytest.main(["
                          "'-q', '-p', 'no:cacheprovider', 'test_wait.py']))",
                          PYTEST_PLUGINS="nursery_qa_pytest", NURSERY_QA_CASE_LIMIT="1",
                          NURSERY_QA_CASE_RETRY="0.5",
                          NURSERY_QA_RECORD=str(record))
    assert done.returncode == 1, done.stdout + done.stderr
    cases = {c["test"]: c for c in map(json.loads, record.read_text().splitlines())}
    assert cases["test_wait.py::test_after"]["outcome"] == "passed"
    waited = cases["test_wait.py::test_waits"]
    assert waited["outcome"] == "failed" and "--case-limit" in waited["message"]


def test_clients_get_what_tritons_container_gives_them(tmp_path):
    """np.NINF (NumPy 1, as Triton's container pins) and pkg_resources.resource_filename
    (tritonclient's shared-memory module finds libcshm.so with it), for the clients only."""
    done = _client_python(tmp_path, (
        "import numpy as np, pkg_resources, pathlib\n"
        "assert np.NINF == -np.inf\n"
        "p = pathlib.Path(pkg_resources.resource_filename('json', 'decoder.py'))\n"
        "assert p.is_file(), p\n"))
    assert done.returncode == 0, done.stderr
    # the server gets the NumPy alias (Triton's Python models use it too), not the rest
    server = _client_python(tmp_path, (
        "import numpy as np, importlib.util\n"
        "assert np.NINF == -np.inf\n"
        "assert importlib.util.find_spec('pkg_resources') is None or "
        "importlib.util.find_spec('pkg_resources').origin\n"
        "import sys; assert 'client_env' not in sys.modules\n"),
        PYTHONPATH=standin.server_env({"PYTHONPATH": str(QA / "hooks")})["PYTHONPATH"])
    assert server.returncode == 0, server.stderr


def test_ensembles_over_models_not_generated_here_are_pruned(tmp_path):
    """The generators write ensembles for every platform; those over TensorRT, OpenVINO or
    TensorFlow models name steps that are never generated here, and go."""
    root = tmp_path / "qa_ensemble_model_repository" / "qa_variable_model_repository"
    names = ["simple_plan_int32_int32_int32", "fan_openvino_nobatch_int8_int8_int8",
             "sequence_graphdef_float32", "simple_onnx_int32_int32_int32",
             "fan_libtorch_nobatch_float32", "nop_TYPE_INT32_-1", "simple_planner_x"]
    for name in names:
        (root / name).mkdir(parents=True)
    removed = run.prune_ensembles(tmp_path)
    assert sorted(p.name for p in removed) == sorted(names[:3])
    assert sorted(p.name for p in root.iterdir()) == sorted(names[3:])


def test_the_collector_download_gets_the_stand_in_collector(tmp_path):
    """L0_trace's `curl -fOL .../otelcol_0.91.0_linux_amd64.tar.gz; tar -xvf ...` unpacks the
    harness's stand-in `otelcol`, which takes OTLP/HTTP from the OpenTelemetry SDK's own
    exporter and writes the file exporter's JSON lines: one per batch (`send_batch_size`
    spans, or what is held when SIGTERM comes); other curl commands run as they are."""
    import signal
    import socket
    import time

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    work, env = _prepared(tmp_path)
    here = tmp_path / "group"
    here.mkdir()
    url = ("https://github.com/open-telemetry/opentelemetry-collector-releases/releases/"
           "download/v0.91.0/otelcol_0.91.0_linux_amd64.tar.gz")
    proc = subprocess.run(
        ["bash", "-c", f"set -e; curl --proto '=https' --tlsv1.2 -fOL {url}; "
                       "tar -xvf otelcol_0.91.0_linux_amd64.tar.gz; "
                       "curl -s -o /dev/null http://127.0.0.1:9/ || echo curl=$?"],
        cwd=here, env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == ["otelcol", "curl=7"], proc.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (here / "trace-config.yaml").write_text(
        "receivers:\n  otlp:\n    protocols:\n      http:\n"
        f"        endpoint: 0.0.0.0:{port}\n"
        "processors:\n  batch:\n    send_batch_size: 10\n    timeout: 10s\n"
        "exporters:\n  file:\n    path: ./collected_traces.json\n"
        "service:\n  pipelines:\n    traces:\n"
        "      receivers: [otlp]\n      processors: [batch]\n      exporters: [file]\n")
    log = here / "collector.log"
    with open(log, "w") as err:
        collector = subprocess.Popen(["./otelcol", "--config", "./trace-config.yaml"],
                                     cwd=here, env=env, stderr=err)
    out = here / "collected_traces.json"
    try:
        deadline = time.monotonic() + 30
        while "Everything is ready" not in log.read_text():
            assert collector.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert out.read_text() == ""  # created (truncated) at start, as the file exporter
        provider = TracerProvider(resource=Resource.create({"service.name": "test_triton"}))
        provider.add_span_processor(SimpleSpanProcessor(  # one export per span
            OTLPSpanExporter(endpoint=f"http://localhost:{port}/v1/traces")))
        tracer = provider.get_tracer("t")
        for _ in range(4):  # 12 spans: a batch of 10 goes out, 2 are held
            with tracer.start_as_current_span("InferRequest") as top:
                top.add_event("HTTP_RECV_START", {"n": 1})
                with tracer.start_as_current_span("simple"), \
                        tracer.start_as_current_span("compute"):
                    pass
        provider.shutdown()
        lines = out.read_text().splitlines()
        assert len(lines) == 1
        assert '"name":"InferRequest"' in lines[0]  # compact, as L0_trace greps it
        batch = json.loads(lines[0])
        resource = batch["resourceSpans"][0]["resource"]["attributes"]
        assert {"key": "service.name", "value": {"stringValue": "test_triton"}} in resource
        spans = [s for rs in batch["resourceSpans"] for ss in rs["scopeSpans"]
                 for s in ss["spans"]]
        assert len(spans) == 10
        for s in spans:
            assert len(s["traceId"]) == 32 and len(s["spanId"]) == 16
            if s["name"] == "InferRequest":
                assert s["parentSpanId"] == ""
                assert s["events"][0]["name"] == "HTTP_RECV_START"
            else:
                assert len(s["parentSpanId"]) == 16
        collector.send_signal(signal.SIGTERM)  # the batch processor sends what it holds
        assert collector.wait(timeout=30) == 0
        lines = out.read_text().splitlines()
        assert len(lines) == 2
        assert sum(len(ss["spans"]) for rs in json.loads(lines[1])["resourceSpans"]
                   for ss in rs["scopeSpans"]) == 2
    finally:
        if collector.poll() is None:
            collector.kill()
            collector.wait()


def test_the_generators_find_openvino_runtime() -> None:
    """Triton's gen_qa_models.py imports ``openvino.runtime`` (removed in OpenVINO 2025+): the
    harness's sitecustomize answers it with ``openvino``'s own API, leaving ``openvino`` as
    it is."""
    code = ("import openvino.runtime as ov, openvino\n"
            "assert ov.Model is openvino.Model and ov.opset1.add is openvino.opset1.add\n"
            "assert openvino.__name__ == 'openvino'\n"
            "print('ok')")
    env = {**os.environ, "PYTHONPATH": str(QA / "hooks")}
    env.pop("NURSERY_QA_RECORD", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_model_config_cases_are_rechecked_as_a_machine_without_gpus(tmp_path, capsys):
    compare = _load("model_config_cpu_compare")
    group = tmp_path / "L0_model_config"
    served = ('config {\n  name: "m"\n  instance_group {\n    name: "m"\n    count: 1\n'
              '    kind: KIND_CPU\n  }\n  backend: "python"\n}\n')
    for case, count in (("gpu_only", 1), ("differs", 4)):
        folder = group / "autofill_noplatform_success" / "python" / case
        folder.mkdir(parents=True)
        (folder / "expected").write_text(
            f'name: "m"\ninstance_group {{\n  name: "m"\n  count: {count}\n  gpus: 0\n'
            '  kind: KIND_GPU\n}\nbackend: "python"\nruntime: ""\n')
    log = "".join(f"Test autofill_noplatform_success/python/{case}\n"
                  "Model config doesn't match any expected output:\nModel config:\n"
                  f"{served}\nNon-matching:\nname: \"m\"\n\n{compare.FAILED}\n"
                  for case in ("gpu_only", "differs"))
    (group / "client.log").write_text("Test autofill_noplatform_success/python/passing\n" + log)
    assert compare.main([str(group)]) == 0
    out = capsys.readouterr().out
    assert "MATCH autofill_noplatform_success/python/gpu_only" in out
    assert "DIFF  autofill_noplatform_success/python/differs" in out and "'count': 4" in out
    assert "1 of 2 match as a machine without GPUs" in out


def test_sed_over_a_model_that_cannot_be_generated_here_is_skipped(tmp_path):
    """L0_lifecycle's `sed` (under `set -e`) over a TensorRT model's files from data/: the
    missing file is skipped with a log line, a plain sed then writes nothing, `sed -i` does
    nothing; a script naming such a model is still a script, and any other missing file
    still fails as sed fails."""
    work, env = _prepared(tmp_path)
    data = work / "data" / "inferenceserver" / "nursery" / "qa_model_repository"
    (data / "onnx_int32").mkdir(parents=True)
    (data / "onnx_int32" / "config.pbtxt").write_text("name: plan_int32\n")
    proc = subprocess.run(
        ["bash", "-c",
         f"set -e; cd {tmp_path}; sed '/^version_policy/d' {data}/plan_int32/config.pbtxt > a; "
         f"sed -i 's/x/y/' models/plan_int32/config.pbtxt; "
         f"sed 's/plan_int32/simple_int32/' {data}/onnx_int32/config.pbtxt > b; "
         f"sed -e 's/name/n/' {data}/plan_int32/config.pbtxt {data}/onnx_int32/config.pbtxt > c; "
         f"echo edited; sed 's/a/b/' {data}/onnx_missing/config.pbtxt || echo refused"],
        env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == ["edited", "refused"]
    assert (tmp_path / "a").read_text() == ""
    assert (tmp_path / "b").read_text() == "name: simple_int32\n"
    assert (tmp_path / "c").read_text() == "n: plan_int32\n"
    assert proc.stderr.count("nursery-qa: skipped: sed") == 3


def test_a_sectioned_script_runs_each_section_whatever_the_one_before_did(tmp_path):
    """L0_lifecycle's way: a section that fails (`set -e`, its own `exit 1`, a server left
    running) ends itself only; the next sections run with the header's variables, the log
    index runs on, and the script's status says that one failed."""
    marker = "LOG_IDX=$((LOG_IDX+1))"
    script = "\n".join([
        "set -e", "RET=0", "LOG_IDX=0", "echo header",
        marker, "", "echo one $LOG_IDX", "false", "echo not reached",
        marker, "", "echo two $LOG_IDX", "sleep 300 &", "SERVER_PID=$!", "exit 1",
        marker, "", "  " + marker, "echo three $LOG_IDX", marker, "echo three $LOG_IDX",
        "RET=1",
        # a job that ended with an error is no failure of the section
        marker, "", "echo four $LOG_IDX", "(exit 3) &", "sleep 0.5",
        "if [ $RET -eq 0 ]; then echo fine; fi", "exit $RET", ""])
    text = run.sectioned(script, marker)
    path = tmp_path / "s.sh"
    path.write_text(text)
    started = time.monotonic()
    proc = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30  # the section's sleeping "server" was stopped
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("nursery-qa")]
    # an indented marker, and one followed by more commands, are the section's own (not
    # splits): section three counts them
    assert lines == ["header", "one 1", "two 2", "three 4", "three 5", "four 4", "fine"]
    assert proc.stdout.count("nursery-qa: section") == 3  # one, two, three
    assert proc.returncode == 1
    assert run.sectioned("echo x\n", marker) == "echo x\n"


def test_the_minio_download_gets_a_stand_in_s3_server(tmp_path):
    """L0_storage_S3_local's `wget .../minio`, `curl -O .../minio.service` and `awslocal`: the
    stand-in serves S3 on the address the script gives it (buckets made and filled with the
    AWS CLI) to requests signed with MinIO's credentials only, and any other wget is
    refused."""
    import socket

    work, env = _prepared(tmp_path)
    env.update(AWS_ACCESS_KEY_ID="minio", AWS_SECRET_ACCESS_KEY="miniostorage",
               MINIO_ACCESS_KEY="minio", MINIO_SECRET_KEY="miniostorage")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.pbtxt").write_text("name: \"m\"\n")
    endpoint = f"--endpoint-url=http://127.0.0.1:{port}"
    script = (
        "set -e; wget https://dl.min.io/server/minio/release/linux-amd64/minio; chmod +x minio; "
        "curl -O https://raw.githubusercontent.com/minio/minio-service/master/linux-systemd/"
        "minio.service; test -s minio.service; "
        f"./minio server -C conf --address 127.0.0.1:{port} vol & pid=$!; "
        f"for i in $(seq 50); do awslocal {endpoint} s3 ls >/dev/null 2>&1 && break; "
        "sleep 0.2; done; "
        f"awslocal {endpoint} s3 mb s3://demo-bucket1.0 && "
        f"awslocal {endpoint} s3 sync models s3://demo-bucket1.0 >/dev/null; "
        f"awslocal {endpoint} s3 ls s3://demo-bucket1.0/m/; "
        f"AWS_SECRET_ACCESS_KEY=wrong awslocal {endpoint} s3 ls s3://demo-bucket1.0/m/ "
        "2>/dev/null || echo denied; kill $pid; wait $pid; "
        "wget https://example.invalid/x || echo refused")
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-3:] == ["config.pbtxt", "denied", "refused"], proc.stdout
    assert "nursery-qa: refused: wget" in proc.stderr


def test_the_stand_in_s3_server_accepts_the_temporary_credentials_its_sts_issued(tmp_path):
    """L0_storage_S3's temporary-credential run (`aws sts get-session-token`, then requests
    signed with what it issued and its session token) and its access-decline run (the issued
    key with a wrong secret): served, then refused with 403, as by AWS."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MINIO_ACCESS_KEY": "k", "MINIO_SECRET_KEY": "secret-k",
           "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "secret-k",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
           "HOME": str(tmp_path)}
    server = subprocess.Popen([sys.executable, str(run.HERE / "tools" / "minio.py"), "server",
                               "--address", f"127.0.0.1:{port}"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def aws(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "awscli", *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=60)
    try:
        for _ in range(100):
            if aws("s3", "mb", "s3://bucket-one").returncode == 0:
                break
            time.sleep(0.2)
        issued = json.loads(aws("sts", "get-session-token").stdout)["Credentials"]
        temporary = {"AWS_ACCESS_KEY_ID": issued["AccessKeyId"],
                     "AWS_SECRET_ACCESS_KEY": issued["SecretAccessKey"],
                     "AWS_SESSION_TOKEN": issued["SessionToken"]}
        assert aws("s3", "ls", "s3://bucket-one", **temporary).returncode == 0
        declined = aws("s3", "ls", "s3://bucket-one", **{**temporary, "AWS_SESSION_TOKEN": "",
                                                        "AWS_SECRET_ACCESS_KEY": "[Invalid]"})
        assert declined.returncode != 0 and "SignatureDoesNotMatch" in declined.stderr
    finally:
        server.terminate()
        server.wait(10)


def test_private_folders_are_overlays_under_the_work_folder(tmp_path):
    commands = run.overlay_mounts(tmp_path, "L0_storage_S3_local")
    assert commands.count("mount -t overlay") == len(run.PRIVATE_DIRS["L0_storage_S3_local"])
    assert "lowerdir=/etc," in commands and f"upperdir={tmp_path}/overlays/" in commands
    assert (tmp_path / "overlays" / "L0_storage_S3_local" / "0" / "upper").is_dir()
    assert run.overlay_mounts(tmp_path, "L0_http") == ""


def test_shared_memory_variants_are_copies_with_their_variable(tmp_path):
    """Dockerfile.QA's L0_batcher_shm and the like: the group copied under the second name,
    run with TEST_SYSTEM_SHARED_MEMORY=1 beside the group's own variables."""
    triton = _fake_triton(tmp_path)
    (triton / "qa" / "L0_batcher").mkdir()
    (triton / "qa" / "L0_batcher" / "test.sh").write_text("exit 0\n")
    work = tmp_path / "work"
    run.prepare(triton, work)
    assert (work / "qa" / "L0_batcher_shm" / "test.sh").read_text() == "exit 0\n"
    assert not (work / "qa" / "L0_infer_shm").exists()  # no L0_infer in this checkout
    assert run.GROUP_ENV["L0_batcher_shm"] == {**run.GROUP_ENV["L0_batcher"],
                                                "TEST_SYSTEM_SHARED_MEMORY": "1"}


def test_a_sectioned_script_can_run_only_the_sections_naming_a_case():
    marker = "LOG_IDX=$((LOG_IDX+1))"
    script = "\n".join(["RET=0", "LOG_IDX=0", marker, "", "echo one $LOG_IDX", marker, "",
                        "echo two test_x $LOG_IDX", ""])
    proc = subprocess.run(["bash", "-c", run.sectioned(script, marker, ["test_x"])],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n")[:1] == ["two test_x 2"], proc.stdout

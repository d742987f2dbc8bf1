"""The deployment kit, checked without a cluster: the chart's committed renders are what Helm
renders now, the built-in kinds pass kubernetes-validate (strict), the custom resources
(KServe's runtimes and InferenceService, the ServiceMonitor) pass their CRDs' schemas kept in
deploy/schemas/ (strict: unknown fields refused, as `kubectl apply --validate=strict`), the
values' schema refuses values that name no model repository, and the `tritonserver` command
line of KServe's runtime parses as Triton's."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_python.chart import Chart
from helm_python.errors import HelmValuesError

from nursery.settings import settings_from_args
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "nursery"
RENDERS = sorted((DEPLOY / "rendered").glob("*.yaml"))
KSERVE = sorted((DEPLOY / "kserve").glob("*.yaml"))
# the oldest Kubernetes kubernetes-validate knows (the chart says >= 1.23) and a current one
KUBERNETES = ["1.25.0", "1.33.0"]


def _load_render_script() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_chart",
                                                  ROOT / "scripts" / "render_chart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _strict(schema: Any) -> Any:
    """A CRD's structural schema with unknown fields refused where the API server's strict
    field validation refuses them (objects with properties, not marked to keep unknown
    fields)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in (DEPLOY / "schemas").glob("*.json"):
        doc = json.loads(path.read_text())
        out[(doc["apiVersion"], doc["kind"])] = _strict(doc["schema"])
    return out


CRDS = _crd_schemas()


def _validate_custom(doc: dict[str, Any]) -> None:
    schema = CRDS[(doc["apiVersion"], doc["kind"])]
    jsonschema.validate(doc, schema, cls=jsonschema.Draft7Validator)


def test_the_committed_renders_are_what_helm_renders_now() -> None:
    assert [p.name for p in RENDERS] == ["default.yaml", "s3.yaml"]
    assert _load_render_script().main(["--check"]) == 0


@pytest.mark.parametrize("path", RENDERS, ids=lambda p: p.name)
def test_renders_validate(path: Path) -> None:
    kinds = []
    for doc in _docs(path):
        kinds.append(doc["kind"])
        if (doc["apiVersion"], doc["kind"]) in CRDS:
            _validate_custom(doc)
            continue
        for version in KUBERNETES:
            kubernetes_validate.validate(doc, version, strict=True)
    assert {"Deployment", "Service", "ServiceAccount", "HorizontalPodAutoscaler",
            "ServiceMonitor"} <= set(kinds)


def test_strict_validation_refuses_an_unknown_field() -> None:
    """The checks above would notice a typo: kubernetes-validate strict and the strict CRD
    schemas both refuse a field the API does not have."""
    docs = {d["kind"]: d for d in _docs(DEPLOY / "rendered" / "default.yaml")}
    deployment = copy.deepcopy(docs["Deployment"])
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES[-1], strict=True)
    monitor = copy.deepcopy(docs["ServiceMonitor"])
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        _validate_custom(monitor)
    runtime = _docs(DEPLOY / "kserve" / "servingruntime.yaml")[0]
    runtime["spec"]["supportedModelFormat"] = runtime["spec"].pop("supportedModelFormats")
    with pytest.raises(jsonschema.ValidationError):
        _validate_custom(runtime)


def test_the_deployment_is_what_kubernetes_and_triton_users_expect() -> None:
    for path in RENDERS:
        docs = {d["kind"]: d for d in _docs(path)}
        pod = docs["Deployment"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["args"][0] == "tritonserver"
        assert [p["containerPort"] for p in container["ports"]] == [8000, 8001, 8002]
        assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
        assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert pod["securityContext"]["runAsUser"] == 1000
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        settings = settings_from_args(container["args"][1:], raise_errors=True)
        assert settings.model_repositories
        hpa = docs["HorizontalPodAutoscaler"]["spec"]
        assert hpa["metrics"][0]["pods"]["metric"]["name"] == "avg_time_queue_us"
    s3 = {d["kind"]: d for d in _docs(DEPLOY / "rendered" / "s3.yaml")}
    container = s3["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "--model-repository=s3://models-bucket/triton" in container["args"]
    assert container["envFrom"] == [{"secretRef": {"name": "nursery-s3-credentials"}}]
    rules = yaml.safe_load(s3["ConfigMap"]["data"]["config.yaml"])["rules"]
    assert rules[0]["name"]["as"] == "avg_time_queue_us"
    assert "nv_inference_queue_duration_us" in rules[0]["metricsQuery"]
    assert "nv_inference_request_success" in rules[0]["metricsQuery"]


def test_values_that_name_no_model_repository_are_refused() -> None:
    chart = Chart.load(CHART)
    chart.validate_schema(None)  # the defaults name a volume
    chart.validate_schema({"modelRepository": {"url": "s3://b/p", "volume": None}})
    chart.validate_schema({"modelRepository": {"volume": None},
                           "serverArgs": ["--model-store=/mnt/models"]})
    # (None deletes a default in Helm's merge; {} would be merged with it)
    for values in ({"modelRepository": {"volume": None}},
                   {"modelRepository": {"volume": None, "url": ""},
                    "serverArgs": ["--log-verbose=1"]}):
        with pytest.raises(HelmValuesError, match="anyOf"):
            chart.validate_schema(values)
    with pytest.raises(HelmValuesError, match="url"):
        chart.validate_schema({"modelRepository": {"url": "/not/a/bucket"}})
    with pytest.raises(HelmValuesError):
        chart.validate_schema({"imagee": {}})  # a typo is refused too


@pytest.mark.parametrize("path", KSERVE, ids=lambda p: p.name)
def test_kserve_manifests_validate_against_kserves_crds(path: Path) -> None:
    for doc in _docs(path):
        _validate_custom(doc)


def test_the_runtimes_serve_triton_and_onnx_on_v2_and_grpc_v2() -> None:
    for name in ("servingruntime.yaml", "clusterservingruntime.yaml"):
        (runtime,) = _docs(DEPLOY / "kserve" / name)
        spec = runtime["spec"]
        assert {f["name"] for f in spec["supportedModelFormats"]} == {"triton", "onnx"}
        assert spec["protocolVersions"] == ["v2", "grpc-v2"]
        (container,) = spec["containers"]
        settings = settings_from_args(container["args"][1:], raise_errors=True)
        assert (settings.http_port, settings.grpc_port) == (8080, 9000)
        assert str(settings.model_repositories[0]) == "/mnt/models"
    (isvc,) = _docs(DEPLOY / "kserve" / "inferenceservice.yaml")
    assert isvc["spec"]["predictor"]["model"]["runtime"] == "nursery"


# KServe's kserve-tritonserver ClusterServingRuntime (config/runtimes/kserve-tritonserver.yaml)
# and Triton's k8s-onprem chart give the server these command lines
KSERVE_ARGS = ["--model-store=/mnt/models", "--grpc-port=9000", "--http-port=8080",
               "--allow-grpc=true", "--allow-http=true"]


def test_kserves_and_tritons_spellings_parse() -> None:
    s = settings_from_args(KSERVE_ARGS, prog="tritonserver", raise_errors=True)
    assert [str(r) for r in s.model_repositories] == ["/mnt/models"]
    assert (s.grpc_port, s.http_port, s.metrics_port) == (9000, 8080, 8002)
    assert s.allow_grpc and s.allow_http and s.allow_metrics
    s = settings_from_args(["--model-repository=/models", "--allow-grpc", "false",
                            "--allow-http=false", "--allow-metrics=false"], raise_errors=True)
    assert not (s.allow_grpc or s.allow_http or s.allow_metrics)
    s = settings_from_args(["--model-store", "/a", "--model-repository", "/b"],
                           raise_errors=True)
    assert [str(r) for r in s.model_repositories] == ["/a", "/b"]


def test_the_tritonserver_command_is_installed_beside_nursery() -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tritonserver"] == "nursery.__main__:tritonserver"
    assert scripts["nursery"] == "nursery.__main__:main"


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the final stage of deploy/Dockerfile, continuation lines
    joined (enough to read back the facts below; the image itself is not built here)."""
    lines, current = [], ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        current += raw.rstrip("\\").strip() + " "
        if not raw.endswith("\\"):
            lines.append(current.strip())
            current = ""
    stages: list[list[tuple[str, str]]] = []
    for line in lines:
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), args.strip()))
    return stages[-1]


def test_the_image_runs_tritonserver_as_pid_1_and_uid_1000() -> None:
    final = _dockerfile_instructions()
    by = {}
    for instruction, args in final:
        by.setdefault(instruction, []).append(args)
    assert by["USER"] == ["1000:1000"]
    assert json.loads(by["CMD"][-1])[0] == "tritonserver"  # exec form: no shell, PID 1
    assert "ENTRYPOINT" not in by  # KServe's and the chart's args replace CMD whole
    assert by["STOPSIGNAL"] == ["SIGTERM"]
    assert by["EXPOSE"] == ["8000 8001 8002"]
    assert any("useradd --uid 1000" in run for run in by["RUN"])


@pytest.mark.parametrize("values_file", [None, DEPLOY / "helm" / "examples" / "s3-values.yaml"],
                         ids=["default", "s3"])
def test_helm_lint_strict_finds_nothing(values_file: Path | None) -> None:
    from helm_python.chart import lint

    values = yaml.safe_load(values_file.read_text()) if values_file else None
    report = lint(CHART, values, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # only "icon is recommended"

"""Model repositories in buckets, end to end: ``python -m nursery serve`` reads s3://, gs://
and as:// roots on real local storage servers (moto, gcp-storage-emulator, Azurite) and
tritonclient infers; poll mode follows the bucket by its listing; a bad root or a bad object
costs its own model, never the server."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import cloud_servers
from tests.cloud_servers import Cloud
from tests.conftest import ROOT, ServerProcess, make_models

pytestmark = pytest.mark.e2e


def _wait(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def _infer_add_sub(client: httpclient.InferenceServerClient, model: str = "add_sub"
                   ) -> httpclient.InferResult:
    a = np.full((1, 16), 3.0, np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
              httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    return result


def _use(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in cloud.env.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def s3_port() -> Iterator[int]:
    with cloud_servers.moto_server() as port:
        yield port


class _Requests(logging.Handler):
    """What moto's server was asked (werkzeug's request log, in this process)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_s3_serves_and_poll_follows_the_bucket(s3_port: int, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               start_server: type[ServerProcess]) -> None:
    cloud = cloud_servers.s3_cloud(s3_port)
    _use(cloud, monkeypatch)
    local = tmp_path / "local"
    make_models.write_add_sub(local)
    cloud.put(local)
    server = start_server(cloud.url, "--model-control-mode=poll",
                          "--repository-poll-secs=1")
    http = httpclient.InferenceServerClient(server.url)
    assert _infer_add_sub(http).get_response()["model_version"] == "1"
    # a new version uploaded to the bucket: loaded, and the latest policy retires version 1
    cloud.put_bytes("add_sub/2/model.onnx", (local / "add_sub" / "1" / "model.onnx").read_bytes())
    _wait(lambda: http.is_model_ready("add_sub", "2") and not http.is_model_ready("add_sub", "1"))
    assert _infer_add_sub(http).get_response()["model_version"] == "2"
    # a changed configuration (the same size would do: the ETag changes)
    config = (local / "add_sub" / "config.pbtxt").read_text()
    cloud.put_bytes("add_sub/config.pbtxt",
                    config.replace("max_batch_size: 8", "max_batch_size: 3").encode())
    _wait(lambda: http.get_model_config("add_sub")["max_batch_size"] == 3)
    # a model added, then removed
    make_models.write_mlp(tmp_path / "more")
    cloud.put(tmp_path / "more")
    _wait(lambda: http.is_model_ready("mlp"))
    for key in cloud.keys():
        if key.startswith("mlp/"):
            cloud.delete(key)
    _wait(lambda: not http.is_model_ready("mlp"))
    assert http.is_model_ready("add_sub")


def test_gcs_azure_and_local_roots_in_explicit_mode(s3_port: int, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    start_server: type[ServerProcess]) -> None:
    local = tmp_path / "local"
    make_models.write_mlp(local)
    with cloud_servers.gcs() as gcs, cloud_servers.azure(tmp_path / "azurite") as azure:
        staged = tmp_path / "staged"
        make_models.write_add_sub(staged, name="add_sub_gs")
        make_models.write_add_sub(staged, name="add_sub_as")
        gcs.put(staged / "add_sub_gs", "add_sub_gs")
        azure.put(staged / "add_sub_as", "add_sub_as")
        _use(gcs, monkeypatch)
        _use(azure, monkeypatch)
        server = start_server([local, gcs.url, azure.url],
                              "--model-control-mode=explicit")
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        assert [m["name"] for m in http.get_model_repository_index()] == [
            "add_sub_as", "add_sub_gs", "mlp"]
        http.load_model("add_sub_gs")
        grpc.load_model("add_sub_as")
        http.load_model("mlp")
        _infer_add_sub(http, "add_sub_gs")
        _infer_add_sub(http, "add_sub_as")
        assert http.is_model_ready("mlp")
        # loading again without a change fetches and restarts nothing; unload works
        http.load_model("add_sub_gs")
        http.unload_model("add_sub_as")
        _wait(lambda: not http.is_model_ready("add_sub_as"))
        _infer_add_sub(http, "add_sub_gs")


def test_bad_roots_and_bad_objects_cost_only_their_models(
        s3_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        start_server: type[ServerProcess]) -> None:
    cloud = cloud_servers.s3_cloud(s3_port)
    _use(cloud, monkeypatch)
    staged = tmp_path / "staged"
    make_models.write_add_sub(staged)
    make_models.write_add_sub(staged, name="evil")
    cloud.put(staged)
    cloud.put_bytes("evil//etc/passwd", b"root:x:0:0")  # a key that is not a relative path
    missing = cloud.url.replace("/nursery-", "/missing-")
    local = tmp_path / "local"
    make_models.write_mlp(local)
    server = start_server([local, cloud.url, missing, "s3://"],
                          "--model-control-mode=poll", "--repository-poll-secs=1",
                          "--exit-on-error=false", "--strict-readiness=false", wait=False)
    server.wait_ready(path="/v2/models/mlp/ready")
    http = httpclient.InferenceServerClient(server.url)
    # unreadable roots: not live, not ready, as Triton's server that failed to initialize
    assert not http.is_server_live() and not http.is_server_ready()
    _infer_add_sub(http)
    assert http.is_model_ready("mlp")
    assert not http.is_model_ready("evil")
    log = server.log()
    # Triton's check of the bucket first (a HEAD: no body, the status kept)
    assert (f"failed to poll model repository '{missing}': Unable to create S3 filesystem "
            "client. Check account credentials. Exception: '' Message: 'No response body.' "
            "(HTTP 404 Not Found)") in log
    assert "failed to poll model repository 's3://': malformed URL: no bucket name" in log
    assert f"object '{cloud.url}/evil//etc/passwd' is not a plain path" in log
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert "not a plain path inside the model folder" in index["evil"]["reason"]
    # the bad key removed: a later poll loads the model
    cloud.delete("evil//etc/passwd")
    _wait(lambda: http.is_model_ready("evil"))
    _infer_add_sub(http, "evil")


def test_malformed_root_fails_the_start_with_exit_on_error(
        tmp_path: Path, start_server: type[ServerProcess]) -> None:
    server = start_server("as://account", wait=False)
    assert server.wait_exit() != 0
    assert ("failed to load all models: failed to poll model repository 'as://account': "
            "malformed URL: no container name") in server.log()


def test_a_restart_with_the_cache_downloads_only_what_changed(
        s3_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        start_server: type[ServerProcess]) -> None:
    cloud = cloud_servers.s3_cloud(s3_port)
    _use(cloud, monkeypatch)
    staged = tmp_path / "staged"
    make_models.write_add_sub(staged)
    make_models.write_mlp(staged)
    cloud.put(staged)
    cache = tmp_path / "cache"
    requests = _Requests()
    logging.getLogger("werkzeug").addHandler(requests)
    try:
        server = start_server(cloud.url, f"--cloud-cache-directory={cache}")
        _infer_add_sub(httpclient.InferenceServerClient(server.url))
        assert server.stop() == 0
        fetched = [line for line in requests.lines if '"GET /' in line and "list-type" not in line]
        assert len(fetched) == 4, fetched  # two models of two files each
        # restart after changing one file: only that object is fetched again
        config = (staged / "mlp" / "config.pbtxt").read_text() + "\n# edited\n"
        cloud.put_bytes("mlp/config.pbtxt", config.encode())
        requests.lines.clear()
        server = start_server(cloud.url, f"--cloud-cache-directory={cache}")
        http = httpclient.InferenceServerClient(server.url)
        _infer_add_sub(http)
        assert http.is_model_ready("mlp")
        fetched = [line for line in requests.lines if '"GET /' in line and "list-type" not in line]
        assert len(fetched) == 1 and "/models/mlp/config.pbtxt" in fetched[0], fetched
    finally:
        logging.getLogger("werkzeug").removeHandler(requests)


def test_none_mode_downloads_into_the_mount_directory(
        s3_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        start_server: type[ServerProcess]) -> None:
    cloud = cloud_servers.s3_cloud(s3_port)
    _use(cloud, monkeypatch)
    make_models.write_add_sub(tmp_path / "staged")
    cloud.put(tmp_path / "staged")
    mount = tmp_path / "mount"
    mount.mkdir()
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(mount))
    server = start_server(cloud.url, "--model-control-mode=none")
    http = httpclient.InferenceServerClient(server.url)
    _infer_add_sub(http)
    with pytest.raises(InferenceServerException, match="not allowed if polling is enabled"):
        http.unload_model("add_sub")
    http.close()
    # the download went to Triton's mount directory, and is removed at exit
    (onnx,) = mount.glob("nursery-cloud-*/models/*/add_sub/*/1/model.onnx")
    assert onnx.read_bytes() == (tmp_path / "staged" / "add_sub" / "1" / "model.onnx").read_bytes()
    assert server.stop() == 0
    assert not list(mount.iterdir())


def test_python_models_ensembles_and_version_policies_from_a_bucket(
        s3_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        start_server: type[ServerProcess]) -> None:
    cloud = cloud_servers.s3_cloud(s3_port)
    _use(cloud, monkeypatch)
    staged = tmp_path / "staged"
    for name in ("py_add_sub", "ens_add_sub_py"):
        shutil.copytree(ROOT / "tests" / "models" / name, staged / name)
    make_models.write_add_sub(staged, max_batch_size=64)  # the ensemble allows 64 (Triton: a step must too)
    for version in (2, 3):
        shutil.copytree(staged / "add_sub" / "1", staged / "add_sub" / str(version))
    config = staged / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text() + "\nversion_policy: { specific: { versions: [1, 3] } }\n")
    cloud.put(staged)
    cloud.put_bytes("ens_add_sub_py/1/", b"")  # an empty version folder: a folder marker
    server = start_server(cloud.url)
    http = httpclient.InferenceServerClient(server.url)
    assert http.is_model_ready("add_sub", "1") and http.is_model_ready("add_sub", "3")
    assert not http.is_model_ready("add_sub", "2")
    a = np.full((1, 16), 5.0, np.float32)
    b = np.full((1, 16), 2.0, np.float32)
    inputs = [httpclient.InferInput("A", [1, 16], "FP32"),
              httpclient.InferInput("B", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = http.infer("ens_add_sub_py", inputs)
    np.testing.assert_array_equal(result.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("TWICE_B"), 2 * b)

"""The storage layer against real servers on loopback (moto's S3, a GCS emulator, Azurite):
listing, complete downloads, the object cache, and every bad input the issue names. No mock
stands in for a storage client."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nursery.config.repository import model_fingerprint, scan
from nursery.config.storage import forget_stores, mirror, open_store
from nursery.config.storage.base import StorageError
from nursery.config.storage.url import parse_root
from tests import cloud_servers
from tests.cloud_servers import Cloud
from tests.conftest import make_models


def _upload_add_sub(cloud: Cloud, tmp_path: Path, name: str = "add_sub") -> Path:
    local = tmp_path / "local"
    make_models.write_add_sub(local, name=name)
    cloud.put(local)
    return local / name


def test_scan_lists_models_without_downloading(cloud: Cloud, tmp_path: Path) -> None:
    _upload_add_sub(cloud, tmp_path)
    cloud.put_bytes("README.md", b"not a model: a file at the top")
    cloud.put_bytes(".hidden/config.pbtxt", b"")  # a model folder, as in Triton
    cloud.put_bytes("add_sub/", b"")  # a console's "folder": the model folder's marker
    root = parse_root(cloud.url)
    found = scan([root])
    assert not found.unreadable
    assert set(found.models) == {"add_sub", ".hidden"}
    location = found.models["add_sub"]
    assert location.remote is not None
    assert sorted(o.rel for o in location.remote.files) == ["1/model.onnx", "config.pbtxt"]
    assert mirror.localize(location.remote, open_store(root), tmp_path / "c").is_dir()
    # the fingerprint is the listing: each object's size and tag, nothing fetched
    fingerprint = model_fingerprint(location)
    assert [f[0] for f in fingerprint.files] == ["1/model.onnx", "config.pbtxt"]
    assert all(f[2] for f in fingerprint.files)


def test_localize_is_complete_and_identical(cloud: Cloud, tmp_path: Path) -> None:
    local = _upload_add_sub(cloud, tmp_path)
    remote = scan([parse_root(cloud.url)]).models["add_sub"].remote
    assert remote is not None
    folder = mirror.localize(remote, open_store(remote.root), tmp_path / "cache")
    for rel in ("config.pbtxt", "1/model.onnx"):
        assert (folder / rel).read_bytes() == (local / rel).read_bytes()
    # the same listing again: the same folder, nothing fetched
    assert mirror.localize(remote, open_store(remote.root), tmp_path / "cache") == folder


def test_cache_fetches_only_what_changed(cloud: Cloud, tmp_path: Path) -> None:
    local = _upload_add_sub(cloud, tmp_path)
    base = tmp_path / "cache"
    root = parse_root(cloud.url)
    first = scan([root]).models["add_sub"].remote
    assert first is not None
    old = mirror.localize(first, open_store(root), base)
    onnx_inode = os.stat(old / "1" / "model.onnx").st_ino
    config = (local / "config.pbtxt").read_text() + "\n# changed\n"
    cloud.put_bytes("add_sub/config.pbtxt", config.encode())
    # a restart: a new client, the same cache folder
    forget_stores()
    second = scan([root]).models["add_sub"].remote
    assert second is not None and second != first
    new = mirror.localize(second, open_store(root), base)
    assert new != old
    assert (new / "config.pbtxt").read_text() == config
    # the unchanged object was not fetched again: the new folder links the cached file
    assert os.stat(new / "1" / "model.onnx").st_ino == onnx_inode
    mirror.prune(base, second)
    assert not old.exists() and new.exists()


def test_object_deleted_after_listing_fails_that_model_only(cloud: Cloud, tmp_path: Path
                                                            ) -> None:
    _upload_add_sub(cloud, tmp_path)
    _upload_add_sub(cloud, tmp_path / "b", name="other")
    base = tmp_path / "cache"
    found = scan([parse_root(cloud.url)])
    remote = found.models["add_sub"].remote
    assert remote is not None
    cloud.delete("add_sub/1/model.onnx")
    with pytest.raises(StorageError) as caught:
        mirror.localize(remote, open_store(remote.root), base)
    message = str(caught.value)
    assert f"'{cloud.url}/add_sub/1/model.onnx'" in message
    assert any(w in message for w in ("NoSuchKey", "NotFound", "PreconditionFailed"))
    # nothing half-made is left where a complete model would be
    assert not mirror.model_folder(base, remote).exists()
    assert not list(mirror.model_folder(base, remote).parent.glob(".partial-*"))
    other = found.models["other"].remote
    assert other is not None
    assert (mirror.localize(other, open_store(other.root), base) / "config.pbtxt").is_file()


def test_object_changed_after_listing_is_refused(cloud: Cloud, tmp_path: Path) -> None:
    _upload_add_sub(cloud, tmp_path)
    remote = scan([parse_root(cloud.url)]).models["add_sub"].remote
    assert remote is not None
    cloud.put_bytes("add_sub/1/model.onnx", b"a different model, of another size")
    with pytest.raises(StorageError, match=r"add_sub/1/model\.onnx"):
        mirror.localize(remote, open_store(remote.root), tmp_path / "cache")


def test_unknown_bucket_is_an_unreadable_repository(cloud: Cloud) -> None:
    url = cloud.url.replace("/nursery-", "/missing-")
    found = scan([parse_root(url)])
    (reason,) = found.unreadable.values()
    assert reason.startswith(f"failed to poll model repository '{url}': ")
    # S3: Triton's HEAD of the bucket first, whose answer has no body but its status
    assert any(w in reason for w in ("NoSuchBucket", "NotFound", "ContainerNotFound",
                                     "(HTTP 404 Not Found)"))


def test_empty_path_is_an_unreadable_repository(cloud: Cloud) -> None:
    cloud.put_bytes("m/config.pbtxt", b"")
    found = scan([parse_root(cloud.url + "/nothing-here")])
    (reason,) = found.unreadable.values()
    assert "no object under" in reason


def test_an_empty_bucket_root_is_a_repository_without_models(cloud: Cloud) -> None:
    """Triton's file systems take the root of a bucket that exists as a folder, however
    empty (its L0_storage_S3 starts a server on an empty bucket first); a path in it with
    nothing under it is none (above)."""
    root = cloud.url.rsplit("/models", 1)[0]
    found = scan([parse_root(root)])
    assert not found.unreadable and not found.models


@pytest.mark.parametrize("key", ["evil/1/../../../../etc/passwd", "evil//etc/passwd",
                                 "evil/./config.pbtxt"])
def test_keys_that_climb_out_fail_their_model(key: str, s3_port: int, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # S3 keeps such keys as written (Azure and GCS SDKs normalise some of them away)
    cloud = cloud_servers.s3_cloud(s3_port)
    for name, value in cloud.env.items():
        monkeypatch.setenv(name, value)
    _upload_add_sub(cloud, tmp_path)
    cloud.put_bytes("evil/config.pbtxt", b'backend: "onnxruntime"')
    cloud.put_bytes(key, b"root:x:0:0")
    found = scan([parse_root(cloud.url)])
    evil = found.models["evil"].remote
    assert evil is not None
    with pytest.raises(StorageError, match="not a plain path inside the model folder"):
        mirror.localize(evil, open_store(evil.root), tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("passwd"))
    good = found.models["add_sub"].remote
    assert good is not None
    assert mirror.localize(good, open_store(good.root), tmp_path / "cache").is_dir()


def test_a_server_that_stops_answering_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NURSERY_STORAGE_TIMEOUT_SECS", "1")
    for name, value in cloud_servers.S3_ENV.items():
        monkeypatch.setenv(name, value)
    forget_stores()
    with cloud_servers.silent_server() as port:
        url = f"s3://127.0.0.1:{port}/bucket/models"
        (reason,) = scan([parse_root(url)]).unreadable.values()
    assert reason.startswith(f"failed to poll model repository '{url}': ")
    assert "timeout" in reason.lower() or "timed out" in reason.lower()


@pytest.mark.parametrize("scheme", ["gs", "as"])
def test_gcs_and_azure_servers_that_stop_answering_time_out(
        scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NURSERY_STORAGE_TIMEOUT_SECS", "1")
    forget_stores()
    with cloud_servers.silent_server() as port:
        if scheme == "gs":
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
            url = "gs://bucket/models"
        else:
            monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                               cloud_servers.azurite_connection(port))
            url = "as://devstoreaccount1/container/models"
        (reason,) = scan([parse_root(url)]).unreadable.values()
    assert reason.startswith(f"failed to poll model repository '{url}': ")
    assert "timeout" in reason.lower() or "timed out" in reason.lower(), reason


def test_azure_wrong_key_is_refused(azure_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    cloud = cloud_servers.azure_cloud(azure_port)
    cloud.put_bytes("m/config.pbtxt", b"")
    wrong = cloud_servers.azurite_connection(azure_port).replace(
        cloud_servers.AZURITE_KEY, "d3Jvbmcga2V5IGZvciBhenVyaXRlIHRlc3Rz" * 2)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong)
    forget_stores()
    (reason,) = scan([parse_root(cloud.url)]).unreadable.values()
    assert reason.startswith(f"failed to poll model repository '{cloud.url}': ")
    assert "Authorization" in reason or "authenticat" in reason.lower()


def _moto_user(port: int) -> dict[str, str]:
    """An IAM user with an access key allowed to read S3, then moto checks every request's
    signature (its auth mode)."""
    import boto3
    import requests

    iam = boto3.client("iam", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                       aws_access_key_id="x", aws_secret_access_key="x")
    iam.create_user(UserName="reader")
    iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    requests.post(f"http://127.0.0.1:{port}/moto-api/reset-auth", data=b"0", timeout=10)
    return {"key_id": key["AccessKeyId"], "secret_key": key["SecretAccessKey"]}


def test_s3_credentials_env_and_file_longest_prefix(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import requests

    with cloud_servers.moto_server() as port:
        try:
            _check_credentials(port, tmp_path, monkeypatch)
        finally:  # moto keeps its auth mode process-wide: back to no checks
            requests.post(f"http://127.0.0.1:{port}/moto-api/reset-auth", data=b"inf",
                          timeout=10)


def _check_credentials(port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # at the bucket's top: moto's signature check of a listing with a prefix is wrong
    # (it refuses a correctly signed ListObjectsV2 whose prefix holds a '/')
    cloud = cloud_servers.s3_cloud(port, prefix="")
    cloud.put_bytes("m/config.pbtxt", b"")
    second = cloud_servers.s3_cloud(port, prefix="")
    second.put_bytes("m/config.pbtxt", b"")
    good = _moto_user(port)
    root = parse_root(cloud.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    forget_stores()
    (reason,) = scan([root]).unreadable.values()
    assert ("Unable to create S3 filesystem client. Check account credentials. Exception: '' "
            "Message: 'No response body.' (HTTP 403 Forbidden)") in reason, reason
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", good["key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", good["secret_key"])
    forget_stores()
    found = scan([root])
    assert set(found.models) == {"m"}, found.unreadable
    # the credential file wins over the environment; the longest matching prefix is used
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"s3": {
        f"s3://127.0.0.1:{port}": {"key_id": "AKIAWRONGWRONGWRONG0", "secret_key": "x"},
        cloud.url: good,
        "s3://elsewhere": good}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(creds))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    forget_stores()
    assert set(scan([root]).models) == {"m"}
    (reason,) = scan([parse_root(second.url)]).unreadable.values()
    assert "Check account credentials" in reason, reason
    creds.write_text(json.dumps({"s3": {"s3://elsewhere": good}}))
    forget_stores()
    (reason,) = scan([root]).unreadable.values()
    assert "Cannot match credential for path" in reason


def test_malformed_url_is_an_unreadable_repository() -> None:
    (reason,) = scan([parse_root("s3://")]).unreadable.values()
    assert reason == "failed to poll model repository 's3://': malformed URL: no bucket name"


def test_local_and_cloud_roots_mix(cloud: Cloud, tmp_path: Path) -> None:
    _upload_add_sub(cloud, tmp_path)
    local = tmp_path / "repo"
    make_models.write_mlp(local)
    make_models.write_add_sub(local, name="add_sub")
    found = scan([local, parse_root(cloud.url)])
    assert set(found.models) == {"mlp"}
    assert set(found.duplicates) == {"add_sub"}

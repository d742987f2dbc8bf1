"""Cloud repository URLs, credential matching and object-key checks: pure, no server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nursery.config.repository import scan
from nursery.config.storage import credentials, forget_stores, mirror
from nursery.config.storage.base import ObjectInfo, RemoteModel, StorageError, unsafe_part
from nursery.config.storage.url import CloudRoot, parse_root
from nursery.settings import settings_from_args


@pytest.mark.parametrize(("url", "want"), [
    ("s3://bucket/path/to/models", ("s3", "bucket", "path/to/models", "", "")),
    ("s3://bucket", ("s3", "bucket", "", "", "")),
    ("s3://bucket//models///", ("s3", "bucket", "models", "", "")),
    ("s3://127.0.0.1:9000/bucket/models", ("s3", "bucket", "models",
                                           "http://127.0.0.1:9000", "")),
    ("s3://http://minio.local:9000/bucket", ("s3", "bucket", "", "http://minio.local:9000", "")),
    ("s3://https://s3.example.com:443/bucket/m", ("s3", "bucket", "m",
                                                  "https://s3.example.com:443", "")),
    ("gs://my-bucket/models", ("gs", "my-bucket", "models", "", "")),
    ("as://account/container/models", ("as", "container", "models", "", "account")),
    ("as://account.blob.core.windows.net/container", ("as", "container", "", "", "account")),
])
def test_url_forms(url: str, want: tuple[str, ...]) -> None:
    root = parse_root(url)
    assert not root.error
    assert (root.scheme, root.bucket, root.prefix, root.endpoint, root.account) == want
    assert str(root) == url


@pytest.mark.parametrize(("url", "why"), [
    ("s3://", "no bucket name"),
    ("s3:///", "no bucket name"),
    ("s3://https://bucket/x", "'https://' must be followed by host:port"),
    ("s3://Bucket_Upper/x", "'Bucket_Upper' is not a valid bucket name"),
    ("s3://bucket/models/../other", "the path may not contain '..'"),
    ("gs://bucket/./x", "the path may not contain '.'"),
    ("as://account", "no container name"),
    ("as://UPPER/container", "'UPPER' is not a storage account name"),
    ("gs://bucket/with space", "blank or NUL"),
])
def test_malformed_urls(url: str, why: str) -> None:
    root = parse_root(url)
    assert root.error.startswith("malformed URL: ") and why in root.error


def test_settings_mix_local_and_cloud_roots(tmp_path: Path) -> None:
    settings = settings_from_args(["--model-repository", str(tmp_path),
                                   "--model-repository", "s3://127.0.0.1:9000/b-1/m",
                                   "--model-store", "as://acct/cont",
                                   "--cloud-cache-directory", str(tmp_path / "c")])
    local, s3, azure = settings.model_repositories
    assert local == tmp_path
    assert isinstance(s3, CloudRoot) and s3.endpoint == "http://127.0.0.1:9000"
    assert isinstance(azure, CloudRoot) and azure.scheme == "as"
    assert settings.cloud_cache_directory == str(tmp_path / "c")


def test_longest_prefix() -> None:
    names = ["", "s3://a", "s3://a/b", "s3://ab", 7]
    assert credentials.longest_prefix(names, "s3://a/b/c") == "s3://a/b"
    assert credentials.longest_prefix(names, "s3://abc") == "s3://ab"
    assert credentials.longest_prefix(names, "gs://x") == ""
    assert credentials.longest_prefix(["s3://z"], "s3://a") is None


def test_credential_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "creds.json"
    path.write_text(json.dumps({
        "s3": {"s3://bucket": {"key_id": "short"}, "s3://bucket/models": {"key_id": "long"}},
        "gs": {"": "/keys/any.json", "gs://bb1": {"not": "a path"}},
        "as": {"as://acct": {"account_str": "acct", "account_key": "k"}}}))
    monkeypatch.setenv(credentials.ENV, str(path))
    assert credentials.from_file(parse_root("s3://bucket/models/x")) == {"key_id": "long"}
    assert credentials.from_file(parse_root("s3://bucket/other")) == {"key_id": "short"}
    assert credentials.from_file(parse_root("gs://other/m")) == "/keys/any.json"
    with pytest.raises(StorageError, match="must be a file path"):
        credentials.from_file(parse_root("gs://bb1/m"))
    with pytest.raises(StorageError, match="Cannot match credential for path s3://else/m"):
        credentials.from_file(parse_root("s3://else/m"))
    path.write_text("{not json")
    with pytest.raises(StorageError, match="cannot read the credential file"):
        credentials.from_file(parse_root("s3://bucket/m"))
    monkeypatch.delenv(credentials.ENV)
    assert credentials.from_file(parse_root("s3://bucket/m")) is None


@pytest.mark.parametrize(("rel", "unsafe"), [
    ("config.pbtxt", False), ("1/model.onnx", False), ("1/", False), ("a/b/c.txt", False),
    ("../x", True), ("1/../../x", True), ("/etc/passwd", True), ("1//x", True), ("./x", True),
    ("", True), ("a\\..\\b", True), ("a\0b", True),
])
def test_unsafe_keys(rel: str, unsafe: bool) -> None:
    assert unsafe_part(rel) is unsafe


def test_model_folder_is_named_by_the_listing(tmp_path: Path) -> None:
    root = parse_root("s3://bucket/models")
    one = RemoteModel(root, "m", (ObjectInfo("config.pbtxt", 3, "e1"),))
    same = RemoteModel(root, "m", (ObjectInfo("config.pbtxt", 3, "e1"),))
    changed = RemoteModel(root, "m", (ObjectInfo("config.pbtxt", 3, "e2"),))
    assert mirror.model_folder(tmp_path, one) == mirror.model_folder(tmp_path, same)
    assert mirror.model_folder(tmp_path, one) != mirror.model_folder(tmp_path, changed)
    assert mirror.model_folder(tmp_path, one).parent == mirror.model_folder(tmp_path, changed).parent


def test_mount_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path))
    monkeypatch.delenv("TRITON_GCS_MOUNT_DIRECTORY", raising=False)
    assert mirror.mount_directory("s3") == str(tmp_path)
    assert mirror.mount_directory("gs") != str(tmp_path)


def test_a_malformed_root_is_unreadable_not_raised() -> None:
    found = scan([parse_root("as://account")])
    assert found.unreadable == {
        parse_root("as://account"):
        "failed to poll model repository 'as://account': malformed URL: no container name"}


@pytest.mark.parametrize(("url", "module", "extra"), [
    ("s3://bucket/models", "boto3", "s3"),
    ("gs://bucket/models", "google.cloud.storage", "gcs"),
    ("as://account/container/models", "azure.storage.blob", "azure"),
])
def test_a_missing_extra_is_one_clear_line(url: str, module: str, extra: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what an uninstalled package looks like
    parent, _, leaf = module.rpartition(".")
    if parent in sys.modules:  # an imported package keeps its submodule as an attribute
        monkeypatch.delattr(sys.modules[parent], leaf, raising=False)
    forget_stores()
    (reason,) = scan([parse_root(url)]).unreadable.values()
    forget_stores()
    assert reason.startswith(f"failed to poll model repository '{url}': {url[:2]}:// "
                             f"repositories need the '{extra}' extra "
                             f"(pip install 'nursery[{extra}]'): ")
    assert reason.endswith("is not installed") and "\n" not in reason


def test_a_model_of_too_many_objects_is_refused(tmp_path: Path) -> None:
    root = parse_root("s3://bucket/models")
    files = tuple(ObjectInfo(f"1/f{i}", 1, "t") for i in range(mirror.MAX_OBJECTS_PER_MODEL + 1))
    with pytest.raises(StorageError, match="more than the 10000 a model may have"):
        mirror.localize(RemoteModel(root, "m", files), None, tmp_path)  # type: ignore[arg-type]


def test_demand_flags(tmp_path: Path) -> None:
    settings = settings_from_args([
        "--model-repository", str(tmp_path), "--model-control-mode=explicit",
        "--model-load-on-demand", "--model-load-budget", "models=3",
        "--model-load-budget", "bytes=1Gi", "--model-load-pin", "a", "--model-load-pin", "b",
        "--model-load-on-demand-timeout-secs", "7.5"])
    assert settings.model_load_on_demand
    assert settings.model_load_budget.models == 3
    assert settings.model_load_budget.bytes == 1024**3
    assert settings.model_load_pins == ("a", "b")
    assert settings.model_load_on_demand_timeout_secs == 7.5
    for bad in (["--model-load-budget", "models=3"],  # not explicit mode
                ["--model-control-mode=explicit", "--model-load-budget", "models=0"],
                ["--model-control-mode=explicit", "--model-load-on-demand-timeout-secs", "0"]):
        with pytest.raises(SystemExit):
            settings_from_args(["--model-repository", str(tmp_path), *bad])


def test_a_repository_given_twice_is_one(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton keeps its repositories in a set (L0_lifecycle's config override case gives the
    same folder twice and expects its model to load)."""
    monkeypatch.delenv("AIP_STORAGE_URI", raising=False)
    a, b = tmp_path / "a", tmp_path / "b"
    settings = settings_from_args([f"--model-repository={a}", f"--model-repository={b}",
                                   f"--model-repository={a}/", f"--model-repository={a}"])
    assert settings.model_repositories == (a, b)

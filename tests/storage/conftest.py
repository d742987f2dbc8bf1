"""Storage servers for the cloud-repository tests: one of each per module, a fresh bucket per
test (``cloud`` is parametrized over S3, GCS and Azure)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nursery.config.storage import forget_stores
from tests import cloud_servers
from tests.cloud_servers import Cloud


@pytest.fixture(scope="module")
def s3_port() -> Iterator[int]:
    with cloud_servers.moto_server() as port:
        yield port


@pytest.fixture(scope="module")
def gcs_port() -> Iterator[int]:
    with cloud_servers.gcs_server() as port:
        yield port


@pytest.fixture(scope="module")
def azure_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with cloud_servers.azurite_server(tmp_path_factory.mktemp("azurite")) as port:
        yield port


def make_cloud(scheme: str, request: pytest.FixtureRequest) -> Cloud:
    if scheme == "s3":
        return cloud_servers.s3_cloud(request.getfixturevalue("s3_port"))
    if scheme == "gs":
        return cloud_servers.gcs_cloud(request.getfixturevalue("gcs_port"))
    return cloud_servers.azure_cloud(request.getfixturevalue("azure_port"))


@pytest.fixture(params=["s3", "gs", "as"])
def cloud(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    """A fresh bucket on a real local server, its client environment set in this process."""
    made = make_cloud(request.param, request)
    for key, value in made.env.items():
        monkeypatch.setenv(key, value)
    forget_stores()
    yield made
    forget_stores()

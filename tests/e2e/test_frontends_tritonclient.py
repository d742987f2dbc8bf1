"""tritonclient.http's whole suite (``test_http_tritonclient.py``) again, with the HTTP port
served by two frontend processes beside the engine (``--http-frontend-processes 2``): every
endpoint, datatype and error answers as the single process does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, running_server
from tests.e2e.test_http_tritonclient import *  # noqa: F403 - the same tests, collected here

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(e2e_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(e2e_repo, "--http-frontend-processes", "2",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc

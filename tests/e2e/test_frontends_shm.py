"""The system shared-memory suite (``test_system_shm.py``) again, with the HTTP port served by
frontend processes: a request naming a region is forwarded to the engine, which holds the
registry, and answers as the single process does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ServerProcess, make_models, running_server
from tests.e2e.test_system_shm import *  # noqa: F403 - the same tests, collected here

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("shm_repo")
    make_models.write_add_sub(repo)
    make_models.write_string_identity(repo)
    with running_server(repo, "--allow-client-shm=true", "--http-frontend-processes", "2",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc

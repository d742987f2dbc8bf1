"""The hostile-HTTP suite (``test_hostile_http.py``) again, with the HTTP port served by a
frontend process: slow, malformed and vanishing clients cost their own connection, never the
frontend, the engine or another client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ServerProcess, make_models, running_server
from tests.e2e.test_hostile_http import *  # noqa: F403 - the same tests, collected here
from tests.e2e.test_hostile_http import SHORT

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    make_models.write_add_sub(repo)
    with running_server(repo, *SHORT, "--http-frontend-processes", "1",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc

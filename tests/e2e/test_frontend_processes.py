"""``--http-frontend-processes``: the HTTP port served by processes beside the engine
(``nursery/protocol/frontends``). The fast path's suite again through a frontend (an answer
too big for the client's window, a pipelined request, a client leaving while its request
waits: withdrawn over the link), then the supervision boundary: a frontend killed is started
again while the others serve; the engine killed takes its frontends with it; a shutdown ends
them all, exit status 0."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, make_models
from tests.e2e.test_http_fast_path import *  # noqa: F403 - the same tests, collected here
from tests.e2e.test_http_fast_path import fast_path_repo

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = fast_path_repo(tmp_path_factory.mktemp("repo"))
    proc = ServerProcess(repo, "--http-frontend-processes", "1",
                         log_path=tmp_path_factory.mktemp("log") / "server.log")
    proc.wait_ready()
    yield proc
    assert proc.stop() == 0, proc.log()


def _frontends(server: ServerProcess) -> list[int]:
    """The server's frontend processes (its children running ``frontends.process``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == server.proc.pid and b"frontends.process" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _until(check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError("not within the time")


def _add_sub(url: str) -> None:
    """One inference on a new connection, checked."""
    client = httpclient.InferenceServerClient(url)
    try:
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
                  httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    finally:
        client.close()


@pytest.fixture
def two_frontends(start_server: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    repo = tmp_path / "repo"
    make_models.write_add_sub(repo)
    return start_server(repo, "--http-frontend-processes", "2")  # type: ignore[call-arg]


def test_a_killed_frontend_is_started_again_while_the_other_serves(
        two_frontends: ServerProcess) -> None:
    server = two_frontends
    _until(lambda: len(_frontends(server)) == 2)
    first, second = _frontends(server)
    os.kill(first, signal.SIGKILL)
    for _ in range(20):  # the other one serves meanwhile: nothing is refused
        _add_sub(server.url)
    _until(lambda: "exited (killed by SIGKILL); starting it again" in server.log())
    _until(lambda: len(_frontends(server)) == 2 and first not in _frontends(server))
    assert second in _frontends(server)
    restarted = next(p for p in _frontends(server) if p != second)
    for _ in range(20):
        _add_sub(server.url)
    with urllib.request.urlopen(f"http://{server.url}/v2/models/add_sub/stats") as r:
        assert b'"count":40' in r.read().replace(b" ", b"")
    assert server.stop() == 0, server.log()
    assert not _alive(second) and not _alive(restarted)


def test_the_frontends_end_with_the_engine(two_frontends: ServerProcess) -> None:
    server = two_frontends
    _until(lambda: len(_frontends(server)) == 2)
    frontends = _frontends(server)
    _add_sub(server.url)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    # the link closes with the engine: each frontend sees it and exits, freeing the port
    _until(lambda: not any(_alive(p) for p in frontends), 10)


def test_a_shutdown_ends_every_frontend(two_frontends: ServerProcess) -> None:
    server = two_frontends
    _until(lambda: len(_frontends(server)) == 2)
    frontends = _frontends(server)
    _add_sub(server.url)
    assert server.stop() == 0, server.log()
    assert not any(_alive(p) for p in frontends)

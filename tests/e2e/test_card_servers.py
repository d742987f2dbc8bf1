"""The design card's servers, the 'card-servers' extra: hypercorn + quart-trio on the HTTP port
(``--http-server hypercorn``) and grpclib on a trio-asyncio loop on the gRPC port
(``--grpc-server grpclib``), driven by NVIDIA's tritonclient; and, with the extra's packages
made unimportable, the one line that names the extra, and the default servers serving without
them.

Elsewhere the card servers also answer the recorded Triton cases
(``test_http_wire.test_both_http_servers_match_triton``) and export OpenTelemetry spans
(``test_observability.test_opentelemetry_mode_exports_spans``).
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ROOT, ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

# the top-level modules of the extra's packages (grpclib is required: see pyproject.toml)
CARD_MODULES = ("hypercorn", "quart", "quart_trio", "trio_asyncio")
EXTRA_HINT = "needs the 'card-servers' extra: pip install \"nursery[card-servers]\""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models.write_add_sub(tmp_path_factory.mktemp("repo")).parent


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(repo, "--http-server", "hypercorn", "--grpc-server", "grpclib",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def _inputs(client: Any) -> tuple[list[Any], np.ndarray, np.ndarray]:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, np.float32)
    inputs = [client.InferInput("INPUT0", [2, 16], "FP32"),
              client.InferInput("INPUT1", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def _check_http(url: str) -> None:
    """Health, metadata, config and one inference through tritonclient.http."""
    client = httpclient.InferenceServerClient(url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("add_sub") and not client.is_model_ready("nope")
        assert client.get_server_metadata()["name"] == "triton"
        meta = client.get_model_metadata("add_sub")
        assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}
        assert client.get_model_config("add_sub")["max_batch_size"] == 8
        inputs, a, b = _inputs(httpclient)
        result = client.infer("add_sub", inputs)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    finally:
        client.close()


def _check_grpc(url: str) -> None:
    """Health, metadata, config, one inference and one streamed through tritonclient.grpc."""
    client = grpcclient.InferenceServerClient(url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("add_sub") and not client.is_model_ready("nope")
        assert client.get_server_metadata(as_json=True)["name"] == "triton"
        meta = client.get_model_metadata("add_sub", as_json=True)
        assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}
        assert client.get_model_config("add_sub", as_json=True)["config"]["max_batch_size"] == 8
        inputs, a, b = _inputs(grpcclient)
        result = client.infer("add_sub", inputs)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(lambda result, error: answers.put((result, error)))
        client.async_stream_infer("add_sub", inputs, request_id="s1")
        client.async_stream_infer("nope", inputs, request_id="s2")
        got = [answers.get(timeout=30) for _ in range(2)]
        client.stop_stream()
        results = [r for r, e in got if e is None]
        errors = [str(e) for _, e in got if e is not None]
        assert len(results) == 1 and results[0].get_response().id == "s1"
        np.testing.assert_allclose(results[0].as_numpy("OUTPUT1"), a - b)
        assert len(errors) == 1 and "nope" in errors[0]
    finally:
        client.close()


def test_hypercorn_serves_http(server: ServerProcess) -> None:
    _check_http(server.url)


def test_grpclib_serves_grpc(server: ServerProcess) -> None:
    _check_grpc(f"127.0.0.1:{server.grpc_port}")


def test_grpclib_status_for_an_unknown_model(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inputs, _, _ = _inputs(grpcclient)
    with pytest.raises(Exception, match="Request for unknown model") as err:
        client.infer("nope", inputs)
    assert "NOT_FOUND" in str(err.value.status())  # type: ignore[attr-defined]
    client.close()


# -- without the extra ---------------------------------------------------------------------

@pytest.fixture
def without_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``sitecustomize`` on PYTHONPATH that makes the extra's modules unimportable in every
    Python process started from here on (as if the extra were not installed)."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        f"for name in {CARD_MODULES!r}:\n"
        "    sys.modules[name] = None  # import raises ModuleNotFoundError\n")
    path = [str(blocker)]
    if existing := os.environ.get("PYTHONPATH"):
        path.append(existing)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    return blocker


@pytest.mark.parametrize("flag", ["--http-server=hypercorn", "--grpc-server=grpclib"])
def test_missing_extra_is_one_line(tmp_path: Path, without_extra: Path, flag: str) -> None:
    (tmp_path / "empty").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "nursery", "serve", "--model-repository", str(tmp_path / "empty"),
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", flag],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    server, impl = flag.removeprefix("--").split("=")
    assert lines == [f"error: creating server: Internal - --{server} {impl} {EXTRA_HINT}"], \
        proc.stderr
    assert proc.stdout == ""


def test_default_servers_need_no_extra(repo: Path, without_extra: Path,
                                       start_server: type[ServerProcess]) -> None:
    server = start_server(repo)
    _check_http(server.url)
    _check_grpc(f"127.0.0.1:{server.grpc_port}")
    assert server.stop() == 0, server.log()

"""Unregistering shared-memory regions that requests in flight use, as Triton's
L0_shared_memory ``TestSharedMemoryUnregister`` does it, with tritonclient against a real
server: the unregister answers at once, the regions stay registered (listed, usable by new
requests) while a request holds them, the held request's outputs land in its regions, and
once the last request holding them has answered they are gone without another unregister.

The requests are held in flight by ``py_gated_simple`` (``tests/models``): each touches a
file when it starts executing and answers once the test creates its release file, so nothing
here depends on timing."""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, running_server, wait_for_file
from tests.shm_client import system_shm as shm

pytestmark = pytest.mark.e2e

MODEL = "py_gated_simple"
SIZE = 64  # 16 INT32
IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
IN1 = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module", params=["nursery", "grpclib"])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Both gRPC servers: the lean one answers ModelInfer on its fast path (``infer_now``),
    grpclib through ``_infer``."""
    repo = tmp_path_factory.mktemp("gated_repo")
    shutil.copytree(ROOT / "tests" / "models" / MODEL, repo / MODEL)
    with running_server(repo, "--allow-client-shm=true", "--log-verbose=1",
                        f"--grpc-server={request.param}",
                        tmp_path_factory=tmp_path_factory) as proc:
        yield proc


class Regions:
    """Triton's test's four regions (two inputs, two outputs), created and registered."""

    def __init__(self, server: ServerProcess) -> None:
        tag = uuid.uuid4().hex[:8]
        self.names = [f"{n}_{tag}" for n in ("input0", "input1", "output0", "output1")]
        self.handles = [shm.create_shared_memory_region(n, f"/nursery_{n}", SIZE)
                        for n in self.names]
        self.http = httpclient.InferenceServerClient(server.url)
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        for name in self.names:
            self.http.register_system_shared_memory(name, f"/nursery_{name}", SIZE)
        shm.set_shared_memory_region(self.handles[0], [IN0])
        shm.set_shared_memory_region(self.handles[1], [IN1])

    def listed(self) -> list[str]:
        """The registered regions, as both protocols list them (they must agree)."""
        by_http = sorted(r["name"] for r in self.http.get_system_shared_memory_status())
        by_grpc = sorted(self.grpc.get_system_shared_memory_status(as_json=True)
                         .get("regions", {}))
        assert by_http == by_grpc
        return by_http

    def output(self, index: int) -> np.ndarray:
        return shm.get_contents_as_numpy(self.handles[2 + index], np.int32, [1, 16])

    def close(self) -> None:
        self.http.unregister_system_shared_memory()
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)
        self.http.close()
        self.grpc.close()


@pytest.fixture
def regions(server: ServerProcess) -> Iterator[Regions]:
    r = Regions(server)
    yield r
    r.close()


def _request(module: Any, names: list[str]) -> tuple[list[Any], list[Any]]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),
              module.InferInput("INPUT1", [1, 16], "INT32")]
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    inputs[0].set_shared_memory(names[0], SIZE)
    inputs[1].set_shared_memory(names[1], SIZE)
    outputs[0].set_shared_memory(names[2], SIZE)
    outputs[1].set_shared_memory(names[3], SIZE)
    return inputs, outputs


class Held:
    """One request sent from a thread of its own (its own client: tritonclient's HTTP client
    is gevent-based), held in flight by the model until ``release``."""

    def __init__(self, server: ServerProcess, protocol: str, names: list[str],
                 gates: Path, label: str) -> None:
        self.started = gates / f"{label}.started"
        self.released = gates / f"{label}.release"
        self.error: BaseException | None = None
        self.result: Any = None
        params = {"started": str(self.started), "release": str(self.released)}
        send: Callable[[], Any]
        if protocol == "http":
            def send() -> Any:
                with httpclient.InferenceServerClient(server.url) as client:
                    inputs, outputs = _request(httpclient, names)
                    return client.infer(MODEL, inputs, outputs=outputs, parameters=params)
        elif protocol == "grpc":
            def send() -> Any:
                with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
                    inputs, outputs = _request(grpcclient, names)
                    return client.infer(MODEL, inputs, outputs=outputs, parameters=params)
        else:  # a gRPC stream
            def send() -> Any:
                import queue
                answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
                with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
                    client.start_stream(callback=lambda result, error: answers.put((result, error)))
                    try:
                        inputs, outputs = _request(grpcclient, names)
                        client.async_stream_infer(MODEL, inputs, outputs=outputs,
                                                  parameters=params)
                        result, error = answers.get(timeout=120)
                    finally:
                        client.stop_stream()
                if error is not None:
                    raise error
                return result

        def run() -> None:
            try:
                self.result = send()
            except BaseException as exc:  # noqa: BLE001 - the test looks at it
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        wait_for_file(self.started)  # executing now: its regions are held

    def answer(self) -> Any:
        self.released.touch()
        self.thread.join(120)
        assert not self.thread.is_alive()
        assert self.error is None, self.error
        return self.result


@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc_stream"])
def test_unregistering_regions_in_use_waits_for_the_requests(
        server: ServerProcess, regions: Regions, protocol: str, tmp_path: Path) -> None:
    first = Held(server, protocol, regions.names, tmp_path, "first")
    # unregistering every region (HTTP), and one by name (gRPC), succeed at once...
    regions.http.unregister_system_shared_memory()
    regions.grpc.unregister_system_shared_memory(regions.names[0])
    # ...and the regions stay while the request holds them, usable by a second request
    assert regions.listed() == sorted(regions.names)
    second = Held(server, protocol, regions.names, tmp_path, "second")
    with pytest.raises(InferenceServerException, match="already in manager"):
        regions.http.register_system_shared_memory(regions.names[0],
                                                   f"/nursery_{regions.names[0]}", SIZE)

    first.answer()
    np.testing.assert_array_equal(regions.output(0), IN0 + IN1)  # its outputs landed
    np.testing.assert_array_equal(regions.output(1), IN0 - IN1)
    assert regions.listed() == sorted(regions.names)  # the second request holds them still

    second.answer()
    assert regions.listed() == []  # gone with the last holder, no second unregister
    for name in regions.names:
        with pytest.raises(InferenceServerException,
                           match=f"Unable to find system shared memory region: '{name}'"):
            regions.http.get_system_shared_memory_status(name)
    inputs, outputs = _request(httpclient, regions.names)
    with pytest.raises(InferenceServerException,
                       match=f"Unable to find shared memory region: '{regions.names[0]}'"):
        regions.http.infer(MODEL, inputs, outputs=outputs)
    assert ("will be unregistered after in-flight requests complete" in server.log())


def test_regions_unregistered_after_the_request_go_at_once(
        server: ServerProcess, regions: Regions, tmp_path: Path) -> None:
    held = Held(server, "grpc", regions.names, tmp_path, "only")
    assert regions.listed() == sorted(regions.names)
    held.answer()
    assert regions.listed() == sorted(regions.names)  # never unregistered: they stay
    regions.grpc.unregister_system_shared_memory()
    assert regions.listed() == []


def test_a_refused_request_holds_nothing(server: ServerProcess, regions: Regions) -> None:
    """A request refused at parsing (an output past its region) lets go of the regions it
    had looked up: an unregister afterwards removes them at once."""
    for module, client in ((httpclient, regions.http), (grpcclient, regions.grpc)):
        inputs, outputs = _request(module, regions.names)
        outputs[1].set_shared_memory(regions.names[3], SIZE, offset=8)
        with pytest.raises(InferenceServerException, match="Invalid offset \\+ byte size"):
            client.infer(MODEL, inputs, outputs=outputs)
    regions.http.unregister_system_shared_memory()
    assert regions.listed() == []

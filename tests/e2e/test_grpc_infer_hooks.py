"""Triton's test-only hooks inside its ModelInfer handler end to end (its
qa/L0_request_cancellation sets them): ``TRITONSERVER_DELAY_GRPC_PROCESS_ENTRY`` holds a call
before it is processed, ``TRITONSERVER_DELAY_RESPONSE_COMPLETE_EXEC`` and
``TRITONSERVER_DELAY_RESPONSE_COMPLETION`` hold its reply before it is written, each logged
in Triton's words; a client that cancels while its reply is held gets CANCELLED, and the
server goes on serving."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from nursery.protocol.grpc.lean import infer_hooks_from
from tests.conftest import ROOT, ServerProcess

pytestmark = pytest.mark.e2e


def _inputs() -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), np.float32))
    return inputs


def _server(tmp_path: Path) -> ServerProcess:
    proc = ServerProcess(ROOT / "model_repository", "--model-control-mode=explicit",
                         "--load-model=add_sub", log_path=tmp_path / "server.log")
    proc.wait_ready()
    return proc


def test_a_call_and_its_reply_are_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_GRPC_PROCESS_ENTRY", "300")
    monkeypatch.setenv("TRITONSERVER_DELAY_RESPONSE_COMPLETE_EXEC", "300")
    monkeypatch.setenv("TRITONSERVER_DELAY_RESPONSE_COMPLETION", "400")
    proc = _server(tmp_path)
    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc_port}") as client:
            start = time.monotonic()
            result = client.infer("add_sub", _inputs())
            assert time.monotonic() - start >= 1.0
            assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 16]
            start = time.monotonic()
            assert client.is_server_live()  # only ModelInfer is held
            assert time.monotonic() - start < 1.0
        log = proc.log()
        for words in ("Delaying the entry to Process thread by 300 ms...",
                      "Delaying InferResponseComplete execution by 300 ms...",
                      "Delaying InferResponseComplete by 400 ms..."):
            assert words in log
    finally:
        assert proc.stop() == 0


def test_a_call_cancelled_while_its_reply_is_held(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_RESPONSE_COMPLETION", "5000")
    proc = _server(tmp_path)
    try:
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        with grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc_port}") as client:
            call = client.async_infer("add_sub", _inputs(),
                                      callback=lambda result, error: answers.put((result, error)))
            deadline = time.monotonic() + 30
            while "Delaying InferResponseComplete by 5000 ms..." not in proc.log():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            call.cancel()  # the model has answered; its reply is held
            result, error = answers.get(timeout=10)
            assert result is None and error.status() == "StatusCode.CANCELLED"
            assert client.is_server_live()
            assert client.is_model_ready("add_sub")
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize(("values", "hooks"), [
    ({"TRITONSERVER_DELAY_GRPC_PROCESS_ENTRY": "1000"}, (1000, 0, 0)),
    ({"TRITONSERVER_DELAY_RESPONSE_COMPLETE_EXEC": "5000",
      "TRITONSERVER_DELAY_RESPONSE_COMPLETION": "x"}, (0, 5000, 0)),
    ({"TRITONSERVER_DELAY_GRPC_NOTIFICATION": "5000"}, (0, 0, 0)),
    ({}, (0, 0, 0)),
])
def test_the_hooks_are_read_in_milliseconds(values: dict[str, str],
                                            hooks: tuple[int, int, int]) -> None:
    assert infer_hooks_from(values) == hooks

"""Triton's TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC hook end to end (its
qa/L0_client_timeout sets it): every non-inference gRPC reply is written that many seconds
late, so a client deadline shorter than that expires ("Deadline Exceeded") while the call
itself is carried out; inference replies are not held back, and a longer deadline gets the
answer."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from nursery.protocol.grpc.lean import reply_delay_from
from tests.conftest import ROOT, ServerProcess

pytestmark = pytest.mark.e2e


def test_non_inference_replies_are_held_back(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC", "1")
    proc = ServerProcess(ROOT / "model_repository", "--model-control-mode=explicit",
                         "--load-model=add_sub", log_path=tmp_path / "server.log")
    try:
        proc.wait_ready()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc_port}")
        with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
            client.is_server_live(client_timeout=0.2)
        with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
            client.unload_model("add_sub", client_timeout=0.2)
        start = time.monotonic()
        assert not client.is_model_ready("add_sub", client_timeout=5)  # the unload was done
        assert time.monotonic() - start >= 1.0
        client.load_model("add_sub", client_timeout=5)
        inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(np.ones((1, 16), np.float32))
        start = time.monotonic()
        result = client.infer("add_sub", inputs, client_timeout=0.9)  # not held back
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 16]
        assert time.monotonic() - start < 0.9
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize(("value", "seconds"), [("2", 2), (" 3s", 3), ("abc", 0), ("", 0),
                                                ("-4", 0)])
def test_the_hook_is_read_as_triton_reads_it(value: str, seconds: int) -> None:
    assert reply_delay_from({"TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC": value}) == seconds
    assert reply_delay_from({}) == 0

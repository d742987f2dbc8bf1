"""Large tensors with the default limits, as Triton's qa/L0_large_payload sends them (there
1.9 GB; here 96 MiB, well past the 64 MiB a gRPC message was once limited to): Triton's gRPC
server takes messages up to INT32_MAX bytes and its HTTP server bodies up to the same, and so
does nursery by default; the server answers the same bytes and serves a small request after."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, make_models

pytestmark = pytest.mark.e2e


def test_a_large_tensor_round_trips_over_grpc_and_http(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_models.write_model(
        repo, "identity_fp32", make_models.build_identity("FP32", [-1]),
        make_models.config_text("identity_fp32", [("INPUT0", "FP32", [-1])],
                                [("OUTPUT0", "FP32", [-1])], 0))
    large = np.arange(24 * 1024 * 1024, dtype=np.float32)  # 96 MiB
    small = np.array([1.5], np.float32)
    proc = ServerProcess(repo, log_path=tmp_path / "server.log")
    try:
        proc.wait_ready()
        clients = ((grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc_port}")),
                   (httpclient, httpclient.InferenceServerClient(proc.url)))
        for module, client in clients:
            for data in (large, small):
                tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data, **({"binary_data": True}
                                                    if module is httpclient else {}))
                out = client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
                assert np.array_equal(out, data), module.__name__
    finally:
        assert proc.stop() == 0

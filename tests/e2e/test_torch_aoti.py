"""An AOTInductor package served as Triton serves it: ``platform: "torch_aoti"`` and a
``model.pt2`` made by ``torch._inductor.aoti_compile_and_package`` (compiled here on the CPU,
about half a minute), its input and output named by its call specification as Triton names
them (``ARGS[0]``, ``RESULT``), inferred over HTTP and gRPC with tritonclient, batched."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

CONFIG = """
name: "scale_aoti"
platform: "torch_aoti"
max_batch_size: 8
input [ { name: "ARGS[0]" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
"""


@pytest.fixture(scope="module")
def aoti_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("aoti_repo")
    make_models.write_torch_aoti_scale(repo, "scale_aoti", CONFIG)
    with running_server(repo, tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def test_an_aoti_package_serves_over_http_and_grpc(aoti_server: ServerProcess) -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    http = httpclient.InferenceServerClient(aoti_server.url)
    config = http.get_model_config("scale_aoti")
    assert (config["platform"], config["backend"], config["default_model_filename"]) == (
        "torch_aoti", "pytorch", "model.pt2")
    tensor = httpclient.InferInput("ARGS[0]", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = http.infer("scale_aoti", [tensor])
    assert result.as_numpy("RESULT").tolist() == (data * 2 + 1).tolist()
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{aoti_server.grpc_port}")
    one = grpcclient.InferInput("ARGS[0]", [1, 4], "FP32")
    one.set_data_from_numpy(data[:1])
    assert grpc.infer("scale_aoti", [one]).as_numpy("RESULT").tolist() == [[1, 3, 5, 7]]

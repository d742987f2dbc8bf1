"""``batch_input`` end to end (Triton's L0_batch_input): three requests of different lengths
to a ragged ONNX model share one batch, and the model gets the batch inputs the server makes
from their shapes: each request's element count and their running sums from 0. The model
answers every request with the whole of both (a row each), as Triton's qa model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tests.conftest import ServerProcess, make_models

pytestmark = pytest.mark.e2e


def _model() -> onnx.ModelProto:
    """COUNTS_OUT = ones[N, 1] x COUNTS[1, N], ACC_OUT = ones[N, 1] x ACC[1, N + 1], where N
    is the number of requests (COUNTS / COUNTS is a 1 per request)."""
    f = TensorProto.FLOAT

    def vi(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, f, shape)

    shape_col = helper.make_tensor("col", TensorProto.INT64, [2], [-1, 1])
    shape_row = helper.make_tensor("row", TensorProto.INT64, [2], [1, -1])
    nodes = [
        helper.make_node("Div", ["COUNTS", "COUNTS"], ["ones"]),
        helper.make_node("Reshape", ["ones", "col"], ["ones_col"]),
        helper.make_node("Reshape", ["COUNTS", "row"], ["counts_row"]),
        helper.make_node("Reshape", ["ACC", "row"], ["acc_row"]),
        helper.make_node("MatMul", ["ones_col", "counts_row"], ["COUNTS_OUT"]),
        helper.make_node("MatMul", ["ones_col", "acc_row"], ["ACC_OUT"]),
        helper.make_node("ReduceSum", ["RAGGED"], ["unused"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "batch_input",
        [vi("RAGGED", ["total"]), vi("COUNTS", ["n"]), vi("ACC", ["n1"])],
        [vi("COUNTS_OUT", ["n", "n"]), vi("ACC_OUT", ["n", "n1"])],
        [shape_col, shape_row])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


CONFIG = '''name: "batch_in"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "RAGGED" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "COUNTS_OUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "ACC_OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_input [
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNTS" data_type: TYPE_FP32 source_input: "RAGGED" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "ACC" data_type: TYPE_FP32
    source_input: "RAGGED" }
]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 5000000 }
'''


def test_batch_inputs_reach_the_model(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_models.write_model(repo, "batch_in", _model(), CONFIG)
    proc = ServerProcess(repo, log_path=tmp_path / "server.log")
    try:
        proc.wait_ready()
        client = httpclient.InferenceServerClient(proc.url, concurrency=3)
        handles = []
        for width in (2, 4, 1):
            x = np.full((1, width), width, dtype=np.float32)
            i = httpclient.InferInput("RAGGED", [1, width], "FP32")
            i.set_data_from_numpy(x)
            handles.append(client.async_infer("batch_in", [i]))
        for handle in handles:
            result = handle.get_result()
            assert result.as_numpy("COUNTS_OUT").tolist() == [[2, 4, 1]]
            assert result.as_numpy("ACC_OUT").tolist() == [[0, 2, 6, 7]]
        stats = client.get_inference_statistics("batch_in")["model_stats"][0]
        assert stats["execution_count"] == 1
        client.close()
    finally:
        proc.stop()

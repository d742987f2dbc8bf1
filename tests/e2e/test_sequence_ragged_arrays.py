"""Ragged inputs in sequence batches of an ONNX and a LibTorch model (Triton's ONNX Runtime and
PyTorch backends flatten an ``allow_ragged_batch`` input over whatever batch the scheduler
forms, the sequence batcher's included). Three sequences' requests of different lengths share
a ``direct`` batch; the next batch has an empty slot between two sequences, whose padding row
(Triton's null request, a copy of the batch's first request) adds zeros to the flattened input
and an element count to the batch input. Each request gets its own part of the scattered
output, its own row of the controls and state, and its own element count."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

SEQUENCE = """
sequence_batching {
  max_sequence_idle_microseconds: 30000000
  direct { }
  control_input [
    { name: "%(ready)s" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "%(corrid)s" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 } ] }
  ]
  state [ { input_name: "%(state_in)s" output_name: "%(state_out)s" data_type: TYPE_FP32
            dims: [ 1 ] initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true
                                        name: "zero" } } ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ONNX_CONFIG = """name: "ragged_seq_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "CORR" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "COUNT" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "ELEMS" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNTS" data_type: TYPE_FP32
                source_input: "INPUT" } ]
batch_output [ { target_name: "OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT" } ]
""" + SEQUENCE % {"ready": "READY", "corrid": "CORRID", "state_in": "STATE_IN",
                  "state_out": "STATE_OUT"}

TORCH_CONFIG = """name: "ragged_seq_torch"
backend: "pytorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "CORR__1" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "COUNT__2" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "ELEMS__3" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNTS__4" data_type: TYPE_FP32
                source_input: "INPUT__0" } ]
batch_output [ { target_name: "OUTPUT__0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT__0" } ]
""" + SEQUENCE % {"ready": "READY__1", "corrid": "CORRID__2", "state_in": "STATE_IN__3",
                  "state_out": "STATE_OUT__4"}


def _onnx_model() -> onnx.ModelProto:
    """OUTPUT = 2 INPUT (flattened over the batch); CORR = CORRID; STATE_OUT = COUNT =
    STATE_IN + READY (the requests a sequence has had); ELEMS = COUNTS as a column."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [
        helper.make_node("Mul", ["INPUT", "two"], ["OUTPUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORR"]),
        helper.make_node("Add", ["STATE_IN", "READY"], ["STATE_OUT"]),
        helper.make_node("Identity", ["STATE_OUT"], ["COUNT"]),
        helper.make_node("Reshape", ["COUNTS", "col"], ["ELEMS"]),
    ]
    graph = helper.make_graph(
        nodes, "ragged_seq",
        [helper.make_tensor_value_info("INPUT", f, ["total"]),
         helper.make_tensor_value_info("READY", f, ["n", 1]),
         helper.make_tensor_value_info("CORRID", i64, ["n", 1]),
         helper.make_tensor_value_info("STATE_IN", f, ["n", 1]),
         helper.make_tensor_value_info("COUNTS", f, ["n"])],
        [helper.make_tensor_value_info("OUTPUT", f, ["total"]),
         helper.make_tensor_value_info("CORR", i64, ["n", 1]),
         helper.make_tensor_value_info("COUNT", f, ["n", 1]),
         helper.make_tensor_value_info("ELEMS", f, ["n", 1]),
         helper.make_tensor_value_info("STATE_OUT", f, ["n", 1])],
        [helper.make_tensor("two", f, [], [2.0]),
         helper.make_tensor("col", i64, [2], [-1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _torch_model() -> Any:
    torch = make_models._torch_quietly()

    class RaggedSequence(torch.nn.Module):  # type: ignore[name-defined,misc]
        def forward(self, x: torch.Tensor, ready: torch.Tensor, corrid: torch.Tensor,
                    state: torch.Tensor, counts: torch.Tensor,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               torch.Tensor]:
            total = state + ready
            return x * 2, corrid.clone(), total, counts.reshape(-1, 1), total

    return torch.jit.script(RaggedSequence())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    make_models.write_model(repo, "ragged_seq_onnx", _onnx_model(), ONNX_CONFIG)
    make_models.write_torch_model(repo, "ragged_seq_torch", _torch_model(), TORCH_CONFIG)
    # the first batch waits for all five requests, so the batches are known
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITONSERVER_DELAY_SCHEDULER", "5")
        with running_server(repo, tmp_path_factory=tmp_path_factory) as proc:
            yield proc


@pytest.mark.parametrize(("model", "suffix"), [("ragged_seq_onnx", ("", "", "", "", "")),
                                               ("ragged_seq_torch", ("__0", "__0", "__1",
                                                                     "__2", "__3"))])
def test_ragged_sequence_batches(server: ServerProcess, model: str,
                                 suffix: tuple[str, ...]) -> None:
    inp, out, corr, count, elems = (n + s for n, s in zip(
        ("INPUT", "OUTPUT", "CORR", "COUNT", "ELEMS"), suffix, strict=True))
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    # (request id, sequence, width, start, end), in the order the stream carries them: A, B
    # and C take slots 0, 1 and 2; B ends in the first batch, so the second has A, a padding
    # row for slot 1, and C
    sent = [("a1", 101, 2, True, False), ("b1", 102, 3, True, True),
            ("c1", 103, 4, True, False), ("a2", 101, 5, False, True),
            ("c2", 103, 1, False, True)]
    data = {}
    for rid, sid, width, start, end in sent:
        x = np.arange(1, width + 1, dtype=np.float32).reshape(1, width) + sid
        data[rid] = x
        i = grpcclient.InferInput(inp, [1, width], "FP32")
        i.set_data_from_numpy(x)
        client.async_stream_infer(model, [i], sequence_id=sid, sequence_start=start,
                                  sequence_end=end, request_id=rid)
    answers = {}
    for _ in sent:
        result, error = results.get(timeout=60)
        assert error is None, error
        answers[result.get_response().id] = result
    client.stop_stream()
    for rid, sid, width, _start, _end in sent:
        r = answers[rid]
        np.testing.assert_array_equal(r.as_numpy(out), data[rid] * 2)
        assert r.as_numpy(corr).tolist() == [[sid]]
        assert r.as_numpy(count).tolist() == [[2.0 if rid.endswith("2") else 1.0]]
        assert r.as_numpy(elems).tolist() == [[float(width)]]
    stats = client.get_inference_statistics(model).model_stats[0]
    assert (stats.execution_count, stats.inference_count) == (2, 5)
    # both batches have three rows: the second's padding row counts, as Triton's null request
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(3, 2)]
    client.close()

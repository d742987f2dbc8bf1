"""Triton's TRITONSERVER_DELAY_SCHEDULER hook end to end: started with it in its environment,
the server's dynamic and sequence batchers form their first batch only once that many
requests are queued, so requests sent one after another share one batch (Triton's
L0_batcher and L0_sequence_batcher rely on it to check batch sizes)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, make_models

pytestmark = pytest.mark.e2e


def _input(value: int) -> httpclient.InferInput:
    i = httpclient.InferInput("INPUT0", [1, 1], "INT32")
    i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return i


def test_batchers_wait_for_the_queued_count(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    make_models.write_model(
        repo, "ident", make_models.build_identity("INT32", ["batch", 1]),
        make_models.config_text("ident", [("INPUT0", "INT32", [1])],
                                [("OUTPUT0", "INT32", [1])], 8,
                                "dynamic_batching { }\n"))
    make_models.write_sequence_accumulator(repo, "acc", max_batch_size=4)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    proc = ServerProcess(repo, log_path=tmp_path / "server.log")
    try:
        proc.wait_ready()
        client = httpclient.InferenceServerClient(proc.url, concurrency=4)
        # sent one at a time, each waiting 0.2 s: without the hook each would run alone
        handles = []
        for v in range(3):
            handles.append(client.async_infer("ident", [_input(v)]))
            threading.Event().wait(0.2)
        assert [h.get_result().as_numpy("OUTPUT0").tolist() for h in handles] == [
            [[0]], [[1]], [[2]]]
        stats = client.get_inference_statistics("ident")["model_stats"][0]
        assert stats["execution_count"] == 1
        assert [(b["batch_size"], b["compute_infer"]["count"])
                for b in stats["batch_stats"]] == [(3, 1)]
        # released for good: a lone request now runs alone
        assert client.infer("ident", [_input(7)]).as_numpy("OUTPUT0").tolist() == [[7]]

        # the sequence batcher: three sequences' START requests wait for each other
        seq = []
        for sid in (1, 2, 3):
            i = httpclient.InferInput("INPUT", [1, 1], "INT32")
            i.set_data_from_numpy(np.array([[sid]], dtype=np.int32))
            seq.append(client.async_infer("acc", [i], sequence_id=sid, sequence_start=True,
                                          sequence_end=True))
            threading.Event().wait(0.2)
        assert [h.get_result().as_numpy("OUTPUT").tolist() for h in seq] == [
            [[1]], [[2]], [[3]]]
        stats = client.get_inference_statistics("acc")["model_stats"][0]
        assert stats["execution_count"] == 1 and stats["inference_count"] == 3
        client.close()
    finally:
        proc.stop()
    assert "Delaying scheduler for ident until 3 queued requests" in proc.log()


def test_ragged_requests_share_a_batch(tmp_path: Path) -> None:
    """Triton's L0_batcher ragged case: an identity ONNX model whose input is declared [-1]
    without a batch dim, served with max_batch_size 8, allow_ragged_batch on its input and a
    BATCH_SCATTER_WITH_INPUT_SHAPE output: requests of different lengths run in one batch
    (the model sees their elements one after another) and each gets its own part back."""
    repo = tmp_path / "repo"
    make_models.write_model(
        repo, "ragged", make_models.build_identity("FP32", ["n"]),
        'name: "ragged"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] '
        "allow_ragged_batch: true } ]\n"
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'batch_output [ { target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
        'source_input: "INPUT0" } ]\n'
        "dynamic_batching { preferred_batch_size: [ 2 ] "
        "max_queue_delay_microseconds: 5000000 }\n")
    proc = ServerProcess(repo, log_path=tmp_path / "server.log")
    try:
        proc.wait_ready()
        client = httpclient.InferenceServerClient(proc.url, concurrency=2)
        sent = [np.arange(16, dtype=np.float32).reshape(1, 16),
                np.arange(100, 108, dtype=np.float32).reshape(1, 8)]
        handles = []
        for x in sent:
            i = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            handles.append(client.async_infer("ragged", [i]))
        for x, handle in zip(sent, handles, strict=True):
            np.testing.assert_array_equal(handle.get_result().as_numpy("OUTPUT0"), x)
        stats = client.get_inference_statistics("ragged")["model_stats"][0]
        assert stats["execution_count"] == 1
        assert [(b["batch_size"], b["compute_infer"]["count"])
                for b in stats["batch_stats"]] == [(2, 1)]
        client.close()
    finally:
        proc.stop()

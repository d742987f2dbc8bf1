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

"""--arrival-log (nursery only): the server records real tritonclient traffic, the simulator
replays it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy
from nursery.simulate import arrivals, report
from nursery.simulate.cost import CostTable
from nursery.simulate.engine import simulate
from tests.conftest import ServerProcess, make_models

pytestmark = pytest.mark.e2e


def test_arrival_log_records_requests_for_replay(start_server: type[ServerProcess],
                                                 tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_models.write_mlp(repo, max_batch_size=8)
    log_path = tmp_path / "arrivals.jsonl"
    server = start_server(repo, "--arrival-log", str(log_path))
    client = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = np.zeros((3, 784), np.float32)
    inp = httpclient.InferInput("INPUT0", [3, 784], "FP32")
    inp.set_data_from_numpy(x)
    for _ in range(4):
        client.infer("mlp", [inp])
    g_inp = grpcclient.InferInput("INPUT0", [1, 784], "FP32")
    g_inp.set_data_from_numpy(x[:1])
    grpc.infer("mlp", [g_inp], priority=2, timeout=70_000)
    bad = httpclient.InferInput("INPUT0", [1, 5], "FP32")  # rejected before queueing: not logged
    bad.set_data_from_numpy(np.zeros((1, 5), np.float32))
    with pytest.raises(InferenceServerException, match="unexpected shape"):
        client.infer("mlp", [bad])
    client.close()
    grpc.close()
    assert server.stop() == 0  # the log is written out when the server stops
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(lines) == 5
    assert [(e["model"], e["version"], e["batch_size"]) for e in lines] == [("mlp", "1", 3)] * 4 + [
        ("mlp", "1", 1)]
    assert (lines[-1]["priority"], lines[-1]["timeout_us"]) == (2, 70_000)
    assert all(e["sequence_id"] == 0 and e["sequence_start"] is False for e in lines)
    times = [e["time"] for e in lines]
    assert times == sorted(times) and times[0] > 0
    requests = arrivals.read_trace(log_path)
    assert [r.batch_size for r in requests] == [3, 3, 3, 3, 1]
    result = simulate(DynamicBatchPolicy(BatchConfig(max_batch_size=8)), requests,
                      CostTable.constant(0.001))
    summary = report.summarize(result)
    assert summary["completed"] == 5 and summary["unanswered"] == 0


def test_arrival_log_unwritable_is_a_clear_startup_error(start_server: type[ServerProcess],
                                                        tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_models.write_mlp(repo, max_batch_size=8)
    server = start_server(repo, "--arrival-log", str(tmp_path / "no" / "such" / "dir.jsonl"),
                          wait=False)
    assert server.wait_exit(60) == 1
    assert "cannot open the arrival log" in server.log()

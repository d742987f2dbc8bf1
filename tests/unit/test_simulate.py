"""The simulator: exact queueing figures, determinism, conservation, cost tables, traces, CLI."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.scheduling.batch_policy import BatchConfig, DynamicBatchPolicy, QueuePolicy
from nursery.scheduling.decisions import Dispatch, Poll
from nursery.scheduling.fifo import FifoPolicy
from nursery.simulate import arrivals, cli, cost, policies, report
from nursery.simulate.arrivals import SimRequest
from nursery.simulate.cost import CostTable, parse_duration
from nursery.simulate.engine import SimulationError, simulate
from tests.conftest import ROOT


def _at(*times: float, **fields: int) -> list[SimRequest]:
    return [SimRequest(i, t, **fields) for i, t in enumerate(times)]


# -- exact, hand-computed cases ----------------------------------------------------------------

def test_fifo_constant_cost_matches_the_hand_computed_queue() -> None:
    # one instance, 10 ms per request; arrivals at 0, 0, 5 and 30 ms:
    # r0 runs 0-10 (10 ms), r1 10-20 (20 ms), r2 20-30 (25 ms, queued 15), r3 30-40 (10 ms)
    policy, slots = policies.build("fifo", BatchConfig(max_batch_size=0), 1)
    result = simulate(policy, _at(0.0, 0.0, 0.005, 0.030), CostTable.constant(0.010),
                      instances=1, slots=slots, overhead=0.001)
    starts = [o.started for o in result.outcomes]
    assert starts == [0.0, 0.010, 0.020, 0.030]
    assert [o.finished for o in result.outcomes] == [0.011, 0.021, 0.031, 0.041]
    s = report.summarize(result)
    assert (s["completed"], s["rejected"], s["timed_out"], s["unanswered"]) == (4, 0, 0, 0)
    assert s["throughput"] == pytest.approx(4 / 0.041)
    lat = s["latency_ms"]  # 11, 21, 26, 11 ms with the 1 ms overhead; nearest rank
    assert lat["p50"] == pytest.approx(11.0)
    assert lat["p90"] == lat["p99"] == lat["max"] == pytest.approx(26.0)
    assert lat["mean"] == pytest.approx((11 + 21 + 26 + 11) / 4)
    assert s["queue_ms"]["max"] == pytest.approx(15.0)
    assert s["batch_size_histogram"] == {"1": 4}
    assert s["utilization"] == pytest.approx(0.040 / 0.041)


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.sampled_from([0.0, 0.001, 0.0025, 0.004, 0.02]), min_size=1,
                     max_size=40),
       service=st.sampled_from([0.001, 0.003, 0.005]))
def test_fifo_single_instance_follows_lindley(gaps: list[float], service: float) -> None:
    """Any arrivals, one instance, constant cost: start = max(arrival, previous end)."""
    times, t = [], 0.0
    for g in gaps:
        t += g
        times.append(t)
    policy, slots = policies.build("fifo", BatchConfig(max_batch_size=0), 1)
    result = simulate(policy, _at(*times), CostTable.constant(service), slots=slots)
    end = 0.0
    for outcome, arrival in zip(result.outcomes, times, strict=True):
        start = max(arrival, end)
        end = start + service
        assert (outcome.status, outcome.started, outcome.finished) == ("completed", start, end)


def test_dynamic_batcher_waits_its_delay_then_sends_one_batch() -> None:
    # max batch 4, delay 1 ms: three requests by 0.4 ms leave together at 1 ms, cost 2 ms
    batch = BatchConfig(max_batch_size=4, max_queue_delay_us=1000)
    result = simulate(DynamicBatchPolicy(batch), _at(0.0, 0.0002, 0.0004, 0.0100),
                      CostTable.parse("1:1ms,4:2.5ms"))
    assert [o.started for o in result.outcomes] == [0.001, 0.001, 0.001, 0.011]
    assert [b.rows for b in result.batches] == [3, 1]
    assert result.outcomes[0].finished == pytest.approx(0.001 + 0.002)  # 3 rows: interpolated
    assert report.summarize(result)["batch_size_histogram"] == {"1": 1, "3": 1}


def test_timeouts_and_full_queues_are_counted_apart() -> None:
    # one instance, 10 ms a request; a 2-request queue that rejects after 5 ms. The three
    # requests of t=0 arrive before the policy decides (as in the actor): the third finds the
    # queue full, the second times out at 5 ms, the fourth (12 ms) finds the instance free.
    batch = BatchConfig(max_batch_size=1, default_queue_policy=QueuePolicy(
        default_timeout_us=5000, max_queue_size=2))
    result = simulate(DynamicBatchPolicy(batch), _at(0, 0, 0, 0.012), CostTable.constant(0.010))
    s = report.summarize(result)
    assert (s["completed"], s["rejected"], s["timed_out"]) == (2, 1, 1)
    assert [o.status for o in result.outcomes] == ["completed", "timed_out", "rejected",
                                                    "completed"]


# -- determinism and conservation --------------------------------------------------------------

BATCH_POLICIES = ["adaptive", "dynamic", "edf", "fifo"]  # built only from a BatchConfig


@pytest.mark.parametrize("spec", BATCH_POLICIES)
def test_same_seed_same_figures(spec: str) -> None:
    batch = BatchConfig(max_batch_size=8, max_queue_delay_us=500,
                        default_queue_policy=QueuePolicy(default_timeout_us=20_000))

    def once(seed: int) -> dict[str, object]:
        policy, slots = policies.build(spec, batch, 2)
        reqs = arrivals.poisson(3000, duration=0.5, seed=seed)
        return report.summarize(simulate(policy, reqs, CostTable.parse("1:0.5ms,8:1.5ms"),
                                         instances=2, slots=slots))

    first = once(7)
    assert once(7) == first
    assert once(8) != first


@settings(max_examples=40, deadline=None)
@given(spec=st.sampled_from(BATCH_POLICIES), rate=st.sampled_from([200, 2000, 20000]),
       instances=st.integers(1, 3), seed=st.integers(0, 1000),
       delay=st.sampled_from([0, 300, 3000]), timeout=st.sampled_from([0, 1000, 10_000]),
       queue=st.sampled_from([0, 4]), reject=st.booleans(),
       rows=st.integers(1, 3), priority=st.integers(0, 2))
def test_every_arrival_ends_completed_rejected_or_timed_out(
        spec: str, rate: int, instances: int, seed: int, delay: int, timeout: int, queue: int,
        reject: bool, rows: int, priority: int) -> None:
    batch = BatchConfig(max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_us=delay,
                        priority_levels=2, default_priority_level=2,
                        default_queue_policy=QueuePolicy(reject, timeout, True, queue))
    policy, slots = policies.build(spec, batch, instances)
    reqs = arrivals.poisson(rate, count=60, seed=seed,
                            shape=arrivals.RequestShape(rows, priority, timeout // 2))
    result = simulate(policy, reqs, CostTable.parse("1:0.2ms,8:1ms"), instances=instances,
                      slots=slots)
    s = report.summarize(result)
    assert s["unanswered"] == 0
    assert s["completed"] + s["rejected"] + s["timed_out"] == len(reqs) == s["requests"]
    assert sum(b.rows for b in result.batches) == rows * s["completed"]
    for o in result.outcomes:
        if o.status == "completed":
            assert o.request.arrival <= o.dispatched <= o.started < o.finished


# -- the engine refuses a policy that breaks the contract --------------------------------------

class _Greedy(FifoPolicy[SimRequest]):
    def poll(self, now: float) -> Poll[SimRequest]:  # dispatches even with no free slot
        items = tuple(self._queue)
        self._queue.clear()
        return Poll([Dispatch(0, (item,)) for item in items], None)


class _Nagging(FifoPolicy[SimRequest]):
    def poll(self, now: float) -> Poll[SimRequest]:
        return Poll([], now)


def test_contract_breaches_stop_the_simulation() -> None:
    with pytest.raises(SimulationError, match="no free slot"):
        simulate(_Greedy(1), _at(0, 0, 0), CostTable.constant(0.01))
    with pytest.raises(SimulationError, match="polled"):
        simulate(_Nagging(1), _at(0), CostTable.constant(0.01))


# -- cost tables, arrival processes, traces ----------------------------------------------------

def test_cost_table_interpolates_and_extrapolates() -> None:
    table = CostTable.parse("1:1ms, 4:2.5ms,8:3.5ms")
    assert table(1) == 0.001 and table(4) == 0.0025
    assert table(2) == pytest.approx(0.0015)
    assert table(6) == pytest.approx(0.003)
    assert table(16) == pytest.approx(0.0055)  # the last segment continued
    assert CostTable.parse("2ms")(50) == 0.002
    assert parse_duration("250us") == pytest.approx(0.00025)
    for bad in ("1:1ms,x", "0:1ms", "1:-1ms"):
        with pytest.raises(ValueError, match="cost table"):
            CostTable.parse(bad)


def test_overhead_percentiles_are_sampled_per_request() -> None:
    assert cost.parse_overhead("0.5ms") == pytest.approx(0.0005)
    draw = cost.parse_overhead("50:1ms,90:2ms,99:4ms", seed=1)
    assert callable(draw)
    values = sorted(draw(None) for _ in range(20_000))
    assert values[0] == pytest.approx(0.001) and values[-1] == pytest.approx(0.004)
    assert report.percentile(values, 70) == pytest.approx(0.0015, rel=0.05)
    again = cost.parse_overhead("50:1ms,90:2ms,99:4ms", seed=1)
    assert sorted(again(None) for _ in range(20_000)) == values
    with pytest.raises(ValueError, match="percentile"):
        cost.parse_overhead("50:1ms,x")
    with pytest.raises(ValueError, match="strictly between"):
        cost.parse_overhead("100:1ms")
    result = simulate(FifoPolicy(1), _at(0.0, 1.0), CostTable.constant(0.01),
                      overhead=lambda r: 0.001 * (r.id + 1))
    assert [o.finished for o in result.outcomes] == [0.011, 1.012]


def test_arrival_processes() -> None:
    p = arrivals.poisson(1000, duration=2.0, seed=3)
    assert 1800 < len(p) < 2200 and all(0 <= r.arrival < 2.0 for r in p)
    assert [r.arrival for r in p] == sorted(r.arrival for r in p)
    assert [r.arrival for r in arrivals.constant(4, count=3)] == [0.0, 0.25, 0.5]
    b = arrivals.bursts(3, 0.1, count=7)
    assert [r.arrival for r in b] == [0.0] * 3 + [0.1] * 3 + [0.2]
    seqs = arrivals.sequences(200, length=3, gap=0.01, count=30, seed=2)
    assert len(seqs) == 30 and len({r.sequence_id for r in seqs}) == 10
    for sid in range(1, 11):
        steps = [r for r in seqs if r.sequence_id == sid]
        assert [(r.sequence_start, r.sequence_end) for r in steps] == [
            (True, False), (False, False), (False, True)]
        assert [r.arrival for r in steps] == sorted(r.arrival for r in steps)
    with pytest.raises(ValueError, match="rate must be positive"):
        arrivals.poisson(0, count=3)


def test_trace_files_json_lines_and_csv(tmp_path: Path) -> None:
    lines = [{"time": 10.5, "model": "a", "batch_size": 2, "priority": 1, "timeout_us": 300,
              "sequence_id": 7, "sequence_start": True, "sequence_end": False},
             {"time": 10.0, "model": "b"},
             {"time": 10.25, "model": "a", "sequence_id": "corr", "sequence_end": True}]
    path = tmp_path / "arrivals.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    reqs = arrivals.read_trace(path)
    assert [(r.arrival, r.model) for r in reqs] == [(0.0, "b"), (0.25, "a"), (0.5, "a")]
    assert (reqs[2].batch_size, reqs[2].priority, reqs[2].timeout_us) == (2, 1, 300)
    assert (reqs[2].sequence_id, reqs[2].sequence_start) == (7, True)
    assert (reqs[1].sequence_id, reqs[1].sequence_end) == ("corr", True)
    assert [r.arrival for r in arrivals.read_trace(path, model="a")] == [0.0, 0.25]
    csv_path = tmp_path / "arrivals.csv"
    csv_path.write_text("time,model,batch_size,sequence_start\n1.0,a,4,true\n1.5,a,,\n")
    reqs = arrivals.read_trace(csv_path)
    assert [(r.arrival, r.batch_size, r.sequence_start) for r in reqs] == [
        (0.0, 4, True), (0.5, 1, False)]
    (tmp_path / "bad.jsonl").write_text('{"model": "a"}\n')
    with pytest.raises(ValueError, match="no 'time'"):
        arrivals.read_trace(tmp_path / "bad.jsonl")


def test_policies_by_name_and_import_path() -> None:
    batch = BatchConfig(max_batch_size=4)
    assert isinstance(policies.build("server", batch, 1)[0], FifoPolicy)  # no model config
    assert policies.build("fifo", batch, 1)[1] == 2  # the server's default-scheduler slots
    policy, slots = policies.build("nursery.scheduling.edf:EarliestDeadlinePolicy", batch, 1)
    assert type(policy).__name__ == "EarliestDeadlinePolicy" and slots == 1
    for bad, message in (("nope", "unknown policy"), ("no.such.module:X", "cannot import"),
                         ("nursery.scheduling.edf:Nope", "has no"),
                         ("nursery.scheduling.decisions:W", "not a class"),
                         ("nursery.scheduling.decisions:Poll", "no arrive"),
                         ("sequence", "sequence")):
        with pytest.raises((ValueError, TypeError), match=message):
            policies.build(bad, batch, 1)


# -- the command line --------------------------------------------------------------------------

def test_cli_sweep_writes_json_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_csv = tmp_path / "r.json", tmp_path / "r.csv"
    rc = cli.main(["--max-batch-size", "8", "--max-queue-delay-us", "200", "--cost",
                   "1:0.5ms,8:2ms", "--policy", "fifo", "--policy", "dynamic", "--rate",
                   "500,1500", "--duration", "1", "--instances", "2", "--json", str(out_json),
                   "--csv", str(out_csv), "--plot", str(tmp_path / "p.png")])
    assert rc == 0
    table = capsys.readouterr().out
    assert "dynamic" in table and "p99 ms" in table
    data = json.loads(out_json.read_text())
    assert [(r["policy"], r["rate"]) for r in data["runs"]] == [
        ("fifo", 500.0), ("dynamic", 500.0), ("fifo", 1500.0), ("dynamic", 1500.0)]
    assert data["batch_config"]["max_queue_delay_us"] == 200
    rows = out_csv.read_text().splitlines()
    assert len(rows) == 5 and "latency_ms_p99" in rows[0] and "batch_size_histogram" in rows[0]


def test_cli_errors_are_clear(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--max-batch-size", "4"]) == 1
    assert "cost model" in capsys.readouterr().err
    assert cli.main(["--cost", "1ms"]) == 1
    assert "--model NAME" in capsys.readouterr().err
    assert cli.main(["--max-batch-size", "4", "--cost", "1ms", "--policy", "x.y:Z"]) == 1
    assert "cannot import" in capsys.readouterr().err


def test_python_m_nursery_simulate_reads_the_model_config(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.onnx").write_bytes((ROOT / "model_repository/mlp/1/model.onnx")
                                                  .read_bytes())
    config = (ROOT / "model_repository/mlp/config.pbtxt").read_text().replace('"mlp"', '"m"')
    (repo / "m" / "config.pbtxt").write_text(
        config + "dynamic_batching { max_queue_delay_microseconds: 300 }\n")
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nursery", "simulate", "--model-repository", str(repo),
         "--model", "m", "--profile", "--profile-sizes", "1,8", "--profile-runs", "3",
         "--save-cost", str(tmp_path / "cost.json"), "--rate", "2000", "--duration", "0.5",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    run = data["runs"][0]
    assert run["policy"] == "server" and data["batch_config"]["max_queue_delay_us"] == 300
    assert run["unanswered"] == 0 and run["completed"] == run["requests"] > 0
    assert run["mean_batch_rows"] > 1  # the dynamic batcher batched
    cost = json.loads((tmp_path / "cost.json").read_text())["cost"]
    assert set(cost) == {"1", "8"} and all(v > 0 for v in cost.values())
    assert not math.isnan(run["latency_ms"]["p99"])


def test_frontend_thread_is_one_queue_in_and_out() -> None:
    """Two requests at t=0, a 2 ms frontend (1 ms to decode, 1 ms to encode) and 1 ms of
    compute on one FIFO instance: the second waits for the first's decode; the first's encode
    (t=2..3) goes before the second's (t=3..4), and the overhead adds after both."""
    result = simulate(FifoPolicy(1), _at(0.0, 0.0), CostTable.constant(0.001),
                      frontend=0.002, overhead=0.0005)
    by_id = sorted(result.outcomes, key=lambda o: o.request.id)
    assert [round(o.started, 6) for o in by_id] == [0.001, 0.002]
    assert [round(o.finished, 6) for o in by_id] == [0.0035, 0.0045]
    alone = simulate(FifoPolicy(1), _at(0.0), CostTable.constant(0.001), frontend=0.002)
    assert round(alone.outcomes[0].finished, 6) == 0.003  # decode + compute + encode


def test_idle_gap_is_the_time_since_the_server_last_answered() -> None:
    """One instance, 10 ms per request, arrivals at 0, 5, 30 and 31 ms: r0 finds a fresh
    server (idle 0), r1 finds r0 in the server (0), r2 arrives 10 ms after r1's answer at
    20 ms, r3 finds r2 still running (0); overhead and frontend do not make the server busy."""
    seen: list[tuple[int, float]] = []

    class Recording:
        uses_idle = True

        def __call__(self, request: SimRequest, idle: float) -> float:
            seen.append((request.id, round(idle, 9)))
            return 0.050  # the client's time: long, but not the server's

    result = simulate(FifoPolicy(1), _at(0.0, 0.005, 0.030, 0.031), CostTable.constant(0.010),
                      overhead=Recording())
    assert sorted(seen) == [(0, 0.0), (1, 0.0), (2, 0.010), (3, 0.0)]
    assert [round(o.idle, 9) for o in result.outcomes] == [0.0, 0.0, 0.010, 0.0]
    # with a 2 ms frontend the server answers after encoding: r0 decodes 0-1, runs 1-11,
    # encodes 11-12; r1 decodes 5-6, runs 11-21, encodes 21-22: r2 at 30 finds 8 ms of idle
    result = simulate(FifoPolicy(1), _at(0.0, 0.005, 0.030), CostTable.constant(0.010),
                      frontend=0.002)
    assert [round(o.idle, 9) for o in result.outcomes] == [0.0, 0.0, 0.008]


def test_idle_overhead_draws_warm_when_busy_and_cold_after_long_idle() -> None:
    text = "warm=50:1ms,99:2ms;cold=50:5ms,99:6ms;tau=10ms"
    model = cost.parse_overhead(text, seed=3)
    assert isinstance(model, cost.IdleOverhead) and model.uses_idle
    warm = [model(None, 0.0) for _ in range(2000)]
    assert 0.001 <= min(warm) and max(warm) <= 0.002
    cold = [model(None, 10.0) for _ in range(2000)]  # 1000 tau: asleep for sure
    assert 0.005 <= min(cold) and max(cold) <= 0.006
    # idle for tau: asleep with probability 1 - 1/e
    mixed = [model(None, 0.010) for _ in range(20_000)]
    share = sum(v >= 0.005 for v in mixed) / len(mixed)
    assert share == pytest.approx(1 - math.exp(-1), abs=0.02)
    same1, same2 = cost.parse_overhead(text, seed=5), cost.parse_overhead(text, seed=5)
    assert [same1(None, 0.004) for _ in range(500)] == [same2(None, 0.004) for _ in range(500)]
    assert cost.IdleOverhead.parse(str(model)).tau == pytest.approx(0.010)
    for bad, message in (("warm=50:1ms;tau=1ms", "needs warm"),
                         ("warm=50:1ms;cold=50:2ms;tau=0", "positive"),
                         ("warm=50:1ms;cold=50:2ms;speed=3", "cannot read"),
                         ("warm=50:1ms;cold=x;tau=1ms", "percentile")):
        with pytest.raises(ValueError, match=message):
            cost.parse_overhead(bad)
    # in the engine: a lone request after a long quiet spell pays the cold figure
    result = simulate(FifoPolicy(1), _at(0.0, 5.0), CostTable.constant(0.001),
                      overhead=cost.parse_overhead(text))
    first, second = sorted(result.outcomes, key=lambda o: o.request.id)
    assert first.finished - 0.001 <= 0.002 + 1e-9 and second.finished - 5.001 >= 0.005 - 1e-9


def test_idle_overhead_parts_move_a_share_of_the_way_to_cold() -> None:
    """With several parts each asleep with probability p, the overhead lies asleep/parts of the
    way from warm to cold (at the request's quantile): its mean moves p of the way."""
    text = "warm=50:1ms,99:1ms;cold=50:5ms,99:5ms;tau=10ms;parts=4"
    model = cost.parse_overhead(text, seed=1)
    assert isinstance(model, cost.IdleOverhead) and model.parts == 4
    assert cost.IdleOverhead.parse(str(model)).parts == 4
    assert {model(None, 0.0) for _ in range(200)} == {0.001}
    assert {round(model(None, 10.0), 9) for _ in range(200)} == {0.005}
    values = [model(None, 0.010) for _ in range(20_000)]
    assert {round(v * 1e3, 6) for v in values} == {1.0, 2.0, 3.0, 4.0, 5.0}
    p = 1 - math.exp(-1)
    assert statistics.mean(values) == pytest.approx(0.001 + 0.004 * p, rel=0.02)
    for bad, message in (("warm=50:1ms;cold=50:2ms;tau=1ms;parts=0", "at least one part"),
                         ("warm=50:1ms;cold=50:2ms;tau=1ms;parts=two", "whole number")):
        with pytest.raises(ValueError, match=message):
            cost.parse_overhead(bad)


def test_waking_on_the_frontend_thread_makes_the_next_request_wait() -> None:
    """frontend 2 ms (1 in, 1 out), 1 ms per batch, warm 1 ms, cold 5 ms: r0 wakes a server
    idle for 10 s, r1 comes 0.5 ms later. wake=outside: r0 decodes 10-10.001, runs to 10.002,
    encodes to 10.003, +5 ms outside = 8 ms; r1 decodes 10.001-10.002, runs to 10.003, encodes
    to 10.004, +1 ms = 4.5 ms. wake=frontend: r0's 4 ms of waking are on the frontend thread:
    r0 decodes to 10.005, runs to 10.006, encodes to 10.007, +1 ms = 8 ms; r1 decodes after it
    (to 10.006), runs to 10.007, encodes to 10.008, +1 ms = 8.5 ms."""
    base = "warm=50:1ms,99:1ms;cold=50:5ms,99:5ms;tau=1ms"
    for wake, expected in (("outside", [0.008, 0.0045]), ("frontend", [0.008, 0.0085])):
        result = simulate(FifoPolicy(1), _at(10.0, 10.0005), CostTable.constant(0.001),
                          overhead=cost.parse_overhead(f"{base};wake={wake}"), frontend=0.002)
        latency = [o.finished - o.request.arrival
                   for o in sorted(result.outcomes, key=lambda o: o.request.id)]
        assert latency == pytest.approx(expected, abs=1e-9), wake
    # tail: everything above the warm median runs on the frontend, the rest outside
    model = cost.parse_overhead("warm=50:1ms,99:3ms;cold=50:5ms,99:6ms;tau=1ms;wake=tail", 2)
    assert isinstance(model, cost.IdleOverhead) and "wake=tail" in str(model)
    for idle in (0.0, 10.0):
        for _ in range(300):
            inside, outside = model.split(None, idle)
            assert inside >= 0 and 0 < outside <= 0.001 + 1e-12
            assert (inside + outside) <= (0.003 if idle == 0 else 0.006) + 1e-12
    # the warm share it charges the frontend: the tail above 1 ms, rising linearly to 2 ms more
    # from the median to p99, 2 ms beyond: 0.49 * 1 ms + 0.01 * 2 ms = 0.51 ms on average
    assert model.warm_frontend_mean() == pytest.approx(0.00051, rel=1e-3)
    assert cost.parse_overhead(f"{base};wake=frontend").warm_frontend_mean() == 0.0
    with pytest.raises(ValueError, match="expected outside, frontend or tail"):
        cost.parse_overhead(f"{base};wake=inside")


def test_frontend_wake_is_paid_only_by_a_request_that_finds_the_thread_idle() -> None:
    """frontend 2 ms (1 in, 1 out), wake 3 ms, 1 ms per batch; arrivals at 0 and 0.5 ms: r0
    finds the thread idle and decodes 0-4, runs 4-5; r1 found it busy: decodes 4-5, runs 5-6;
    r0's answer is encoded 5-6, r1's 6-7: latencies 6 and 6.5 ms."""
    result = simulate(FifoPolicy(1), _at(0.0, 0.0005), CostTable.constant(0.001),
                      frontend=0.002, frontend_wake=0.003)
    latency = [o.finished - o.request.arrival
               for o in sorted(result.outcomes, key=lambda o: o.request.id)]
    assert latency == pytest.approx([0.006, 0.0065], abs=1e-9)


def test_frontend_batch_work_brackets_each_batch_on_the_frontend_thread() -> None:
    """frontend 2 ms (1 in, 1 out), 4 ms per batch (2 to hand it over, 2 to collect it), 1 ms
    of compute, one FIFO instance, two requests at 0: r0 decodes 0-1, r1 1-2; r0's batch is
    handed over once the thread is free, 2-4, runs 4-5, is collected 5-7; then the instance is
    free and r0's answer encoded 7-8; r1's batch is handed over 8-10, runs 10-11, collected
    11-13, encoded 13-14."""
    result = simulate(FifoPolicy(1), _at(0.0, 0.0), CostTable.constant(0.001),
                      frontend=0.002, frontend_batch=0.004)
    by_id = sorted(result.outcomes, key=lambda o: o.request.id)
    assert [o.started for o in by_id] == pytest.approx([0.004, 0.010], abs=1e-9)
    assert [o.finished for o in by_id] == pytest.approx([0.008, 0.014], abs=1e-9)
    alone = simulate(FifoPolicy(1), _at(0.0), CostTable.constant(0.001), frontend_batch=0.004)
    assert alone.outcomes[0].finished == pytest.approx(0.005)  # hand over, compute, collect
    # one batch of two pays it once: both arrive at 0, hand over 0-2, run 2-3, collect 3-5
    batch = BatchConfig(max_batch_size=2, max_queue_delay_us=0)
    shared = simulate(DynamicBatchPolicy(batch), _at(0.0, 0.0), CostTable.constant(0.001),
                      frontend_batch=0.004)
    assert [b.rows for b in shared.batches] == [2]
    assert [o.finished for o in shared.outcomes] == pytest.approx([0.005, 0.005], abs=1e-9)


def test_timer_queues_waits_for_the_frontend_thread() -> None:
    """Dynamic batcher, max 4 rows, 1 ms delay; frontend 4 ms (2 in, 2 out), 1 ms per batch;
    arrivals at 0 and 0.5 ms. r0 is decoded 0-2, r1 2-4. Without timer_queues the deadline
    (2 + 1 ms) sends r0 alone at 3; with it the scheduler runs once the thread is free, at 4,
    and r1, decoded by then, goes in the same batch."""
    batch = BatchConfig(max_batch_size=4, max_queue_delay_us=1000)
    rows = []
    for queues in (False, True):
        result = simulate(DynamicBatchPolicy(batch), _at(0.0, 0.0005),
                          CostTable.constant(0.001), frontend=0.004, timer_queues=queues)
        rows.append([(b.rows, round(b.started, 6)) for b in result.batches])
    assert rows[0] == [(1, 0.003), (1, 0.005)]
    assert rows[1] == [(2, 0.004)]
    assert cli.main(["--max-batch-size", "4", "--cost", "1ms", "--frontend", "4ms",
                     "--frontend-batch", "1ms", "--timer-queues", "--rate", "100",
                     "--duration", "1", "--quiet"]) == 0
    assert cli.main(["--max-batch-size", "4", "--cost", "1ms", "--frontend-batch=-1ms",
                     "--rate", "100", "--quiet"]) == 1


def test_contention_stretches_the_overhead_of_a_request_that_finds_others_in_the_server() -> None:
    """Two requests at once, 1 ms each, 2 ms of overhead, contention 0.5: r0 finds nobody
    (runs 0-1, +2 ms = 3 ms); r1 finds r0 (runs 1-2, +2 * 1.5 ms = 5 ms)."""
    for overhead in (0.002, cost.parse_overhead("warm=50:2ms,99:2ms;cold=50:2ms,99:2ms;tau=1ms")):
        result = simulate(FifoPolicy(1), _at(0.0, 0.0), CostTable.constant(0.001),
                          overhead=overhead, contention=0.5)
        latency = [o.finished - o.request.arrival
                   for o in sorted(result.outcomes, key=lambda o: o.request.id)]
        assert latency == pytest.approx([0.003, 0.005], abs=1e-9)
        assert sorted(o.concurrent for o in result.outcomes) == [0, 1]


def test_cli_takes_the_idle_overhead(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Lower rates find the server idle longer: with a cold figure far above the warm one,
    p50 falls as the rate rises (what a fixed overhead cannot show)."""
    out_json = tmp_path / "r.json"
    rc = cli.main(["--max-batch-size", "8", "--cost", "0.1ms", "--policy", "fifo", "--rate",
                   "20,2000", "--duration", "5", "--overhead",
                   "warm=50:1ms,99:1.2ms;cold=50:3ms,99:3.5ms;tau=5ms", "--json", str(out_json)])
    assert rc == 0
    low, high = json.loads(out_json.read_text())["runs"]
    assert low["latency_ms"]["p50"] > 2.9 and high["latency_ms"]["p50"] < 1.5
    # --inherit-idle: requests that arrive behind a waking one are cold too; at a rate where
    # they often do, the tail grows (and the flag is recorded with the figures)
    tails = []
    for extra in ([], ["--inherit-idle"]):
        assert cli.main(["--max-batch-size", "1", "--cost", "1ms", "--policy", "fifo",
                         "--rate", "300", "--duration", "5", "--overhead",
                         "warm=50:1ms,99:1ms;cold=50:3ms,99:3ms;tau=1ms", "--json",
                         str(out_json), *extra]) == 0
        result = json.loads(out_json.read_text())
        assert result["inherit_idle"] == bool(extra)
        tails.append(result["runs"][0]["latency_ms"]["p90"])
    assert tails[1] > tails[0] + 0.5
    assert cli.main(["--max-batch-size", "8", "--cost", "1ms", "--overhead",
                     "warm=50:1ms;tau=1"]) == 1
    assert "needs warm=..., cold=... and tau=..." in capsys.readouterr().err


def test_inherit_idle_makes_a_request_behind_the_waking_one_cold_too() -> None:
    """1 ms per request, overhead 1 ms warm and 5 ms cold (any idle time makes it cold).
    Arrivals at 10, 10.0005 and 10.0015 s: r0 woke the server (cold): runs 10-10.001, +5 ms =
    6 ms. r1 came while r0 was in the server: warm by default (runs 10.001-10.002, +1 ms =
    2.5 ms); with inherit_idle as cold as r0 (+5 ms = 6.5 ms). r2 came after r0 was answered:
    warm either way (runs 10.002-10.003, +1 ms = 2.5 ms)."""
    model = "warm=50:1ms,99:1ms;cold=50:5ms,99:5ms;tau=0.001us"
    for inherit, expected in ((False, [0.006, 0.0025, 0.0025]), (True, [0.006, 0.0065, 0.0025])):
        result = simulate(FifoPolicy(1), _at(10.0, 10.0005, 10.0015), CostTable.constant(0.001),
                          overhead=cost.parse_overhead(model), inherit_idle=inherit)
        outcomes = sorted(result.outcomes, key=lambda o: o.request.id)
        latency = [o.finished - o.request.arrival for o in outcomes]
        assert latency == pytest.approx(expected, abs=1e-9), inherit
        assert [o.idle > 0 for o in outcomes] == [True, inherit, False]


def test_cli_latency_policy_needs_an_objective_and_reports_goodput(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--max-batch-size", "8", "--cost", "1:2ms,8:4ms", "--policy",
                     "latency"]) == 1
    assert "policy 'latency' needs an objective" in capsys.readouterr().err
    assert cli.main(["--max-batch-size", "8", "--cost", "1:2ms,8:4ms", "--policy", "dynamic",
                     "--policy", "latency", "--latency-objective-ms", "20", "--rate", "4000",
                     "--count", "2000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "good/s"
    good = {line.split()[0]: float(line.split()[-1]) for line in lines[1:]}
    # twice the capacity (8 rows per 4 ms): the dynamic batcher's queue makes almost every
    # answer late, the latency batcher sheds the excess and answers the rest in time
    assert good["latency"] > 10 * good["dynamic"]

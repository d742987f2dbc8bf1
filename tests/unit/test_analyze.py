"""``python -m nursery analyze`` without a server: the search space, the candidate configs,
the closed loop on the simulator, the ranking, the report, and bad input refused before
anything is written."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from nursery.analyze import report, search, space
from nursery.analyze.cli import main
from nursery.analyze.search import Calibration, Goal, Load
from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.scheduling.latency_objective import Objective
from nursery.simulate import arrivals, cost
from nursery.simulate.engine import simulate
from nursery.simulate.policies import build
from tests.conftest import ROOT

ADD_SUB = ROOT / "model_repository" / "add_sub"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(ADD_SUB, tmp_path / "repo" / "add_sub")
    return tmp_path / "repo"


def _model(path: Path = ADD_SUB) -> object:
    return read_model_config(path, path.name, backends=get_factory)[0]


def _calibration(per_batch: float = 0.002, per_row: float = 0.0005) -> Calibration:
    table = cost.CostTable(((1, per_batch + per_row), (8, per_batch + 8 * per_row)))
    return Calibration(table, 0.0001, 0.0002, "50:0.2ms,99:0.5ms")


# -- the space and the configs ---------------------------------------------------------------

def test_grid_stays_within_the_models_max_batch_size() -> None:
    model = _model()
    grid = space.grid(model, instances=[1, 2], max_batch_sizes=None, delays_us=[0, 500],
                      objective=Objective(0.01))
    assert {c.max_batch_size for c in grid} == {1, 2, 4, 8}
    assert {c.policy for c in grid} == {"fifo", "dynamic", "latency"}
    assert {c.instances for c in grid} == {1, 2}
    assert len(grid) == len(set(grid))
    assert not [c for c in space.grid(model, instances=[1], max_batch_sizes=None,
                                      delays_us=[0], objective=None) if c.policy == "latency"]
    with pytest.raises(ValueError, match="between 1 and the model's max_batch_size 8"):
        space.grid(model, instances=[1], max_batch_sizes=[16], delays_us=[0], objective=None)


@pytest.mark.parametrize("candidate", [
    space.Candidate("fifo", 2, 8),
    space.Candidate("dynamic", 1, 4, 500, 2),
    space.Candidate("latency", 3, 8),
])
def test_candidate_configs_load_and_keep_the_rest(tmp_path: Path,
                                                  candidate: space.Candidate) -> None:
    original = (ADD_SUB / "config.pbtxt").read_text()
    text = space.config_text(original, candidate, Objective(0.02, 95.0))
    shutil.copytree(ADD_SUB, tmp_path / "add_sub")
    (tmp_path / "add_sub" / "config.pbtxt").write_text(text)
    model = read_model_config(tmp_path / "add_sub", "add_sub", backends=get_factory)[0]
    assert len(model.placements()) == candidate.instances
    assert model.max_batch_size == candidate.max_batch_size
    assert [t.name for t in model.inputs] == ["INPUT0", "INPUT1"]
    if candidate.policy == "dynamic":
        assert model.batching is not None and model.objective is None
        assert model.batching.max_queue_delay_us == 500
        assert model.batching.preferred_batch_sizes == (2,)
    elif candidate.policy == "latency":
        assert model.objective == Objective(0.02, 95.0) and model.batching is None
    else:
        assert model.batching is None and model.objective is None


def test_a_dynamic_candidate_drops_the_latency_parameters() -> None:
    original = space.config_text((ADD_SUB / "config.pbtxt").read_text(),
                                 space.Candidate("latency", 1, 8), Objective(0.02))
    text = space.config_text(original, space.Candidate("dynamic", 1, 8, 100), None)
    assert "nursery." not in text and "dynamic_batching" in text


# -- the simulator: a closed loop --------------------------------------------------------------

@pytest.mark.parametrize("clients", [1, 3, 8])
def test_a_closed_loop_never_has_more_requests_out_than_clients(clients: int) -> None:
    policy, slots = build("dynamic", _model().batching or space.Candidate(
        "dynamic", 1, 8).batch_config(_model()), 1)  # type: ignore[arg-type]
    load = Load("concurrency", clients)
    follow = search._closed_loop(clients, 300)
    result = simulate(policy, search.requests_for(load, 300, 0, None), _calibration().cost,
                      slots=slots, overhead=0.0003, closed_loop=follow)
    assert len(result.outcomes) == 300
    assert all(o.status == "completed" for o in result.outcomes)
    events = sorted([(o.request.arrival, 1) for o in result.outcomes]
                    + [(o.finished, -1) for o in result.outcomes])
    out = peak = 0
    for _, step in events:
        out += step
        peak = max(peak, out)
    assert peak == clients


# -- search and ranking ----------------------------------------------------------------------

def test_search_ranks_candidates_that_meet_the_budget_first() -> None:
    model = _model()
    goal = Goal(0.030, 99.0)
    candidates = space.grid(model, instances=[1], max_batch_sizes=[1, 8], delays_us=[0, 2000],
                            objective=goal.objective())
    ranked = search.search(candidates, model, _calibration(), [Load("rate", 300),
                                                               Load("rate", 1200)], goal,
                           count=600)
    assert ranked[0].meets
    meets = [s.meets for s in ranked]
    assert meets == sorted(meets, reverse=True)  # every one that meets comes first
    # a batch of one takes 2.5 ms: 1200/s is three times what one row a batch can do
    one_row = [s for s in ranked if s.candidate.max_batch_size == 1]
    assert one_row and not any(s.meets for s in one_row)


def test_an_impossible_budget_meets_nothing_and_ranks_the_closest_first() -> None:
    model = _model()
    goal = Goal(0.0005, 99.0)  # below one batch's execution time
    candidates = space.grid(model, instances=[1], max_batch_sizes=[8], delays_us=[0, 2000],
                            objective=goal.objective(), policies=["dynamic"])
    ranked = search.search(candidates, model, _calibration(), [Load("rate", 100)], goal,
                           count=300)
    assert not any(s.meets for s in ranked)
    overs = [s.over for s in ranked]
    assert overs == sorted(overs) and overs[0] > 1


# -- the report ------------------------------------------------------------------------------

def test_report_files(tmp_path: Path) -> None:
    model = _model()
    goal = Goal(0.05, 99.0)
    loads = [Load("concurrency", 2), Load("rate", 500)]
    candidates = space.grid(model, instances=[1, 2], max_batch_sizes=[4, 8], delays_us=[0, 500],
                            objective=goal.objective())
    ranked = search.search(candidates, model, _calibration(), loads, goal, count=200)
    chosen = ranked[0]
    chosen.measured = [{"throughput": 100.0, "p50_ms": 1.0, "p90_ms": 1.5, "p99_ms": 2.0},
                       {"error": "perf_analyzer stopped"}]
    report.candidates_csv(tmp_path / "c.csv", ranked)
    rows = (tmp_path / "c.csv").read_text().splitlines()
    assert len(rows) == 1 + len(ranked) * len(loads)
    report.plot_svg(tmp_path / "p.svg", ranked, chosen, goal)
    svg = ET.parse(tmp_path / "p.svg").getroot()
    texts = [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert any(t.startswith("chosen: ") for t in texts)
    assert any("budget 50 ms" in t for t in texts)
    text = report.markdown("add_sub", goal, loads, _calibration(), (0.002, 0.0005), ranked,
                           chosen, [chosen], [])
    assert "**(chosen)**" in text and "failed: perf_analyzer stopped" in text
    assert "| 100 |" in text  # the measured throughput beside the predicted


def test_the_recommended_config_goes_beside_the_original(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text("original")
    target = report.write_recommended(tmp_path, "new")
    assert target.name == "config.pbtxt.recommended"
    assert (tmp_path / "config.pbtxt").read_text() == "original"


# -- bad input: a clear message, nothing written ---------------------------------------------

def _untouched(repo: Path) -> None:
    model = repo / "add_sub"
    assert (model / "config.pbtxt").read_text() == (ADD_SUB / "config.pbtxt").read_text()
    assert not (model / "config.pbtxt.recommended").exists()


@pytest.mark.parametrize("budget", ["0", "-5"])
def test_a_budget_of_zero_or_less_is_refused(repo: Path, tmp_path: Path, budget: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["--model-repository", str(repo), "--model", "add_sub", "--concurrency", "1",
                 f"--latency-budget-ms={budget}", "--output-dir", str(out)])
    assert code == 2
    assert "--latency-budget-ms must be a positive number of milliseconds" in (
        capsys.readouterr().err)
    assert not out.exists()
    _untouched(repo)


@pytest.mark.parametrize("content", ["{not json\n", "time,model\nsoon,add_sub\n",
                                     '{"model": "add_sub"}\n', ""])
def test_an_unparseable_arrival_log_is_refused(repo: Path, tmp_path: Path, content: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "arrivals.jsonl"
    log.write_text(content)
    out = tmp_path / "out"
    code = main(["--model-repository", str(repo), "--model", "add_sub", "--arrival-log",
                 str(log), "--output-dir", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--arrival-log {log}" in err
    assert not out.exists()
    _untouched(repo)


def test_a_missing_perf_analyzer_is_named(repo: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["--model-repository", str(repo), "--model", "add_sub", "--concurrency", "1",
                 "--perf-analyzer", str(tmp_path / "nowhere" / "perf_analyzer"),
                 "--output-dir", str(out)])
    assert code == 1
    err = capsys.readouterr().err
    assert "perf_analyzer was not found" in err and "scripts/install_perf_analyzer.sh" in err
    assert not out.exists()
    _untouched(repo)


def test_an_objective_nothing_meets_says_so_and_names_the_closest(
        repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calibration = tmp_path / "profile.json"
    calibration.write_text(json.dumps({"calibration": _calibration().to_json(), "line": None}))
    out = tmp_path / "out"
    code = main(["--model-repository", str(repo), "--model", "add_sub", "--request-rate", "200",
                 "--latency-budget-ms", "0.5", "--calibration", str(calibration),
                 "--verify", "0", "--instances", "1", "--delays-us", "0", "--sim-requests",
                 "200", "--output-dir", str(out)])
    assert code == 3
    err = capsys.readouterr().err
    assert "no configuration meets p99 latency within 0.5 ms" in err and "the closest is" in err
    text = (out / "report.md").read_text()
    assert "**No configuration meets p99 latency within 0.5 ms.** The closest:" in text
    assert not (out / "config.pbtxt").exists()
    _untouched(repo)


def test_a_calibrated_run_writes_the_recommendation_beside_the_original(
        repo: Path, tmp_path: Path) -> None:
    calibration = tmp_path / "profile.json"
    calibration.write_text(json.dumps({"calibration": _calibration().to_json(), "line": None}))
    out = tmp_path / "out"
    code = main(["--model-repository", str(repo), "--model", "add_sub", "--request-rate",
                 "200,1000", "--latency-budget-ms", "40", "--calibration", str(calibration),
                 "--verify", "0", "--sim-requests", "300", "--output-dir", str(out)])
    assert code == 0
    model = repo / "add_sub"
    assert (model / "config.pbtxt").read_text() == (ADD_SUB / "config.pbtxt").read_text()
    recommended = (model / "config.pbtxt.recommended").read_text()
    assert recommended == (out / "config.pbtxt").read_text()
    for name in ("report.md", "candidates.csv", "plot.svg", "analysis.json", "profile.json"):
        assert (out / name).is_file()
    chosen = json.loads((out / "analysis.json").read_text())["chosen"]
    assert f"{chosen} **(chosen)**" in (out / "report.md").read_text()


def test_the_command_is_wired(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "nursery", "analyze", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--latency-budget-ms" in proc.stdout


def test_read_trace_is_what_the_arrival_log_holds(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    log.write_text("".join(json.dumps({"time": 10 + i * 0.01, "model": "add_sub"}) + "\n"
                           for i in range(5)))
    assert [round(r.arrival, 6) for r in arrivals.read_trace(log, model="add_sub")] == [
        0.0, 0.01, 0.02, 0.03, 0.04]


def test_a_recorded_arrival_log_is_the_load(repo: Path, tmp_path: Path) -> None:
    log = tmp_path / "arrivals.jsonl"
    log.write_text("".join(json.dumps({"time": 50 + i * 0.004, "model": name})
                           + "\n" for i, name in enumerate(["add_sub", "other"] * 200)))
    calibration = tmp_path / "profile.json"
    calibration.write_text(json.dumps({"calibration": _calibration().to_json(), "line": None}))
    out = tmp_path / "out"
    code = main(["--model-repository", str(repo), "--model", "add_sub", "--arrival-log",
                 str(log), "--latency-budget-ms", "40", "--calibration", str(calibration),
                 "--verify", "0", "--instances", "1", "--output-dir", str(out)])
    assert code == 0
    analysis = json.loads((out / "analysis.json").read_text())
    assert [load["kind"] for load in analysis["loads"]] == ["trace"]
    with (out / "candidates.csv").open() as f:
        rows = list(csv.DictReader(f))
    # only add_sub's 200 arrivals, one every 8 ms: 125/s
    assert all(r["load"] == "trace" for r in rows)
    assert abs(float(rows[0]["throughput"]) - 125) < 5

"""scripts/triton_qa (the harness that runs Triton's own qa/ groups against nursery): the
tritonserver stand-in's flag mapping, the prepared tree, and the case recording, on a tiny
qa tree made here (CI has no Triton checkout)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QA = ROOT / "scripts" / "triton_qa"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"triton_qa_{name}", QA / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


standin = _load("standin")
run = _load("run")


def test_flags_pass_through_unchanged():
    argv = ["--model-repository=/m", "--log-verbose", "1", "--backend-config=python,x=1",
            "--exit-timeout-secs=120", "--http-thread-count=4",
            "--allow-model-file-upload=false"]
    assert standin.map_flags(argv) == (argv, [])


def test_model_file_upload_is_allowed_as_in_triton_unless_chosen():
    out, notes = standin.map_flags(["--model-repository=/m"])
    assert out == ["--model-repository=/m", "--allow-model-file-upload=true"]
    assert notes and "added --allow-model-file-upload=true" in notes[0]


def test_allow_client_shm_true_is_dropped_false_is_kept():
    up = standin.UPLOAD
    out, notes = standin.map_flags(["--allow-client-shm=true", "--model-repository", "m"])
    assert out == ["--model-repository", "m", up]
    assert "dropped --allow-client-shm=true" in notes[0]
    out, _ = standin.map_flags(["--allow-client-shm", "--log-verbose=1"])
    assert out == ["--log-verbose=1", up]
    out, _ = standin.map_flags(["--allow-client-shm", "1"])
    assert out == [up]
    assert standin.map_flags(["--allow-client-shm=false"])[0] == ["--allow-client-shm=false", up]


def test_python_mode_added_unless_the_command_line_chooses_one():
    out, notes = standin.map_flags(["--model-repository=m"], "process")
    assert out[-1] == "--backend-config=python,nursery-instance-mode=process" and notes
    chosen = ["--backend-config", "python,nursery-instance-mode=thread",
              "--allow-model-file-upload=true"]
    assert standin.map_flags(chosen, "process") == (chosen, [])


def test_server_env_puts_the_project_first_and_drops_the_recording_hooks():
    hooks = str(QA / "hooks")
    env = standin.server_env({"PYTHONPATH": os.pathsep.join([hooks, "/x"]),
                              "NURSERY_QA_ROOT": "/proj", "NURSERY_QA_RECORD": "/r",
                              "PYTEST_PLUGINS": "nursery_qa_pytest"})
    assert env["PYTHONPATH"] == os.pathsep.join(["/proj", "/x"])
    assert "NURSERY_QA_RECORD" not in env and "PYTEST_PLUGINS" not in env


def _fake_triton(tmp_path: Path) -> Path:
    triton = tmp_path / "server"
    (triton / "qa" / "common").mkdir(parents=True)
    (triton / "qa" / "common" / "util.sh").write_text("SERVER_LOG=./server.log\n")
    group = triton / "qa" / "L0_fake"
    group.mkdir()
    (group / "test.sh").write_text(
        "SERVER=/opt/tritonserver/bin/tritonserver\n"
        "test -f $SERVER || exit 3\n"
        "pip3 uninstall -y torch || exit 4\n"
        "git clone https://example.invalid/x && exit 5\n"
        "git clone --depth=1 -b main https://example.invalid/org/lib.git here || exit 6\n"
        "test -f here/README || exit 7\n"
        "git clone https://example.invalid/org/lib -b || exit 8\n"  # an empty tag variable
        "test -f lib/README || exit 9\n"
        "python3 -m unittest fake_test >client.log 2>&1\n"
        "python3 -m pytest -q fake_test.py >>client.log 2>&1\n"
        "MODEL_NAME=m1 python3 -m pytest -q fake_test.py -k test_ok >>client.log 2>&1\n"
        "exit 0\n")
    (group / "fake_test.py").write_text(
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self):\n        pass\n"
        "    def test_bad(self):\n        self.assertEqual(1, 2)\n"
        "    @unittest.skip('no')\n    def test_skip(self):\n        pass\n"
        "    def test_data(self):\n"
        "        self.assertNotIn('/data/inferenceserver', '/data/inferenceserver/x')\n"
        "    def test_sub(self):\n"
        "        for i in range(3):\n"
        "            with self.subTest(i=i):\n                self.assertLess(i, 2)\n")
    return triton


def test_a_group_runs_in_the_prepared_tree_and_its_cases_are_counted(tmp_path):
    triton = _fake_triton(tmp_path)
    work = tmp_path / "work"
    run.prepare(triton, work)
    script = (work / "qa" / "L0_fake" / "test.sh").read_text()
    assert f"SERVER={work}/opt/tritonserver/bin/tritonserver" in script
    assert "SERVER=/opt/tritonserver/" in (triton / "qa" / "L0_fake" / "test.sh").read_text()
    assert os.access(work / "opt" / "tritonserver" / "bin" / "tritonserver", os.X_OK)
    checkouts = tmp_path / "checkouts"
    (checkouts / "lib").mkdir(parents=True)
    (checkouts / "lib" / "README").write_text("a local checkout\n")
    out = run.run_group(work, "L0_fake", "process", timeout=120, netns=False,
                        checkouts=checkouts)
    assert out["exit"] == 0, (work / "results" / "L0_fake.log").read_text()
    outcomes = sorted((c["test"].rsplit(".", 1)[-1].rsplit(":", 1)[-1], c["outcome"])
                      for c in out["cases"])
    # the same five cases, once through unittest and once through pytest; a failing sub-test
    # fails its test and is not a case of its own
    assert outcomes == sorted([("test_ok", "passed"), ("test_bad", "failed"),
                               ("test_skip", "skipped"), ("test_data", "failed"),
                               ("test_sub", "failed")] * 2 + [("test_ok[m1]", "passed")])
    assert out["summary"] == {"run": 9, "passed": 3, "failed": 6, "skipped": 2, "runs": 11}
    saved = json.loads((work / "results" / "L0_fake.json").read_text())
    assert saved["summary"] == out["summary"]
    log = (work / "results" / "L0_fake.log").read_text()
    assert "skipped: pip3 uninstall -y torch" in log and "refused: git clone" in log


def test_the_stand_in_script_runs_nursery_with_the_mapped_flags(tmp_path):
    """The stand-in execs `python -m nursery serve`; `--help` shows it arrived there."""
    triton = _fake_triton(tmp_path)
    work = tmp_path / "work"
    run.prepare(triton, work)
    env = run.environment(work, work / "r.jsonl", "")
    proc = subprocess.run([str(work / "opt" / "tritonserver" / "bin" / "tritonserver"),
                           "--allow-client-shm=true", "--help"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "python -m nursery serve" in proc.stdout
    assert "nursery-qa: dropped --allow-client-shm=true" in proc.stderr



def test_a_case_run_several_times_passes_only_if_every_run_passed():
    cases = [{"test": "a", "outcome": "passed"}, {"test": "a", "outcome": "failed"},
             {"test": "a", "outcome": "passed"}, {"test": "b", "outcome": "passed"},
             {"test": "b", "outcome": "passed"}, {"test": "c", "outcome": "skipped"}]
    assert run.summarize(cases) == {"run": 2, "passed": 1, "failed": 1, "skipped": 1, "runs": 6}

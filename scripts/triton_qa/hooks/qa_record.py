"""Records every test case Triton's qa clients run, one JSON line each, into the file named by
NURSERY_QA_RECORD (set by scripts/triton_qa/run.py). Loaded two ways, both from this folder on
PYTHONPATH: `sitecustomize` calls install_unittest() (plain `python3 -m unittest` / `unittest.main`
runs), and pytest loads the `nursery_qa_pytest` plugin through PYTEST_PLUGINS. Under pytest a
unittest case reports through pytest's own result object, so no case is counted twice."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def record(test: str, outcome: str, message: str = "") -> None:
    path = os.environ.get("NURSERY_QA_RECORD")
    if not path:
        return
    # Triton's scripts run one client file for several models, naming the model in MODEL_NAME
    # (L0_backend_python's test_infer_shm_leak.py): each model is a case of its own
    model = os.environ.get("MODEL_NAME")
    if model:
        test = f"{test}[{model}]"
    line = json.dumps({"test": test, "outcome": outcome, "message": message[-2000:],
                       "cwd": os.getcwd(), "argv": sys.argv[:6], "time": time.time()})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _last_line(err: Any) -> str:
    if isinstance(err, tuple) and len(err) == 3 and err[1] is not None:
        return f"{type(err[1]).__name__}: {err[1]}"
    return str(err)


def install_unittest() -> None:
    import unittest

    base = unittest.TestResult

    def wrap(name: str, outcome: str, with_err: bool) -> None:
        original = getattr(base, name)

        def method(self: Any, test: Any, *rest: Any) -> Any:
            message = _last_line(rest[0]) if with_err and rest else (str(rest[0]) if rest else "")
            record(test.id(), outcome, message)
            return original(self, test, *rest)

        setattr(base, name, method)

    wrap("addSuccess", "passed", False)
    wrap("addFailure", "failed", True)
    wrap("addError", "error", True)
    wrap("addSkip", "skipped", False)
    wrap("addExpectedFailure", "xfailed", True)
    wrap("addUnexpectedSuccess", "xpassed", False)
    # a failing subTest fails its test (unittest then calls neither addSuccess nor addFailure
    # for it); sub-tests are not cases of their own
    original_sub = base.addSubTest
    original_stop = base.stopTest

    def add_sub_test(self: Any, test: Any, subtest: Any, err: Any) -> Any:
        if err is not None:
            failed = self.__dict__.setdefault("_nursery_qa_subfailed", {})
            failed.setdefault(test.id(), f"a sub-test failed: {subtest.id()}: {_last_line(err)}")
        return original_sub(self, test, subtest, err)

    def stop_test(self: Any, test: Any) -> Any:
        failed = self.__dict__.get("_nursery_qa_subfailed", {})
        if test.id() in failed:
            record(test.id(), "failed", failed.pop(test.id()))
        return original_stop(self, test)

    base.addSubTest = add_sub_test  # type: ignore[method-assign]
    base.stopTest = stop_test  # type: ignore[method-assign]

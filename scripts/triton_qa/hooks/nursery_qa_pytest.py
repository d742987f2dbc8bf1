"""pytest plugin (PYTEST_PLUGINS=nursery_qa_pytest): one record per test case (see qa_record.py).
A failing sub-test (pytest's own subtests, or unittest's subTest) fails its test; sub-tests are
not cases of their own."""
from typing import Any

import qa_record

_failed_subtests: dict[str, str] = {}


def _message(report: Any) -> str:
    if report.failed and report.longrepr is not None:
        return str(getattr(report.longrepr, "reprcrash", None) or report.longrepr)
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    return ""


def pytest_runtest_logreport(report: Any) -> None:
    if getattr(report, "context", None) is not None:  # a sub-test
        if report.failed:
            _failed_subtests.setdefault(report.nodeid, _message(report))
        return
    if report.when == "teardown" and report.outcome == "passed":
        return
    if report.when != "call" and report.outcome == "passed":
        return
    outcome = report.outcome
    message = _message(report)
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if outcome == "passed" else "xfailed"
    elif report.when != "call" and outcome == "failed":
        outcome = "error"
    elif report.when == "call" and report.nodeid in _failed_subtests:
        sub = _failed_subtests.pop(report.nodeid)
        if outcome == "passed":
            outcome, message = "failed", f"a sub-test failed: {sub}"
    qa_record.record(report.nodeid, outcome, message)

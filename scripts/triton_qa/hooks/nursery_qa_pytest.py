"""pytest plugin (PYTEST_PLUGINS=nursery_qa_pytest): one record per test case (see qa_record.py)."""
from typing import Any

import qa_record


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call" or (report.when != "call" and report.outcome != "passed"):
        if report.when == "teardown" and report.outcome == "passed":
            return
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xpassed" if outcome == "passed" else "xfailed"
        elif report.when != "call" and outcome == "failed":
            outcome = "error"
        message = ""
        if report.failed and report.longrepr is not None:
            message = str(getattr(report.longrepr, "reprcrash", None) or report.longrepr)
        elif report.skipped and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2])
        qa_record.record(report.nodeid, outcome, message)

"""pytest plugin (PYTEST_PLUGINS=nursery_qa_pytest): one record per test case (see qa_record.py).
A failing sub-test (pytest's own subtests, or unittest's subTest) fails its test; sub-tests are
not cases of their own.

A case that runs longer than ``NURSERY_QA_CASE_LIMIT`` seconds (run.py's ``--case-limit``) is
failed there: Triton's clients wait for stream answers without a timeout
(``user_data._completed_requests.get()``), so one case whose model can never answer here (a
GPU-only model whose thread fails on ``.cuda()``) would otherwise hold the group until its
time runs out, and the cases after it would never run."""
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
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


class CaseTimeLimit(Exception):
    pass


_limit_hit = False
_exit_status = 1
# after the limit, the clean-up the case runs is interrupted this often (seconds)
RETRY_S = float(os.environ.get("NURSERY_QA_CASE_RETRY") or 5)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Iterator[None]:
    limit = float(os.environ.get("NURSERY_QA_CASE_LIMIT") or 0)
    if limit <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        # the case's own clean-up may wait for ever too (a gRPC client's close() joins a
        # stream thread that ends only when the server ends the stream): it is interrupted
        # again until the case has ended
        global _limit_hit
        _limit_hit = True
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        raise CaseTimeLimit(f"nursery-qa: the case ran past its {limit:g} s "
                            "(run.py --case-limit); stopped so that the next cases run")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: Any) -> None:
    """After a case hit the limit, threads it left (a client's stream reader waiting for the
    server) would keep the interpreter from exiting: leave without waiting for them, once
    pytest has written its reports."""
    if _limit_hit:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)

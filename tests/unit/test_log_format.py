"""Log lines in Triton's layouts (common/src/logging.cc, docs/protocol/extension_logging.md):
``<level><MMDD> <hh:mm:ss.uuuuuu> <pid> <file>:<line>] <message>`` (default) and
``<YYYY-MM-DDThh:mm:ssZ> <level> <pid> <file>:<line>] <message>`` (ISO8601), UTC, messages
JSON-escaped unless TRITON_SERVER_ESCAPE_LOG_MESSAGES=0."""

from __future__ import annotations

import json
import logging
import re
import sys

import pytest

from nursery.observability.logs import (
    LogManager,
    LogSettings,
    _Formatter,
    escape_from_environment,
    escape_message,
)
from nursery.settings import settings_from_args

# the fields Triton's own log-format test (qa/L0_logging) picks out, as our patterns
DEFAULT = re.compile(r"(?P<level>[EWI])(?P<month>\d{2})(?P<day>\d{2}) "
                     r"(?P<time>\d{2}:\d{2}:\d{2}\.\d{6}) (?P<pid>\d+) "
                     r"(?P<file>[\w.]+):(?P<line>\d+)\] (?P<message>.*)", re.DOTALL)
ISO8601 = re.compile(r"(?P<stamp>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z) (?P<level>[EWI]) "
                     r"(?P<pid>\d+) (?P<file>[\w.]+):(?P<line>\d+)\] (?P<message>.*)", re.DOTALL)

CREATED = 1763812260.713675  # 2025-11-22 11:51:00.713675 UTC


def _record(message: str, level: int = logging.INFO, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.LogRecord("nursery.server", level, "/src/nursery/server.py", 201, message,
                               None, exc_info)
    record.created = CREATED
    record.process = 5330
    return record


def test_default_layout() -> None:
    line = _Formatter("default").format(_record("Started HTTP on 0.0.0.0:8000"))
    assert line == 'I1122 11:51:00.713675 5330 server.py:201] "Started HTTP on 0.0.0.0:8000"'
    match = DEFAULT.fullmatch(line)
    assert match is not None and match["file"] == "server.py" and match["line"] == "201"


def test_iso8601_layout() -> None:
    line = _Formatter("ISO8601").format(_record("disk full", logging.WARNING))
    assert line == '2025-11-22T11:51:00Z W 5330 server.py:201] "disk full"'
    assert ISO8601.fullmatch(line) is not None


@pytest.mark.parametrize(("level", "letter"), [(logging.DEBUG, "I"), (logging.INFO, "I"),
                                               (logging.WARNING, "W"), (logging.ERROR, "E"),
                                               (logging.CRITICAL, "E")])
def test_level_letters(level: int, letter: str) -> None:
    assert _Formatter("default").format(_record("x", level))[0] == letter


def test_escaping_follows_rapidjson() -> None:
    text = 'say "hi"\\ \n\t\r\b\f \x01\x1f é / \x7f'
    escaped = escape_message(text)
    assert escaped == '"say \\"hi\\"\\\\ \\n\\t\\r\\b\\f \\u0001\\u001F é / \x7f"'
    assert json.loads(escaped) == text  # valid JSON, the same string back


def test_a_traceback_stays_on_one_line_when_escaped() -> None:
    line = _Formatter("default").format(_record("failed", logging.ERROR, exc=True))
    assert "\n" not in line
    message = DEFAULT.fullmatch(line)["message"]  # type: ignore[index]
    assert json.loads(message).startswith("failed\nTraceback")


def test_unescaped_mode_writes_messages_as_they_are() -> None:
    line = _Formatter("default", escape=False).format(_record('two\nlines "q"'))
    assert line.endswith('server.py:201] two\nlines "q"')
    assert DEFAULT.fullmatch(line) is not None


def test_escape_switch_is_the_environment_variable() -> None:
    assert escape_from_environment({})
    assert escape_from_environment({"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "1"})
    assert escape_from_environment({"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "false"})  # only "0"
    assert not escape_from_environment({"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "0"})


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "0")
    assert settings_from_args(["--model-repository", str(tmp_path)]).log_escape is False
    monkeypatch.delenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES")
    assert settings_from_args(["--model-repository", str(tmp_path)]).log_escape is True


def test_the_logging_extension_keeps_the_escape_mode() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        manager = LogManager(LogSettings(escape=False))
        manager.update({"log_format": "ISO8601"})
        assert "escape" not in manager.settings.to_json()
        line = manager.handler.format(_record("a\nb"))
        assert line.endswith("] a\nb") and ISO8601.fullmatch(line) is not None
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_a_config_parse_error_gets_libprotobufs_unescaped_line(
        caplog: pytest.LogCaptureFixture) -> None:
    """Under Triton libprotobuf logs a text-format error itself, unescaped, in its own
    layout (L0_simple_ensemble greps for `Expected integer, got: "invalid_value"`); the
    configuration error that follows is Triton's, escaped as every line."""
    from nursery.config.model import parse_config_text
    from nursery.errors import ConfigError
    from nursery.observability.logs import LIBPROTOBUF

    with caplog.at_level(logging.ERROR, logger="nursery.config"), \
            pytest.raises(ConfigError, match="Expected integer"):
        parse_config_text('name: "e"\nensemble_scheduling {\n  max_inflight_requests: '
                          '"invalid_value"\n}\n', "e")
    [record] = [r for r in caplog.records if getattr(r, LIBPROTOBUF, False)]
    for escape in (True, False):
        line = _Formatter("default", escape).format(record)
        assert line.startswith("[libprotobuf ERROR model.py:")
        assert line.endswith('] Error parsing text-format inference.ModelConfig: 3:26: '
                             'Expected integer, got: "invalid_value" (an integer for field '
                             "'max_inflight_requests')")


def test_a_table_follows_its_heading_unescaped_in_tritons_layout() -> None:
    """The model status table Triton logs at start-up: the record's message (escaped, here
    empty) then the table on lines of its own, as L0_logging's validator parses it (border,
    header, border, rows, border) and as L0_rate_limiter greps a failed model's reason."""
    from nursery.observability.logs import TABLE, render_table

    reason = ('UNAVAILABLE: Invalid argument: Resource count for "resource1" is limited to 1 '
              "which will prevent scheduling of one or more model instances, the minimum "
              "required count is 4")
    table = render_table(("Model", "Version", "Status"),
                         [["simple", "1", "READY"], ["custom_zero_1_float32", "1", reason]])
    record = _record("")
    setattr(record, TABLE, table)
    for escape in (True, False):
        text = _Formatter("default", escape).format(record)
        match = DEFAULT.match(text)
        assert match is not None
        heading, *lines = match["message"].split("\n")
        assert heading == ""
        border = re.compile(r"^\+[-+]+\+$")
        row = re.compile(r"^\| (?P<row>.*?) \|$")
        assert border.match(lines[0]) and border.match(lines[2]) and border.match(lines[-1])
        assert [c.strip() for c in row.match(lines[1])["row"].split("|")] == [
            "Model", "Version", "Status"]
        assert f"| custom_zero_1_float32 | 1       | {reason} |" in lines
        assert len({len(line) for line in lines}) == 1


def test_a_narrow_table_wraps_long_cells_over_lines_of_their_row() -> None:
    from nursery.observability.logs import render_table

    lines = render_table(("Model", "Version", "Status"), [["m", "1", "x" * 100]],
                         width=60).split("\n")[1:]
    assert len({len(line) for line in lines}) == 1 and max(map(len, lines)) <= 60
    cells = [line.split("|")[3].strip() for line in lines[3:-1]]
    assert "".join(cells) == "x" * 100 and len(cells) > 1
    assert lines[4].split("|")[1].strip() == ""  # the row's continuation lines

"""Logging as Triton configures it: levels, verbosity, format and file, changeable at run time.

The settings are Triton's: ``log_info``, ``log_warning``, ``log_error`` (each level on or off),
``log_verbose_level`` (0 = no verbose lines; 1 and up turn nursery's DEBUG lines on, 2 and up
the libraries' too), ``log_format`` and ``log_file`` (set at start only). The logging
extension (``/v2/logging``, gRPC LogSettings) reads and changes them.

Line layouts, as Triton's logger writes them (common/src/logging.cc; documented in
docs/protocol/extension_logging.md), the time in UTC:

- "default": ``<level><month><day> <hour>:<min>:<sec>.<usec> <pid> <file>:<line>] <message>``,
  e.g. ``I1122 12:51:00.713675 5330 server.py:201] "Started HTTP on 0.0.0.0:8000"``
- "ISO8601": ``<year>-<month>-<day>T<hour>:<min>:<sec>Z <level> <pid> <file>:<line>] <message>``
- a text-format error in a model configuration also gets the line libprotobuf's own logger
  writes under Triton, in libprotobuf's layout and never escaped:
  ``[libprotobuf ERROR <file>:<line>] Error parsing text-format inference.ModelConfig: ...``

``<level>`` is E, W or I (verbose lines are I); ``<file>`` is the source file's base name.
Messages are escaped by JSON string rules (rapidjson's: quotes around, ``\"``, ``\\`` and
control characters escaped, so a multi-line message or traceback stays on one line) unless
the environment variable ``TRITON_SERVER_ESCAPE_LOG_MESSAGES`` is "0" when the server starts;
Triton has no flag for it and its logging extension cannot change it.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nursery.errors import InvalidArgument, Unsupported

_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
           logging.CRITICAL: "E"}
_LIBRARIES = ("hypercorn", "quart", "grpclib", "h2", "hpack", "trio_asyncio", "asyncio")
ESCAPE_ENVIRONMENT_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"
# a record with this attribute set (``extra={LIBPROTOBUF: True}``) is written as libprotobuf
# writes its log lines: ``[libprotobuf ERROR <file>:<line>] <message>``, unescaped
LIBPROTOBUF = "libprotobuf"
# a record with this attribute (``extra={TABLE: render_table(...)}``) ends with that table,
# on lines of its own and never escaped, after its message (the heading, escaped as any
# message; empty: none): Triton's tables (the model status table at start-up) are so, and
# scripts grep them, and parse them (L0_logging: border, header, border, rows, border)
TABLE = "table"

# rapidjson's string escapes: the short forms it has, \u00XX (upper-case hex) for the other
# control characters; '/' and characters past 0x7f are written as they are
_ESCAPES: dict[int, str] = {c: f"\\u{c:04X}" for c in range(0x20)}
_ESCAPES.update({0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r",
                 0x22: '\\"', 0x5C: "\\\\"})


def escape_message(message: str) -> str:
    """``message`` as a JSON string, the way Triton's TritonJson::SerializeString writes it."""
    return '"' + message.translate(_ESCAPES) + '"'


def escape_from_environment(environ: Mapping[str, str]) -> bool:
    """Triton escapes log messages unless ``TRITON_SERVER_ESCAPE_LOG_MESSAGES`` is "0"."""
    return environ.get(ESCAPE_ENVIRONMENT_VARIABLE) != "0"


@dataclass(frozen=True)
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"
    escape: bool = True  # TRITON_SERVER_ESCAPE_LOG_MESSAGES, at start only (not in to_json)

    def to_json(self) -> dict[str, Any]:
        return {"log_file": self.log_file, "log_info": self.log_info,
                "log_warning": self.log_warning, "log_error": self.log_error,
                "log_verbose_level": self.log_verbose_level, "log_format": self.log_format}


def _terminal_width() -> int:
    """Triton's table printer fits its tables to standard output's terminal, or to 500
    columns when that is not a terminal."""
    try:
        columns = os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 500
    return columns or 500


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 width: int | None = None) -> str:
    """An ASCII table in the layout of Triton's table printer: a leading newline, then
    border, header, border, rows, border. The columns share the width (``width``: the
    terminal's) evenly, a narrow column giving what it does not use to the wider ones; a
    cell longer than its column continues on the next lines of its row."""
    count = len(headers)
    widest = [max([len(headers[i]), *(len(row[i]) for row in rows)]) for i in range(count)]
    usable = (width or _terminal_width()) - 2 * count - (count + 1)
    shares = [float(usable // count)] * count
    order = sorted(range(count), key=lambda i: widest[i])  # narrowest first, stable
    for place, column in enumerate(order):
        if widest[column] < shares[column]:
            spare = shares[column] - widest[column]
            shares[column] = widest[column]
            rest = order[place + 1:]
            for other in rest:
                shares[other] += spare / len(rest)
    cols = [max(1, int(share)) for share in shares]
    border = "+" + "+".join("-" * (c + 2) for c in cols) + "+"

    def lines(row: Sequence[str]) -> list[str]:
        depth = max(1, *((len(cell) + c - 1) // c for cell, c in zip(row, cols, strict=True)))
        return ["|" + "|".join(f" {cell[j * c:(j + 1) * c]:<{c}} "
                               for cell, c in zip(row, cols, strict=True)) + "|" for j in range(depth)]

    out = [border, *lines(headers), border]
    for row in rows:
        out += lines(row)
    out.append(border)
    return "\n" + "\n".join(out)


class _Formatter(logging.Formatter):
    def __init__(self, style: str, escape: bool = True) -> None:
        super().__init__()
        self.style_name = style
        self.escape = escape

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTER.get(record.levelno, "I")
        message = record.getMessage()
        if getattr(record, LIBPROTOBUF, False):
            # libprotobuf's own logger writes its lines so under Triton: its layout, never
            # escaped (scripts grep Triton's log for them as they are)
            return f"[libprotobuf {logging.getLevelName(record.levelno)} " \
                   f"{record.filename}:{record.lineno}] {message}"
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if self.escape and message:
            message = escape_message(message)
        table = getattr(record, TABLE, None)
        if table is not None:
            message += table
        utc = time.gmtime(record.created)
        where = f"{record.process} {record.filename}:{record.lineno}]"
        if self.style_name == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", utc)
            return f"{stamp} {letter} {where} {message}"
        micros = int((record.created % 1) * 1_000_000)
        stamp = time.strftime("%m%d %H:%M:%S", utc)
        return f"{letter}{stamp}.{micros:06d} {where} {message}"


class _LevelGate(logging.Filter):
    def __init__(self, manager: LogManager) -> None:
        super().__init__()
        self.manager = manager

    def filter(self, record: logging.LogRecord) -> bool:
        s = self.manager.settings
        if record.levelno >= logging.ERROR:
            return s.log_error
        if record.levelno >= logging.WARNING:
            return s.log_warning
        if record.levelno >= logging.INFO:
            return s.log_info
        return s.log_verbose_level > 0


class LogManager:
    """Owns the root handler; :meth:`update` applies a logging-extension request."""

    def __init__(self, settings: LogSettings) -> None:
        self.settings = settings
        if settings.log_file:
            self.handler: logging.Handler = logging.FileHandler(settings.log_file)
        else:
            self.handler = logging.StreamHandler(sys.stderr)
        self.handler.addFilter(_LevelGate(self))
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(self.handler)
        self._apply()

    def _apply(self) -> None:
        s = self.settings
        self.handler.setFormatter(_Formatter(s.log_format, s.escape))
        logging.getLogger().setLevel(logging.DEBUG if s.log_verbose_level > 0 else logging.INFO)
        library_level = logging.DEBUG if s.log_verbose_level > 1 else logging.WARNING
        for name in (*_LIBRARIES, "nursery.http"):
            logging.getLogger(name).setLevel(library_level)

    def update(self, changes: dict[str, Any]) -> LogSettings:
        """Apply ``changes`` (the extension's settings, as Python values); Triton's checks and
        messages; unknown keys are ignored, as Triton does; nothing changes on an error."""
        current = self.settings
        new: dict[str, Any] = {}
        if "log_file" in changes:
            raise Unsupported("log file location can not be updated through network protocol")
        for key in ("log_info", "log_warning", "log_error"):
            if key in changes:
                if not isinstance(changes[key], bool):
                    raise InvalidArgument(f"expect boolean for '{key}'")
                new[key] = changes[key]
        if "log_verbose_level" in changes:
            value = changes["log_verbose_level"]
            if type(value) is not int or not 0 <= value < 2**32:
                raise InvalidArgument("expect int32 for 'log_verbose_level'")
            new["log_verbose_level"] = value
        if "log_format" in changes:
            value = changes["log_format"]
            if not isinstance(value, str):
                raise InvalidArgument("expect string for 'log_format'")
            if value not in ("default", "ISO8601"):
                raise InvalidArgument(f"invalid argument for log_format, got: {value}")
            new["log_format"] = value
        self.settings = replace(current, **new)
        self._apply()
        if new:
            logging.getLogger("nursery.server").info("log settings changed: %s", new)
        return self.settings


def log_manager_for(settings: Any) -> LogManager:
    """Triton's logging flags of a ``nursery.settings.Settings``; the manager also serves the
    logging extension."""
    return LogManager(LogSettings(
        log_file=settings.log_file, log_info=settings.log_info,
        log_warning=settings.log_warning, log_error=settings.log_error,
        log_verbose_level=settings.log_verbose, log_format=settings.log_format,
        escape=settings.log_escape))

"""Logging as Triton configures it: levels, verbosity, format and file, changeable at run time.

The settings are Triton's: ``log_info``, ``log_warning``, ``log_error`` (each level on or off),
``log_verbose_level`` (0 = no verbose lines; 1 and up turn nursery's DEBUG lines on, 2 and up
the libraries' too), ``log_format`` ("default": ``I1122 12:51:00.713675 5330 module] msg``, or
"ISO8601": ``2026-11-22T12:51:00Z I 5330 module] msg``) and ``log_file`` (set at start only).
The logging extension (``/v2/logging``, gRPC LogSettings) reads and changes them.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from nursery.errors import InvalidArgument, Unsupported

_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
           logging.CRITICAL: "E"}
_LIBRARIES = ("hypercorn", "quart", "grpclib", "h2", "hpack", "trio_asyncio", "asyncio")


@dataclass(frozen=True)
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def to_json(self) -> dict[str, Any]:
        return {"log_file": self.log_file, "log_info": self.log_info,
                "log_warning": self.log_warning, "log_error": self.log_error,
                "log_verbose_level": self.log_verbose_level, "log_format": self.log_format}


class _Formatter(logging.Formatter):
    def __init__(self, style: str) -> None:
        super().__init__()
        self.style_name = style

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTER.get(record.levelno, "I")
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if self.style_name == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            return f"{stamp} {letter} {record.process} {record.name}] {message}"
        local = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        stamp = time.strftime("%m%d %H:%M:%S", local)
        return f"{letter}{stamp}.{micros:06d} {record.process} {record.name}] {message}"


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
        self.handler.setFormatter(_Formatter(s.log_format))
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

"""One transport-free error vocabulary.

Triton's status codes as :class:`ErrorKind`, plus the two the house plan adds. Every layer
raises :class:`NurseryError` (or a subclass); only ``protocol/status_map.py`` knows which HTTP
or gRPC status a kind becomes. Third-party exceptions are translated at the edge with
:func:`map_errors`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


class ErrorKind(enum.Enum):
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"


class NurseryError(Exception):
    """An error with a kind and a message a person can act on."""

    kind: ErrorKind = ErrorKind.UNKNOWN

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind.value}: {self.message!r})"


class InvalidArgument(NurseryError):
    kind = ErrorKind.INVALID_ARG


class NotFound(NurseryError):
    kind = ErrorKind.NOT_FOUND


class Unavailable(NurseryError):
    kind = ErrorKind.UNAVAILABLE


class Unsupported(NurseryError):
    kind = ErrorKind.UNSUPPORTED


class InternalError(NurseryError):
    kind = ErrorKind.INTERNAL


class AlreadyExists(NurseryError):
    kind = ErrorKind.ALREADY_EXISTS


class Cancelled(NurseryError):
    kind = ErrorKind.CANCELLED


class DeadlineExceeded(NurseryError):
    kind = ErrorKind.DEADLINE_EXCEEDED


class ResourceExhausted(NurseryError):
    kind = ErrorKind.RESOURCE_EXHAUSTED


class ConfigError(InvalidArgument):
    """A model configuration that cannot be used, naming the model, the file and the field."""


@contextmanager
def map_errors(
    mapping: Mapping[type[BaseException], ErrorKind], prefix: str = ""
) -> Iterator[None]:
    """Translate third-party exceptions into :class:`NurseryError` at a boundary.

    ``mapping`` goes from exception type to kind; the first matching entry wins.
    ``NurseryError`` passes through untouched.
    """
    try:
        yield
    except NurseryError:
        raise
    except BaseException as exc:
        for exc_type, kind in mapping.items():
            if isinstance(exc, exc_type):
                raise NurseryError(f"{prefix}{exc}", kind) from exc
        raise

"""One transport-free error vocabulary.

Triton's status codes as :class:`ErrorKind`, plus the two the house plan adds. Every layer
raises :class:`NurseryError` (or a subclass); only ``protocol/codecs/status.py`` knows which HTTP
or gRPC status a kind becomes. :class:`StartupError` ends
the server at start-up; :func:`failure_reason` writes a failure as Triton's status string.
"""

from __future__ import annotations

import enum


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


class Overloaded(Unavailable):
    """A request shed because the model cannot answer it within its latency objective
    (``nursery/scheduling/latency_objective.py``): UNAVAILABLE, with the seconds after which
    a retry may fare better. HTTP adds ``Retry-After``, and answers 429 instead of 503 when
    the request asked for it (``protocol/codecs/status.py``)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unsupported(NurseryError):
    kind = ErrorKind.UNSUPPORTED


class InternalError(NurseryError):
    kind = ErrorKind.INTERNAL


class AlreadyExists(NurseryError):
    kind = ErrorKind.ALREADY_EXISTS


class Cancelled(NurseryError):
    kind = ErrorKind.CANCELLED


class ResourceExhausted(NurseryError):
    kind = ErrorKind.RESOURCE_EXHAUSTED


class AnsweredError(NurseryError):
    """An error a model answered with (a Python model's ``InferenceResponse(error=...)``): the
    request failed for its client, but the model executed and answered it, so Triton's
    statistics count it a success."""

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
        super().__init__(message, kind)


class ConfigError(InvalidArgument):
    """A model configuration that cannot be used, naming the model, the file and the field."""


class NoVersionError(ConfigError):
    """A readable configuration whose version policy selects no version folder: Triton's poll
    takes such a model in and its load fails (the server is then not ready), where a
    configuration that cannot be read leaves the model out."""


class StartupError(Exception):
    """The server cannot start (a model failed with --exit-on-error, a flag cannot be used)."""


# Triton's Status code strings, used in the "reason" of a failed version
_CODE_STRINGS = {
    ErrorKind.UNKNOWN: "Unknown",
    ErrorKind.INTERNAL: "Internal",
    ErrorKind.NOT_FOUND: "Not found",
    ErrorKind.INVALID_ARG: "Invalid argument",
    ErrorKind.UNAVAILABLE: "Unavailable",
    ErrorKind.UNSUPPORTED: "Unsupported",
    ErrorKind.ALREADY_EXISTS: "Already exists",
    ErrorKind.CANCELLED: "Cancelled",
    ErrorKind.DEADLINE_EXCEEDED: "Deadline exceeded",
    ErrorKind.RESOURCE_EXHAUSTED: "Resource exhausted",
}


def failure_reason(exc: BaseException) -> str:
    """Triton's ``Status::AsString()`` form: ``"Invalid argument: <message>"``."""
    error = first_error(exc)
    if isinstance(error, NurseryError):
        return f"{_CODE_STRINGS[error.kind]}: {error.message}"
    return f"Internal: {error}"


def first_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (trio wraps nursery failures in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc

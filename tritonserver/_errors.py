"""The ``tritonserver`` error types, and nursery's errors turned into them."""

from __future__ import annotations

from nursery.errors import (
    AlreadyExists,
    Cancelled,
    InvalidArgument,
    NotFound,
    NurseryError,
    Unavailable,
    Unsupported,
)
from nursery.errors import (
    InternalError as _Internal,
)


class TritonError(Exception):
    """Every error the API raises."""


class NotFoundError(TritonError):
    pass


class UnknownError(TritonError):
    pass


class InternalError(TritonError):
    pass


class InvalidArgumentError(TritonError):
    pass


class UnavailableError(TritonError):
    pass


class AlreadyExistsError(TritonError):
    pass


class UnsupportedError(TritonError):
    pass


class CancelledError(TritonError):
    pass


_KINDS: tuple[tuple[type[NurseryError], type[TritonError]], ...] = (
    (NotFound, NotFoundError), (InvalidArgument, InvalidArgumentError),
    (Unavailable, UnavailableError), (_Internal, InternalError),
    (AlreadyExists, AlreadyExistsError), (Unsupported, UnsupportedError),
    (Cancelled, CancelledError))


def triton_error(error: BaseException) -> TritonError:
    """nursery's error as the API's: same message, Triton's type."""
    if isinstance(error, TritonError):
        return error
    if isinstance(error, NurseryError):
        for kind, api in _KINDS:
            if isinstance(error, kind):
                return api(error.message)
        return UnknownError(error.message)
    return UnknownError(str(error))

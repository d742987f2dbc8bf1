"""The only place that knows HTTP and gRPC status numbers.

Triton's mapping (server ``HttpCodeFromError`` and ``grpc/grpc_utils``): INTERNAL 500,
NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501, everything else 400.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from nursery.errors import ErrorKind, NurseryError, Overloaded

HTTP_STATUS = {
    ErrorKind.INTERNAL: 500,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.UNSUPPORTED: 501,
    ErrorKind.INVALID_ARG: 400,
    ErrorKind.ALREADY_EXISTS: 400,
    ErrorKind.CANCELLED: 400,
    ErrorKind.UNKNOWN: 400,
    ErrorKind.DEADLINE_EXCEEDED: 400,
    ErrorKind.RESOURCE_EXHAUSTED: 400,
}

# grpc.StatusCode numbers
GRPC_STATUS = {
    ErrorKind.UNKNOWN: 2,
    ErrorKind.INTERNAL: 13,
    ErrorKind.NOT_FOUND: 5,
    ErrorKind.INVALID_ARG: 3,
    ErrorKind.UNAVAILABLE: 14,
    ErrorKind.UNSUPPORTED: 12,
    ErrorKind.ALREADY_EXISTS: 6,
    ErrorKind.CANCELLED: 1,
    ErrorKind.DEADLINE_EXCEEDED: 4,
    ErrorKind.RESOURCE_EXHAUSTED: 8,
}


def http_error(error: NurseryError) -> tuple[int, bytes]:
    """HTTP status and the ``{"error": "..."}`` body for an error."""
    return HTTP_STATUS[error.kind], error_body(error.message)


# the request parameter with which a caller asks to be told of overload with HTTP 429
OVERLOAD_STATUS_PARAMETER = "nursery.overload_status"


def overload_answer(error: NurseryError,
                    parameters: Mapping[str, Any] | None) -> tuple[int, list[tuple[bytes, bytes]]]:
    """The HTTP status and extra headers for a request shed for overload (an
    :class:`Overloaded` error; any other error: its usual status, no headers): 503, or 429
    where the request's parameter ``nursery.overload_status`` is 429, with ``Retry-After`` in
    whole seconds (at least 1) either way."""
    status = HTTP_STATUS[error.kind]
    if not isinstance(error, Overloaded):
        return status, []
    asked = (parameters or {}).get(OVERLOAD_STATUS_PARAMETER)
    if str(asked).strip() == "429":
        status = 429
    seconds = max(1, math.ceil(error.retry_after_s)) if math.isfinite(error.retry_after_s) else 1
    return status, [(b"retry-after", str(seconds).encode())]


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, separators=(",", ":")).encode()

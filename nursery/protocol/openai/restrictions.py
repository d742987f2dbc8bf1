"""``--openai-restricted-api <APIs> <header> <value>``: Triton's OpenAI frontend's restricted
API groups, pure (no I/O).

Each group of routes may require one request header with one value:

- ``inference``: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``;
- ``model-repository``: ``GET /v1/models`` (and each model), ``POST /v1/models/...`` (load
  and unload);
- ``metrics``: ``GET /metrics``;
- ``health``: ``GET /health/ready``.

A request is matched as Triton's frontend matches it (the method, and the path's prefix), and
also by the route nursery will serve it on (``HEAD`` as ``GET``, ``/health`` with
``/health/ready``), so no spelling of a path reaches a restricted route without the header.
A request without the header, or with another value, is answered 401 in Triton's words before
its body is parsed. The values are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Triton's groups, each with (method, path prefix) pairs
ENDPOINTS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "inference": (("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                  ("POST", "/v1/embeddings")),
    "model-repository": (("GET", "/v1/models"), ("POST", "/v1/models/")),
    "metrics": (("GET", "/metrics"),),
    "health": (("GET", "/health/ready"),),
}


class RestrictionError(ValueError):
    """A malformed ``--openai-restricted-api``: Triton's words."""


@dataclass(frozen=True)
class Restrictions:
    """The groups restricted, each with the header (its name as given) and value it needs."""

    by_api: Mapping[str, tuple[str, str]]

    def __bool__(self) -> bool:
        return bool(self.by_api)

    def summary(self) -> dict[str, str]:
        """For the start-up log: each group and its header's name, never the value."""
        return {api: header for api, (header, _) in self.by_api.items()}

    def required(self, method: str, path: str, route_group: str | None = None
                 ) -> tuple[str, str] | None:
        """The (header, value) a request must carry, or None when it is not restricted.
        ``route_group``: the group of the route nursery resolved the request to, if any."""
        method = "GET" if method == "HEAD" else method
        for api, need in self.by_api.items():
            if api == route_group:
                return need
            for m, prefix in ENDPOINTS[api]:
                if method == m and path.startswith(prefix):
                    return need
        return None

    @staticmethod
    def allows(need: tuple[str, str], sent: bytes | None) -> bool:
        return sent is not None and hmac.compare_digest(sent, need[1].encode("utf-8"))

    @staticmethod
    def message(need: tuple[str, str]) -> str:
        return f"This API is restricted, expecting header '{need[0]}' with valid value"


def parse(groups: Iterable[tuple[str, str, str]]) -> Restrictions:
    """The flag's occurrences, each ``(APIs, header, value)`` with the APIs comma-separated,
    checked as Triton's frontend checks them."""
    by_api: dict[str, tuple[str, str]] = {}
    for apis, header, value in groups:
        for api in apis.split(","):
            if api not in ENDPOINTS:
                raise RestrictionError(
                    f"Unknown API '{api}'. Available APIs: {list(ENDPOINTS)}")
            if api in by_api:
                raise RestrictionError(
                    f"restricted api '{api}' can not be specified in multiple config groups")
            by_api[api] = (header, value)
    return Restrictions(by_api)

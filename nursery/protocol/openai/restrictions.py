"""``--openai-restricted-api <APIs> <header> <value>``: Triton's OpenAI frontend's restricted
API groups, pure (no I/O).

Each group of routes may require one request header with one value:

- ``inference``: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``;
- ``model-repository``: ``GET /v1/models`` (and each model), ``POST /v1/models/...`` (load
  and unload);
- ``metrics``: ``GET /metrics``;
- ``health``: ``GET /health/ready``.

The groups are kept and checked by the KServe ports' mechanism (``protocol/access.py``:
``Restrictions.refusal``, the first such header deciding, its value compared in constant
time); what is the OpenAI frontend's own is here: its flag's form and refusals, in Triton's
words, and which group a request falls in. A request is placed by the route nursery serves
it on (``HEAD`` as ``GET``, ``/health`` with ``/health/ready``, a trailing slash or not), else
by Triton's frontend's rule (the method, and the path's prefix), so no spelling of a path
reaches a restricted route without the header. A request without the header, or with another
value, is answered 401 in Triton's words before its body is parsed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nursery.protocol.access import Restrictions

# Triton's groups, each with (method, path prefix) pairs
ENDPOINTS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "inference": (("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                  ("POST", "/v1/embeddings")),
    "model-repository": (("GET", "/v1/models"), ("POST", "/v1/models/")),
    "metrics": (("GET", "/metrics"),),
    "health": (("GET", "/health/ready"),),
}
# the group of each route nursery serves (its path without a trailing slash)
ROUTES: Mapping[str, str] = {
    "/v1/chat/completions": "inference", "/v1/completions": "inference",
    "/v1/embeddings": "inference", "/v1/models": "model-repository", "/metrics": "metrics",
    "/health/ready": "health", "/health": "health"}


class RestrictionError(ValueError):
    """A malformed ``--openai-restricted-api``: Triton's words."""


def parse(groups: Iterable[tuple[str, str, str]]) -> Restrictions:
    """The flag's occurrences, each ``(APIs, header, value)`` with the APIs comma-separated,
    checked as Triton's frontend checks them."""
    rules: list[tuple[str, str, str]] = []
    for apis, header, value in groups:
        for api in apis.split(","):
            if api not in ENDPOINTS:
                raise RestrictionError(
                    f"Unknown API '{api}'. Available APIs: {list(ENDPOINTS)}")
            if any(api == taken for taken, _, _ in rules):
                raise RestrictionError(
                    f"restricted api '{api}' can not be specified in multiple config groups")
            rules.append((api, header, value))
    return Restrictions(tuple(rules))


def group_of(method: str, path: str) -> str | None:
    """The group a request (its percent-decoded path) falls in, restricted or not."""
    route = path.rstrip("/")
    group = ROUTES.get(route)
    if group is None and route.startswith("/v1/models/"):
        group = "model-repository"
    if group is not None:
        return group
    method = "GET" if method == "HEAD" else method
    for api, endpoints in ENDPOINTS.items():
        if any(method == m and path.startswith(prefix) for m, prefix in endpoints):
            return api
    return None


def summary(restrictions: Restrictions) -> dict[str, str]:
    """For the start-up log: each group and its header's name, never the value."""
    return {api: header for api, header, _ in restrictions.rules}


def message(header: str) -> str:
    """The 401's words, for a request without ``header`` (or with another value)."""
    return f"This API is restricted, expecting header '{header}' with valid value"

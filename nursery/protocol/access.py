"""Who may use which endpoint: Triton's restricted API groups, and headers forwarded to models.

Pure: no sockets, no trio. The flags are parsed here (``settings.py`` calls
:func:`parse_restrictions` and :func:`compile_forward_pattern`), the servers ask
:meth:`Restrictions.refusal` per request and :meth:`HeaderForward.parameters` per inference.

- ``--http-restricted-api <groups>:<header>=<value>`` and ``--grpc-restricted-protocol
  <groups>:<key>=<value>``: a request to an endpoint of a restricted group must carry that
  header (gRPC: the metadata key ``triton-grpc-protocol-<key>``) with exactly that value.
  Refused: HTTP 403 ``This API is restricted, expecting header '<header>'``; gRPC UNAVAILABLE
  ``This protocol is restricted, expecting header '<key>'`` (Triton's codes and words,
  ``http_server.cc`` / ``grpc_server.cc``). Groups not named stay open. A group may be named
  in one flag only; an unknown group or a malformed flag stops the start-up with Triton's
  reason.
- ``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``: the headers (call
  metadata) whose name the regex finds (case-insensitive unless the pattern starts with
  ``(?-i)``) become string request parameters; a reserved name (``sequence_id`` ...,
  ``triton_*``) fails the request with Triton's message.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Triton's restricted categories, in Triton's order (src/restricted_features.h)
CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config",
              "model-repository", "statistics", "trace", "logging")

# the prefix Triton puts before the key of --grpc-restricted-protocol (grpc_server.h)
GRPC_KEY_PREFIX = "triton-grpc-protocol-"

# request parameter names a header may not be forwarded as (Triton's kReservedParameterKeys),
# and any name starting with "triton_"
RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority",
                                 "timeout", "headers", "binary_data_output"})


@dataclass(frozen=True, slots=True)
class Restrictions:
    """Restricted groups: category -> (header or metadata key, expected value)."""

    rules: tuple[tuple[str, str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.rules)

    def rule(self, category: str) -> tuple[str, str] | None:
        for name, key, value in self.rules:
            if name == category:
                return key, value
        return None

    def refusal(self, category: str | None, headers: Iterable[tuple[str, str]]) -> str | None:
        """The header a request of ``category`` lacks (None when it may pass). ``headers``:
        (lower-case name, value) pairs."""
        if category is None or not self.rules:
            return None
        rule = self.rule(category)
        if rule is None:
            return None
        key, expected = rule
        wanted = key.lower()
        for name, value in headers:
            if name == wanted:  # the first one decides, compared in constant time
                same = hmac.compare_digest(value.encode("utf-8", "surrogatepass"),
                                           expected.encode("utf-8", "surrogatepass"))
                return None if same else key
        return key


def parse_restrictions(entries: Iterable[str], option: str, feature: str,
                       key_prefix: str = "") -> Restrictions:
    """Every ``<groups>:<key>=<value>`` of one flag; ValueError with Triton's reason.
    ``feature``: "api" (HTTP) or "protocol" (gRPC)."""
    rules: list[tuple[str, str, str]] = []
    taken: set[str] = set()
    for arg in entries:
        groups, key, value = _generic_option(arg, option)
        for group in groups.split(","):
            if group not in CATEGORIES:
                raise ValueError(f"unknown restricted {feature} '{group}'")
            if group in taken:
                raise ValueError(f"restricted {feature} '{group}' can not be specified in "
                                 "multiple config groups")
            taken.add(group)
            rules.append((group, key_prefix + key, value))
    return Restrictions(tuple(rules))


def _generic_option(arg: str, option: str) -> tuple[str, str, str]:
    """``<name>:<setting>=<value>`` with each part non-empty (Triton's
    ParseGenericConfigOption, its message)."""
    reason = (f"--{option} option format is '<config name>:<setting>=<value>'. Got {arg}")
    name, colon, rest = arg.partition(":")
    setting, equals, value = rest.partition("=")
    if not colon or not equals or not name or not setting or not value:
        raise ValueError(reason)
    return name, setting, value


# -- which group an endpoint belongs to --------------------------------------------------------

_HTTP_GROUPS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), group) for pattern, group in (
        (r"/v2/health/(live|ready)", "health"),
        (r"/v2/models/[^/]+(/versions/[^/]+)?/ready", "health"),
        (r"/v2", "metadata"),
        (r"/v2/models/stats", "statistics"),
        (r"/v2/models/[^/]+(/versions/[^/]+)?/stats", "statistics"),
        (r"/v2/models/[^/]+(/versions/[^/]+)?/config", "model-config"),
        (r"/v2/models/[^/]+(/versions/[^/]+)?/(infer|generate|generate_stream)", "inference"),
        (r"/v2/models/[^/]+(/versions/[^/]+)?/trace/setting", "trace"),
        (r"/v2/models/[^/]+(/versions/[^/]+)?", "metadata"),
        (r"/v2/trace/setting", "trace"),
        (r"/v2/logging", "logging"),
        (r"/v2/(system|cuda)sharedmemory(/region/[^/]+)?/(status|register|unregister)",
         "shared-memory"),
        (r"/v2/repository(/[^/]+)?/index", "model-repository"),
        (r"/v2/repository(/[^/]+)?/models/[^/]+/(load|unload)", "model-repository"),
    ))


def http_group(path: str) -> str | None:
    """The restricted group of an HTTP path (decoded, without the query); None for a path
    no endpoint has (answered 404 whatever the restrictions)."""
    for pattern, group in _HTTP_GROUPS:
        if pattern.fullmatch(path):
            return group
    return None


_SERVICE = "/inference.GRPCInferenceService/"
GRPC_GROUPS: dict[str, str] = {
    **{_SERVICE + m: "health" for m in ("ServerLive", "ServerReady", "ModelReady")},
    "/grpc.health.v1.Health/Check": "health",
    **{_SERVICE + m: "metadata" for m in ("ServerMetadata", "ModelMetadata")},
    _SERVICE + "ModelConfig": "model-config",
    _SERVICE + "ModelStatistics": "statistics",
    _SERVICE + "TraceSetting": "trace",
    _SERVICE + "LogSettings": "logging",
    **{_SERVICE + f"{kind}SharedMemory{op}": "shared-memory"
       for kind in ("System", "Cuda") for op in ("Status", "Register", "Unregister")},
    **{_SERVICE + m: "model-repository"
       for m in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")},
    **{_SERVICE + m: "inference" for m in ("ModelInfer", "ModelStreamInfer")},
}


def http_refusal_message(header: str) -> str:
    return f"This API is restricted, expecting header '{header}'"


def grpc_refusal_message(key: str) -> str:
    return f"This protocol is restricted, expecting header '{key}'"


# -- header forwarding -------------------------------------------------------------------------

def compile_forward_pattern(pattern: str) -> re.Pattern[str] | None:
    """Triton's header-forward regex: case-insensitive unless it starts with ``(?-i)``
    (RE2's way to turn that off, which Python's ``re`` spells differently); None for ""."""
    if not pattern:
        return None
    if pattern.startswith("(?-i)"):
        return re.compile(pattern[len("(?-i)"):])
    return re.compile(pattern, re.IGNORECASE)


class ReservedHeader(ValueError):
    """A header matched the forward pattern but its name is a reserved parameter."""


@dataclass(frozen=True, slots=True)
class HeaderForward:
    pattern: re.Pattern[str] | None = None

    def parameters(self, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The headers to forward, as string parameters; :class:`ReservedHeader` with
        Triton's message for a reserved name."""
        out: dict[str, str] = {}
        if self.pattern is None:
            return out
        for name, value in headers:
            if self.pattern.search(name) is None:
                continue
            if name in RESERVED_PARAMETERS or name.startswith("triton_"):
                raise ReservedHeader(
                    f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
            out[name] = value
        return out


__all__ = ["CATEGORIES", "GRPC_GROUPS", "GRPC_KEY_PREFIX", "HeaderForward", "ReservedHeader",
           "Restrictions", "compile_forward_pattern", "grpc_refusal_message", "http_group",
           "http_refusal_message", "parse_restrictions"]

OPEN = Restrictions()  # no group restricted
NO_FORWARD = HeaderForward()  # no header forwarded

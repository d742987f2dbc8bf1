"""JSON request bodies however deeply nested, parsed without recursion.

Triton's HTTP frontend parses every JSON body with RapidJSON, which keeps its place on the heap,
so a document nested 250,000 deep parses, and the handler then answers what is wrong with it in
its own words (``Invalid value for 'ready': expected a boolean``, ``JSON nesting depth exceeds
maximum allowed limit (100)`` for tensor data). Python's parsers recurse: the standard library's
stops with a RecursionError about a thousand levels down, and orjson recurses on the C stack
until it overflows (orjson 3.8 kills the process somewhere past 100,000 levels), so a body must
never reach orjson unless its depth is known to be small.

:func:`loads` is the frontends' one entry point. A body with few brackets (every tensor sent as
a flat ``data`` list) goes straight to the fast parser; a body whose brackets could nest past
:data:`FAST_DEPTH` is measured first; a deeper one is parsed by :func:`loads_iterative`, an
explicit-stack parser whose containers below :data:`KEEP_DEPTH` are checked (the whole document
must be valid JSON, as for RapidJSON) but kept only as :data:`TOO_DEEP`, a value of no JSON
type: a handler sees a container where it expected one (or not), never a structure that a
recursive walk of its own could choke on.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import numpy as np

try:  # orjson is several times faster on tensor-sized JSON; the stdlib is the fallback
    import orjson

    def _fast(data: bytes) -> Any:
        return orjson.loads(data)

except ImportError:  # pragma: no cover - exercised only without orjson
    def _fast(data: bytes) -> Any:
        return json.loads(data)

# nesting the fast parser is trusted with (the standard library's own limit is about 1000)
FAST_DEPTH = 512
# containers deeper than this are validated but kept as TOO_DEEP
KEEP_DEPTH = 512


class JSONSyntaxError(ValueError):
    """A body that is not JSON; ``str()`` is the parser's description."""


class _TooDeep:
    """A container nested past :data:`KEEP_DEPTH`: valid JSON, not kept."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<JSON nested too deeply>"


TOO_DEEP: Any = _TooDeep()

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def max_depth_bound(data: bytes) -> int:
    """An upper bound of the document's nesting (brackets inside strings count too), at
    memory speed: a few milliseconds for 8 MB."""
    brackets = data.translate(None, _NOT_BRACKETS)
    opens = brackets.count(b"[") + brackets.count(b"{")
    if opens <= FAST_DEPTH:
        return opens
    steps = _STEP[np.frombuffer(brackets, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def shallow(data: bytes | memoryview) -> bool:
    """Whether :func:`loads` takes the fast parser for ``data`` (no deeper than
    :data:`FAST_DEPTH`): a deeper body costs a parse in Python, which callers on an event
    loop run in a worker thread."""
    return max_depth_bound(data if isinstance(data, bytes) else bytes(data)) <= FAST_DEPTH


def loads(data: bytes | memoryview, *, stdlib: bool = False) -> Any:
    """Parse a JSON body: with orjson (or, ``stdlib``, the standard library's parser, its
    grammar and messages) when it is no deeper than :data:`FAST_DEPTH`, else with
    :func:`loads_iterative`. A body that is not JSON raises a ValueError."""
    raw = data if isinstance(data, bytes) else bytes(data)
    if max_depth_bound(raw) <= FAST_DEPTH:
        return json.loads(raw) if stdlib else _fast(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONSyntaxError(f"the body is not UTF-8: {exc}") from None
    return loads_iterative(text)


# one token at a time, after any whitespace; a run of opening or of closing square brackets is
# one token (the deep part of a hostile body is such runs); a string token is its opening
# quote (the standard library's scanstring reads the rest)
_TOKEN = re.compile(r"""[ \t\n\r]*(?:
      (?P<open>\[(?:[ \t\n\r]*\[)*)
    | (?P<close>\](?:[ \t\n\r]*\])*)
    | (?P<punct>[{}:,])
    | (?P<string>")
    | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)
    | (?P<word>true|false|null|NaN|Infinity|-Infinity)
    )?""", re.VERBOSE)
_WORDS: dict[str, Any] = {
    "true": True, "false": False, "null": None,
    "NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf"),
}

# parser states
_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _COLON, _AFTER = range(6)
_EXPECTED = {
    _VALUE: "Expecting value", _VALUE_OR_CLOSE: "Expecting value",
    _KEY: "Expecting property name enclosed in double quotes",
    _KEY_OR_CLOSE: "Expecting property name enclosed in double quotes",
    _COLON: "Expecting ':' delimiter", _AFTER: "Expecting ',' delimiter",
}


def _error(message: str, text: str, pos: int) -> JSONSyntaxError:
    return JSONSyntaxError(str(json.JSONDecodeError(message, text, pos)))


class _Parser:
    """The explicit stack: ``kinds`` holds every open container's kind (``[`` or ``{``), one
    byte a level; ``kept`` the first KEEP_DEPTH of them as [container, pending key]."""

    def __init__(self) -> None:
        self.kinds = bytearray()
        self.kept: list[list[Any]] = []
        self.root: Any = None

    def attach(self, value: Any) -> None:
        """A complete value goes into the innermost open container (if kept)."""
        depth = len(self.kinds)
        if depth == 0:
            self.root = value
        elif depth <= KEEP_DEPTH:
            container, key = self.kept[-1]
            if key is None:
                container.append(value)
            else:
                container[key] = value

    def push(self, kind: int, count: int = 1) -> None:
        room = max(0, KEEP_DEPTH - len(self.kinds))
        for _ in range(min(count, room)):
            self.kept.append([[] if kind == 0x5B else {}, None])
        self.kinds.extend(bytes([kind]) * count)

    def pop(self, kind: int, count: int) -> bool:
        """Close ``count`` containers of ``kind``; False if they are not the innermost."""
        kinds = self.kinds
        if len(kinds) < count or kinds[len(kinds) - count:] != bytes([kind]) * count:
            return False
        deep = max(0, len(kinds) - KEEP_DEPTH)
        bulk = min(count, deep)
        if bulk:  # discarded containers, closed at once: the last one's parent sees TOO_DEEP
            del kinds[len(kinds) - bulk:]
            self.attach(TOO_DEEP)
        for _ in range(count - bulk):
            container = self.kept.pop()[0]
            del kinds[-1]
            self.attach(container)
        return True


def loads_iterative(text: str) -> Any:
    """``json.loads`` with an explicit stack: any depth, containers below
    :data:`KEEP_DEPTH` kept as :data:`TOO_DEEP` (validated, not built). The standard
    library's grammar (NaN and Infinity too; the last of duplicate keys wins)."""
    parser = _Parser()
    state = _VALUE
    pos = 0
    end = len(text)
    match = _TOKEN.match
    while True:
        m = match(text, pos)
        assert m is not None  # the pattern matches whitespace alone, even none
        kind = m.lastgroup
        if kind is None:
            at = m.end()
            if at == end and state == _AFTER and not parser.kinds:
                return parser.root
            message = "Extra data" if state == _AFTER and not parser.kinds else _EXPECTED[state]
            raise _error(message, text, at)
        start, pos = m.start(kind), m.end()
        token = m.group(kind)
        if state == _AFTER and not parser.kinds:
            raise _error("Extra data", text, start)
        if kind == "open" and state in (_VALUE, _VALUE_OR_CLOSE):
            parser.push(0x5B, token.count("["))
            state = _VALUE_OR_CLOSE
        elif kind == "close" and state in (_AFTER, _VALUE_OR_CLOSE):
            if not parser.pop(0x5B, token.count("]")):
                raise _error(_EXPECTED[state], text, start)
            state = _AFTER
        elif token == "{" and state in (_VALUE, _VALUE_OR_CLOSE):
            parser.push(0x7B)
            state = _KEY_OR_CLOSE
        elif token == "}" and state in (_AFTER, _KEY_OR_CLOSE):
            if not parser.pop(0x7B, 1):
                raise _error(_EXPECTED[state], text, start)
            state = _AFTER
        elif token == ":" and state == _COLON:
            state = _VALUE
        elif token == "," and state == _AFTER:
            state = _KEY if parser.kinds[-1] == 0x7B else _VALUE
        elif kind == "string" and state in (_KEY, _KEY_OR_CLOSE):
            key, pos = _scan(text, pos)
            if len(parser.kinds) <= KEEP_DEPTH:
                parser.kept[-1][1] = key
            state = _COLON
        elif state in (_VALUE, _VALUE_OR_CLOSE) and kind in ("string", "number", "word"):
            value: Any
            if kind == "string":
                value, pos = _scan(text, pos)
            elif kind == "number":
                value = float(token) if any(c in token for c in ".eE") else int(token)
            else:
                value = _WORDS[token]
            parser.attach(value)
            state = _AFTER
        else:
            raise _error(_EXPECTED[state], text, start)


def _scan(text: str, pos: int) -> tuple[str, int]:
    try:
        return scanstring(text, pos)
    except json.JSONDecodeError as exc:
        raise JSONSyntaxError(str(exc)) from None

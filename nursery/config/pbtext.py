"""Protobuf text format (``config.pbtxt``) for betterproto messages.

betterproto has no text format, so this module reads and writes it from the generated
classes' field metadata. It follows what Triton's C++ ``TextFormat`` parser accepts:
``field: value`` and ``field { ... }`` / ``field: { ... }`` / ``field < ... >``, repeated
fields given as ``[a, b]`` lists or by repeating the field, optional ``,``/``;`` separators,
``#`` comments, single or double quoted strings with C escapes (adjacent strings
concatenate), enum values by name or number, maps as repeated ``{ key: ... value: ... }``.
A singular field given twice, or two members of one oneof, is an error, as in Triton.

Errors carry the line and column: ``3:14: unknown field 'max_batch' in ModelConfig``.
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

import betterproto

_INT_TYPES = {
    "int32": (-(2**31), 2**31 - 1),
    "sint32": (-(2**31), 2**31 - 1),
    "sfixed32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "sint64": (-(2**63), 2**63 - 1),
    "sfixed64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "fixed32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
    "fixed64": (0, 2**64 - 1),
}
_FLOAT_TYPES = ("float", "double")


class TextFormatError(ValueError):
    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(f"{line}:{col}: {message}")
        self.line = line
        self.col = col
        self.reason = message


# -- schema -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldInfo:
    name: str  # the Python attribute (betterproto appends "_" to keywords: global -> global_)
    proto_name: str  # the name in the .proto, text format and JSON
    proto_type: str  # betterproto type name: "string", "int64", "message", "enum", "map", ...
    repeated: bool
    group: str | None  # oneof group
    cls: Any  # message/enum class for "message"/"enum"; for maps the value class
    map_types: tuple[str, str] | None


@cache
def fields_of(cls: type[betterproto.Message]) -> dict[str, FieldInfo]:
    """Field descriptions keyed by proto name, in declaration order."""
    # betterproto's annotations fall short here: its classproperty takes the owner class as
    # type[Never], and Message is no dataclass to mypy (only the generated subclasses are)
    meta = cls._betterproto  # type: ignore[arg-type]
    out: dict[str, FieldInfo] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        fm = f.metadata["betterproto"]
        proto_name = f.name[:-1] if f.name.endswith("_") and keyword.iskeyword(f.name[:-1]) else f.name
        if fm.proto_type == "map":
            value_cls = meta.cls_by_field.get(f"{f.name}.value")
            out[proto_name] = FieldInfo(f.name, proto_name, "map", False, None, value_cls,
                                        fm.map_types)
        else:
            repeated = meta.default_gen[f.name] is list
            out[proto_name] = FieldInfo(f.name, proto_name, fm.proto_type, repeated, fm.group,
                                        meta.cls_by_field.get(f.name), None)
    return out


def mark_present(message: betterproto.Message) -> None:
    """Record that a sub-message was given, even if every field in it is default.

    betterproto tracks presence of sub-messages in a private flag; this is the one place
    that touches it.
    """
    object.__setattr__(message, "_serialized_on_wire", True)


def is_present(parent: betterproto.Message, info: FieldInfo) -> bool:
    """Whether a singular message field (or oneof member) is set on ``parent``."""
    if info.group is not None:
        return betterproto.which_one_of(parent, info.group)[0] == info.name
    return betterproto.serialized_on_wire(getattr(parent, info.name))


# -- tokenizer ----------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\n\f\v]+) |
    (?P<comment>\#[^\n]*) |
    (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*') |
    (?P<number>-?(?:0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?)) |
    (?P<ident>-?[A-Za-z_][A-Za-z0-9_]*) |
    (?P<symbol>[{}\[\]<>:,;])
    """,
    re.VERBOSE,
)


@dataclass(slots=True)
class _Tok:
    kind: str
    text: str
    line: int
    col: int


def _tokens(text: str) -> Iterator[_Tok]:
    pos, line, line_start = 0, 1, 0
    n = len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise TextFormatError(line, pos - line_start + 1, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        tok_text = m.group()
        if kind not in ("ws", "comment"):
            yield _Tok(kind, tok_text, line, pos - line_start + 1)
        newlines = tok_text.count("\n")
        if newlines:
            line += newlines
            line_start = pos + tok_text.rindex("\n") + 1
        pos = m.end()
    yield _Tok("eof", "", line, pos - line_start + 1)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
            "\\": "\\", "'": "'", '"': '"', "?": "?"}


def _unescape(tok: _Tok) -> bytes:
    body = tok.text[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        i += 1
        e = body[i]
        if e in _ESCAPES:
            out += _ESCAPES[e].encode()
            i += 1
        elif e in "xX":
            m = re.match(r"[0-9a-fA-F]{1,2}", body[i + 1 :])
            if not m:
                raise TextFormatError(tok.line, tok.col, "invalid \\x escape in string")
            out.append(int(m.group(), 16))
            i += 1 + len(m.group())
        elif e in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i:])
            assert m is not None
            out.append(int(m.group(), 8) & 0xFF)
            i += len(m.group())
        elif e in "uU":
            width = 4 if e == "u" else 8
            digits = body[i + 1 : i + 1 + width]
            if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise TextFormatError(tok.line, tok.col, f"invalid \\{e} escape in string")
            out += chr(int(digits, 16)).encode("utf-8")
            i += 1 + width
        else:
            raise TextFormatError(tok.line, tok.col, f"invalid escape '\\{e}' in string")
    return bytes(out)


# -- parser -------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self._toks = list(_tokens(text))
        self._i = 0

    @property
    def tok(self) -> _Tok:
        return self._toks[self._i]

    def advance(self) -> _Tok:
        t = self._toks[self._i]
        self._i += 1
        return t

    def error(self, message: str, tok: _Tok | None = None) -> TextFormatError:
        t = tok or self.tok
        return TextFormatError(t.line, t.col, message)

    def accept(self, symbol: str) -> bool:
        if self.tok.kind == "symbol" and self.tok.text == symbol:
            self._i += 1
            return True
        return False

    def expect(self, symbol: str) -> None:
        if not self.accept(symbol):
            got = self.tok.text or "end of file"
            raise self.error(f"expected '{symbol}', got '{got}'")

    def parse_message(self, msg: betterproto.Message, close: str | None) -> None:
        cls = type(msg)
        schema = fields_of(cls)
        seen: dict[str, _Tok] = {}
        while True:
            if close is None and self.tok.kind == "eof":
                return
            if close is not None and self.accept(close):
                return
            name_tok = self.tok
            if name_tok.kind != "ident":
                what = name_tok.text or "end of file"
                if close is not None and name_tok.kind == "eof":
                    raise self.error(f"expected '{close}' to close {cls.__name__}, got end of file")
                raise self.error(f"expected a field name in {cls.__name__}, got '{what}'")
            self.advance()
            info = schema.get(name_tok.text)
            if info is None:
                raise self.error(f"unknown field '{name_tok.text}' in {cls.__name__}", name_tok)
            if not info.repeated and info.proto_type != "map":
                if info.proto_name in seen:
                    raise self.error(
                        f"field '{info.proto_name}' is specified more than once in "
                        f"{cls.__name__}",
                        name_tok,
                    )
                if info.group is not None:
                    for other in seen:
                        if schema[other].group == info.group:
                            raise self.error(
                                f"field '{info.proto_name}' is specified along with '{other}', "
                                f"another member of oneof '{info.group}' in {cls.__name__}",
                                name_tok,
                            )
            seen[info.proto_name] = name_tok
            self.parse_field(msg, info)
            if not self.accept(","):
                self.accept(";")

    def parse_field(self, msg: betterproto.Message, info: FieldInfo) -> None:
        is_message = info.proto_type in ("message", "map")
        has_colon = self.accept(":")
        if not is_message and not has_colon:
            raise self.error(f"expected ':' after field '{info.proto_name}'")
        if self.tok.kind == "symbol" and self.tok.text == "[":
            if not info.repeated and info.proto_type != "map":
                raise self.error(f"field '{info.proto_name}' is not repeated; a list is not allowed")
            self.advance()
            if self.accept("]"):
                return
            while True:
                self.parse_one(msg, info)
                if self.accept("]"):
                    return
                self.expect(",")
        else:
            self.parse_one(msg, info)

    def parse_one(self, msg: betterproto.Message, info: FieldInfo) -> None:
        if info.proto_type == "map":
            key, value = self.parse_map_entry(info)
            getattr(msg, info.name)[key] = value
            return
        if info.proto_type == "message":
            if self.accept("{"):
                close = "}"
            elif self.accept("<"):
                close = ">"
            else:
                raise self.error(f"expected '{{' to start {info.cls.__name__} '{info.proto_name}'")
            if info.repeated:
                sub = info.cls()
                mark_present(sub)
                self.parse_message(sub, close)
                getattr(msg, info.name).append(sub)
            else:
                if info.group is not None:
                    sub = info.cls()
                else:
                    sub = getattr(msg, info.name)
                mark_present(sub)
                self.parse_message(sub, close)
                setattr(msg, info.name, sub)
            return
        value = self.parse_scalar(info.proto_type, info.cls, info.proto_name)
        if info.repeated:
            getattr(msg, info.name).append(value)
        else:
            setattr(msg, info.name, value)

    def parse_map_entry(self, info: FieldInfo) -> tuple[Any, Any]:
        assert info.map_types is not None
        key_type, value_type = info.map_types
        if self.accept("{"):
            close = "}"
        elif self.accept("<"):
            close = ">"
        else:
            raise self.error(f"expected '{{' to start an entry of map '{info.proto_name}'")
        key: Any = None
        value: Any = None
        while not self.accept(close):
            t = self.tok
            if t.kind != "ident" or t.text not in ("key", "value"):
                raise self.error(f"expected 'key' or 'value' in an entry of map '{info.proto_name}'")
            self.advance()
            if t.text == "key":
                if key is not None:
                    raise self.error(f"'key' given twice in an entry of map '{info.proto_name}'", t)
                self.expect(":")
                key = self.parse_scalar(key_type, None, f"{info.proto_name}.key")
            else:
                if value is not None:
                    raise self.error(f"'value' given twice in an entry of map '{info.proto_name}'", t)
                if value_type == "message":
                    self.accept(":")
                    if self.accept("{"):
                        vclose = "}"
                    elif self.accept("<"):
                        vclose = ">"
                    else:
                        raise self.error(f"expected '{{' for the value of map '{info.proto_name}'")
                    value = info.cls()
                    mark_present(value)
                    self.parse_message(value, vclose)
                else:
                    self.expect(":")
                    value = self.parse_scalar(value_type, info.cls, f"{info.proto_name}.value")
            if not self.accept(","):
                self.accept(";")
        if key is None:
            key = "" if key_type == "string" else 0
        if value is None:
            value = info.cls() if value_type == "message" else _default_scalar(value_type)
        return key, value

    def parse_scalar(self, proto_type: str, cls: Any, name: str) -> Any:
        t = self.tok
        if proto_type == "string" or proto_type == "bytes":
            if t.kind != "string":
                raise self.error(f"expected a string for field '{name}', got '{t.text}'")
            data = b""
            while self.tok.kind == "string":
                data += _unescape(self.advance())
            if proto_type == "bytes":
                return data
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                raise self.error(f"string for field '{name}' is not valid UTF-8", t) from None
        self.advance()
        if proto_type == "bool":
            if t.text in ("true", "True", "t", "1"):
                return True
            if t.text in ("false", "False", "f", "0"):
                return False
            raise self.error(f"expected true or false for field '{name}', got '{t.text}'", t)
        if proto_type == "enum":
            if t.kind == "ident":
                try:
                    return cls[t.text]
                except KeyError:
                    valid = ", ".join(m.name for m in cls)
                    raise self.error(
                        f"unknown value '{t.text}' for field '{name}' (one of: {valid})", t
                    ) from None
            if t.kind == "number" and _is_int(t.text):
                number = _int(t.text)
                try:
                    return cls(number)
                except ValueError:
                    raise self.error(f"unknown value {number} for enum field '{name}'", t) from None
            raise self.error(f"expected an enum value for field '{name}', got '{t.text}'", t)
        if proto_type in _INT_TYPES:
            # protobuf's own words first (tools grep Triton's log for them), then the field
            lo, hi = _INT_TYPES[proto_type]
            if t.kind != "number" or not _is_int(t.text) or (lo == 0 and t.text.startswith("-")):
                got = "-" if t.kind == "number" and t.text.startswith("-") and _is_int(
                    t.text) else t.text
                raise self.error(f"Expected integer, got: {got} (an integer for field "
                                 f"'{name}')", t)
            v = _int(t.text)
            if not lo <= v <= hi:
                raise self.error(f"Integer out of range ({t.text}) for {proto_type} field "
                                 f"'{name}'", t)
            return v
        if proto_type in _FLOAT_TYPES:
            low = t.text.lower().lstrip("-")
            sign = -1.0 if t.text.startswith("-") else 1.0
            if t.kind == "ident" and low in ("inf", "infinity"):
                return sign * math.inf
            if t.kind == "ident" and low == "nan":
                return math.nan
            if t.kind != "number":
                raise self.error(f"expected a number for field '{name}', got '{t.text}'", t)
            text = t.text.rstrip("fF") if not t.text.lower().startswith(("0x", "-0x")) else t.text
            try:
                return float(_int(text)) if _is_int(text) else float(text)
            except (ValueError, OverflowError):
                raise self.error(f"expected a number for field '{name}', got '{t.text}'", t) from None
        raise self.error(f"field '{name}' of type {proto_type} is not supported in text format", t)


def _is_int(text: str) -> bool:
    """Hexadecimal, octal (a leading 0: digits 0-7 only) or decimal, and short enough that
    ``int()`` is cheap and cannot refuse it: 40 digits exceed every 64-bit field anyway, and
    the range check then names the value."""
    return re.fullmatch(r"-?(0[xX][0-9a-fA-F]{1,40}|0[0-7]{0,40}|[1-9][0-9]{0,40})", text) is not None


def _int(text: str) -> int:
    neg = text.startswith("-")
    body = text[1:] if neg else text
    if body[:2] in ("0x", "0X"):
        v = int(body, 16)
    elif len(body) > 1 and body.startswith("0"):
        v = int(body, 8)
    else:
        v = int(body)
    return -v if neg else v


def _default_scalar(proto_type: str) -> Any:
    if proto_type == "string":
        return ""
    if proto_type == "bytes":
        return b""
    if proto_type == "bool":
        return False
    if proto_type in _FLOAT_TYPES:
        return 0.0
    return 0


M = TypeVar("M", bound=betterproto.Message)


def parse(text: str, message: M) -> M:
    """Parse text format into ``message`` (modified in place and returned)."""
    _Parser(text).parse_message(message, None)
    return message


# -- printer ------------------------------------------------------------------------------


def _format_scalar(value: Any, proto_type: str) -> str:
    if proto_type == "string":
        return _quote(value.encode("utf-8"))
    if proto_type == "bytes":
        return _quote(value)
    if proto_type == "bool":
        return "true" if value else "false"
    if proto_type == "enum":
        return value.name if hasattr(value, "name") and value.name else str(int(value))
    if proto_type in _FLOAT_TYPES:
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(float(value))
    return str(int(value))


def _quote(data: bytes) -> str:
    out = []
    for b in data:
        c = chr(b)
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif 32 <= b < 127:
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def dumps(message: betterproto.Message, indent: int = 0) -> str:
    """Text format for ``message``: set fields only (non-default scalars, present messages)."""
    pad = "  " * indent
    lines: list[str] = []
    for info in fields_of(type(message)).values():
        if info.group is not None and not is_present(message, info):
            continue
        value = getattr(message, info.name)
        if info.proto_type == "map":
            assert info.map_types is not None
            for k, v in value.items():
                key = _format_scalar(k, info.map_types[0])
                if info.map_types[1] == "message":
                    inner = dumps(v, indent + 2)
                    lines.append(
                        f"{pad}{info.proto_name} {{\n{pad}  key: {key}\n{pad}  value {{\n"
                        f"{inner}{pad}  }}\n{pad}}}"
                    )
                else:
                    val = _format_scalar(v, info.map_types[1])
                    lines.append(f"{pad}{info.proto_name} {{ key: {key} value: {val} }}")
        elif info.proto_type == "message":
            items = value if info.repeated else [value]
            for sub in items:
                if not info.repeated and info.group is None and not is_present(message, info):
                    continue
                lines.append(f"{pad}{info.proto_name} {{\n{dumps(sub, indent + 1)}{pad}}}")
        elif info.repeated:
            if value:
                joined = ", ".join(_format_scalar(v, info.proto_type) for v in value)
                lines.append(f"{pad}{info.proto_name}: [{joined}]")
        else:
            if value != _default_scalar(info.proto_type) or (info.group is not None):
                lines.append(f"{pad}{info.proto_name}: {_format_scalar(value, info.proto_type)}")
    return "".join(line + "\n" for line in lines)

"""Tool calling on ``/v1/chat/completions``, as Triton's OpenAI frontend offers it. Pure: no
I/O, no trio.

A request's ``tools`` go to the chat template (``tools=``); ``tool_choice`` decides what
comes back:

- ``"none"``: the model's text, as content;
- a named function (``{"type": "function", "function": {"name": ...}}``) or ``"required"``
  (the first tool): the model is asked for that function's arguments (guided decoding with the
  function's ``parameters`` schema, where the model takes it: TRT-LLM's
  ``guided_decoding_guide_type`` / ``guided_decoding_guide`` inputs, vLLM's
  ``structured_outputs``), and its whole text is that call's ``arguments``;
- ``"auto"`` (the default when there are tools): the text is parsed by the server's
  ``--tool-call-parser`` (``llama3``: JSON objects ``{"name", "arguments" | "parameters"}``
  separated by ``; ``, optionally after ``<|python_tag|>``; ``hermes``: ``<tool_call>{...}
  </tool_call>`` blocks after optional text; ``mistral``: ``[TOOL_CALLS]`` and a JSON list of
  ``{"name", "arguments"}`` after optional text, or the list alone); calls found make
  ``tool_calls`` with ``finish_reason`` ``"tool_calls"``, otherwise the text is the content.

Streaming, the parser runs as the text comes: content streams as it is certain (a tail that
may start a tool call waits), and each call goes out as OpenAI and vLLM send it: a first
delta with its index, id, type and name once the name is complete, then its arguments piece
by piece (``_CallReader`` writes them as ``json.dumps`` does, so the pieces joined are the
whole call's ``arguments``); a call's arguments that come before its name wait for it. When
a call's text is complete, the whole parse of it sends what the pieces lack (a Python-literal
hermes call goes out whole then). A call cut off (``max_tokens``) or broken after it started
stays as far as it went, where the whole answer would be content.

Refusals carry Triton's messages: tools without ``--tool-call-parser`` ("having tools in the
request requires --tool-call-parser to be set"), ``"auto"`` without it, ``"required"`` or a
named choice without tools, a named function not among the tools.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nursery.protocol.openai.requests import ApiError


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call-{uuid.uuid4().hex}")

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


# -- the request ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolPlan:
    """What a chat request asks of tools: ``tools`` for the template; ``named``: the function
    whose arguments the whole text is (named choice or "required"); ``schema``: its
    parameters' JSON schema (for guided decoding); ``parser``: the parser of an "auto"
    choice."""

    tools: list[dict[str, Any]] | None = None
    named: str | None = None
    schema: str | None = None
    parser: str | None = None


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ApiError(400, "Invalid 'tools': expected an array of tools.", "invalid_type",
                       "tools")
    out = []
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type", "function") == "function"
                and isinstance(function, dict) and isinstance(function.get("name"), str)
                and function["name"]):
            raise ApiError(400, f"Invalid 'tools[{i}]': expected {{\"type\": \"function\", "
                           "\"function\": {\"name\": ..., \"parameters\": {...}}}.",
                           "invalid_value", f"tools[{i}]")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise ApiError(400, f"Invalid 'tools[{i}].function.parameters': expected an "
                           "object (a JSON schema).", "invalid_type",
                           f"tools[{i}].function.parameters")
        out.append({"type": "function", "function": dict(function)})
    return out


def plan(body: dict[str, Any], parser: str) -> ToolPlan:
    """Check ``tools`` and ``tool_choice`` (Triton's rules and messages) and say what to do."""
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    named: str | None = None
    if isinstance(choice, dict):
        function = choice.get("function")
        if not (choice.get("type") == "function" and isinstance(function, dict)
                and isinstance(function.get("name"), str)):
            raise ApiError(400, "Invalid 'tool_choice': expected \"none\", \"auto\", "
                           "\"required\" or {\"type\": \"function\", \"function\": {\"name\": "
                           "...}}.", "invalid_value", "tool_choice")
        if not tools:
            raise ApiError(400, "Named tool choice requires CreateChatCompletionRequest.tools "
                           "to be provided", None, "tool_choice")
        named = function["name"]
    elif choice is not None and choice not in ("none", "auto", "required"):
        raise ApiError(400, f"Invalid 'tool_choice': expected \"none\", \"auto\", \"required\" "
                       f"or a named function, but got {json.dumps(choice)[:100]} instead.",
                       "invalid_value", "tool_choice")
    if choice == "required":
        if not tools:
            raise ApiError(400, '"required" tool choice requires '
                           "CreateChatCompletionRequest.tools to be provided", None, "tool_choice")
        named = tools[0]["function"]["name"]
    if choice == "auto" and not parser:
        raise ApiError(400, '"auto" tool choice requires --tool-call-parser to be set', None,
                       "tool_choice")
    if choice is None and tools and not parser:
        raise ApiError(400, "having tools in the request requires --tool-call-parser to be set",
                       None, "tools")
    if named is not None:
        assert tools is not None
        found = {t["function"]["name"]: t["function"] for t in tools}
        if named not in found:
            raise ApiError(400, f"Tool '{named}' has not been passed in `tools`.", None,
                           "tool_choice")
        return ToolPlan(tools, named, json.dumps(found[named].get("parameters") or {}))
    auto = bool(tools) and choice in (None, "auto")
    return ToolPlan(tools, parser=parser if auto else None)


def messages_for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` carry their arguments as a JSON text; chat
    templates want them as objects (as Triton's frontend and transformers give them)."""
    out = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list):
            fixed = []
            for j, call in enumerate(calls):
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict):
                    raise ApiError(400, f"Invalid 'messages[{i}].tool_calls[{j}]': expected "
                                   "a function call.", "invalid_value",
                                   f"messages[{i}].tool_calls[{j}]")
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except ValueError:
                        raise ApiError(400, f"Invalid 'messages[{i}].tool_calls[{j}].function."
                                       "arguments': not JSON.", "invalid_value",
                                       f"messages[{i}].tool_calls[{j}]") from None
                fixed.append({**call, "function": {**function, "arguments": arguments}})
            message = {**message, "tool_calls": fixed}
        out.append(message)
    return out


# -- the parsers ---------------------------------------------------------------------------------

def _call(obj: Any, ensure_ascii: bool = True, new_id: Callable[[], str] | None = None
          ) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    text = json.dumps(arguments, ensure_ascii=ensure_ascii)
    return ToolCall(obj["name"], text) if new_id is None else ToolCall(obj["name"], text, new_id())


def _json_call(text: str, ensure_ascii: bool, new_id: Callable[[], str] | None = None
               ) -> ToolCall | None:
    try:
        return _call(json.loads(text), ensure_ascii, new_id)
    except ValueError:
        return None


def _mistral_id() -> str:
    """Mistral's tool call ids: 9 letters and digits (mistral-common refuses others)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


_ALNUM = string.ascii_letters + string.digits
_WS = " \t\r\n"
_CLOSER = {"{": "}", "[": "]"}


# -- streaming a call piece by piece -------------------------------------------------------------

@dataclass(frozen=True)
class CallDelta:
    """A piece of a streamed tool call: a call's first piece has its ``id`` and ``name`` (and
    the arguments known so far, maybe none), later ones more of its ``arguments``."""

    index: int
    arguments: str
    name: str | None = None
    id: str | None = None

    def as_json(self) -> dict[str, Any]:
        if self.name is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class _CallReader:
    """One tool call's JSON object ``{"name": ..., "arguments": ...}``, read as it arrives.
    ``name`` once that string is complete; ``args``: the ``arguments`` (or ``parameters``)
    value written as ``json.dumps`` writes it (``", "`` and ``": "`` between items; strings,
    numbers and literals as json writes them), growing token by token and strings piece by
    piece, so that the complete text equals the whole call's ``arguments``. ``done`` once the
    object closed; ``failed`` at text that is not JSON (nothing more is read)."""

    ARGS = ("arguments", "parameters")

    def __init__(self, ensure_ascii: bool) -> None:
        self.ensure_ascii = ensure_ascii
        self.raw = ""  # the text read
        self.name: str | None = None
        self.args = ""
        self.done = self.failed = False
        self._stack: list[str] = []  # the open containers: "{" or "["
        self._expect = "top"  # top | key | key? | colon | value | value? | next
        self._key: str | None = None  # the call object's key whose value comes
        self._args_seen = False
        self._capturing = False  # inside the arguments value
        self._token = ""  # a number or a literal being read
        self._string: list[str] | None = None  # a string's raw characters not yet written
        self._string_is_key = False
        self._escaped = False

    def feed(self, text: str) -> int:
        """Read from ``text`` up to the end of the object; how many characters were read."""
        used = len(text)
        for i, ch in enumerate(text):
            if self.done or self.failed:
                used = i
                break
            self._char(ch)
        self.raw += text[:used]
        if self._string is not None and self._capturing and not self.failed:
            self._flush_string(final=False)
        return used

    # -- the characters -----------------------------------------------------------------

    def _char(self, ch: str) -> None:
        if self._string is not None:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == '"':
                self._end_string()
                return
            self._string.append(ch)
            return
        if self._token:
            if ch.isalnum() or ch in "+-.":
                self._token += ch
                return
            self._end_token()
            if self.failed:
                return
        if ch in _WS:
            return
        expect = self._expect
        if expect == "top":
            if ch != "{":
                self.failed = True
                return
            self._open(ch)
        elif expect in ("key", "key?"):
            if ch == '"':
                self._begin_string(key=True)
            elif ch == "}" and expect == "key?":
                self._close()
            else:
                self.failed = True
        elif expect == "colon":
            if ch != ":":
                self.failed = True
                return
            self._emit(": ")
            self._expect = "value"
            if len(self._stack) == 1 and self._key in self.ARGS and not self._args_seen:
                self._args_seen = self._capturing = True  # the arguments value begins
        elif expect in ("value", "value?"):
            if ch == "]" and expect == "value?":
                self._close()
            elif ch in "{[":
                self._open(ch)
            elif ch == '"':
                self._begin_string(key=False)
            elif ch.isalnum() or ch == "-":
                self._token = ch
            else:
                self.failed = True
        elif expect == "next":
            top = self._stack[-1]
            if ch == ",":
                self._emit(", ")
                self._expect = "key" if top == "{" else "value"
            elif ch == _CLOSER[top]:
                self._close()
            else:
                self.failed = True

    def _emit(self, text: str) -> None:
        if self._capturing:
            self.args += text

    def _open(self, ch: str) -> None:
        self._emit(ch)
        self._stack.append(ch)
        self._expect = "key?" if ch == "{" else "value?"

    def _close(self) -> None:
        self._emit(_CLOSER[self._stack.pop()])
        if not self._stack:
            self.done = True
        else:
            self._value_done()

    def _value_done(self) -> None:
        self._expect = "next"
        if len(self._stack) == 1:  # a value of the call object ended
            self._capturing = False

    def _end_token(self) -> None:
        token, self._token = self._token, ""
        try:
            value = json.loads(token)
        except ValueError:
            self.failed = True
            return
        self._emit(json.dumps(value))
        self._value_done()

    def _begin_string(self, key: bool) -> None:
        self._string, self._string_is_key = [], key
        self._emit('"')

    def _end_string(self) -> None:
        assert self._string is not None
        value = ""
        if self._capturing:  # what is left of it goes into args (and is checked)
            self._flush_string(final=True)
            if self.failed:
                return
        else:
            try:
                value = json.loads(f'"{"".join(self._string)}"')
            except ValueError:
                self.failed = True
                return
        self._string = None
        self._emit('"')
        if self._string_is_key:
            if len(self._stack) == 1:
                self._key = value
            self._expect = "colon"
            return
        if len(self._stack) == 1 and self._key == "name" and self.name is None:
            self.name = value
        self._value_done()

    def _flush_string(self, final: bool) -> None:
        """Write what is certain of the string being read: its characters up to the last
        complete escape (a high surrogate waits for its pair)."""
        assert self._string is not None
        raw = "".join(self._string)  # only what is not written yet
        safe = len(raw)
        if not final:
            i = safe = 0
            while i < len(raw):
                if raw[i] == "\\":
                    size = 6 if raw[i + 1:i + 2] == "u" else 2
                    if size == 6 and raw[i + 2:i + 4].lower() in ("d8", "d9", "da", "db"):
                        size = 12  # a surrogate pair: both halves or nothing
                    if i + size > len(raw):
                        break
                    i += size
                else:
                    i += 1
                safe = i
        if not safe:
            return
        try:
            text = json.loads(f'"{raw[:safe]}"')
        except ValueError:
            self.failed = True
            return
        self.args += json.dumps(text, ensure_ascii=self.ensure_ascii)[1:-1]
        self._string = [raw[safe:]]


class _Calls:
    """The calls of one streamed answer going out: a call starts (its first delta) once its
    name is known; then its arguments follow as ``_CallReader`` writes them; when the call's
    text is complete, the whole parse of it (``close``) sends what is still missing."""

    def __init__(self, ensure_ascii: bool, new_id: Callable[[], str]) -> None:
        self.ensure_ascii = ensure_ascii
        self.new_id = new_id
        self.count = 0  # calls started
        self.open = False  # the current call has started
        self._sent = ""  # the current call's arguments sent

    def reader(self) -> _CallReader:
        self.open, self._sent = False, ""
        return _CallReader(self.ensure_ascii)

    def progress(self, reader: _CallReader) -> list[CallDelta]:
        if reader.name is None:
            return []  # arguments that come before the name wait for it
        if not self.open:
            return [self._start(reader.name, reader.args)]
        more = reader.args[len(self._sent):]
        self._sent = reader.args
        return [CallDelta(self.count - 1, more)] if more else []

    def close(self, call: ToolCall | None) -> list[CallDelta]:
        """The current call's text is complete; ``call``: what the whole parse makes of it
        (None: not a call; one already started stays as far as it went)."""
        out = []
        if call is not None and not self.open:
            out.append(self._start(call.name, call.arguments))
        elif call is not None and call.arguments.startswith(self._sent) \
                and call.arguments != self._sent:
            out.append(CallDelta(self.count - 1, call.arguments[len(self._sent):]))
        self.open, self._sent = False, ""
        return out

    def _start(self, name: str, arguments: str) -> CallDelta:
        self.open, self._sent = True, arguments
        self.count += 1
        return CallDelta(self.count - 1, arguments, name, self.new_id())


def merge(deltas: list[CallDelta]) -> list[CallDelta]:
    """Consecutive pieces of one call as one."""
    out: list[CallDelta] = []
    for delta in deltas:
        if out and out[-1].index == delta.index:
            last = out[-1]
            out[-1] = CallDelta(last.index, last.arguments + delta.arguments, last.name, last.id)
        else:
            out.append(delta)
    return out


def _call_id() -> str:
    return f"call-{uuid.uuid4().hex}"


# -- the parsers ---------------------------------------------------------------------------------

class Llama3:
    """Llama 3's JSON tool calls: ``{"name": ..., "arguments": {...}}`` (or ``parameters``),
    several separated by ``; ``, the text starting with ``{`` or ``<|python_tag|>``."""

    TAG = "<|python_tag|>"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        if not (text.startswith(self.TAG) or text.startswith("{")):
            return text, []
        calls = []
        at = len(self.TAG) if text.startswith(self.TAG) else 0
        decoder = json.JSONDecoder()
        try:
            while at < len(text):
                obj, end = decoder.raw_decode(text, at)
                call = _call(obj)
                if call is None:
                    return text, []
                calls.append(call)
                at = end + len("; ")
        except ValueError:
            return text, []
        return "", calls

    def stream(self) -> Llama3Stream:
        return Llama3Stream()


class Llama3Stream:
    def __init__(self) -> None:
        self.text = ""
        self.mode = ""  # "" undecided, "text" or "tool"
        self.at = 0  # how far the tool calls are read
        self.calls = _Calls(True, _call_id)
        self.reader: _CallReader | None = None
        self.stopped = False

    @property
    def started(self) -> int:
        return self.calls.count

    def feed(self, delta: str) -> tuple[str, list[CallDelta]]:
        self.text += delta
        if not self.mode:
            if self.text.startswith(Llama3.TAG) or self.text.startswith("{"):
                self.mode = "tool"
                self.at = len(Llama3.TAG) if self.text.startswith(Llama3.TAG) else 0
            elif not Llama3.TAG.startswith(self.text):
                self.mode = "text"
                return self.text, []
            else:
                return "", []  # may still become the tag
        if self.mode == "text":
            return delta, []
        out: list[CallDelta] = []
        while not self.stopped and self.at < len(self.text):
            if self.reader is None:
                if self.text[self.at] in "; ":  # between calls
                    self.at += 1
                    continue
                self.reader = self.calls.reader()
            reader = self.reader
            self.at += reader.feed(self.text[self.at:])
            out += self.calls.progress(reader)
            if not (reader.done or reader.failed):
                break  # the call goes on in later text
            was_open, before = self.calls.open, self.calls.count
            out += self.calls.close(_json_call(reader.raw, True) if reader.done else None)
            if reader.failed or (not was_open and self.calls.count == before):
                self.stopped = True  # not a call (or broken): nothing after it is read
            self.reader = None
        return "", merge(out)

    def finish(self) -> tuple[str, list[CallDelta]]:
        if self.mode != "text" and not self.calls.count:
            return self.text, []  # never a call: the text was the answer
        return "", []  # a call cut off stays as far as it went


class Hermes:
    """Hermes-style tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
    after optional text (the content)."""

    START, END = "<tool_call>", "</tool_call>"
    BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

    @staticmethod
    def body(text: str) -> ToolCall | None:
        text = text.strip()
        try:
            obj = json.loads(text)
        except ValueError:
            try:
                obj = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
        return _call(obj, ensure_ascii=False)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.START not in text:
            return text, []
        calls = []
        for closed, unclosed in self.BLOCK.findall(text):
            call = self.body(closed or unclosed)
            if call is None:
                return text, []
            calls.append(call)
        return text[:text.find(self.START)], calls

    def stream(self) -> HermesStream:
        return HermesStream()


class HermesStream:
    def __init__(self) -> None:
        self.pending = ""  # text not yet released: a possible start of a tag, or a call
        self.inside = False
        self.fed = 0  # characters of the call in ``pending`` its reader has read
        self.calls = _Calls(False, _call_id)
        self.reader: _CallReader | None = None

    @property
    def started(self) -> int:
        return self.calls.count

    def feed(self, delta: str) -> tuple[str, list[CallDelta]]:
        self.pending += delta
        content = ""
        out: list[CallDelta] = []
        while True:
            if self.inside:
                assert self.reader is not None
                end = self.pending.find(Hermes.END)
                upto = len(self.pending) if end < 0 else end
                self.reader.feed(self.pending[self.fed:upto])
                self.fed = upto  # what the reader leaves (after its object) is not JSON
                out += self.calls.progress(self.reader)
                if end < 0:
                    break
                content += self._close(self.pending[:end], out, closed=True)
                self.pending = self.pending[end + len(Hermes.END):]
                continue
            start = self.pending.find(Hermes.START)
            if start >= 0:
                if not self.calls.count:
                    content += self.pending[:start]  # text after a call is not content
                self.pending = self.pending[start + len(Hermes.START):]
                self.inside, self.fed, self.reader = True, 0, self.calls.reader()
                continue
            held = _partial_tail(self.pending, Hermes.START)
            if not self.calls.count:
                content += self.pending[:len(self.pending) - held]
            self.pending = self.pending[len(self.pending) - held:]
            break
        return content, merge(out)

    def _close(self, block: str, out: list[CallDelta], closed: bool) -> str:
        """A call's block is complete: what it still lacks goes out; the content it makes
        (a block that is not a call, before any call: its text)."""
        was_open, before = self.calls.open, self.calls.count
        out += self.calls.close(Hermes.body(block))
        self.inside, self.reader = False, None
        if not was_open and self.calls.count == before == 0:
            return Hermes.START + block + (Hermes.END if closed else "")
        return ""

    def finish(self) -> tuple[str, list[CallDelta]]:
        if self.inside:  # an unclosed call: what there is of it
            out: list[CallDelta] = []
            content = self._close(self.pending, out, closed=False)
            return content, merge(out)
        return ("" if self.calls.count else self.pending), []


class Mistral:
    """Mistral's tool calls: ``[TOOL_CALLS]`` and a JSON list of ``{"name", "arguments"}``
    objects (text before the token is the content), or the list alone where the server
    dropped the special token from the text; ids of 9 letters and digits, as Mistral's
    templates require."""

    TOKEN = "[TOOL_CALLS]"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        head = text.lstrip()
        at = text.find(self.TOKEN)
        if head.startswith("[") and not head.startswith(self.TOKEN):
            content, rest = "", head  # a list alone (a token later is in its strings)
        elif at >= 0:
            content, rest = text[:at], text[at + len(self.TOKEN):]
        else:
            return text, []
        calls = []
        decoder = json.JSONDecoder()
        pos = 0
        while True:
            pos = _skip_space(rest, pos)
            try:
                items, pos = decoder.raw_decode(rest, pos)
            except ValueError:
                return text, []
            if not isinstance(items, list):
                return text, []
            for obj in items:
                call = _call(obj, ensure_ascii=False, new_id=_mistral_id)
                if call is None:
                    return text, []
                calls.append(call)
            pos = _skip_space(rest, pos)
            if not rest.startswith(self.TOKEN, pos):
                break  # text after the calls is left out
            pos += len(self.TOKEN)
        return (content, calls) if calls else (text, [])

    def stream(self) -> MistralStream:
        return MistralStream()


class MistralStream:
    def __init__(self) -> None:
        self.text = ""
        self.at = 0  # how far the text is read
        self.state = "start"  # start | text | list | items | item | after | stopped
        self.calls = _Calls(False, _mistral_id)
        self.reader: _CallReader | None = None
        self.released = 0  # characters of the text released as content

    @property
    def started(self) -> int:
        return self.calls.count

    def feed(self, delta: str) -> tuple[str, list[CallDelta]]:
        self.text += delta
        content = ""
        out: list[CallDelta] = []
        token = Mistral.TOKEN
        while self.at < len(self.text) and self.state != "stopped":
            rest = self.text[self.at:]
            if self.state == "start":
                head = rest.lstrip()
                if token.startswith(head):
                    break  # nothing yet, or the start of the token
                if head.startswith("[") and not head.startswith(token):
                    self.state = "list"  # a list without the token
                    self.at += len(rest) - len(head)
                else:
                    self.state = "text"
                continue
            if self.state == "text":
                found = rest.find(token)
                if found < 0:
                    keep = _partial_tail(rest, token)
                    content += rest[:len(rest) - keep]
                    self.at += len(rest) - keep
                    self.released = self.at
                    break
                content += rest[:found]
                self.at += found + len(token)
                self.released = self.at - len(token)
                self.state = "list"
                continue
            if rest[0] in _WS:
                self.at += 1
                continue
            if self.state == "list":
                self.state = "items" if rest[0] == "[" else "stopped"
                self.at += rest[0] == "["
            elif self.state == "items":
                if rest[0] == "]":
                    self.state, self.at = "after", self.at + 1
                elif rest[0] == "," and self.calls.count:
                    self.at += 1
                elif rest[0] == "{":
                    self.state, self.reader = "item", self.calls.reader()
                else:
                    self.state = "stopped"
            elif self.state == "item":
                assert self.reader is not None
                self.at += self.reader.feed(rest)
                out += self.calls.progress(self.reader)
                if not (self.reader.done or self.reader.failed):
                    break
                out += self.calls.close(_json_call(self.reader.raw, False, _mistral_id)
                                        if self.reader.done else None)
                self.state = "items" if self.calls.count else "stopped"
                self.reader = None
            elif self.state == "after":
                if rest.startswith(token):
                    self.state, self.at = "list", self.at + len(token)
                elif not token.startswith(rest):
                    self.state = "stopped"  # text after the calls is left out
                else:
                    break
        return content, merge(out)

    def finish(self) -> tuple[str, list[CallDelta]]:
        if not self.calls.count:  # never a call: the text not yet released is content
            return self.text[self.released:], []
        return "", []


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def _partial_tail(text: str, tag: str) -> int:
    """The length of the longest tail of ``text`` that begins ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


Parser = Llama3 | Hermes | Mistral
PARSERS: dict[str, type[Parser]] = {"llama3": Llama3, "hermes": Hermes, "mistral": Mistral}


def parser(name: str) -> Parser:
    return PARSERS[name]()


__all__ = ["PARSERS", "CallDelta", "Hermes", "Llama3", "Mistral", "ToolCall", "ToolPlan",
           "merge", "messages_for_template", "parser", "plan"]

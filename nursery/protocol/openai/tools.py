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
  </tool_call>`` blocks after optional text); calls found make ``tool_calls`` with
  ``finish_reason`` ``"tool_calls"``, otherwise the text is the content.

Streaming, the parser runs as the text comes: content streams as it is certain (a tail that
may start a tool call waits), and each call goes out in one delta (id, name and the whole
arguments) when its JSON is complete. Triton streams a call's arguments piece by piece;
clients join the pieces either way.

Refusals carry Triton's messages: tools without ``--tool-call-parser`` ("having tools in the
request requires --tool-call-parser to be set"), ``"auto"`` without it, ``"required"`` or a
named choice without tools, a named function not among the tools.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
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

def _call(obj: Any, ensure_ascii: bool = True) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=ensure_ascii))


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
        self.calls: list[ToolCall] = []

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
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
        found = []
        decoder = json.JSONDecoder()
        while True:
            start = self.at
            while self.text.startswith(";", start) or self.text.startswith(" ", start):
                start += 1
            try:
                obj, end = decoder.raw_decode(self.text, start)
            except ValueError:
                break
            call = _call(obj)
            if call is None:
                break
            found.append(call)
            self.at = end
        self.calls += found
        return "", found

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self.mode == "tool" and not self.calls:
            return self.text, []  # never a call: the text was the answer
        if not self.mode:
            return self.text, []
        return "", []


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
        self.calls: list[ToolCall] = []

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        self.pending += delta
        content = ""
        found: list[ToolCall] = []
        while True:
            if self.inside:
                end = self.pending.find(Hermes.END)
                if end < 0:
                    break
                call = Hermes.body(self.pending[:end])
                raw = Hermes.START + self.pending[:end + len(Hermes.END)]
                self.pending = self.pending[end + len(Hermes.END):]
                self.inside = False
                if call is not None:
                    found.append(call)
                elif not self.calls and not found:
                    content += raw  # not a call after all
                continue
            start = self.pending.find(Hermes.START)
            if start >= 0:
                if not self.calls and not found:
                    content += self.pending[:start]  # text after a call is not content
                self.pending = self.pending[start + len(Hermes.START):]
                self.inside = True
                continue
            held = _partial_tail(self.pending, Hermes.START)
            if not self.calls and not found:
                content += self.pending[:len(self.pending) - held]
            self.pending = self.pending[len(self.pending) - held:]
            break
        self.calls += found
        return content, found

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self.inside:  # an unclosed call: what there is of it
            call = Hermes.body(self.pending)
            if call is not None:
                self.calls.append(call)
                return "", [call]
            return ("" if self.calls else Hermes.START + self.pending), []
        return ("" if self.calls else self.pending), []


def _partial_tail(text: str, tag: str) -> int:
    """The length of the longest tail of ``text`` that begins ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


PARSERS: dict[str, type[Llama3] | type[Hermes]] = {"llama3": Llama3, "hermes": Hermes}


def parser(name: str) -> Llama3 | Hermes:
    return PARSERS[name]()


__all__ = ["PARSERS", "Hermes", "Llama3", "ToolCall", "ToolPlan", "messages_for_template",
           "parser", "plan"]

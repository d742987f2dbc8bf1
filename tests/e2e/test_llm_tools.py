"""Tool calling on the OpenAI port, with the official ``openai`` SDK, against llm_echo (which
answers its prompt's words again, one token each) and a chat template that renders the last
message alone: what the user writes is what the "model" answers, so a test writes the tool
call a model would. Every parser (``--tool-call-parser llama3``, ``hermes`` and ``mistral``),
plain and streamed (the stream put together by the SDK's own ``ChatCompletionStreamState``: a
call's first delta has its id, type and name, the later ones pieces of its arguments);
``tool_choice`` none, auto, required and named; a tool's result sent back; and the refusals
with Triton's messages."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from tests.conftest import ServerProcess, running_server
from tests.llm_tokenizer import write_tokenizer

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parents[1] / "models"
TEMPLATE = (
    "{% set last = messages[-1] %}"
    "{% if last['content'] == 'list tools' %}"
    "{% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
    "{% elif last['role'] == 'tool' %}"
    "{{ messages[-2]['tool_calls'][0]['function']['arguments']['city'] }} is "
    "{{ last['content'] }}"
    "{% else %}{{ last['content'] }}{% endif %}")
TOOLS: list[Any] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
# what a model would write to call get_weather, in each parser's form
CALLS = {"llama3": '{"name": "get_weather", "arguments": {"city": "Paris"}}',
         "hermes": 'Looking it up. <tool_call>{"name": "get_weather", "arguments": {"city": '
                   '"Paris"}}</tool_call>',
         "mistral": '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'}
CONTENT = {"llama3": "", "hermes": "Looking it up. ", "mistral": ""}


@pytest.fixture(scope="module", params=["llama3", "hermes", "mistral"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, openai.OpenAI]]:
    root = tmp_path_factory.mktemp("tools")
    shutil.copytree(MODELS / "llm_echo", root / "repo" / "llm_echo")
    tokenizer = write_tokenizer(root / "tokenizer")
    with running_server(root / "repo", "--tokenizer", str(tokenizer), "--chat-template",
                        TEMPLATE, "--tool-call-parser", request.param,
                        tmp_path_factory=tmp_path_factory, openai=True) as proc, \
            openai.OpenAI(base_url=proc.openai_url, api_key="unused", max_retries=0,
                          timeout=60) as sdk:
        yield request.param, sdk


def ask(sdk: openai.OpenAI, content: str, **kw: Any) -> Any:
    return sdk.chat.completions.create(model="llm_echo", max_completion_tokens=64,
                                       messages=[{"role": "user", "content": content}], **kw)


def streamed(sdk: openai.OpenAI, content: str, **kw: Any
             ) -> tuple[str, list[dict[str, Any]], list[Any], list[Any]]:
    """The streamed answer put together by the SDK (content, calls), the finish reasons, and
    every tool-call delta as it came."""
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    finishes, pieces = [], []
    for chunk in ask(sdk, content, stream=True, **kw):
        state.handle_chunk(chunk)
        if chunk.choices:
            finishes.append(chunk.choices[0].finish_reason)
            pieces += chunk.choices[0].delta.tool_calls or []
    message = state.get_final_completion().choices[0].message
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
             for c in message.tool_calls or []]
    return message.content or "", calls, finishes, pieces


def test_auto_tool_calls_are_parsed(served: tuple[str, openai.OpenAI]) -> None:
    parser, sdk = served
    answer = ask(sdk, CALLS[parser], tools=TOOLS)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == CONTENT[parser]
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_auto_tool_calls_stream(served: tuple[str, openai.OpenAI]) -> None:
    parser, sdk = served
    text, calls, finishes, pieces = streamed(sdk, CALLS[parser], tools=TOOLS,
                                             stream_options={"include_usage": True})
    whole = ask(sdk, CALLS[parser], tools=TOOLS).choices[0].message.tool_calls[0]
    assert text == CONTENT[parser]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("get_weather", whole.function.arguments)]  # the same call as unstreamed
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}
    # the first delta: index, id, type and name; then the arguments, piece by piece
    first, *rest = pieces
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather")
    assert first.id == calls[0]["id"]
    if parser == "mistral":
        assert len(first.id) == 9 and first.id.isalnum()
    assert len(rest) > 1 and all(p.index == 0 and p.id is None and p.function.name is None
                                 for p in rest)
    assert first.function.arguments + "".join(p.function.arguments for p in rest) == \
        calls[0]["arguments"]


def test_text_without_a_call_is_content(served: tuple[str, openai.OpenAI]) -> None:
    _, sdk = served
    answer = ask(sdk, "It is sunny in Paris", tools=TOOLS)
    assert answer.choices[0].message.content == "It is sunny in Paris"
    assert not answer.choices[0].message.tool_calls
    assert answer.choices[0].finish_reason == "stop"
    text, calls, finishes, _ = streamed(sdk, "It is sunny in Paris", tools=TOOLS)
    assert (text, calls, finishes[-1]) == ("It is sunny in Paris", [], "stop")


def test_tools_reach_the_template_and_none_leaves_the_text_alone(
        served: tuple[str, openai.OpenAI]) -> None:
    parser, sdk = served
    answer = ask(sdk, "list tools", tools=TOOLS, tool_choice="none")
    assert answer.choices[0].message.content == "get_weather get_time"
    answer = ask(sdk, CALLS[parser], tools=TOOLS, tool_choice="none")
    assert answer.choices[0].message.content == CALLS[parser]
    assert not answer.choices[0].message.tool_calls


def test_a_named_or_required_choice_makes_the_text_the_arguments(
        served: tuple[str, openai.OpenAI]) -> None:
    _, sdk = served
    arguments = '{"city": "Rome"}'
    named = {"type": "function", "function": {"name": "get_weather"}}
    answer = ask(sdk, arguments, tools=TOOLS, tool_choice=named)
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == arguments
    assert answer.choices[0].finish_reason == "stop"  # as Triton's frontend answers it
    text, calls, _, _ = streamed(sdk, arguments, tools=TOOLS, tool_choice="required")
    assert text == "" and [(c["name"], c["arguments"]) for c in calls] == [
        ("get_weather", arguments)]
    assert calls[0]["id"]


def test_a_tool_result_goes_back_to_the_model(served: tuple[str, openai.OpenAI]) -> None:
    parser, sdk = served
    call = ask(sdk, CALLS[parser], tools=TOOLS).choices[0].message.tool_calls[0]
    answer = sdk.chat.completions.create(model="llm_echo", tools=TOOLS, messages=[
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    assert answer.choices[0].message.content == "Paris is sunny"  # arguments as an object


def test_bad_tool_requests_are_refused_with_tritons_messages(
        served: tuple[str, openai.OpenAI]) -> None:
    _, sdk = served
    with pytest.raises(openai.BadRequestError) as caught:
        ask(sdk, "hi", tool_choice="required")
    assert '"required" tool choice requires CreateChatCompletionRequest.tools to be ' \
        "provided" in str(caught.value)
    with pytest.raises(openai.BadRequestError) as caught:
        ask(sdk, "hi", tools=TOOLS, tool_choice={"type": "function",
                                                 "function": {"name": "nope"}})
    assert "Tool 'nope' has not been passed in `tools`." in str(caught.value)


def test_without_a_parser_tools_need_one(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "llm_echo", repo / "llm_echo")
    tokenizer = write_tokenizer(tmp_path / "tokenizer")
    server: ServerProcess = start_server(repo, "--tokenizer", str(tokenizer), "--chat-template",
                                         TEMPLATE, openai=True)
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0,
                       timeout=60) as sdk:
        with pytest.raises(openai.BadRequestError) as caught:
            ask(sdk, "hi", tools=TOOLS)
        assert "having tools in the request requires --tool-call-parser to be set" in \
            str(caught.value)
        with pytest.raises(openai.BadRequestError) as caught:
            ask(sdk, "hi", tools=TOOLS, tool_choice="auto")
        assert '"auto" tool choice requires --tool-call-parser to be set' in str(caught.value)
        # a named choice needs no parser
        answer = ask(sdk, '{"city": "Oslo"}', tools=TOOLS,
                     tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert answer.choices[0].message.tool_calls[0].function.arguments == '{"city": "Oslo"}'


def test_a_streamed_parse_past_its_limit_ends_and_stops_the_model(
        tmp_path: Path, start_server: Any) -> None:
    """--max-tool-call-parse-bytes (Triton's, 128 KiB by default): a streamed chat whose text
    the tool-call parser would read past the limit ends with finish_reason "length", and the
    model's inference is cancelled (llm_echo's "forever" prompt never ends by itself)."""
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "llm_echo", repo / "llm_echo")
    tokenizer = write_tokenizer(tmp_path / "tokenizer")
    server: ServerProcess = start_server(
        repo, "--tokenizer", str(tokenizer), "--chat-template", TEMPLATE,
        "--tool-call-parser", "hermes", "--max-tool-call-parse-bytes", "64", openai=True)
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0,
                       timeout=60) as sdk:
        text, finishes = "", []
        for chunk in ask(sdk, "talk forever", stream=True, tools=TOOLS,
                         stream_options={"include_usage": True}):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finishes.append(chunk.choices[0].finish_reason)
        assert finishes[-1] == "length" and finishes.count("length") == 1, (text, finishes)
        assert text.startswith("talk forever talk") and len(text) <= 64
        deadline = time.monotonic() + 30  # bounded wait for the model to see the cancel
        while json.loads(ask(sdk, "__stats__").choices[0].message.content)["cancelled"] < 1:
            assert time.monotonic() < deadline, "the model was never cancelled"
            time.sleep(0.05)
    assert "Streaming tool-call parse buffer limit set to 64 bytes" in server.log()
    assert "Streaming tool-call parse buffer exceeded 64 bytes" in server.log()

"""Tool calling's pure half (nursery/protocol/openai/tools.py): the request checks with
Triton's messages, the llama3 and hermes parsers on whole answers, and their streaming form,
which, however the text is cut into pieces, gives the content and calls the whole-answer
parse gives."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.config.model import TensorSpec
from nursery.protocol.openai import mapping
from nursery.protocol.openai.requests import ApiError
from nursery.protocol.openai.tools import Hermes, Llama3, messages_for_template, plan
from nursery.types import DataType

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def refused(body: dict[str, object], parser: str = "") -> str:
    with pytest.raises(ApiError) as caught:
        plan(body, parser)
    assert caught.value.status == 400
    return str(caught.value)


def test_the_request_checks_give_tritons_messages() -> None:
    assert "having tools in the request requires --tool-call-parser to be set" in refused(
        {"tools": [WEATHER]})
    assert '"auto" tool choice requires --tool-call-parser to be set' in refused(
        {"tools": [WEATHER], "tool_choice": "auto"})
    assert '"required" tool choice requires CreateChatCompletionRequest.tools to be provided' \
        in refused({"tool_choice": "required"}, "llama3")
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert "Named tool choice requires CreateChatCompletionRequest.tools to be provided" in \
        refused({"tool_choice": named}, "llama3")
    assert "Tool 'get_weather' has not been passed in `tools`." in refused(
        {"tools": [TIME], "tool_choice": named})
    assert "Invalid 'tools[0]'" in refused({"tools": [{"type": "function"}]}, "llama3")
    assert "Invalid 'tool_choice'" in refused({"tools": [TIME], "tool_choice": "always"},
                                              "llama3")
    # what passes: "none" and named choices need no parser; auto needs one
    assert plan({"tools": [WEATHER], "tool_choice": "none"}, "").parser is None
    forced = plan({"tools": [TIME, WEATHER], "tool_choice": named}, "")
    assert forced.named == "get_weather"
    assert json.loads(forced.schema or "") == WEATHER["function"]["parameters"]
    assert plan({"tools": [TIME, WEATHER], "tool_choice": "required"}, "").named == "get_time"
    auto = plan({"tools": [WEATHER]}, "hermes")
    assert auto.parser == "hermes" and auto.tools == [WEATHER] and auto.named is None
    assert plan({}, "hermes").parser is plan({"tools": []}, "hermes").parser is None


def test_a_forced_call_asks_the_model_for_guided_json() -> None:
    gen = mapping.Generation(prompt="p", stream=False, max_tokens=4, guided_json='{"a": 1}')

    class Config:  # the two formats' inputs, all declared
        max_batch_size = 0
        input_map: dict[str, object] = {}

    names = {"text_input": DataType.BYTES, "stream": DataType.BOOL,
             "max_tokens": DataType.INT32, "guided_decoding_guide_type": DataType.BYTES,
             "guided_decoding_guide": DataType.BYTES, "sampling_parameters": DataType.BYTES}
    Config.input_map = {n: TensorSpec(n, t, (1,)) for n, t in names.items()}
    trt = mapping.generation_request(Config, "m", "1", mapping.TRTLLM, gen)  # type: ignore[arg-type]
    assert trt.inputs["guided_decoding_guide_type"].data.reshape(-1)[0] == b"json_schema"
    assert trt.inputs["guided_decoding_guide"].data.reshape(-1)[0] == b'{"a": 1}'
    vllm = mapping.generation_request(Config, "m", "1", mapping.VLLM, gen)  # type: ignore[arg-type]
    sampling = json.loads(vllm.inputs["sampling_parameters"].data.reshape(-1)[0])
    assert json.loads(sampling["structured_outputs"]) == {"json": '{"a": 1}'}


def test_assistant_tool_calls_reach_the_template_as_objects() -> None:
    messages = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    out = messages_for_template(messages)
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert out[1] == messages[1]
    with pytest.raises(ApiError, match="not JSON"):
        messages_for_template([{"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": "{nope"}}]}])


def test_llama3_answers() -> None:
    p = Llama3()
    content, calls = p.parse('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    content, calls = p.parse('<|python_tag|>{"name": "a", "parameters": {"x": 1}}; '
                             '{"name": "b", "arguments": {}}')
    assert [(c.name, c.arguments) for c in calls] == [("a", '{"x": 1}'), ("b", "{}")]
    assert calls[0].id != calls[1].id
    for text in ("The weather is fine.", '{"name": "a", "arguments": {', '{"no_name": 1}',
                 ' {"name": "a", "arguments": {}}'):
        assert p.parse(text) == (text, [])


def test_hermes_answers() -> None:
    p = Hermes()
    content, calls = p.parse('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": '
                             '{"city": "Zürich"}}\n</tool_call>\n<tool_call>{"name": "get_time",'
                             ' "arguments": {}}</tool_call>')
    assert content == "Let me look.\n"
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Zürich"}'), ("get_time", "{}")]
    _, calls = p.parse("<tool_call>{'name': 'f', 'arguments': {'k': True}}")  # unclosed, Python
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"k": true}')]
    for text in ("no calls here", "<tool_call>not json</tool_call>"):
        assert p.parse(text) == (text, [])


ANSWERS = {
    "llama3": ['{"name": "get_weather", "arguments": {"city": "Paris"}}',
               '<|python_tag|>{"name": "a", "parameters": {"x": [1, 2]}}; {"name": "b", '
               '"arguments": {"s": "x; y"}}',
               "plain text, no call", "<|python", "{", '{"name": "a", "arguments": {"x": 1'],
    "hermes": ['Thinking <tool_call>{"name": "f", "arguments": {"a": "<b>"}}</tool_call>',
               '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": '
               '"g", "arguments": {"n": 2}}</tool_call>',
               "a < b and <tool_ but no call", "<tool_call>broken</tool_call>",
               '<tool_call>{"name": "f", "arguments": {"x": 1}}', "text <tool_c"],
}


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(sorted(ANSWERS)), data=st.data())
def test_streaming_gives_what_the_whole_answer_gives(kind: str, data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(ANSWERS[kind]))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    parser = Llama3() if kind == "llama3" else Hermes()
    stream = parser.stream()
    content, calls = "", []
    for piece in pieces:
        more, found = stream.feed(piece)
        content += more
        calls += found
    more, found = stream.finish()
    content, calls = content + more, calls + found
    want_content, want_calls = parser.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (c.name, json.loads(c.arguments)) for c in want_calls]
    assert content == want_content


def test_a_long_inline_chat_template_is_taken_as_a_template() -> None:
    from nursery.protocol.openai.tokenizer import load_chat_template

    long = "{{ messages[-1]['content'] }}" * 20  # longer than a file name may be
    assert load_chat_template(long) == long

"""Tool calling's pure half (nursery/protocol/openai/tools.py): the request checks with
Triton's messages, the llama3, hermes and mistral parsers on whole answers, and their
streaming form, which, however the text is cut into pieces, gives the content and calls the
whole-answer parse gives: each call's first piece with its id and name, then its arguments
piece by piece, written as the whole parse writes them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.config.model import TensorSpec
from nursery.protocol.openai import mapping
from nursery.protocol.openai.requests import ApiError
from nursery.protocol.openai.tools import (
    CallDelta,
    Hermes,
    Llama3,
    Mistral,
    _CallReader,
    messages_for_template,
    plan,
)
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


def test_mistral_answers() -> None:
    p = Mistral()
    content, calls = p.parse('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": '
                             '"Zürich"}}, {"name": "get_time", "arguments": {}}]')
    assert content == ""
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Zürich"}'), ("get_time", "{}")]
    assert all(len(c.id) == 9 and c.id.isalnum() for c in calls)  # Mistral's ids
    assert calls[0].id != calls[1].id
    # text before the token is the content; the list alone (the token dropped) is calls too
    content, calls = p.parse('Let me check.[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}]')
    assert content == "Let me check." and [(c.name, c.arguments) for c in calls] == [
        ("f", '{"x": 1}')]
    content, calls = p.parse(' [{"name": "f", "arguments": {}}] and then some words')
    assert content == "" and [c.name for c in calls] == ["f"]
    for text in ("plain text", "[TOOL_CALLS] not json", '[TOOL_CALLS] [{"no_name": 1}]',
                 "[1, 2, 3]", "[TOOL_CALLS][]", '[TOOL_CALLS] [{"name": "f", "arguments": {'):
        assert p.parse(text) == (text, [])


ANSWERS = {  # well formed, or not a call at all: streamed, the same as whole
    "llama3": ['{"name": "get_weather", "arguments": {"city": "Paris"}}',
               '<|python_tag|>{"name": "a", "parameters": {"x": [1, 2]}}; {"name": "b", '
               '"arguments": {"s": "x; y"}}',
               '{"arguments": {"late": "name"}, "name": "c"}',
               '{"name": "u", "arguments": {"t": "caf\\u00e9 \\ud83d\\ude00 \\"q\\"", '
               '"n": 1.50e1, "z": null}}',
               "plain text, no call", "<|python", "{", '{"no_name": 1}'],
    "hermes": ['Thinking <tool_call>{"name": "f", "arguments": {"a": "<b>"}}</tool_call>',
               '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": '
               '"g", "arguments": {"n": 2}}</tool_call>',
               "<tool_call>{'name': 'f', 'arguments': {'k': True}}</tool_call>",
               '<tool_call>{"name": "f", "arguments": {"k": \'v\'}}</tool_call>',
               "a < b and <tool_ but no call", "<tool_call>broken</tool_call>",
               '<tool_call>{"name": "f", "arguments": {"x": 1}}', "text <tool_c"],
    "mistral": ['[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Zürich"}}, '
                '{"name": "g", "arguments": {"deep": [{"a": [true, false]}, -0.5]}}]',
                'Sure.[TOOL_CALLS][{"name": "f", "arguments": {}}] trailing words',
                '[{"name": "f", "arguments": {"x": "[TOOL_CALLS]"}}]',
                "[TOOL_CALLS] not json", "[1, 2]", "a [TOOL_CALLS", "[TOOL", "[TOOL_CALLS][]",
                "plain text"],
}
CUT_OFF = {  # a call cut off: its pieces go out as they come, so the stream started it
    "llama3": ['{"name": "a", "arguments": {"x": 1'],
    "hermes": ['<tool_call>{"name": "f", "arguments": {"x": 1}} oops</tool_call>'],
    "mistral": ['[TOOL_CALLS] [{"name": "f", "arguments": {"x": "abc'],
}
PARSER = {"llama3": Llama3, "hermes": Hermes, "mistral": Mistral}


def stream_pieces(kind: str, pieces: list[str]) -> tuple[str, list[list[CallDelta]]]:
    """The content and, per call, its deltas."""
    stream = PARSER[kind]().stream()
    content, deltas = "", []
    for piece in pieces:
        more, found = stream.feed(piece)
        content += more
        deltas += found
    more, found = stream.finish()
    content += more
    deltas += found
    assert stream.started == len({d.index for d in deltas})
    calls: list[list[CallDelta]] = []
    for delta in deltas:
        if delta.index == len(calls):
            calls.append([])
        calls[delta.index].append(delta)
    return content, calls


def cut(data: st.DataObject, text: str) -> list[str]:
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=12)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(sorted(ANSWERS)), data=st.data())
def test_streaming_gives_what_the_whole_answer_gives(kind: str, data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(ANSWERS[kind]))
    content, calls = stream_pieces(kind, cut(data, text))
    want_content, want_calls = PARSER[kind]().parse(text)
    assert content == want_content
    assert len(calls) == len(want_calls)
    for pieces, want in zip(calls, want_calls, strict=True):
        first, *rest = pieces
        assert first.name == want.name and first.id  # the first piece: id and name
        assert all(p.name is None and p.id is None for p in rest)  # then arguments only
        assert "".join(p.arguments for p in pieces) == want.arguments  # written alike


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(sorted(CUT_OFF)), data=st.data())
def test_a_call_cut_off_goes_out_as_far_as_it_came(kind: str, data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(CUT_OFF[kind]))
    content, calls = stream_pieces(kind, cut(data, text))
    assert content == "" and len(calls) == 1 and calls[0][0].name in ("a", "f")
    assert PARSER[kind]().parse(text)[1] == []  # whole, the text is no call


def test_arguments_stream_before_the_call_is_complete() -> None:
    stream = Llama3().stream()
    _, (first,) = stream.feed('{"name": "get_weather", "arg')
    assert (first.index, first.name, first.arguments) == (0, "get_weather", "")
    assert first.as_json() == {"index": 0, "id": first.id, "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}
    _, found = stream.feed('uments": {"city": "Par')
    assert found == [CallDelta(0, '{"city": "Par')]
    assert found[0].as_json() == {"index": 0, "function": {"arguments": '{"city": "Par'}}
    _, found = stream.feed('is"}}; {"name": "get_time", "arguments": {}}')
    assert [(d.index, d.name, d.arguments) for d in found] == [
        (0, None, 'is"}'), (1, "get_time", "{}")]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(value=json_values, ascii_only=st.booleans(), compact=st.booleans(),
       indent=st.sampled_from([None, 2]), data=st.data())
def test_the_reader_writes_arguments_as_json_dumps_does(
        value: object, ascii_only: bool, compact: bool, indent: int | None,
        data: st.DataObject) -> None:
    """However the model spaces and escapes its JSON and however it is cut, the arguments
    the reader writes, joined, are ``json.dumps`` of the value."""
    body = json.dumps({"name": "f", "arguments": value}, indent=indent,
                      ensure_ascii=data.draw(st.booleans()),
                      separators=(",", ":") if compact else None)
    reader = _CallReader(ascii_only)
    seen = []
    for piece in cut(data, body):
        reader.feed(piece)
        assert reader.args.startswith("".join(seen))  # it only grows
        seen = [reader.args]
    assert reader.done and not reader.failed and reader.name == "f"
    assert reader.args == json.dumps(value, ensure_ascii=ascii_only)


def test_a_long_inline_chat_template_is_taken_as_a_template() -> None:
    from nursery.protocol.openai.tokenizer import load_chat_template

    long = "{{ messages[-1]['content'] }}" * 20  # longer than a file name may be
    assert load_chat_template(long) == long

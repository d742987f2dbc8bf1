"""Fuzzing the LLM doors' decoders: a generate request body (any bytes, and any JSON shaped
like one) and an OpenAI request's fields and chat messages. The only exceptions allowed out
are the documented ones: ``NurseryError`` for the generate extension (answered with its
status), ``ApiError`` for the OpenAI frontend (answered in OpenAI's shape); anything else
would be a 500 and a count at the request's boundary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery.backends.base import get_factory
from nursery.config.model import read_model_config
from nursery.errors import NurseryError
from nursery.protocol.http.generate import build_request, parse_body
from nursery.protocol.openai.requests import ApiError, Fields, conversation

MODELS = Path(__file__).resolve().parents[1] / "models"
CONFIG, _ = read_model_config(MODELS / "llm_echo", "llm_echo", backends=get_factory)
SPECS = {s.name: s for s in CONFIG.inputs}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
keys = st.one_of(st.sampled_from([*SPECS, "parameters", "id", "x"]), st.text(max_size=6))
bodies = st.dictionaries(keys, values, max_size=6)


def _generate(body: bytes) -> None:
    try:
        build_request(None, "llm_echo", "", parse_body(body), 4096,  # type: ignore[arg-type]
                      SPECS, CONFIG.max_batch_size)
    except NurseryError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_generate_bytes(data: bytes) -> None:
    _generate(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_generate_json(body: dict[str, Any]) -> None:
    _generate(json.dumps(body, allow_nan=True).encode())


def _fields(body: dict[str, Any]) -> None:
    fields = Fields(body)
    for read in (lambda: fields.boolean("stream"), lambda: fields.integer("max_tokens", 1),
                 lambda: fields.number("temperature", 0, 2), lambda: fields.string("model"),
                 fields.stop, lambda: fields.include_usage(bool(body.get("stream"))),
                 lambda: conversation(body.get("messages"))):
        try:
            read()
        except ApiError:
            pass


openai_keys = st.one_of(st.sampled_from(["stream", "max_tokens", "temperature", "model", "stop",
                                         "stream_options", "messages"]), st.text(max_size=4))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(openai_keys, values, max_size=6))
def test_openai_fields(body: dict[str, Any]) -> None:
    _fields(body)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]), values,
                                max_size=3), max_size=4))
def test_chat_messages(messages: list[dict[str, Any]]) -> None:
    _fields({"messages": messages})

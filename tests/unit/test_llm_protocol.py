"""The LLM doors' pure parts: the generate extension's request and response conversion, the
OpenAI-to-Triton mapping, the tokenizer folder and the chunked framing of streamed answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nursery.backends.base import get_factory
from nursery.config.model import ModelConfig, read_model_config
from nursery.errors import InternalError, InvalidArgument, NurseryError, Unsupported
from nursery.protocol.http import http1
from nursery.protocol.http.generate import build_request, encode, fit_shape, parse_body
from nursery.protocol.openai import mapping
from nursery.protocol.openai.tokenizer import Tokenizer, TokenizerError
from nursery.types import DataType, InferenceResponse, Tensor
from tests.llm_tokenizer import write_tokenizer

MODELS = Path(__file__).resolve().parents[1] / "models"


def _config(name: str) -> ModelConfig:
    config, _ = read_model_config(MODELS / name, name, backends=get_factory)
    return config


def _build(name: str, body: bytes, limit: int = 1 << 20) -> object:
    config = _config(name)
    return build_request(None, name, "", parse_body(body), limit,  # type: ignore[arg-type]
                         {s.name: s for s in config.inputs}, config.max_batch_size)


# -- generate ---------------------------------------------------------------------------------

def test_generate_inputs_take_the_models_shapes() -> None:
    request = _build("llm_echo", b'{"text_input": "hi", "stop_words": ["a", "b"], "x": 1.5, '
                                 b'"parameters": {"y": true}, "id": "7"}')
    assert request.inputs["text_input"].shape == (1, 1)  # type: ignore[attr-defined]
    assert request.inputs["stop_words"].shape == (1, 2)  # type: ignore[attr-defined]
    assert request.inputs["text_input"].data.tolist() == [[b"hi"]]  # type: ignore[attr-defined]
    assert request.parameters == {"x": 1.5, "y": True, "id": "7"}  # type: ignore[attr-defined]
    assert request.id == "7"  # type: ignore[attr-defined]


def test_fit_shape_is_tritons_two_passes() -> None:
    spec = _config("llm_echo").input_map["stop_words"]
    assert fit_shape(spec, 8, 3, "stop_words") == (1, 3)
    assert fit_shape(spec, 0, 3, "stop_words") == (3,)
    fixed = _config("llm_echo").input_map["max_tokens"]
    with pytest.raises(InvalidArgument, match="can not convert input 'max_tokens'"):
        fit_shape(fixed, 0, 2, "max_tokens")


@pytest.mark.parametrize(("body", "error", "text"), [
    (b'{"text_input": "a", "text_input": "b"}', InvalidArgument, "already exists"),
    (b'{"text_input": "a", "parameters": {"text_input": "b"}}', InvalidArgument,
     "Converting keyword: 'parameters': input 'text_input' already exists in request"),
    (b'{"p": [1]}', InvalidArgument, "parameter 'p' has invalid type"),
    (b'{"parameters": []}', InvalidArgument, "Expected JSON object for keyword: 'parameters'"),
    (b'{"text_input": {"a": 1}}', InternalError, "non-string as string"),
    (b'{"max_tokens": "5"}', InternalError, "non-signed-integer"),
    (b'[1]', InternalError, "must be a JSON object"),
    (b'{"text_input": "' + b"x" * 100 + b'"}', InvalidArgument, "maximum allowed input size"),
])
def test_generate_refusals(body: bytes, error: type[NurseryError], text: str) -> None:
    with pytest.raises(error, match=text.replace("(", r"\(").replace("[", r"\[")):
        _build("llm_echo", body, limit=64)


def test_generate_answer_is_flat_sorted_and_unwrapped() -> None:
    response = InferenceResponse("m", "1", [
        Tensor("text_output", DataType.BYTES, (1,), np.array([b"hi"], dtype=object)),
        Tensor("ids", DataType.INT32, (2,), np.array([1, 2], dtype=np.int32)),
    ], id="x", parameters={"p": 3})
    assert json.loads(encode(response)) == {"id": "x", "ids": [1, 2], "model_name": "m",
                                            "model_version": "1", "p": 3, "text_output": "hi"}
    assert list(json.loads(encode(response))) == sorted(json.loads(encode(response)))
    response.parameters = {"raw": b"\x00"}
    with pytest.raises(Unsupported, match="TRITONSERVER_PARAMETER_BYTES"):
        encode(response)


def test_streamed_framing() -> None:
    head = http1.stream_head(200, [(b"content-type", b"text/event-stream")], True)
    assert b"transfer-encoding: chunked\r\n" in head and b"content-length" not in head
    assert http1.chunk(b"data: 1\n\n") == b"9\r\ndata: 1\n\n\r\n"
    old = http1.stream_head(200, [], True, b"1.0")
    assert b"connection: close" in old and b"chunked" not in old


# -- the OpenAI mapping -------------------------------------------------------------------------

def test_request_format_per_model() -> None:
    assert mapping.request_format(_config("llm_echo"), "") == mapping.TRTLLM
    assert mapping.request_format(_config("llm_vllm"), "") == mapping.VLLM
    assert mapping.request_format(_config("llm_echo"), "vllm") == mapping.VLLM


def test_trtllm_request_sends_only_declared_inputs() -> None:
    gen = mapping.Generation(prompt="p", stream=True, max_tokens=5, stop=["s"],
                             temperature=0.5, frequency_penalty=0.1, lora="sql")
    request = mapping.generation_request(_config("llm_echo"), "llm_echo", "", mapping.TRTLLM, gen)
    assert set(request.inputs) == {"text_input", "stream", "max_tokens", "stop_words",
                                   "temperature", "return_num_input_tokens",
                                   "return_num_output_tokens"}  # no frequency_penalty input
    assert request.inputs["max_tokens"].data.dtype == np.int32
    assert request.inputs["max_tokens"].shape == (1, 1)
    assert request.parameters == {"lora_name": "sql"}
    plain = mapping.generation_request(_config("llm_plain"), "llm_plain", "", mapping.TRTLLM, gen)
    assert set(plain.inputs) == {"text_input", "max_tokens"}


def test_vllm_request_carries_sampling_parameters() -> None:
    gen = mapping.Generation(prompt="p", stream=False, max_tokens=7, stop=["s"], seed=3,
                             logprobs=2, lora="fr", sampling={"min_p": 0.1})
    request = mapping.generation_request(_config("llm_vllm"), "llm_vllm", "", mapping.VLLM, gen)
    sampling = json.loads(request.inputs["sampling_parameters"].data.reshape(-1)[0])
    assert sampling == {"min_p": 0.1, "max_tokens": 7, "seed": 3, "stop": ["s"],
                        "logprobs": 2, "lora_name": "fr"}
    assert request.inputs["exclude_input_in_output"].data.tolist() == [True]
    assert request.inputs["return_logprobs"].data.tolist() == [True]


def test_embedding_requests_need_the_vllm_input() -> None:
    request = mapping.embedding_request(_config("llm_embed"), "llm_embed", "", ["a"], 2)
    body = json.loads(request.inputs["embedding_request"].data.reshape(-1)[0])
    assert body == {"input": ["a"], "pooling_params": {"dimensions": [2]}}
    with pytest.raises(mapping.MappingError, match="embedding_request"):
        mapping.embedding_request(_config("llm_echo"), "llm_echo", "", "a", None)
    assert mapping.embeddings_of("[1, 2]") == [[1, 2]]
    assert mapping.embeddings_of("[[1], [2]]") == [[1], [2]]


def test_lora_names_come_from_the_version_folder() -> None:
    assert mapping.lora_names(_config("llm_echo"), 1) == ["sql", "chat"]
    assert mapping.lora_names(_config("llm_plain"), 1) is None


def test_vllm_logprobs_in_openai_shapes() -> None:
    data = [{"3": {"logprob": -1.0, "rank": 2, "decoded_token": "b"},
             "4": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}}]
    chat = mapping.chat_logprobs(data)
    assert chat[0]["token"] == "a" and [t["token"] for t in chat[0]["top_logprobs"]] == ["a", "b"]
    completion = mapping.completion_logprobs(data, offset=4)
    assert completion["tokens"] == ["a"] and completion["text_offset"] == [4]


# -- the tokenizer folder ---------------------------------------------------------------------

def test_chat_template_and_counts(tmp_path: Path) -> None:
    tokenizer = Tokenizer(write_tokenizer(tmp_path / "tok"))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello world"}])
    assert prompt == "<s>user: hello world\nassistant:"
    assert tokenizer.count("hello world") == 2
    with pytest.raises(TokenizerError, match="unknown role robot"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "x"}])
    custom = Tokenizer(tmp_path / "tok", chat_template="{{ messages[0]['content'] }}!")
    assert custom.apply_chat_template([{"role": "user", "content": "x"}]) == "x!"


def test_a_tokenizer_without_a_template(tmp_path: Path) -> None:
    tokenizer = Tokenizer(write_tokenizer(tmp_path / "tok", template=None))
    with pytest.raises(TokenizerError, match="chat_template is not set"):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer(tmp_path)

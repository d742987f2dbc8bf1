"""OpenAI requests as Triton requests, and Triton responses back, by Triton's OpenAI-frontend
conventions (``openai_frontend/engine/utils/triton.py``). Pure: no I/O, no trio.

Two request formats, chosen per model (``--backend`` overrides the choice for every model):

- **vLLM** (a model of backend ``vllm``, or one with a ``sampling_parameters`` input):
  ``text_input``, ``stream``, ``exclude_input_in_output``, ``sampling_parameters`` (a JSON
  string with the request's sampling fields: ``max_tokens``, ``stop``, ``temperature``,
  ``top_p``, ``seed``, ``logprobs``, ``lora_name``, ...), ``return_num_input_tokens`` /
  ``return_num_output_tokens``.
- **TRT-LLM** (everything else: a Python model, an ensemble, TensorRT-LLM): ``text_input``,
  ``stream``, ``max_tokens``, ``stop_words``, ``top_p``, ``temperature``, ``seed``,
  ``frequency_penalty``, ``presence_penalty``, ``exclude_input_in_output``,
  ``return_num_input_tokens`` / ``return_num_output_tokens``.

Responses: ``text_output`` (the text, or its next piece when streaming), optionally
``num_input_tokens`` / ``num_output_tokens`` (the usage) and, vLLM style, ``logprobs`` (a JSON
string). Embeddings use the vLLM convention for every backend: an ``embedding_request`` input
(JSON: ``{"input": ..., "pooling_params": {...}}``) answered with the vector(s) as a JSON
string in ``text_output``.

nursery departs from Triton's frontend in one way: an input the model does not declare is not
sent (Triton sends every TRT-LLM input and the core refuses the undeclared ones), so a small
Python model needs to declare only what it reads. The LoRA chosen with ``<model><sep><lora>``
goes to the model as the request parameter ``lora_name`` (and inside ``sampling_parameters``
for the vLLM format).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nursery.config.model import ModelConfig
from nursery.protocol.http.generate import fit_shape
from nursery.types import DataType, InferenceRequest, InferenceResponse, Tensor

VLLM, TRTLLM = "vllm", "tensorrtllm"
ECHO_INPUTS = ("exclude_input_in_output", "sampling_param_exclude_input_from_output")
# OpenAI fields that are not sampling parameters (Triton's exclusion list for vLLM)
NOT_SAMPLING = frozenset({
    "model", "stream", "messages", "prompt", "echo", "store", "metadata", "response_format",
    "service_tier", "stream_options", "tools", "tool_choice", "parallel_tool_calls", "user",
    "function_call", "functions", "suffix", "max_completion_tokens", "max_tokens", "logprobs",
    "top_logprobs", "best_of", "n",
})


class MappingError(Exception):
    """A model that cannot take the request in the form asked for (a client error)."""


@dataclass
class Generation:
    """One generation request, already validated."""

    prompt: str
    stream: bool
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: int | None = None  # how many top log probabilities (vLLM), None: not asked
    echo: bool | None = None
    lora: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # every other field, for vLLM
    guided_json: str | None = None  # a JSON schema the text must follow (a forced tool call)


def request_format(config: ModelConfig, override: str | None) -> str:
    if override:
        return override
    if config.backend == VLLM or "sampling_parameters" in config.input_map:
        return VLLM
    return TRTLLM


def _tensor(config: ModelConfig, name: str, values: list[Any]) -> Tensor | None:
    """``values`` as the model's input ``name`` (its datatype, its shape filled as the generate
    extension fills it); None when the model has no such input."""
    spec = config.input_map.get(name)
    if spec is None:
        return None
    shape = fit_shape(spec, config.max_batch_size, len(values), name)
    if spec.datatype is DataType.BYTES:
        data = np.array([v.encode() if isinstance(v, str) else v for v in values],
                        dtype=object)
    else:
        data = np.array(values).astype(spec.datatype.numpy_dtype)
    return Tensor(name, spec.datatype, shape, data.reshape(shape))


def generation_request(config: ModelConfig, name: str, version: str, fmt: str,
                       gen: Generation) -> InferenceRequest:
    inputs: dict[str, list[Any]] = {"text_input": [gen.prompt], "stream": [gen.stream]}
    if fmt == VLLM:
        sampling = dict(gen.sampling)
        sampling["max_tokens"] = gen.max_tokens
        for key in ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"):
            value = getattr(gen, key)
            if value is not None:
                sampling[key] = value
        if gen.stop:
            sampling["stop"] = gen.stop
        if gen.logprobs is not None:
            sampling["logprobs"] = gen.logprobs
        if gen.lora is not None:
            sampling["lora_name"] = gen.lora
        if gen.guided_json is not None:  # vLLM's StructuredOutputsParams, as a JSON text
            sampling["structured_outputs"] = json.dumps({"json": gen.guided_json})
        inputs["sampling_parameters"] = [json.dumps(sampling)]
        inputs["return_logprobs"] = [gen.logprobs is not None]
        echo_default = True  # vLLM: the prompt is left out unless echo is asked for
    else:
        inputs["max_tokens"] = [gen.max_tokens]
        if gen.stop:
            inputs["stop_words"] = list(gen.stop)
        for key in ("top_p", "frequency_penalty", "presence_penalty", "seed", "temperature"):
            value = getattr(gen, key)
            if value is not None:
                inputs[key] = [value]
        if gen.guided_json is not None:  # TensorRT-LLM's guided decoding inputs
            inputs["guided_decoding_guide_type"] = ["json_schema"]
            inputs["guided_decoding_guide"] = [gen.guided_json]
        echo_default = None
    exclude = (not gen.echo) if gen.echo is not None else echo_default
    if exclude is not None:
        for echo_name in ECHO_INPUTS:
            if echo_name in config.input_map:
                inputs[echo_name] = [exclude]
                break
    inputs["return_num_input_tokens"] = [True]
    inputs["return_num_output_tokens"] = [True]
    if "text_input" not in config.input_map:
        raise MappingError(f"Model '{name}' has no 'text_input' input: it does not take "
                           "completions in the TRT-LLM or vLLM form")
    tensors = {}
    for key, values in inputs.items():
        tensor = _tensor(config, key, values)
        if tensor is not None:
            tensors[key] = tensor
    parameters: dict[str, Any] = {}
    if gen.lora is not None:
        parameters["lora_name"] = gen.lora
    return InferenceRequest(name, version, tensors, parameters=parameters)


def embedding_request(config: ModelConfig, name: str, version: str, value: str | list[str],
                      dimensions: int | None) -> InferenceRequest:
    if "embedding_request" not in config.input_map:
        raise MappingError(
            f"Model '{name}' does not take embedding requests: it has no 'embedding_request' "
            "input (the vLLM convention Triton's frontend uses)")
    body: dict[str, Any] = {"input": value, "pooling_params": {}}
    if dimensions is not None:
        body["pooling_params"]["dimensions"] = [dimensions]
    inputs: dict[str, list[Any]] = {
        "embedding_request": [json.dumps(body)], "return_num_input_tokens": [True],
        "return_num_output_tokens": [True]}
    tensors = {}
    for key, values in inputs.items():
        tensor = _tensor(config, key, values)
        if tensor is not None:
            tensors[key] = tensor
    return InferenceRequest(name, version, tensors)


def _output(response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in response.outputs:
        if tensor.name == name:
            return tensor
    return None


def text_of(response: InferenceResponse) -> str:
    """``text_output`` (its first element), "" when the response has none."""
    tensor = _output(response, "text_output")
    if tensor is None or tensor.data.size == 0:
        return ""
    value = tensor.data.reshape(-1)[0]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def count_of(response: InferenceResponse, name: str) -> int | None:
    tensor = _output(response, name)
    if tensor is None or tensor.data.size == 0 or tensor.data.dtype.kind not in "iu":
        return None
    return int(tensor.data.reshape(-1)[0])


def logprobs_of(response: InferenceResponse) -> list[dict[str, Any]] | None:
    """vLLM's ``logprobs`` output: per token, {token id: {logprob, rank, decoded_token}}."""
    tensor = _output(response, "logprobs")
    if tensor is None or tensor.data.size == 0:
        return None
    raw = tensor.data.reshape(-1)[0]
    try:
        parsed = json.loads(bytes(raw) if isinstance(raw, bytes | bytearray) else str(raw))
    except ValueError:
        return None
    return parsed if isinstance(parsed, list) else None


def _ranked(entry: dict[str, Any]) -> list[dict[str, Any]]:
    items = [v for v in entry.values() if isinstance(v, dict)]
    return sorted(items, key=lambda v: v.get("rank", 1 << 30))


def chat_logprobs(data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat ``logprobs.content`` from vLLM's list."""
    out = []
    for entry in data:
        ranked = _ranked(entry) if isinstance(entry, dict) else []
        if not ranked:
            continue
        chosen = ranked[0]
        token = str(chosen.get("decoded_token", ""))
        out.append({
            "token": token, "logprob": chosen.get("logprob"), "bytes": list(token.encode()),
            "top_logprobs": [{"token": str(t.get("decoded_token", "")),
                              "logprob": t.get("logprob"),
                              "bytes": list(str(t.get("decoded_token", "")).encode())}
                             for t in ranked],
        })
    return out


def completion_logprobs(data: list[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """OpenAI completions ``logprobs`` from vLLM's list (text offsets from ``offset``)."""
    text_offset: list[int] = []
    token_logprobs: list[Any] = []
    tokens: list[str] = []
    top: list[dict[str, Any]] = []
    for entry in data:
        ranked = _ranked(entry) if isinstance(entry, dict) else []
        if not ranked:
            continue
        token = str(ranked[0].get("decoded_token", ""))
        text_offset.append(offset)
        token_logprobs.append(ranked[0].get("logprob"))
        tokens.append(token)
        top.append({str(t.get("decoded_token", "")): t.get("logprob") for t in ranked})
        offset += len(token)
    return {"text_offset": text_offset, "token_logprobs": token_logprobs, "tokens": tokens,
            "top_logprobs": top}


def embeddings_of(text: str) -> list[list[float]]:
    """The vector(s) a model wrote in ``text_output``: one list of numbers, or a list of
    them."""
    try:
        parsed = json.loads(text)
    except ValueError:
        raise MappingError("the model's embedding is not JSON") from None
    if isinstance(parsed, list) and parsed and all(isinstance(x, list) for x in parsed):
        return parsed
    if isinstance(parsed, list):
        return [parsed]
    raise MappingError("the model's embedding is not a list of numbers")


def lora_names(config: ModelConfig, version: int) -> list[str] | None:
    """The adapters in ``multi_lora.json`` of the version's folder (a JSON object: adapter
    name -> its path, as Triton's frontend reads it); None when the version lists none."""
    path = config.path / str(version) / "multi_lora.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return [str(k) for k in data] if isinstance(data, dict) else None


__all__ = ["TRTLLM", "VLLM", "Generation", "MappingError", "chat_logprobs",
           "completion_logprobs", "count_of", "embedding_request", "embeddings_of",
           "generation_request", "logprobs_of", "lora_names", "request_format", "text_of"]

"""A decoupled Triton ``model.py`` serving a ``Decoder`` through the ``DecodeLoop``, with the
tensor names of Triton's TensorRT-LLM models (what Triton's OpenAI-compatible frontend and
the generate extension send): ``text_input`` -> ``text_output``.

Inputs, each optional except ``text_input`` (one element each; with ``max_batch_size`` > 0
the shape is ``[1, 1]``): ``text_input`` (BYTES), ``stream`` (BOOL), ``max_tokens`` (INT32),
``stop_words`` / ``bad_words`` (BYTES, any count), ``temperature`` / ``top_p`` (FP32),
``top_k`` (INT32), ``seed`` (UINT64), ``exclude_input_in_output``,
``return_num_input_tokens``, ``return_num_output_tokens`` (BOOL). The request parameter
``lora_name`` picks an adapter of the version folder's ``multi_lora.json``.

Outputs: ``text_output`` (BYTES), ``num_input_tokens`` / ``num_output_tokens`` (UINT32, when
asked for: per response, the prompt's tokens and the tokens in that response). Streaming:
one response per step (one token; text may wait for the rest of a character or a possible
stop string), the last with the final flag. Otherwise one final response with everything.

Model configuration ``parameters``: ``batching_mode`` (continuous | static | sequential),
``max_slots`` (sequences decoded together), ``max_num_batched_tokens`` (tokens one decode
step runs at most: every decoding sequence's next one, then prompt tokens, so a long prompt
is spread over several steps; default ``max_slots``), ``max_prefill_overhead`` (continuous
mode: a step that runs prompt tokens beside decoding sequences costs at most this fraction
more than their decoding alone, by the loop's measured step cost; default ``off``: the
token budget only), ``default_max_tokens``,
``exclude_input_in_output`` (the default of the input of that name), ``tokenizer`` (a
folder beside config.pbtxt), ``weights`` (the decoder's folder in the version folder),
``seed`` (for requests without one), ``blas_threads`` (OpenBLAS's thread count for the
process: small products run fastest on one).
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from nursery.llm.decoder import Decoder, load_decoder, set_blas_threads
from nursery.llm.engine import PREFILL_OVERHEAD, Chunk, DecodeLoop, Job
from nursery.llm.sampling import SamplingParams
from nursery.llm.tokenizer import ByteBPETokenizer
from nursery.llm.weights import load_adapter, read_multi_lora

_FLAGS_FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class RequestError(ValueError):
    """A request that cannot run: its message goes back as the request's error."""


def _parameters(model_config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in (model_config.get("parameters") or {}).items():
        out[key] = value.get("string_value", "") if isinstance(value, dict) else str(value)
    return out


def _flag(text: str, name: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no", ""):
        return False
    raise ValueError(f"parameter {name!r} must be true or false, got {text!r}")


class DecoderServer:
    """What ``TritonPythonModel`` delegates to: ``submit`` each request, ``close`` at the end."""

    def __init__(self, args: dict[str, Any], pb_utils: Any) -> None:
        self.pb = pb_utils
        config = json.loads(args["model_config"])
        self.model_name = config.get("name") or args.get("model_name", "")
        params = _parameters(config)
        model_dir = Path(args["model_repository"])
        version_dir = model_dir / str(args["model_version"])
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.default_max_tokens = int(params.get("default_max_tokens", "16") or 16)
        self.exclude_input = _flag(params.get("exclude_input_in_output", "true"),
                                   "exclude_input_in_output")
        tok_dir = model_dir / (params.get("tokenizer") or "tokenizer")
        self.tokenizer = ByteBPETokenizer.from_file(tok_dir / "tokenizer.json")
        adapters = [load_adapter(name, folder)
                    for name, folder in read_multi_lora(version_dir).items()]
        slots = _integer(params, "max_slots", 32)
        budget = _integer(params, "max_num_batched_tokens", slots)
        overhead = _overhead(params.get("max_prefill_overhead") or "")
        if params.get("blas_threads"):
            set_blas_threads(int(params["blas_threads"]))
        self.decoder: Decoder = load_decoder(version_dir / (params.get("weights") or "."), slots,
                                             adapters)
        eos = {self.decoder.config.eos_token_id}
        special = _special_tokens(tok_dir / "tokenizer_config.json")
        if special.get("eos_token") in self.tokenizer.added:
            eos.add(self.tokenizer.added[special["eos_token"]])
        self.bos_id = self.decoder.config.bos_token_id
        seed = params.get("seed")
        self._metrics = _Metrics(pb_utils, self.model_name, str(args["model_version"]))
        self.loop = DecodeLoop(self.decoder, self.tokenizer.token_bytes, slots,
                               params.get("batching_mode") or "continuous", eos,
                               seed=int(seed) if seed else None, name=self.model_name,
                               observe=self._metrics.update, token_budget=budget,
                               prefill_overhead=overhead,
                               # a step's responses travel together where the server can
                               coalesce=getattr(pb_utils, "coalesce_responses", nullcontext))
        self.loop.start()

    def close(self) -> None:
        self.loop.close()

    # -- one request ------------------------------------------------------------------------

    def submit(self, request: Any) -> None:
        sender = request.get_response_sender()
        try:
            job = self._job(request, sender)
        except RequestError as exc:
            sender.send(self.pb.InferenceResponse(error=self.pb.TritonError(
                str(exc), self.pb.TritonError.INVALID_ARG)), flags=_FLAGS_FINAL)
            return
        self.loop.submit(job)

    def _job(self, request: Any, sender: Any) -> Job:
        pb = self.pb

        def values(name: str) -> np.ndarray | None:
            tensor = pb.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        def one(name: str, default: Any) -> Any:
            array = values(name)
            if array is None:
                return default
            if array.size != 1:
                raise RequestError(f"input '{name}' must hold one value, got shape "
                                   f"{list(array.shape)}")
            return array.reshape(-1)[0]

        def strings(name: str) -> list[str]:
            array = values(name)
            return [] if array is None else [_text(v, name) for v in array.reshape(-1)]

        prompts = values("text_input")
        if prompts is None:
            raise RequestError("input 'text_input' is required")
        if prompts.size != 1:
            raise RequestError(f"model '{self.model_name}' takes one prompt per request; "
                               f"'text_input' has shape {list(prompts.shape)}")
        prompt = _text(prompts.reshape(-1)[0], "text_input")
        try:
            max_tokens = int(one("max_tokens", self.default_max_tokens))
            sampling = SamplingParams(temperature=float(one("temperature", 1.0)),
                                      top_p=float(one("top_p", 1.0)),
                                      top_k=int(one("top_k", 0)), seed=_seed(one("seed", None)))
        except (TypeError, ValueError, OverflowError) as exc:
            raise RequestError(f"a sampling parameter has a wrong type: {exc}") from exc
        problem = sampling.problem()
        if problem:
            raise RequestError(problem)
        stop = strings("stop_words")
        bad = [self.tokenizer.encode(w) for w in strings("bad_words")]
        stream = bool(one("stream", False))
        exclude = bool(one("exclude_input_in_output", self.exclude_input))
        want_in = bool(one("return_num_input_tokens", False))
        want_out = bool(one("return_num_output_tokens", False))
        lora = _lora_name(request.parameters())
        adapter = 0
        if lora:
            found = self.decoder.adapter_index(str(lora))
            if not found:
                known = ", ".join(self.decoder.adapter_names[1:]) or "none"
                raise RequestError(f"LoRA '{lora}' is not available for model "
                                   f"'{self.model_name}' (available: {known})")
            adapter = found
        ids = self.tokenizer.encode(prompt) or [self.bos_id]
        n_ctx = self.decoder.n_ctx
        if max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {max_tokens}")
        if len(ids) + max_tokens > n_ctx:
            raise RequestError(
                f"This model's maximum context length is {n_ctx} tokens. However, you "
                f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, "
                f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.")
        emit = _Emitter(self, sender, stream, "" if exclude or stream else prompt, len(ids),
                        want_in, want_out)
        return Job(ids, max_tokens, emit, sampling, adapter, stop, bad,
                   cancelled=request.is_cancelled)

    def response(self, text: str, n_in: int | None, n_out: int | None) -> Any:
        pb = self.pb
        shape = (1, 1) if self.batched else (1,)
        outputs = [pb.Tensor("text_output",
                             np.array([text.encode("utf-8")], dtype=np.object_).reshape(shape))]
        if n_in is not None:
            outputs.append(pb.Tensor("num_input_tokens", np.full(shape, n_in, np.uint32)))
        if n_out is not None:
            outputs.append(pb.Tensor("num_output_tokens", np.full(shape, n_out, np.uint32)))
        return pb.InferenceResponse(output_tensors=outputs)


class _Emitter:
    """A job's ``emit``: chunks become responses (streamed, or gathered into one)."""

    def __init__(self, server: DecoderServer, sender: Any, stream: bool, prefix: str,
                 n_in: int, want_in: bool, want_out: bool) -> None:
        self.server, self.sender, self.stream = server, sender, stream
        self.parts = [prefix] if prefix else []
        self.tokens = 0
        self.n_in = n_in if want_in else None
        self.want_out = want_out

    def __call__(self, chunk: Chunk) -> None:
        pb = self.server.pb
        flags = _FLAGS_FINAL if chunk.final else 0
        if chunk.error is not None or chunk.finish == "cancelled":
            code = pb.TritonError.CANCELLED if chunk.finish == "cancelled" else \
                pb.TritonError.INTERNAL
            message = chunk.error or "the request was cancelled"
            self.sender.send(pb.InferenceResponse(error=pb.TritonError(message, code)),
                             flags=_FLAGS_FINAL)
            return
        if self.stream:
            self.sender.send(self.server.response(
                chunk.text, self.n_in, chunk.tokens if self.want_out else None), flags=flags)
            return
        self.parts.append(chunk.text)
        self.tokens += chunk.tokens
        if chunk.final:
            self.sender.send(self.server.response(
                "".join(self.parts), self.n_in, self.tokens if self.want_out else None),
                flags=flags)


class _Metrics:
    """Gauges of running and waiting sequences and a counter of ended ones, by outcome
    (custom metrics on the metrics port, as Triton's Python backend offers them)."""

    def __init__(self, pb: Any, model: str, version: str) -> None:
        labels = {"model": model, "version": version}
        # the families live as long as their metrics (a metric whose MetricFamily object is
        # deleted refuses every operation, as in Triton)
        active = pb.MetricFamily(
            name="nursery_llm_active_sequences", description="Sequences in the decode loop",
            kind=pb.MetricFamily.GAUGE)
        waiting = pb.MetricFamily(
            name="nursery_llm_waiting_requests", description="Requests waiting for a slot",
            kind=pb.MetricFamily.GAUGE)
        ended = pb.MetricFamily(
            name="nursery_llm_sequences_total",
            description="Sequences ended, by outcome (stop, length, cancelled, error)",
            kind=pb.MetricFamily.COUNTER)
        self.families = (active, waiting, ended)
        self.active = active.Metric(labels=labels)
        self.waiting = waiting.Metric(labels=labels)
        self.ended = {o: ended.Metric(labels={**labels, "outcome": o})
                      for o in ("stop", "length", "cancelled", "error")}
        self.seen = dict.fromkeys(self.ended, 0)
        self.last = (-1, -1)

    def update(self, loop: DecodeLoop) -> None:
        now = (loop.active, loop.waiting)
        if now != self.last:  # a metric call takes a lock (in a stub: a message): only changes
            self.active.set(now[0])
            self.waiting.set(now[1])
            self.last = now
        for outcome, count in loop.outcomes.items():
            if count != self.seen[outcome]:
                self.ended[outcome].increment(count - self.seen[outcome])
                self.seen[outcome] = count


def _integer(params: dict[str, str], name: str, default: int) -> int:
    text = params.get(name) or ""
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"parameter {name!r} must be an integer, got {text!r}") from None


def _overhead(text: str) -> float | None:
    """``max_prefill_overhead``: a fraction >= 0, ``off`` (no cap but the token budget), or
    empty (the default, ``off``)."""
    if not text.strip():
        return PREFILL_OVERHEAD
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"parameter 'max_prefill_overhead' must be a number >= 0 or 'off', "
                         f"got {text!r}")
    return value


def _text(value: Any, name: str) -> str:
    if isinstance(value, bytes | np.bytes_):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(f"input '{name}' is not valid UTF-8: {exc}") from exc
    return str(value)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    seed = int(value)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return seed


def _lora_name(parameters: str) -> str | None:
    try:
        found = json.loads(parameters or "{}").get("lora_name")
    except (ValueError, AttributeError):
        return None
    return None if found is None else str(found)


def _special_tokens(path: Path) -> dict[str, str]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for key in ("bos_token", "eos_token"):
        value = raw.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out

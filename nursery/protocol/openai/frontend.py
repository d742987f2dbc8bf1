"""The OpenAI-compatible API (``--openai-port``), served by nursery's HTTP/1.1 server.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``,
``GET /v1/models``, ``GET /v1/models/{model}``, ``POST /v1/models/{model}/load`` and
``/unload`` (``--model-control-mode=explicit`` only), ``GET /metrics`` (the metrics port's
text) and ``GET /health/ready``, each group of them behind a header of its own where
``--openai-restricted-api`` says so (``restrictions.py``). Each generation request becomes
one Triton request per choice (``n``), built by ``mapping.py`` with Triton's OpenAI-frontend
conventions, and goes to the model the way every frontend's does: ``Core.acquire``, then the
model client (``ModelClient.stream``: every response of a decoupled model as it comes).
``stream: true`` answers Server-Sent Events (``chat.completion.chunk`` / ``text_completion``) ending with
``data: [DONE]``; the status is sent with the first event, so an error the model gives before
its first response is still a plain JSON error with its status. A client that disconnects
cancels its requests (the request's cancel scope, ``protocol/http/streaming.py``).

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with the message also
under ``detail``, where Triton's frontend (FastAPI) puts it; the model management and health
routes answer ``{"detail": ...}`` alone, as Triton's frontend does there: 400
``invalid_request_error`` for a bad request (Triton's frontend messages where it has one), 400
``model_not_found`` for an unknown model (404 from ``GET /v1/models/{model}``), and the
model's own error with the status the KServe port would give it. The request's supervision
boundary is here too: anything unexpected costs that request a 500 in the same shape, one log
line and one count (``unit="openai"``).
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import trio

from nursery.actors.directory import ModelHandle
from nursery.core import Core
from nursery.errors import ErrorKind, NurseryError
from nursery.messages import Part
from nursery.protocol.http import http1
from nursery.protocol.http.infer import AfterSend, Response
from nursery.protocol.http.streaming import SSE_TYPE, Streaming, StreamWriter, sse_event
from nursery.protocol.openai import mapping, restrictions, tools
from nursery.protocol.openai.requests import ApiError, Fields, conversation, dumps, from_nursery
from nursery.protocol.openai.tokenizer import Tokenizer, TokenizerError, load_chat_template
from nursery.runtime.supervision import describe
from nursery.settings import OpenAISettings
from nursery.types import InferenceRequest

log = logging.getLogger("nursery.openai")

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", SSE_TYPE), (b"cache-control", b"no-cache")]
DONE = b"data: [DONE]\n\n"
OWNED_BY = "Triton Inference Server"
_EXPLICIT_ONLY = "Model load/unload requires --model-control-mode=explicit"


def _detail(status: int, message: str) -> Response:
    """An error in the shape Triton's frontend gives its model management and health routes."""
    return status, list(_JSON), dumps({"detail": message})


# -- one choice's run --------------------------------------------------------------------------

@dataclass
class Choice:
    """What one choice (one Triton request) produced."""

    index: int
    text: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False

    def add(self, part: Part) -> str:
        """Take a response; its text."""
        response = part.response
        text = ""
        if response is not None:
            text = mapping.text_of(response)
            self.text.append(text)
            prompt = mapping.count_of(response, "num_input_tokens")
            if prompt is not None and self.prompt_tokens is None:
                self.prompt_tokens = prompt
            produced = mapping.count_of(response, "num_output_tokens")
            if produced is not None:
                self.completion_tokens = (self.completion_tokens or 0) + produced
            found = mapping.logprobs_of(response)
            if found:
                self.logprobs.extend(found)
        self.finished = part.final
        return text


@dataclass
class Job:
    """One OpenAI generation request, ready to run."""

    kind: str  # "chat" or "completion"
    model: str  # as the client named it (with its LoRA)
    handle: ModelHandle
    requests: list[InferenceRequest]
    gen: mapping.Generation
    tokenizer: Tokenizer | None
    include_usage: bool
    created: int
    id: str
    tools: tools.ToolPlan = field(default_factory=tools.ToolPlan)

    def usage(self, choices: list[Choice]) -> dict[str, int] | None:
        prompt = next((c.prompt_tokens for c in choices if c.prompt_tokens is not None), None)
        if prompt is None and self.tokenizer is not None:
            prompt = self.tokenizer.count(self.gen.prompt, add_special_tokens=self.kind != "chat")
        completion = 0
        for c in choices:
            if c.completion_tokens is not None:
                completion += c.completion_tokens
            elif self.tokenizer is not None:
                completion += self.tokenizer.count("".join(c.text))
            else:
                return None
        if prompt is None:
            return None
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    def finish_reason(self, choice: Choice) -> str:
        if choice.completion_tokens is not None and choice.completion_tokens >= self.gen.max_tokens:
            return "length"
        return "stop"

    def message(self, choice: Choice) -> tuple[dict[str, Any], str]:
        """A chat choice's message and finish reason: its text, or the tool calls the request's
        ``tool_choice`` makes of it (tools.py)."""
        text = "".join(choice.text)
        plan = self.tools
        if plan.named is not None:  # the whole text is that function's arguments
            call = tools.ToolCall(plan.named, text, self.id)
            return ({"role": "assistant", "content": "", "tool_calls": [call.as_json()]},
                    self.finish_reason(choice))
        if plan.parser:
            content, calls = tools.parser(plan.parser).parse(text)
            if calls:
                return ({"role": "assistant", "content": content,
                         "tool_calls": [c.as_json() for c in calls]}, "tool_calls")
        return {"role": "assistant", "content": text}, self.finish_reason(choice)


# -- the frontend ------------------------------------------------------------------------------

class OpenAIFrontend:
    """The handler of the OpenAI port's every request."""

    def __init__(self, core: Core, options: OpenAISettings,
                 tokenizer: Tokenizer | None = None,
                 metrics: Callable[[], Awaitable[bytes]] | None = None) -> None:
        self.core = core
        self.options = options
        self.metrics = metrics  # the metrics port's text; None with --allow-metrics=false
        # loads and unloads one at a time, as Triton's frontend takes them (so of several
        # loads of one model, one answers 200 and the others "already loaded")
        self._managing = trio.Lock()
        if options.restrictions:
            log.info("API restrictions enabled. Restricted API endpoints: %s",
                     restrictions.summary(options.restrictions))
        if options.tool_call_parser:
            log.info("Streaming tool-call parse buffer limit set to %d bytes",
                     options.max_tool_call_parse_bytes)
        self.chat_template = load_chat_template(options.chat_template)
        # --tokenizer: one tokenizer for every model (Triton's frontend); the server reads it
        # before anything starts and hands it over
        if tokenizer is None and options.tokenizer:
            tokenizer = Tokenizer(Path(options.tokenizer), self.chat_template)
        self.tokenizer = tokenizer
        # a model's tokenizer/ folder, read once (or why it could not be)
        self._own: dict[Path, Tokenizer | TokenizerError | None] = {}
        self.created = int(time.time())

    @staticmethod
    def too_large(size: int, limit: int) -> Response:
        """A body past --openai-max-input-size, refused before it is read (Triton's frontend's
        words and status)."""
        return ApiError(413, f"Request size of {size} bytes exceeds the maximum allowed input "
                        f"size of {limit} bytes. Use --openai-max-input-size to increase the "
                        "limit.", "content_too_large", detail=False).response()

    # the request boundary ----------------------------------------------------------------

    async def handle(self, head: http1.RequestHead, body: bytes,
                     after: AfterSend | None = None) -> Response | Streaming:
        """One request (``after``: the HTTP server's hook for a written answer; unused)."""
        try:
            refused = self._restricted(head)
            if refused is not None:
                return refused
            return await self._route(head, body)
        except ApiError as error:
            return error.response()
        except NurseryError as error:
            return from_nursery(error).response()
        except Exception as exc:
            self.core.faults.record("openai", exc, log,
                                    f"an OpenAI request ({head.path[:200].decode('latin-1')})")
            return ApiError(500, f"Internal Server Error: {describe(exc)}").response()

    def _restricted(self, head: http1.RequestHead) -> Response | None:
        """401 in Triton's words for a request to a restricted group without its header."""
        rules = self.options.restrictions
        if not rules:
            return None
        group = restrictions.group_of(head.method.decode("latin-1"),
                                      unquote(head.path.decode("latin-1")))
        # values as the client's UTF-8: a configured value is compared as the text it is
        key = rules.refusal(group, [(k.decode("latin-1"), v.decode("utf-8", "surrogateescape"))
                                    for k, v in head.headers])
        if key is None:
            return None
        return 401, list(_JSON), dumps({"error": {
            "message": restrictions.message(key), "type": "authentication_error",
            "code": "invalid_auth"}})

    async def _route(self, head: http1.RequestHead, body: bytes) -> Response | Streaming:
        path = unquote(head.path.decode("latin-1")).rstrip("/")
        method = head.method.decode("latin-1")
        routes: dict[str, Callable[[dict[str, Any]], Any]] = {
            "/v1/chat/completions": self.chat, "/v1/completions": self.completion,
            "/v1/embeddings": self.embedding}
        if path in routes:
            if method != "POST":
                raise ApiError(405, f"Method Not Allowed ({method} {path})")
            return await routes[path](self._json(body))  # type: ignore[no-any-return]
        if path.startswith("/v1/models/") and method == "POST":
            name, _, action = path[len("/v1/models/"):].rpartition("/")
            if action in ("load", "unload") and name and "/" not in name:
                return await self._manage(name, load=action == "load")
            raise ApiError(404, f"Invalid URL ({method} {path})", "unknown_url")
        if path == "/v1/models" or path.startswith("/v1/models/"):
            if method not in ("GET", "HEAD"):
                raise ApiError(405, f"Method Not Allowed ({method} {path})")
            if path == "/v1/models":
                return 200, list(_JSON), dumps({"object": "list", "data": self.models()})
            name = path[len("/v1/models/"):]
            for model in self.models():
                if model["id"] == name:
                    return 200, list(_JSON), dumps(model)
            raise ApiError(404, f"Unknown model: {name}", "model_not_found", "model")
        if path == "/health/ready" or path == "/health":
            if not self.core.accepting:  # Triton's frontend's status and words
                return _detail(400, "Attached inference engine is not ready for inference "
                               "requests.")
            return 200, [(b"content-type", b"text/plain")], b""
        if path == "/metrics" and method in ("GET", "HEAD"):
            if self.metrics is None:
                raise ApiError(500, "Metrics are off (--allow-metrics=false)", "metrics_off")
            return 200, [(b"content-type", b"text/plain; charset=utf-8")], await self.metrics()
        raise ApiError(404, f"Invalid URL ({method} {path})", "unknown_url")

    # model management (Triton's frontend: explicit control mode only) ------------------------

    async def _manage(self, name: str, load: bool) -> Response:
        """Load ``name`` (answered once it is ready, with its model object) or unload it
        (once its requests in flight are answered: the core's unload drains); explicit mode
        only, one at a time, in the words of Triton's frontend."""
        if self.core.services.control_mode != "explicit":
            return _detail(400, _EXPLICIT_ONLY)
        async with self._managing:
            if self._loaded(name) == load:
                return _detail(400, f"Model '{name}' is already loaded" if load
                               else f"Unknown model: {name}")
            try:
                await (self.core.load_model(name) if load else self.core.unload_model(name))
            except NurseryError as error:
                status = 400 if error.kind is ErrorKind.INVALID_ARG else 500
                verb = "load" if load else "unload"
                return _detail(status, f"Failed to {verb} model '{name}': {error.message}")
        if not load:
            return 200, list(_JSON), dumps({"status": "success", "model": name})
        return 200, list(_JSON), dumps({"id": name, "object": "model",
                                        "created": int(time.time()), "owned_by": OWNED_BY})

    def _loaded(self, name: str) -> bool:
        try:
            entry = self.core.directory.entry(name)
        except NurseryError:  # a name several repositories hold (--model-namespacing)
            return True
        return entry is not None and entry.latest is not None

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            raise ApiError(400, "We could not parse the JSON body of your request. (HINT: This "
                           "likely means you aren't using your HTTP library correctly. The "
                           "OpenAI API expects a JSON payload, but what was sent was not "
                           "valid JSON.)", "invalid_json") from None
        if not isinstance(value, dict):
            raise ApiError(400, "The request body must be a JSON object.", "invalid_json")
        return value

    # models ----------------------------------------------------------------------------------

    def models(self) -> list[dict[str, Any]]:
        out = []
        for _, entry in sorted(self.core.directory.table.models.items()):
            if entry.latest is None:
                continue
            name = entry.name
            names = [name]
            sep = self.options.lora_separator
            if sep:
                loras = mapping.lora_names(entry.latest.config, entry.latest.version)
                names += [f"{name}{sep}{lora}" for lora in loras or ()]
            out += [{"id": n, "object": "model", "created": self.created, "owned_by": OWNED_BY}
                    for n in names]
        return out

    def _unknown(self, name: str) -> bool:
        try:
            return self.core.directory.entry(name) is None
        except NurseryError:  # a name several models hold (--model-namespacing)
            return False

    async def _model(self, requested: str) -> tuple[ModelHandle, str | None]:
        """The model a request names, and its LoRA (``<model><sep><lora>``)."""
        name, lora = requested, None
        sep = self.options.lora_separator
        # a model whose own name holds the separator ("tiny_llm" with "_") is that model;
        # otherwise "<model><sep><lora>", split once as Triton's frontend splits it
        if sep and self._unknown(requested):
            parts = requested.split(sep)
            if len(parts) == 2:
                name, lora = parts
            elif len(parts) > 2:
                name, _, lora = requested.rpartition(sep)
        try:
            handle = await self.core.acquire(name, "")
        except NurseryError as error:
            if error.kind in (ErrorKind.NOT_FOUND, ErrorKind.UNAVAILABLE, ErrorKind.INVALID_ARG):
                # Triton's frontend: a client error (400), as its engine raises it
                raise ApiError(400, f"Unknown model: {requested}", "model_not_found",
                               "model") from None
            raise
        if lora is not None:
            known = mapping.lora_names(handle.config, handle.version)
            if known is None or lora not in known:
                raise ApiError(400, f"Unknown LoRA: {lora}; for model: {requested}",
                               "lora_not_found", "model")
        return handle, lora

    def _tokenizer(self, handle: ModelHandle, required: bool = False) -> Tokenizer | None:
        """--tokenizer, else the model's own ``tokenizer/`` folder (nursery's addition). One
        that cannot be loaded (the llm extra missing, a broken file) fails a chat request
        (``required``) with the reason; other requests go on without token counts."""
        if self.tokenizer is not None:
            return self.tokenizer
        folder = handle.config.path / "tokenizer"
        if folder not in self._own:
            own: Tokenizer | TokenizerError | None = None
            if (folder / "tokenizer.json").is_file():
                try:
                    own = Tokenizer(folder, self.chat_template)
                except TokenizerError as exc:
                    log.warning("the tokenizer of model '%s' cannot be used: %s", handle.name, exc)
                    own = exc
            self._own[folder] = own
        found = self._own[folder]
        if isinstance(found, TokenizerError):
            if required:
                raise ApiError(500, str(found))
            return None
        return found

    # generation ------------------------------------------------------------------------------

    def _generation(self, fields: Fields, prompt: str, chat: bool,
                    lora: str | None) -> mapping.Generation:
        stream = bool(fields.boolean("stream", False))
        if chat:
            max_tokens = fields.integer("max_completion_tokens", 1)
            if max_tokens is None:
                max_tokens = fields.integer("max_tokens", 1)
            logprobs_asked = fields.boolean("logprobs", False)
            top = fields.integer("top_logprobs", 0, 20)
            if top is not None and not logprobs_asked:
                raise ApiError(400, "`top_logprobs` can only be used when `logprobs` is True",
                               None, "top_logprobs")
            logprobs = (top if top is not None else 1) if logprobs_asked else None
            echo = None
        else:
            max_tokens = fields.integer("max_tokens", 1)
            count = fields.integer("logprobs", 0, 5)
            logprobs = count if count else None
            echo = fields.boolean("echo")
        sampling = {k: v for k, v in fields.body.items()
                    if k not in mapping.NOT_SAMPLING and v is not None}
        return mapping.Generation(
            prompt=prompt, stream=stream,
            max_tokens=max_tokens if max_tokens is not None else self.options.default_max_tokens,
            stop=fields.stop(), temperature=fields.number("temperature", 0, 2),
            top_p=fields.number("top_p", 0, 1), seed=fields.integer("seed"),
            frequency_penalty=fields.number("frequency_penalty", -2, 2),
            presence_penalty=fields.number("presence_penalty", -2, 2),
            logprobs=logprobs, echo=echo, lora=lora, sampling=sampling)

    async def _job(self, body: dict[str, Any], chat: bool) -> Job:
        fields = Fields(body)
        requested = fields.string("model", required=True)
        assert requested is not None
        if chat:
            messages = body.get("messages")
            if messages is None:
                raise ApiError(400, "Missing required parameter: 'messages'.",
                               "missing_required_parameter", "messages")
            chat_messages = conversation(messages)
        else:
            prompt_value = body.get("prompt")
            if isinstance(prompt_value, list):
                raise ApiError(400, "only single string input is supported", None, "prompt")
            if prompt_value is not None and not isinstance(prompt_value, str):
                raise fields.bad("prompt", "a string", prompt_value)
            if not prompt_value:
                raise ApiError(400, "prompt must be non-empty", None, "prompt")
            if body.get("suffix") is not None:
                raise ApiError(400, "suffix is not currently supported", None, "suffix")
            best_of = fields.integer("best_of", 1)
            if best_of is not None and best_of > 1:
                raise ApiError(400, f"Received best_of={best_of}, but only single choice "
                               "(best_of=1) is currently supported", None, "best_of")
        if body.get("logit_bias") is not None:
            raise ApiError(400, "logit bias is not currently supported", None, "logit_bias")
        plan = tools.ToolPlan()
        if chat:
            plan = tools.plan(body, self.options.tool_call_parser)
            chat_messages = tools.messages_for_template(chat_messages)
        elif body.get("tools"):
            raise ApiError(400, "having tools in the request requires --tool-call-parser to be "
                           "set", None, "tools")
        n = fields.integer("n", 1, 128) or 1
        stream = bool(fields.boolean("stream", False))
        include_usage = fields.include_usage(stream)
        handle, lora = await self._model(requested)
        config = handle.config
        tokenizer = self._tokenizer(handle, required=chat)
        if chat:
            if tokenizer is None:
                raise ApiError(500, "Unknown tokenizer")
            try:
                prompt = tokenizer.apply_chat_template(chat_messages, tools=plan.tools)
            except TokenizerError as exc:
                raise ApiError(500, str(exc)) from None
        else:
            prompt = str(body["prompt"])
        gen = self._generation(fields, prompt, chat, lora)
        gen.guided_json = plan.schema
        fmt = mapping.request_format(config, self.options.backend)
        if gen.logprobs is not None and "logprobs" not in config.output_map:
            raise ApiError(400, "logprobs are currently available only for the vLLM backend "
                           f"(model '{handle.name}' has no 'logprobs' output)", None, "logprobs")
        if stream and not config.decoupled:
            raise ApiError(400, f"Model '{handle.name}' cannot stream: its "
                           "model_transaction_policy is not decoupled. Ask with "
                           "\"stream\": false.", "stream_unsupported", "stream")
        try:
            requests = [mapping.generation_request(config, handle.name, handle.version_str,
                                                   fmt, gen) for _ in range(n)]
        except mapping.MappingError as exc:
            raise ApiError(400, str(exc), None, "model") from None
        if n > 1 and gen.seed is not None:  # distinct choices, still reproducible
            for i, request in enumerate(requests[1:], 1):
                _reseed(request, gen.seed + i, fmt)
        prefix = "chatcmpl" if chat else "cmpl"
        return Job("chat" if chat else "completion", requested, handle, requests, gen,
                   tokenizer, include_usage, int(time.time()), f"{prefix}-{uuid.uuid4().hex}",
                   plan)

    async def chat(self, body: dict[str, Any]) -> Response | Streaming:
        job = await self._job(body, chat=True)
        if job.gen.stream:
            return Streaming(lambda writer: self._stream(job, writer))
        choices = await self._run_all(job)
        entries = []
        for c in choices:
            message, finish = job.message(c)
            entries.append({
                "index": c.index, "message": message,
                "logprobs": ({"content": mapping.chat_logprobs(c.logprobs)}
                             if job.gen.logprobs is not None else None),
                "finish_reason": finish})
        return 200, list(_JSON), dumps({
            "id": job.id, "object": "chat.completion", "created": job.created,
            "model": job.model, "system_fingerprint": None, "choices": entries,
            "usage": job.usage(choices)})

    async def completion(self, body: dict[str, Any]) -> Response | Streaming:
        job = await self._job(body, chat=False)
        if job.gen.stream:
            return Streaming(lambda writer: self._stream(job, writer))
        choices = await self._run_all(job)
        return 200, list(_JSON), dumps({
            "id": job.id, "object": "text_completion", "created": job.created,
            "model": job.model, "system_fingerprint": None,
            "choices": [{
                "index": c.index, "text": "".join(c.text),
                "logprobs": (mapping.completion_logprobs(c.logprobs)
                             if job.gen.logprobs is not None else None),
                "finish_reason": job.finish_reason(c)} for c in choices],
            "usage": job.usage(choices)})

    async def _run_all(self, job: Job) -> list[Choice]:
        """Every choice to its end; the first error is the answer."""
        choices = [Choice(i) for i in range(len(job.requests))]
        errors: list[NurseryError] = []

        async def one(choice: Choice, request: InferenceRequest,
                      scope: trio.CancelScope) -> None:
            async def on_part(part: Part) -> None:
                if part.error is not None:
                    errors.append(part.error)
                    scope.cancel()
                else:
                    choice.add(part)

            await self.core.client.stream(request, on_part)

        async with trio.open_nursery() as nursery:
            for choice, request in zip(choices, job.requests, strict=True):
                nursery.start_soon(one, choice, request, nursery.cancel_scope)
        if errors:
            raise from_nursery(errors[0])
        return choices

    async def _stream(self, job: Job, writer: StreamWriter) -> None:
        """Server-Sent Events for every choice, then the usage (when asked) and [DONE]."""
        choices = [Choice(i) for i in range(len(job.requests))]
        lock = trio.Lock()
        chat = job.kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        failed: list[NurseryError] = []
        plain: list[bool] = []  # answered with a plain JSON error: nothing more to send

        def chunk(choice_entries: list[dict[str, Any]],
                  usage: dict[str, int] | None = None, with_usage: bool = False) -> bytes:
            doc: dict[str, Any] = {"id": job.id, "object": obj, "created": job.created,
                                   "model": job.model, "system_fingerprint": None,
                                   "choices": choice_entries}
            if job.include_usage or with_usage:
                doc["usage"] = usage
            return sse_event(dumps(doc))

        async def begin() -> None:
            await writer.start(200, list(_SSE))
            if chat:  # the role first, for every choice (as Triton's frontend and OpenAI do)
                for c in choices:
                    await writer.send(chunk([{"index": c.index,
                                              "delta": {"role": "assistant", "content": ""},
                                              "logprobs": None, "finish_reason": None}]))

        async def one(choice: Choice, request: InferenceRequest,
                      scope: trio.CancelScope) -> None:
            offset = 0
            plan = job.tools
            parsing = tools.parser(plan.parser).stream() if chat and plan.parser else None
            calls = 0  # tool calls sent (a named choice's one)
            parsed = 0  # characters the tool-call parser has read
            own = trio.CancelScope()  # this choice's request (cut short past the parse limit)

            async def on_part(part: Part) -> None:
                nonlocal offset, calls, parsed
                async with lock:
                    if failed or own.cancel_called:
                        return
                    if part.error is not None:
                        failed.append(part.error)
                        if not writer.started:  # nothing sent yet: a plain JSON error
                            error = from_nursery(part.error)
                            await writer.start(error.status, list(_JSON))
                            await writer.send(error.body)
                            plain.append(True)
                        else:
                            await writer.send(sse_event(from_nursery(part.error).body))
                        scope.cancel()
                        return
                    if not writer.started:
                        await begin()
                    text = choice.add(part)
                    if part.response is None and not part.final:
                        return
                    finish = job.finish_reason(choice) if part.final else None
                    logprobs: Any = None
                    found = mapping.logprobs_of(part.response) if part.response else None
                    if job.gen.logprobs is not None and found:
                        logprobs = ({"content": mapping.chat_logprobs(found)} if chat
                                    else mapping.completion_logprobs(found, offset))
                    offset += len(text)
                    delta: dict[str, Any] = {"content": text}
                    if chat and plan.named is not None:  # the text is the call's arguments
                        call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
                        if calls == 0:  # the first piece names the call (clients join
                            # every later piece's fields, a name included)
                            call = {"index": 0, "id": job.id, "type": "function",
                                    "function": {"name": plan.named, "arguments": text}}
                            calls = 1
                        delta = {"tool_calls": [call]}
                    elif parsing is not None:
                        parsed += len(text)
                        limit = self.options.max_tool_call_parse_bytes
                        if parsed > limit:  # Triton's bound: the stream ends, the model stops
                            log.warning(
                                "Streaming tool-call parse buffer exceeded %d bytes (request "
                                "%s); truncating response and cancelling backend inference.",
                                limit, job.id)
                            await writer.send(chunk([{  # before the cancel, which would
                                "index": choice.index, "delta": {"content": ""},  # stop it
                                "logprobs": None, "finish_reason": "length"}]))
                            own.cancel()
                            return
                        content, made = parsing.feed(text)
                        if part.final:
                            more, last = parsing.finish()
                            content, made = content + more, tools.merge(made + last)
                        delta = {"content": content} if content or not made else {}
                        if made:  # a call's first piece: id and name; then its arguments
                            delta["tool_calls"] = [d.as_json() for d in made]
                        if part.final and parsing.started:
                            finish = "tool_calls"
                        elif not part.final and not content and not made:
                            return  # nothing certain yet (a possible start of a call)
                    entry: dict[str, Any] = (
                        {"index": choice.index, "delta": delta} if chat
                        else {"index": choice.index, "text": text})
                    entry["logprobs"] = logprobs
                    entry["finish_reason"] = finish
                    await writer.send(chunk([entry]))

            with own:
                await self.core.client.stream(request, on_part)

        async with trio.open_nursery() as nursery:
            for choice, request in zip(choices, job.requests, strict=True):
                nursery.start_soon(one, choice, request, nursery.cancel_scope)
        if plain:
            return
        if not writer.started:
            await begin()
        if job.include_usage and not failed:
            await writer.send(chunk([], job.usage(choices), with_usage=True))
        await writer.send(DONE)

    # embeddings ------------------------------------------------------------------------------

    async def embedding(self, body: dict[str, Any]) -> Response:
        fields = Fields(body)
        requested = fields.string("model", required=True)
        assert requested is not None
        value = body.get("input")
        if value is None:
            raise ApiError(400, "Missing required parameter: 'input'.",
                           "missing_required_parameter", "input")
        if not (isinstance(value, str) or (isinstance(value, list) and value
                                           and all(isinstance(x, str) for x in value))):
            raise fields.bad("input", "a string or an array of strings", value)
        encoding = fields.string("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise ApiError(400, f"Invalid 'encoding_format': expected 'float' or 'base64', but "
                           f"got '{encoding}' instead.", "invalid_value", "encoding_format")
        dimensions = fields.integer("dimensions", 1)
        handle, _ = await self._model(requested)
        try:
            request = mapping.embedding_request(handle.config, handle.name, handle.version_str,
                                                value, dimensions)
        except mapping.MappingError as exc:
            raise ApiError(400, str(exc), None, "model") from None
        job = Job("embedding", requested, handle, [request],
                  mapping.Generation(prompt="", stream=False, max_tokens=0), None, False,
                  int(time.time()), "")
        choice = (await self._run_all(job))[0]
        responses_text = "".join(choice.text)
        try:
            vectors = mapping.embeddings_of(responses_text)
        except mapping.MappingError as exc:
            raise ApiError(500, str(exc)) from None
        data = []
        for i, vector in enumerate(vectors):
            embedding: Any = vector
            if encoding == "base64":
                embedding = base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()
                                             ).decode()
            data.append({"object": "embedding", "embedding": embedding, "index": i})
        tokens = choice.prompt_tokens
        if tokens is None:
            own = self._tokenizer(handle)
            if own is not None:
                texts = [value] if isinstance(value, str) else value
                tokens = sum(own.count(t, add_special_tokens=True) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens} if tokens is not None else None
        return 200, list(_JSON), dumps({"object": "list", "data": data, "model": requested,
                                         "usage": usage})


def _reseed(request: InferenceRequest, seed: int, fmt: str) -> None:
    if fmt == mapping.VLLM and "sampling_parameters" in request.inputs:
        tensor = request.inputs["sampling_parameters"]
        params = json.loads(tensor.data.reshape(-1)[0])
        params["seed"] = seed
        tensor.data.reshape(-1)[0] = json.dumps(params).encode()
    elif "seed" in request.inputs:
        tensor = request.inputs["seed"]
        tensor.data.reshape(-1)[0] = seed


__all__ = ["ApiError", "OpenAIFrontend"]

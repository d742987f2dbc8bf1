"""Amazon SageMaker's inference contract on its own port (``--allow-sagemaker``), as Triton's
SageMaker server (``src/sagemaker_server.cc``) serves it.

Served by nursery's HTTP/1.1 server with this module's handler, under the HTTP port's limits,
deadlines, connection cap and drain; ``--http-restricted-api`` and ``--http-max-input-size``
apply here too, as in Triton. The routes:

- ``GET /ping``: 200 when the server is ready (``SAGEMAKER_TRITON_PING_MODE=live``: live),
  else 400, with an empty body; another method: 405.
- ``POST /invocations``: the KServe v2 inference request for the model named by
  ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`` (``SAGEMAKER_TRITON_INFERENCE_TYPE``: ``infer``,
  the default, or the generate extension's ``generate`` / ``generate_stream``). The content
  type ``application/vnd.sagemaker-triton.binary+json;json-header-size=N`` says where the
  JSON header ends and binary tensor data begins (KServe's ``Inference-Header-Content-Length``);
  an answer with binary outputs comes back with that content type, with the JSON header's
  size. Bodies are never compressed here (Triton's SageMaker server reads identity only).
- ``/models...``: the multi-model endpoint (``SAGEMAKER_MULTI_MODEL=true`` in SageMaker's serve
  script; the routes are there either way, as in Triton). ``POST /models`` with
  ``{"model_name", "url"}`` registers the url's repository (``/opt/ml/models/<hash>/model``;
  ``NURSERY_SAGEMAKER_MODELS_ROOT`` moves /opt/ml/models) with its model folder mapped to the
  target model (``X-Amzn-SageMaker-Target-Model``, else ``model_name``) and loads it; ``GET
  /models`` lists the table, ``GET /models/<name>`` shows one, ``POST
  /models/<name>/invoke`` infers (every failure a 400, or 507 when it reads as out of
  memory), ``DELETE /models/<name>`` unloads it and its dependents and unregisters the
  repository. A name not in the table: 404, empty body.
- anything else: 400, empty body.

The pure parts (routing, the content type) are functions with their own tests; the inference
itself is the HTTP port's (``http/infer.py``, ``http/generate.py``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import trio

from nursery.core import Core
from nursery.errors import ErrorKind, InvalidArgument, NurseryError
from nursery.protocol.access import Restrictions
from nursery.protocol.codecs import binary_tensor
from nursery.protocol.codecs.status import error_body
from nursery.protocol.http import http1
from nursery.protocol.http.generate import generate_response
from nursery.protocol.http.infer import (
    AfterSend,
    Response,
    category_refusal,
    error_response,
    infer_response,
    typed_body_limit,
)
from nursery.protocol.http.streaming import Streaming
from nursery.settings import SageMakerSettings

log = logging.getLogger("nursery.sagemaker")

BINARY_TYPE = b"application/vnd.sagemaker-triton.binary+json;json-header-size="
INFERENCE_TYPES = ("infer", "generate", "generate_stream")
_JSON = [(b"content-type", b"application/json")]
# Triton's models route: "/models", an optional "/", an optional name, an optional "/invoke"
# (so "/modelsabc" names the model "abc", as there)
_MODELS = re.compile(r"/models/?([^/]+)?(/invoke)?")
_ENSEMBLE = re.compile(rb'platform:\s*"ensemble"')
_CONFIG_READ = 1 << 20  # bytes of a config.pbtxt read to tell an ensemble
_MAX_FOLDERS = 4096  # model folders looked at in a loaded url
# Python's JSON parse errors -> rapidjson's (GetParseError_En), for Triton's messages
_RAPIDJSON = {
    "Expecting value": "Invalid value.",
    "Extra data": "The document root must not be followed by other values.",
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
}
UNLOAD_WAIT = 350.0  # seconds an unload waits for its model to be unloaded (Triton's)
UNLOAD_POLL = 0.5
# what out-of-memory errors say, in the frameworks' words (Triton's list)
_OOM = ("CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory",
        "out of memory", "MemoryError", "OutOfMemory", "OOM", "Dst tensor is not initialized",
        "Src tensor is not initialized", "CNMEM_STATUS_OUT_OF_MEMORY",
        "CUDNN_STATUS_NOT_INITIALIZED", "CUBLAS_STATUS_ALLOC_FAILED",
        "CUBLAS_STATUS_NOT_INITIALIZED", "Failed to allocate memory",
        "failed to allocate memory", "No space left on device")


@dataclass(frozen=True, slots=True)
class Route:
    """What a request asks: ``kind`` is ping, invocations, list, get, load, invoke, unload,
    or bad (400); ``model`` the model a /models route names ("" for none)."""

    kind: str
    model: str = ""


def route(method: bytes, path: str) -> Route:
    """The route of a request line (the path as sent, without the query), as Triton's
    ``SagemakerAPIServer::Handle`` picks it."""
    if path == "/ping":
        return Route("ping")
    if path == "/invocations":
        return Route("invocations")
    match = _MODELS.fullmatch(path)
    if match is None:
        return Route("bad")
    model, invoke = match.group(1) or "", match.group(2) is not None
    if method == b"GET":
        return Route("get", model) if model else Route("list")
    if method == b"POST":
        return Route("invoke", model) if invoke else Route("load", model)
    if method == b"DELETE":
        return Route("unload", model)
    return Route("bad")


def header_length(content_type: bytes | None, content_length: int) -> int | None:
    """The size of the JSON header that a SageMaker binary content type declares (None: the
    content type is not that one, the whole body is JSON); refused in Triton's words."""
    return binary_tensor.header_size_in_type(content_type, content_length, BINARY_TYPE)


def as_kserve(headers: list[tuple[bytes, bytes]], length: int | None,
              ) -> list[tuple[bytes, bytes]]:
    """A SageMaker request's headers as the KServe inference route reads them: the header
    size as ``Inference-Header-Content-Length``, and no compression either way."""
    kept = [(k, v) for k, v in headers
            if k not in (b"content-encoding", b"accept-encoding", binary_tensor.HEADER_LOWER)]
    if length is not None:
        kept.append((binary_tensor.HEADER_LOWER, str(length).encode()))
    return kept


def as_sagemaker(response: Response) -> Response:
    """A KServe inference answer as SageMaker's: binary outputs are announced by the
    SageMaker content type with the JSON header's size."""
    status, headers, body = response
    size = next((v for k, v in headers if k == binary_tensor.HEADER_LOWER), None)
    if size is None:
        return response
    kept = [(k, v) for k, v in headers
            if k not in (b"content-type", binary_tensor.HEADER_LOWER)]
    return status, [(b"content-type", BINARY_TYPE + size), *kept], body


def parse_load(body: bytes) -> tuple[str, str]:
    """A load request's ``url`` and ``model_name`` ("" when absent); a body that is not a
    JSON object, or fields that are not strings, are refused."""
    if not body:
        return "", ""
    try:
        request = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            f"failed to parse the request JSON buffer: {parse_error(exc)}") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(request, dict):
        return "", ""
    fields = []
    for key in ("url", "model_name"):
        value = request.get(key, "")
        if not isinstance(value, str):
            raise InvalidArgument(f"attempt to access JSON non-string as string: '{key}'")
        fields.append(value)
    return fields[0], fields[1]


def parse_error(exc: json.JSONDecodeError) -> str:
    """A JSON parse error in rapidjson's words and offset, as Triton reports it ("Invalid
    value. at 0"); a kind without a counterpart here keeps Python's words."""
    words = _RAPIDJSON.get(exc.msg)
    if words is None:
        return f"{exc.msg} at {exc.pos}"
    return f"{words} at {exc.pos}"


def _absolute(url: str) -> str:
    return os.path.normpath(os.path.join(os.getcwd(), url)) if url else os.getcwd()


def forbidden_url(url: str) -> bool:
    """A url that normalizes into /dev, /proc or /sys (refused before anything is read)."""
    return _absolute(url).startswith(("/dev/", "/proc/", "/sys/"))


def _is_ensemble(config: Path) -> bool:
    try:
        with open(config, "rb") as f:
            text = f.read(_CONFIG_READ)
    except OSError:
        return False
    return _ENSEMBLE.search(text) is not None


def model_layout(url: str, models_root: str) -> tuple[str, str]:
    """Where a multi-model load's model lives: (the repository to register, the folder in it
    that serves as the target model). ``url`` must be ``<models_root>/<hash>/model[/<sub>]``.
    With a config.pbtxt at the url, the repository is ``<models_root>/<hash>`` and the folder
    ``model``; else the url is the repository and the folder is its ensemble's (a config
    with platform "ensemble"), or its one model folder (of several: the last by name)."""
    path = _absolute(url)
    pattern = re.escape(models_root.rstrip("/")) + r"/[0-9A-Za-z._]+"
    match = re.fullmatch(f"({pattern})/(model)/?([0-9A-Za-z._]+)?", path)
    if match is None:
        raise InvalidArgument(f"Invalid \"url\" '{url}': expected a path of the form "
                              f"{models_root.rstrip('/')}/<hash>/model[/<subdir>]")
    if os.path.isfile(os.path.join(path, "config.pbtxt")):
        return match.group(1), match.group(2)
    folders: list[str] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if len(folders) >= _MAX_FOLDERS:
                    break
                if entry.is_dir():
                    folders.append(entry.name)
    except OSError:
        pass
    folders.sort()
    ensembles = [f for f in folders if _is_ensemble(Path(path, f, "config.pbtxt"))]
    chosen = ensembles[-1] if ensembles else (folders[-1] if folders else "")
    return path, chosen


def out_of_memory(message: str) -> bool:
    """Whether an error reads as out of memory (Triton answers 507 then)."""
    return any(marker in message for marker in _OOM)


def _message(payload: bytes) -> str:
    try:
        value = json.loads(payload).get("error", "")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


class SageMakerFrontend:
    """The SageMaker port's handler (``HttpServer(handler=...)``)."""

    def __init__(self, core: Core, options: SageMakerSettings, restrictions: Restrictions,
                 max_input_size: int, max_body_size: int) -> None:
        self.core = core
        self.options = options
        self.restrictions = restrictions  # --http-restricted-api, as on the HTTP port
        self.max_input_size = max_input_size
        self.max_body_size = max_body_size
        # models loaded through the multi-model endpoint: model_name -> its repository (the
        # modelUrl the routes answer)
        self.models: dict[str, str] = {}

    def body_limit(self, head: http1.RequestHead) -> int:
        return typed_body_limit(head, BINARY_TYPE, self.max_input_size, self.max_body_size)

    async def handle(self, head: http1.RequestHead, body: bytes,
                     after: AfterSend | None = None) -> Response | Streaming:
        path = head.path.decode("latin-1")
        log.debug("SageMaker request: %s %s", head.method.decode("latin-1"), path)
        where = route(head.method, path)
        if where.kind == "ping":
            return await self._ping(head)
        if where.kind == "invocations":
            return await self._invocations(head, body, after)
        if where.kind in ("list", "get", "load", "unload"):
            refused = category_refusal(self.restrictions, "model-repository", head.headers)
            if refused is not None:
                return refused
        if where.kind == "list":
            return await self._list()
        if where.kind == "get":
            if where.model not in self.models:
                return 404, [], b""
            return 200, list(_JSON), json.dumps(
                {"modelName": where.model, "modelUrl": self.models[where.model]}).encode()
        if where.kind == "load":
            return await self._load(head, body)
        if where.kind == "unload":
            return await self._unload(head, where.model)
        if where.kind == "invoke":
            return await self._invoke(head, body, where.model, after)
        return 400, [], b""

    async def _list(self) -> Response:
        # a model not ready (yet) is an empty object in the list, as in Triton's
        listing = [{"modelName": name, "modelUrl": url}
                   if await self.core.model_ready(name, "1") else {}
                   for name, url in list(self.models.items())]
        return 200, list(_JSON), json.dumps({"models": listing}).encode()

    async def _load(self, head: http1.RequestHead, body: bytes) -> Response:
        """``POST /models``: register the ``url``'s repository with its model folder mapped
        to the target model's name, load that model, and keep it in the table by
        ``model_name``. 409 when the repository or name is taken; a failed load: 400 (507
        when the error reads as out of memory), and the repository is unregistered."""
        try:
            asked = parse_load(body)
        except InvalidArgument as error:
            return 400, list(_JSON), error_body(error.message)
        url, name = asked
        target = (head.header(b"x-amzn-sagemaker-target-model") or b"").decode(
            "latin-1") or name
        log.info("Loading SageMaker TargetModel: %s", target)
        if forbidden_url(url):
            log.error('Invalid URL: %s. "url" property value cannot start with /dev/, /proc/, '
                      "or /sys/.", url)
            return 400, [], b""
        try:  # a few reads of the url's folder: off the event loop
            repository, folder = await trio.to_thread.run_sync(
                model_layout, url, self.options.models_root)
        except InvalidArgument as error:
            return 400, list(_JSON), error_body(error.message)
        try:
            await self.core.register_repository(Path(repository), ((folder, target),))
        except NurseryError as error:
            status = 409 if error.kind is ErrorKind.ALREADY_EXISTS else 400
            return status, list(_JSON), error_body(error.message)
        try:
            await self.core.load_model(target)
        except NurseryError as error:
            try:
                await self.core.unregister_repository(Path(repository))
            except NurseryError:
                pass
            if error.kind is ErrorKind.ALREADY_EXISTS:
                return 409, list(_JSON), error_body(error.message)
            return (507 if out_of_memory(error.message) else 400), list(_JSON), error_body(
                error.message)
        self.models[name] = repository
        return 200, [], b""

    async def _unload(self, head: http1.RequestHead, name: str) -> Response:
        """``DELETE /models/<name>``: unload the model and what only it loaded, wait (up to
        Triton's 350 s) until the index says it is unloaded, unregister its repository."""
        target = (head.header(b"x-amzn-sagemaker-target-model") or b"").decode(
            "latin-1") or name
        if name not in self.models:
            log.debug("Model %s with model hash %s is not loaded.", target, name)
            return 404, [], b""
        log.info("Unloading SageMaker TargetModel: %s", target)
        try:
            await self.core.unload_model(target, unload_dependents=True)
        except NurseryError as error:
            log.error("Error when unloading SageMaker Model with dependents for model: %s",
                      target)
            return 400, list(_JSON), error_body(error.message)
        for _ in range(int(UNLOAD_WAIT / UNLOAD_POLL)):  # Triton polls the index so
            if await self._unloaded(target):
                break
            await trio.sleep(UNLOAD_POLL)
        repository = self.models.pop(name)
        try:
            await self.core.unregister_repository(Path(repository))
        except NurseryError as error:
            log.error("Unable to unregister model repository for path: %s", repository)
            return 400, list(_JSON), error_body(error.message)
        return 200, [], b""

    async def _unloaded(self, name: str) -> bool:
        try:
            index = await self.core.repository_index()
        except NurseryError:
            return True  # nothing to wait for (Triton's loop ends on an error too)
        return any(entry.name == name and entry.state == "UNAVAILABLE"
                   and entry.reason == "unloaded" for entry in index)

    async def _invoke(self, head: http1.RequestHead, body: bytes, name: str,
                      after: AfterSend | None) -> Response:
        """``POST /models/<name>/invoke``: inference on a model loaded through the table;
        every failure is a 400 with the error (507 when it reads as out of memory)."""
        if name not in self.models:
            return 404, [], b""
        target = (head.header(b"x-amzn-sagemaker-target-model") or b"").decode(
            "latin-1") or name
        log.info("Invoking SageMaker TargetModel: %s", target)
        refused = category_refusal(self.restrictions, "inference", head.headers)
        if refused is not None:
            return refused
        try:
            length = header_length(head.header(b"content-type"), len(body))
        except NurseryError as error:
            return 400, list(_JSON), error_body(error.message)
        answer = await infer_response(self.core, target, "", as_kserve(head.headers, length),
                                      body, self.max_input_size, after=after)
        status, headers, payload = as_sagemaker(answer)
        if status != 200:
            message = _message(payload)
            status = 507 if out_of_memory(message) else 400
            headers = list(_JSON)
        return status, headers, payload

    async def _ping(self, head: http1.RequestHead) -> Response:
        refused = category_refusal(self.restrictions, "health", head.headers)
        if refused is not None:
            return refused
        if head.method != b"GET":
            return 405, list(_JSON), error_body("Method Not Allowed")
        if self.options.ping_mode == "live":
            ok = self.core.server_live()
        else:
            ok = await self.core.server_ready()
        return (200 if ok else 400), [], b""

    async def _invocations(self, head: http1.RequestHead, body: bytes,
                           after: AfterSend | None) -> Response | Streaming:
        refused = category_refusal(self.restrictions, "inference", head.headers)
        if refused is not None:
            return refused
        kind = self.options.inference_type
        if kind not in INFERENCE_TYPES:
            return 400, list(_JSON), error_body(
                f"Server has invalid inference type '{kind}'. Must be one of: infer, "
                "generate, generate_stream.")
        if head.method != b"POST":
            return 405, list(_JSON), error_body("Method Not Allowed")
        model = self.options.default_model
        if kind != "infer":
            return await generate_response(
                self.core, model, "", as_kserve(head.headers, None), body,
                self.max_input_size, streaming=kind == "generate_stream")
        try:
            length = header_length(head.header(b"content-type"), len(body))
        except NurseryError as error:
            return error_response(error)
        answer = await infer_response(self.core, model, "", as_kserve(head.headers, length),
                                      body, self.max_input_size, after=after)
        return as_sagemaker(answer)

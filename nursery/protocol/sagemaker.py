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
- ``/models...``: the multi-model endpoint's routes, answered from the table of models loaded
  through it (list, get, invoke, unload); loading from a ``url`` is not built yet and is
  refused with a 400 that says so (docs/conformance.md).
- anything else: 400, empty body.

The pure parts (routing, the content type) are functions with their own tests; the inference
itself is the HTTP port's (``http/infer.py``, ``http/generate.py``).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

from nursery.core import Core
from nursery.errors import InvalidArgument, NurseryError
from nursery.protocol.access import Restrictions, http_refusal_message
from nursery.protocol.codecs import binary_tensor
from nursery.protocol.codecs.status import error_body
from nursery.protocol.http import http1
from nursery.protocol.http.generate import generate_response
from nursery.protocol.http.infer import AfterSend, Response, error_response, infer_response
from nursery.protocol.http.streaming import Streaming
from nursery.settings import SageMakerSettings

log = logging.getLogger("nursery.sagemaker")

BINARY_TYPE = b"application/vnd.sagemaker-triton.binary+json;json-header-size="
INFERENCE_TYPES = ("infer", "generate", "generate_stream")
_JSON = [(b"content-type", b"application/json")]
_INT32_MAX = 2**31 - 1
# Triton's models route: "/models", an optional "/", an optional name, an optional "/invoke"
# (so "/modelsabc" names the model "abc", as there)
_MODELS = re.compile(r"/models/?([^/]+)?(/invoke)?")
_STOI = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")


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
    content type is not that one, the whole body is JSON). Refusals in Triton's words
    (``GetInferenceHeaderLength``): the type must start the header value, the size is read
    as C++'s ``stoi`` reads it (leading blanks, a sign, digits; what follows is ignored) and
    must lie in [0, content length]."""
    if content_type is None:
        return None
    pos = content_type.find(BINARY_TYPE)
    if pos < 0:
        return None
    shown = content_type.decode("latin-1")
    if pos != 0:
        raise InvalidArgument(f"expect MIME type for binary data starts with "
                              f"'{BINARY_TYPE.decode()}', got: {shown}")
    rest = content_type[len(BINARY_TYPE):]
    text = rest.decode("latin-1")
    digits = _STOI.match(rest)
    if digits is None:
        raise InvalidArgument(f"Unable to parse inference header size, got: {text}")
    value = int(digits.group(1))
    if not -_INT32_MAX - 1 <= value <= _INT32_MAX:
        raise InvalidArgument(
            f"Unable to parse inference header size, value is out of range, got: {text}")
    if value < 0 or value > content_length:
        raise InvalidArgument(f"inference header size should be in range (0, "
                              f"{content_length}), got: {text}")
    return value


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


class SageMakerFrontend:
    """The SageMaker port's handler (``HttpServer(handler=...)``)."""

    def __init__(self, core: Core, options: SageMakerSettings, restrictions: Restrictions,
                 max_input_size: int, max_body_size: int) -> None:
        self.core = core
        self.options = options
        self.restrictions = restrictions  # --http-restricted-api, as on the HTTP port
        self.max_input_size = max_input_size
        self.max_body_size = max_body_size
        # models loaded through the multi-model endpoint: name -> url
        self.models: dict[str, str] = {}

    def body_limit(self, head: http1.RequestHead) -> int:
        """An inference body with binary tensor data may reach the hard cap (its JSON header
        is checked against the input size once read); any other body: the input size."""
        if head.method == b"POST" and (head.header(b"content-type") or b"").startswith(
                BINARY_TYPE):
            return self.max_body_size
        return self.max_input_size

    def _refused(self, category: str, head: http1.RequestHead) -> Response | None:
        pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in head.headers]
        key = self.restrictions.refusal(category, pairs)
        if key is None:
            return None
        return 403, list(_JSON), error_body(http_refusal_message(key))

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
            refused = self._refused("model-repository", head)
            if refused is not None:
                return refused
        if where.kind == "list":
            listing = [{"modelName": name, "modelUrl": url} for name, url in self.models.items()
                       if await self.core.model_ready(name, "1")]
            return 200, list(_JSON), json.dumps({"models": listing}).encode()
        if where.kind == "get":
            if where.model not in self.models:
                return 404, [], b""
            return 200, list(_JSON), json.dumps(
                {"modelName": where.model, "modelUrl": self.models[where.model]}).encode()
        if where.kind == "load":
            return 400, list(_JSON), error_body(
                "loading a model from a url (the SageMaker multi-model endpoint) is not "
                "supported by this server yet")
        if where.kind == "unload":
            return 404, [], b""  # nothing is loaded through the endpoint (see "load")
        if where.kind == "invoke":
            refused = self._refused("inference", head)
            if refused is not None:
                return refused
            return 404, [], b""  # only models loaded through the endpoint are invoked
        return 400, [], b""

    async def _ping(self, head: http1.RequestHead) -> Response:
        refused = self._refused("health", head)
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
        refused = self._refused("inference", head)
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

"""The inference route (``POST /v2/models/{m}[/versions/{v}]/infer``) as a lean ASGI handler.

hypercorn calls this directly, ahead of the quart-trio app that serves every other route:
one parse of the JSON header, ``numpy.frombuffer`` views on the body, no per-request logging.
It decodes, calls ``Core.infer``, and encodes; it knows nothing about scheduling or models.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import numpy as np
import trio

from nursery.actors.directory import ModelHandle
from nursery.config.model import ModelConfig
from nursery.core import Core
from nursery.errors import InvalidArgument, NurseryError, Overloaded, Unsupported
from nursery.protocol.access import (
    HeaderForward,
    ReservedHeader,
    Restrictions,
    http_group,
    http_refusal_message,
)
from nursery.protocol.codecs import binary_tensor, deep_json
from nursery.protocol.codecs import json_tensors as json_codec
from nursery.protocol.codecs.status import error_body, http_error, overload_answer
from nursery.protocol.http import http1
from nursery.shm.system import ShmAccess, ShmHold
from nursery.types import (
    DataType,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
    element_count,
    tensor_from_bytes,
)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON_HEADERS = [(b"content-type", b"application/json")]


class ClientGone(Exception):
    """The client disconnected before the request body arrived."""


async def read_body(receive: Receive, limit: int,
                    refuse: Callable[[int, int], NurseryError] | None = None) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise (refuse or too_large)(size, limit)
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        elif kind == "http.disconnect":
            raise ClientGone
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def _decompress(body: bytes, encoding: bytes, limit: int) -> bytes:
    enc = encoding.strip().lower()
    if enc in (b"", b"identity"):
        return body
    if enc == b"gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif enc == b"deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise Unsupported("Unsupported compression type")
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidArgument(f"failed to decompress the request body ({enc.decode()}): {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise InvalidArgument(
            f"decompressed request body exceeds the maximum allowed value of {limit} bytes. "
            "Use --http-max-input-size to increase the limit."
        )
    return out


def _pick_response_encoding(accept: bytes | None) -> str | None:
    """Highest-q of gzip/deflate in Accept-Encoding (identity wins ties); None = identity."""
    if not accept:
        return None
    best, best_q = None, 0.0
    identity_q = 0.001
    for part in accept.decode("latin-1").split(","):
        fields = part.strip().split(";")
        name = fields[0].strip().lower()
        q = 1.0
        for f in fields[1:]:
            f = f.strip()
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        if name == "identity":
            identity_q = q
        elif name in ("gzip", "deflate") and q > best_q:
            best, best_q = name, q
    return best if best is not None and best_q > identity_q else None


def _compress(data: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    else:
        c = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def _raw_request(config: ModelConfig, model: str, version: str, body: bytes) -> InferenceRequest:
    """``Inference-Header-Content-Length: 0``: the body is the only input, batch 1."""
    if len(config.inputs) != 1:
        raise InvalidArgument(
            f"[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
            f"deduced but got {len(config.inputs)} inputs in '{model}' model configuration"
        )
    spec = config.inputs[0]
    batch = (1,) if config.max_batch_size > 0 else ()
    if spec.datatype is DataType.BYTES:
        if list(spec.dims) != [1]:
            raise InvalidArgument(
                f"[request id: <id_unknown>] For BYTE datatype raw input '{spec.name}', the "
                "model must have input shape [1]"
            )
        arr = np.array([bytes(body)], dtype=object).reshape((*batch, 1))
        return InferenceRequest(model, version, {spec.name: Tensor(spec.name, spec.datatype, arr.shape, arr)})
    dims = list(spec.dims)
    variable = [i for i, d in enumerate(dims) if d == -1]
    if len(variable) > 1:
        raise InvalidArgument(  # core's words (InferenceRequest::Normalize)
            f"[request id: <id_unknown>] The shape of the raw input '{spec.name}' can not be "
            "deduced because there are more than one variable-sized dimension"
        )
    if variable:
        known = element_count(tuple([d for d in dims if d != -1])) * spec.datatype.itemsize
        if known == 0 or len(body) % known:
            raise InvalidArgument(
                f"raw input of {len(body)} bytes does not fit input '{spec.name}' of model '{model}'"
            )
        dims[variable[0]] = len(body) // known
    shape = (*batch, *dims)
    data = tensor_from_bytes(
        body, spec.datatype, shape,
        f"[request id: <id_unknown>] input byte size mismatch for input '{spec.name}' for model "
        f"'{model}'",
    )
    return InferenceRequest(
        model, version, {spec.name: Tensor(spec.name, spec.datatype, shape, data)},
        requested_outputs=tuple([RequestedOutput(o.name) for o in config.outputs]),
    )


# Triton's HTTP frontend logs each request's failure at --log-verbose 1 (the same logger as the
# server's per-request line)
request_log = logging.getLogger("nursery.http_requests")

Response = tuple[int, list[tuple[bytes, bytes]], bytes]
# what runs once a response has been written (True) or could not be (False)
AfterSend = list[Callable[[bool], None]]


def run_after_send(after: AfterSend, sent: bool) -> None:
    for done in after:
        done(sent)
    after.clear()


def _send_ended(trace: Any) -> Callable[[bool], None]:
    """A traced response's end: ``HTTP_SEND_END`` when it was written (Triton takes it from
    its HTTP server once the reply is out), then the trace is done."""
    def done(sent: bool) -> None:
        if sent:
            trace.stamp("HTTP_SEND_END")
        trace.finish()
    return done


def error_response(error: NurseryError, extra: list[tuple[bytes, bytes]] | None = None,
                   request: InferenceRequest | None = None) -> Response:
    status, body = http_error(error)
    if isinstance(error, Overloaded):  # shed by the latency-objective batcher
        status, more = overload_answer(error, request.parameters if request else None)
        extra = [*(extra or []), *more]
    return status, [*_JSON_HEADERS, *(extra or [])], body


def restricted(restrictions: Restrictions, raw_path: bytes,
               headers: list[tuple[bytes, bytes]]) -> Response | None:
    """403 with Triton's message when the path's group is restricted and the request lacks
    the header (or its value); None when it may pass. The group is read from the path as
    sent and as decoded (the inference route matches the one, the route table the other), so
    that no spelling of a path slips past its group."""
    raw = raw_path.split(b"?", 1)[0].decode("latin-1")
    pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
    for path in (raw, unquote(raw)):
        answer = _refusal(restrictions, http_group(path), pairs)
        if answer is not None:
            return answer
    return None


def category_refusal(restrictions: Restrictions, category: str | None,
                     headers: list[tuple[bytes, bytes]]) -> Response | None:
    """:func:`restricted` for a request whose group is known (``category``): the SageMaker
    and Vertex AI frontends, whose routes are not the HTTP port's paths."""
    pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
    return _refusal(restrictions, category, pairs)


def _refusal(restrictions: Restrictions, category: str | None,
             pairs: list[tuple[str, str]]) -> Response | None:
    key = restrictions.refusal(category, pairs)
    if key is None:
        return None
    return 403, list(_JSON_HEADERS), error_body(http_refusal_message(key))


def typed_body_limit(head: http1.RequestHead, mime: bytes, max_input_size: int,
                     max_body_size: int) -> int:
    """The body limit of a frontend whose binary tensor data is announced by a content type
    (``<mime><header size>``: SageMaker's, Vertex AI's): such a POST may reach the hard cap
    (its JSON header is checked against the input size once read); any other body: the
    input size."""
    if head.method == b"POST" and (head.header(b"content-type") or b"").startswith(mime):
        return max_body_size
    return max_input_size


class Asked:
    """What the inference route reads from a request's headers."""

    __slots__ = ("header_len", "encoding", "accept", "traceparent")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.header_len: bytes | None = None
        self.encoding: bytes | None = None
        self.accept: bytes | None = None
        self.traceparent = ""
        for key, value in headers:
            if key == binary_tensor.HEADER_LOWER:
                self.header_len = value
            elif key == b"content-encoding":
                self.encoding = value
            elif key == b"accept-encoding":
                self.accept = value
            elif key == b"traceparent":
                self.traceparent = value.decode("latin-1")


class Deep(Exception):
    """A JSON header that may nest past orjson's depth: parsed off the event loop."""

    def __init__(self, json_part: Any) -> None:
        super().__init__()
        self.json_part = json_part


def _decode(handle: ModelHandle, model: str, version: str, asked: Asked, body: bytes,
            max_input_size: int, hold: ShmHold, parsed: Any = None,
            ) -> tuple[InferenceRequest, json_codec.OutputFormat]:
    """The request the body holds, and how its answer is to be written. A JSON header that
    may nest deeply raises :class:`Deep` unless ``parsed`` (its parse) is given."""
    if handle.config.decoupled:
        raise Unsupported("HTTP end point doesn't support models with decoupled transaction policy")
    try:
        return decode_body(model, version, asked, body, max_input_size, hold, parsed)
    except RawBody as raw:
        request = _raw_request(handle.config, model, version, raw.data)
        return request, json_codec.OutputFormat({}, True)


class RawBody(Exception):
    """A raw binary body (``Inference-Header-Content-Length: 0``): its one input is named by
    the model's configuration."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data


def decode_body(model: str, version: str, asked: Asked, body: bytes, max_input_size: int,
                shm: ShmAccess, parsed: Any = None,
                ) -> tuple[InferenceRequest, json_codec.OutputFormat]:
    """What :func:`_decode` reads without the model's configuration: a KServe body (JSON
    header, binary tensor blocks) as a request. Raises :class:`RawBody` for a raw binary body
    and :class:`Deep` for a JSON header that may nest past orjson's depth (unless
    ``parsed``, its parse, is given)."""
    if asked.encoding is not None:
        body = _decompress(body, asked.encoding, max_input_size)
    header_len = asked.header_len
    if header_len is None and not body:
        header_len = b"0"  # Triton treats an empty body as a raw binary request
    json_part, binary = binary_tensor.split_body(body, header_len)
    # --http-max-input-size bounds what must be parsed or copied, as Triton's HTTP
    # frontend does: the JSON header (EVBufferToJson), a raw binary body
    # (EVBufferToRawInput) and, above, a decompressed body; binary tensor blocks after
    # the JSON header are views on the body, bounded by the server's hard body cap
    if binary is not None and len(json_part) == 0:
        if len(binary) > max_input_size:
            raise raw_too_large(len(binary), max_input_size)
        raise RawBody(bytes(binary))
    if len(json_part) > max_input_size:
        raise too_large(len(json_part), max_input_size)
    if parsed is None:
        if not deep_json.shallow(json_part):
            raise Deep(json_part)
        parsed = json_codec.parse_json(json_part)
    return json_codec.decode_request(
        parsed, model, version, binary_tensor.BlockReader(binary, model), max_input_size, shm,
    )


def answered_response(response: InferenceResponse, fmt: json_codec.OutputFormat,
                      accept: bytes | None) -> Response:
    """A model's answer as the route's response (raises NurseryError when it cannot be
    written as asked)."""
    head, blocks = json_codec.encode_response(response, fmt)
    out_headers: list[tuple[bytes, bytes]]
    if blocks:
        payload = b"".join([head, *blocks])
        out_headers = [(b"content-type", b"application/octet-stream"),
                       (b"inference-header-content-length", str(len(head)).encode())]
    else:
        payload = head
        out_headers = list(_JSON_HEADERS)
    chosen = _pick_response_encoding(accept)
    if chosen is not None:
        payload = _compress(payload, chosen)
        out_headers.append((b"content-encoding", chosen.encode()))
    return 200, out_headers, payload


def failed_response(error: NurseryError, request: InferenceRequest | None,
                    encoding: bytes | None) -> Response:
    """An error answer; ``encoding``: the request's Content-Encoding, if any."""
    if request_log.isEnabledFor(logging.DEBUG):  # Triton's line at --log-verbose 1
        request_log.debug("[request id: %s] Infer failed: %s",
                          (request.id if request is not None else "") or "<id_unknown>",
                          error.message)
    unsupported_encoding = isinstance(error, Unsupported) and encoding is not None
    extra = [(b"accept-encoding", b"gzip, deflate")] if unsupported_encoding else []
    return error_response(error, extra, request)


async def infer_response(
    core: Core, model: str, version: str, headers: list[tuple[bytes, bytes]], body: bytes,
    max_input_size: int, forward: HeaderForward | None = None,
    sent: list[tuple[bytes, bytes]] | None = None, after: AfterSend | None = None,
) -> Response:
    """The whole inference route: request head and body in, status, headers, payload out.

    ``headers`` are (lower-cased name, value) pairs; content-length is the caller's business.
    ``forward``: the headers that become request parameters (--http-header-forward-pattern),
    from ``sent`` when given (the values as sent, trailing whitespace kept) else ``headers``.
    ``after``: where a traced request leaves what is done once the response is written
    (``HTTP_SEND_END``, then the trace is finished); the caller runs it after its send, sent
    or not. Without it the trace ends here, when the response is encoded.
    """
    asked = Asked(headers)
    trace = core.tracer.start(model, asked.traceparent) if core.tracer.active else None
    request: InferenceRequest | None = None
    if trace is not None:  # the server has read the whole request by now
        trace.stamp("HTTP_RECV_START")
        trace.stamp("HTTP_RECV_END")
    # the regions the request reads and writes, held until its outputs are written (a region
    # unregistered meanwhile goes then, as in Triton)
    hold = core.shm.hold()
    cancelled = False
    try:
        handle = await core.acquire(model, version)
        try:
            request, fmt = _decode(handle, model, version, asked, body, max_input_size, hold)
        except Deep as deep:  # parsed in Python, however deep: off the event loop
            parsed = await trio.to_thread.run_sync(json_codec.parse_json, deep.json_part)
            request, fmt = _decode(handle, model, version, asked, body, max_input_size, hold,
                                   parsed)
        forward_headers(forward, headers if sent is None else sent, request)
        request.trace = trace or False  # False: sampled here, not traced
        response = await core.infer(request, handle)
        return answered_response(response, fmt, asked.accept)
    except NurseryError as error:
        return failed_response(error, request, asked.encoding)
    except trio.Cancelled:  # the client left: nothing is sent
        cancelled = True
        raise
    finally:
        hold.release()
        if trace is not None:  # the response is encoded; the server sends it next
            if not cancelled:
                trace.stamp("HTTP_SEND_START")
            if cancelled or after is None:
                trace.finish()
            else:
                after.append(_send_ended(trace))


def infer_now(
    core: Core, model: str, version: str, headers: list[tuple[bytes, bytes]], body: bytes,
    max_input_size: int, forward: HeaderForward | None, sent: list[tuple[bytes, bytes]],
    reply: Callable[[Response], None],
) -> Callable[[], None] | None:
    """The inference route without a task waiting (the HTTP server's fast path): the request
    is checked and queued now, and ``reply`` gets the response on the trio thread when the
    model answers. Returns the function that abandons the request (its client left); None
    when the request is not taken here (tracing, on-demand loading, the response cache, a
    decoupled model, or any refusal): then :func:`infer_response` serves it, as before.
    ``reply`` must not raise (the answering actor runs it); it is never called after the
    request was abandoned."""
    if core.demand is not None or core.tracer.active:
        return None
    asked = Asked(headers)
    hold = core.shm.hold()  # the request's regions, held until its outputs are written
    try:
        handle = core.resolve(model, version)
        request, fmt = _decode(handle, model, version, asked, body, max_input_size, hold)
        forward_headers(forward, sent, request)
    except (NurseryError, Deep):
        hold.release()  # infer_response decodes it again, with a hold of its own
        return None
    request.trace = False  # sampled here, not traced

    def answered(answer: Any) -> None:
        if isinstance(answer, NurseryError):
            hold.release()
            reply(failed_response(answer, request, asked.encoding))
            return
        try:
            response = answered_response(answer, fmt, asked.accept)
        except NurseryError as error:
            response = failed_response(error, request, asked.encoding)
        finally:
            hold.release()
        reply(response)

    return core.client.dispatch_holding(request, handle, answered, hold.release)


def forward_headers(forward: HeaderForward | None, headers: list[tuple[bytes, bytes]],
                    request: InferenceRequest) -> None:
    """--http-header-forward-pattern: the request's headers that match become its string
    parameters; a reserved name is the request's INVALID_ARG, with Triton's message."""
    if forward is None or forward.pattern is None:
        return
    try:
        request.parameters.update(forward.parameters(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in headers))
    except ReservedHeader as exc:
        raise InvalidArgument(str(exc)) from None


def too_large(declared: int, limit: int) -> InvalidArgument:
    return InvalidArgument(
        f"request JSON size of {declared} bytes exceeds the maximum allowed input size of "
        f"{limit} bytes. Use --http-max-input-size to increase the limit."
    )


def raw_too_large(size: int, limit: int) -> InvalidArgument:
    return InvalidArgument(
        f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of "
        f"{limit} bytes. Use --http-max-input-size to increase the limit."
    )


def body_too_large(declared: int, cap: int) -> InvalidArgument:
    """A body past the hard cap (nursery's: Triton has no separate flag, see
    ``body_limit``)."""
    return InvalidArgument(
        f"Request body size of {declared} bytes exceeds the maximum allowed body size of {cap} "
        "bytes. Use --http-max-body-size to increase the limit."
    )


def body_limit(headers: list[tuple[bytes, bytes]], max_input_size: int,
               max_body_size: int) -> int:
    """How many body bytes an inference request may send before it is refused unread.

    Without ``Inference-Header-Content-Length`` the whole body is JSON (or compressed), so
    ``--http-max-input-size`` bounds it; with the header, only the JSON part is bounded by it
    (checked once the body is here) and binary tensor data may follow, up to the hard cap
    ``--http-max-body-size`` (2 GiB - 1 by default: Triton reads Content-Length into an int32)."""
    for key, _ in headers:
        if key == binary_tensor.HEADER_LOWER:
            return max(max_body_size, max_input_size)
    return max_input_size


async def handle_infer(
    core: Core, scope: dict[str, Any], receive: Receive, send: Send,
    model: str, version: str, max_input_size: int, max_body_size: int = 2**31 - 1,
    forward: HeaderForward | None = None,
) -> None:
    """The inference route as an ASGI handler (hypercorn's path)."""
    headers = scope["headers"]
    limit = body_limit(headers, max_input_size, max_body_size)
    refuse = too_large if limit == max_input_size else body_too_large
    for key, value in headers:
        if key == b"content-length":
            # more digits than any limit has: too large, without int() on the client's word
            # (past 4300 digits int() raises, and it is quadratic before that)
            declared = (int(value) if len(value) <= 20 else limit + 1) if value.isdigit() else 0
            if declared > limit:
                await send_response(send, error_response(refuse(declared, limit)))
                return
    try:
        body = await read_body(receive, limit, refuse)
    except ClientGone:
        return
    except NurseryError as error:
        await send_response(send, error_response(error))
        return
    after: AfterSend = []
    answer = await infer_response(core, model, version, headers, body, max_input_size, forward,
                                  after=after)
    sent = False
    try:
        await send_response(send, answer)
        sent = True
    finally:
        run_after_send(after, sent)


async def send_response(send: Send, response: Response) -> None:
    status, headers, payload = response
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})

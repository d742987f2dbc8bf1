"""KServe's generate extension as Triton serves it: ``POST /v2/models/{m}[/versions/{v}]/generate``
and ``/generate_stream`` on the HTTP port.

The request is one flat JSON object. Each top-level key that names a model input becomes that
input (a scalar or a 1-D array, shaped by the two passes Triton uses: fixed dimensions first,
then the innermost variable dimension takes what is left and the others are 1); every other
key becomes a request parameter (a string, an integer, a boolean or a number); the reserved
key ``parameters`` holds an object whose keys are converted the same way. A key given twice
(twice at the top, or at the top and under ``parameters``) is refused: ``input 'x' already
exists in request`` for an input, as Triton's core answers, and the same words for a
parameter. ``id`` is the request's id (and, as in Triton, also a parameter).

The answer is ``{"id" (when given), "model_name", "model_version", <each output by name>,
<each response parameter>}`` with the keys in Triton's (sorted) order, a one-element output
unwrapped from its array; a BYTES response parameter is refused. ``/generate`` wants exactly
one response (a decoupled model may send it with or without the final flag); a model that
sends none or several gets Triton's answer, status 200 with an ``{"error": ...}`` body (Triton
has sent the status with the first response when it counts them);
``/generate_stream`` writes one Server-Sent Event per response (``data: {...}\\n\\n``, no
``[DONE]``) with the status of the first response, an error after that as
``data: {"error": "..."}``. Errors before inference are plain JSON with their 4xx/5xx status.
A compressed request body is refused (Triton: "only 'identity' is supported").

The path to the model is the same as ``/infer``'s: ``Core.acquire``, then the model client
(one answer, or ``ModelClient.stream`` for every answer of a decoupled model). A client that
disconnects mid-stream cancels the request through the request's cancel scope
(``streaming.py``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from nursery.config.model import TensorSpec
from nursery.core import Core
from nursery.errors import InternalError, InvalidArgument, NurseryError, Unsupported
from nursery.messages import Part
from nursery.protocol.access import HeaderForward
from nursery.protocol.codecs.json_tensors import json_array
from nursery.protocol.codecs.status import http_error
from nursery.protocol.http.infer import Response, error_response, forward_headers
from nursery.protocol.http.streaming import SSE_TYPE, Streaming, StreamWriter, sse_event
from nursery.types import DataType, InferenceRequest, InferenceResponse, Tensor

GENERATE_PATH = re.compile(
    rb"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/(generate|generate_stream)$")
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", SSE_TYPE)]
ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for "
                "model that generates various number of responses")


class _Object(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs, in order, duplicates kept."""


def parse_body(body: bytes) -> _Object:
    """The request object (an empty body is ``{}``, as Triton allows)."""
    if not body.strip():
        return _Object()
    try:
        value = json.loads(body, object_pairs_hook=_Object)
    except (ValueError, RecursionError) as exc:
        raise InternalError(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(value, _Object):
        raise InternalError("failed to parse the request JSON buffer: the request must be a "
                            "JSON object")
    return value


def _parameter(name: str, value: Any) -> Any:
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    raise InvalidArgument(f"parameter '{name}' has invalid type. It should be either 'int', "
                          "'bool', or 'string'.")


def fit_shape(spec: TensorSpec, max_batch_size: int, count: int, name: str) -> tuple[int, ...]:
    """Triton's two passes: fixed dimensions take their share of ``count``, then the innermost
    variable dimension takes what is left and the other variable ones are 1."""
    shape = spec.full_shape(max_batch_size)
    left = count
    for d in reversed(shape):
        if d != -1:
            if d == 0 or left % d:
                raise InvalidArgument(
                    f"The schema can not convert input '{name}' to tensor with proper shape")
            left //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = left
            left = 1
    if left != 1:
        raise InvalidArgument(
            f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


class _Builder:
    """The request's inputs and parameters as the keys are read."""

    def __init__(self, inputs: dict[str, TensorSpec], max_batch_size: int,
                 max_input_size: int) -> None:
        self.specs = inputs
        self.max_batch_size = max_batch_size
        self.max_input_size = max_input_size
        self.consumed = 0
        self.tensors: dict[str, Tensor] = {}
        self.parameters: dict[str, Any] = {}

    def add(self, name: str, value: Any) -> None:
        spec = self.specs.get(name)
        if spec is None:
            if name in self.parameters:
                raise InvalidArgument(f"parameter '{name}' already exists in request")
            self.parameters[name] = _parameter(name, value)
            return
        if name in self.tensors:
            raise InvalidArgument(f"input '{name}' already exists in request")
        if isinstance(value, _Object) or (
                isinstance(value, list) and any(isinstance(x, _Object) for x in value)):
            what = "string" if spec.datatype is DataType.BYTES else "number"
            raise InternalError(f"Unable to parse '{name}': attempt to access JSON non-{what} "
                                f"as {what}")
        items = value if isinstance(value, list) else [value]
        count = len(items)
        if spec.datatype is DataType.BYTES:
            size = sum(len(x.encode()) + 4 if isinstance(x, str) else 4 for x in items)
        else:
            size = count * spec.datatype.itemsize
        if size and (size + self.consumed > self.max_input_size):
            raise InvalidArgument(
                f"request size of {self.consumed} bytes with input '{name}' of size {size} "
                f"bytes exceeds the maximum allowed input size of {self.max_input_size}. Use "
                "--http-max-input-size to increase the limit.")
        self.consumed += size
        shape = fit_shape(spec, self.max_batch_size, count, name) if count else (0,)
        data = json_array(items, spec.datatype, shape, name, count)
        self.tensors[name] = Tensor(name, spec.datatype, shape, data)


def build_request(core: Core, model: str, version: str, obj: _Object, max_input_size: int,
                  specs: dict[str, TensorSpec], max_batch_size: int) -> InferenceRequest:
    builder = _Builder(specs, max_batch_size, max_input_size)
    request_id = ""
    for key, value in obj:
        if key == "parameters":
            if key in specs:
                raise InvalidArgument("Keyword 'parameters' for nested schema also given as "
                                      "input tensor name")
            if not isinstance(value, _Object):
                raise InvalidArgument("Expected JSON object for keyword: 'parameters'")
            try:
                for name, inner in value:
                    builder.add(name, inner)
            except NurseryError as exc:
                raise type(exc)(f"Converting keyword: 'parameters': {exc.message}",
                                exc.kind) from None
            continue
        if key == "id":
            if not isinstance(value, str):
                raise InternalError("Unable to parse 'id': attempt to access JSON non-string "
                                    "as string")
            request_id = value
        builder.add(key, value)
    return InferenceRequest(model, version, builder.tensors, id=request_id,
                            parameters=builder.parameters)


def _value(tensor: Tensor) -> Any:
    flat = tensor.data.reshape(-1)
    if tensor.datatype is DataType.BYTES:
        items: list[Any] = [
            (bytes(x) if isinstance(x, bytes | bytearray) else str(x).encode()).decode(
                "utf-8", "replace") for x in flat]
    else:
        items = flat.tolist()
        if tensor.datatype in (DataType.FP16, DataType.BF16, DataType.FP32, DataType.FP64):
            items = [x if math.isfinite(x) else None for x in items]
    return items[0] if len(items) == 1 else items


def encode(response: InferenceResponse) -> bytes:
    """A response as the generate extension's JSON object (Triton's sorted key order)."""
    fields: dict[str, Any] = {}
    if response.id:
        fields["id"] = response.id
    fields["model_name"] = response.model_name
    fields["model_version"] = response.model_version
    for name, value in response.parameters.items():
        if isinstance(value, bytes | bytearray):
            raise Unsupported(f"Response parameter '{name}' has type "
                              "'TRITONSERVER_PARAMETER_BYTES' which is not currently supported")
        fields.setdefault(name, value)
    for tensor in response.outputs:
        fields.setdefault(tensor.name, _value(tensor))
    ordered = {key: fields[key] for key in sorted(fields)}
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()


async def generate_response(
    core: Core, model: str, version: str, headers: list[tuple[bytes, bytes]], body: bytes,
    max_input_size: int, *, streaming: bool, forward: HeaderForward | None = None,
    sent: list[tuple[bytes, bytes]] | None = None,
) -> Response | Streaming:
    """The generate routes: the answer, or the stream to write. ``sent``: the headers with
    their values as sent, for ``forward`` (``headers`` when None)."""
    try:
        handle = await core.acquire(model, version)
        for key, value in headers:
            if key == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                raise InvalidArgument(
                    "Unsupported content-encoding, only 'identity' is supported.")
        config = handle.config
        obj = parse_body(body)
        request = build_request(core, model, version, obj, max_input_size,
                                {spec.name: spec for spec in config.inputs},
                                config.max_batch_size)
        forward_headers(forward, headers if sent is None else sent, request)
        if streaming:
            # the request's checks now, so that a refused request is plain JSON as Triton's
            # (refused before inference); the stream submits it again
            _, slot = core.client.submit(request, handle, queue=False)
            slot.close_receiver()
            return Streaming(lambda writer: _stream(core, request, writer))
        if not config.decoupled:
            return 200, list(_JSON), encode(await core.infer(request, handle))
        return await _collect(core, request)
    except NurseryError as error:
        return error_response(error)


async def _collect(core: Core, request: InferenceRequest) -> Response:
    """``/generate`` on a decoupled model: its one response (an error ends it)."""
    responses: list[InferenceResponse] = []
    failed: list[NurseryError] = []

    async def on_part(part: Part) -> None:
        if part.error is not None:
            failed.append(part.error)
        elif part.response is not None:
            responses.append(part.response)

    await core.client.stream(request, on_part)
    if failed:
        return error_response(failed[0])
    if len(responses) != 1:  # Triton has sent its 200 with the first response by then
        return 200, list(_JSON), http_error(InternalError(ONE_RESPONSE))[1]
    try:
        return 200, list(_JSON), encode(responses[0])
    except NurseryError as error:
        return error_response(error)


async def _stream(core: Core, request: InferenceRequest, writer: StreamWriter) -> None:
    """``/generate_stream``: one event per response; the first one sets the status."""

    async def on_part(part: Part) -> None:
        status = 200
        if part.error is not None:
            status, data = http_error(part.error)
        elif part.response is not None:
            try:
                data = encode(part.response)
            except NurseryError as error:
                status, data = http_error(error)
        else:
            return  # a bare final flag: nothing to send
        if not writer.started:
            await writer.start(status, list(_SSE))
        await writer.send(sse_event(data))

    await core.client.stream(request, on_part)
    if not writer.started:  # no response at all: an empty event stream
        await writer.start(200, list(_SSE))


__all__ = ["GENERATE_PATH", "build_request", "encode", "fit_shape", "generate_response", "parse_body"]

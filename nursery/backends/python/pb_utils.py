"""``triton_python_backend_utils``: the API a Triton ``model.py`` imports as ``pb_utils``.

The Python backend registers this module under that name in ``sys.modules`` before it imports
a model, so ``import triton_python_backend_utils as pb_utils`` works unchanged. It offers what
Triton's Python models use: ``Tensor``, ``InferenceRequest`` (served requests and BLS calls
with ``exec`` / ``async_exec``), ``InferenceResponse``, the response sender of decoupled
models, ``TritonError`` with its codes, ``TritonModelException``, ``Logger``, the
``ModelConfig`` helper of ``auto_complete_config`` and the small helpers
(``get_input_tensor_by_name`` ...). Requests and responses wrap nursery's own types: tensors
pass through as the same numpy arrays, without copies.

nursery adds one name: ``coalesce_responses()``, a context manager inside which the responses
a thread's senders send travel to the server together, delivered when the block ends
(``backends/python/outbox.py``; a model that must also run on Triton looks it up with
``getattr(pb_utils, "coalesce_responses", contextlib.nullcontext)``).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import struct
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from nursery.backends.python.outbox import coalesce_responses as coalesce_responses  # nursery's
from nursery.errors import ErrorKind, NurseryError
from nursery.observability.custom_metrics import labels_of
from nursery.observability.tracing import Trace as _Trace
from nursery.observability.tracing import TraceLink as _TraceLink
from nursery.observability.tracing import child_of as _child_of
from nursery.runtime.thread_context import current_context
from nursery.types import DataType, RequestedOutput, datatype_of_array
from nursery.types import InferenceRequest as _Request
from nursery.types import InferenceResponse as _Response
from nursery.types import Tensor as _Tensor


class ResponseSender(Protocol):
    """What ``request.get_response_sender()`` gives (``nursery.backends.python.sender``)."""

    taken: bool

    def send(self, response: Any = None, flags: int = 0) -> None: ...

    def is_cancelled(self) -> bool: ...

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2


class PreferredMemory:
    """Where a BLS call would like its outputs; every output is host memory here."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU,
                 preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_log = logging.getLogger("nursery.python_model")
_here = threading.local()  # per thread: the model folder of the instance it runs
_last_model_dir = ""


def get_model_dir() -> str:
    """The model's version folder (``<repository>/<model>/<version>``), as Triton's stub
    answers it; for a Python-based backend, the folder of the model using it."""
    return str(getattr(_here, "model_dir", _last_model_dir))


def set_model_dir(path: str) -> None:
    """The backend says which model's folder this thread serves."""
    global _last_model_dir
    _here.model_dir = path
    _last_model_dir = path  # threads a model starts itself (one model per stub process)


# -- errors ---------------------------------------------------------------------------------


class TritonError:
    """An error a model puts in a response (or a BLS call returns); ``code`` as in Triton."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):  # noqa: N818 - Triton's name
    """What a model raises to fail its requests (the message reaches the client)."""

    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


_KIND_OF_CODE = {
    TritonError.UNKNOWN: ErrorKind.UNKNOWN,
    TritonError.INTERNAL: ErrorKind.INTERNAL,
    TritonError.NOT_FOUND: ErrorKind.NOT_FOUND,
    TritonError.INVALID_ARG: ErrorKind.INVALID_ARG,
    TritonError.UNAVAILABLE: ErrorKind.UNAVAILABLE,
    TritonError.UNSUPPORTED: ErrorKind.UNSUPPORTED,
    TritonError.ALREADY_EXISTS: ErrorKind.ALREADY_EXISTS,
    TritonError.CANCELLED: ErrorKind.CANCELLED,
}
_CODE_OF_KIND = {v: k for k, v in _KIND_OF_CODE.items()}


def _argument(where: str, name: str, expected: str, value: Any) -> TypeError:
    """A call whose argument the bindings of Triton's stub cannot convert: a TypeError, as
    pybind11 raises it there (None where a value is required, a wrong type)."""
    return TypeError(f"{where}: incompatible function arguments: '{name}' must be {expected}, "
                     f"not {type(value).__name__}")


def _typed(where: str, name: str, value: Any, kind: type | tuple[type, ...],
           expected: str) -> Any:
    if not isinstance(value, kind):
        raise _argument(where, name, expected, value)
    return value


def _text(where: str, name: str, value: Any, expected: str = "str") -> str:
    """A string argument: a str, or bytes, which pybind11 converts to the same std::string
    (a model may pass ``tensor.as_numpy()[0]`` of a BYTES input, as Triton's qa bls_simple
    does)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if not isinstance(value, str):
        raise _argument(where, name, expected, value)
    return value


def _sequence(where: str, name: str, value: Any, expected: str) -> list[Any]:
    """A list argument (any sequence but a string, as pybind11 converts one)."""
    if value is None or isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise _argument(where, name, expected, value)
    return list(value)


def _tensors(where: str, name: str, value: Any, empty: str) -> list[Tensor]:
    """A list of Tensor; a None in it passes the bindings and is refused by the stub
    (``empty``, Triton's words), anything else is a TypeError."""
    items = _sequence(where, name, value, "a list of Tensor")
    for item in items:
        if item is None:
            raise TritonModelException(empty)
        if not isinstance(item, Tensor):
            raise _argument(where, name, "a list of Tensor", item)
    return items


def error_to_nursery(error: Any) -> NurseryError:
    if isinstance(error, TritonError):
        return NurseryError(error.message(), _KIND_OF_CODE.get(error.code(), ErrorKind.INTERNAL))
    return NurseryError(str(error), ErrorKind.INTERNAL)


def error_from_nursery(error: NurseryError) -> TritonError:
    return TritonError(error.message, _CODE_OF_KIND.get(error.kind, TritonError.INTERNAL))


# -- datatypes ------------------------------------------------------------------------------

_NUMPY_OF_CODE = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8,
    7: np.int16, 8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64,
    13: np.object_,
}


def triton_to_numpy_type(data_type: int) -> Any:
    return _NUMPY_OF_CODE.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    try:
        dt = np.dtype(data_type)
    except TypeError:
        return None
    if dt.kind in ("O", "S", "U"):
        return 13
    for code, np_type in _NUMPY_OF_CODE.items():
        if code != 13 and dt == np.dtype(np_type):
            return code
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    if input_tensor.size == 0:
        return ()
    parts = []
    for item in input_tensor.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    out = []
    offset = 0
    view = memoryview(encoded_tensor).cast("B")
    while offset < len(view):
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        out.append(bytes(view[offset:offset + length]))
        offset += length
    return np.array(out, dtype=np.object_)


# -- tensors --------------------------------------------------------------------------------


class _Capsule:
    """Lets numpy import a bare DLPack capsule (a CPU tensor)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


class Tensor:
    """A named tensor over a numpy array (the array itself, not a copy)."""

    __slots__ = ("_name", "_array", "_datatype", "_wire")

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        name = _text("Tensor()", "name", name)
        if numpy_array is None:
            raise _argument("Tensor()", "numpy_array", "a numpy array", numpy_array)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        if array.dtype.kind == "U" or array.dtype == np.void:
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not support by Python backend. Please use "
                "np.object_ instead.")
        if array.dtype.kind == "S":
            array = array.astype(np.object_)
        if triton_dtype is not None:
            wanted = triton_to_numpy_type(triton_dtype)
            if wanted is not None and array.dtype != np.dtype(wanted):
                array = array.view(wanted)
        self._name = name
        self._array = array
        self._datatype: DataType | None = None
        self._wire = False

    @classmethod
    def _wrap(cls, tensor: _Tensor) -> Tensor:
        obj = cls.__new__(cls)
        obj._name = tensor.name
        obj._array = tensor.data
        obj._datatype = tensor.datatype
        obj._wire = True
        return obj

    def _unwrap(self) -> _Tensor:
        datatype = self._datatype or datatype_of_array(self._array)
        return _Tensor(self._name, datatype, tuple(self._array.shape), self._array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        array = self._array
        if self._wire and not array.flags.writeable:
            # a view over the request's wire bytes; Triton's models may write into their
            # inputs (its arrays live in writable shared memory): copy once, on first use
            array = self._array = array.copy()
            self._wire = False
        return array

    def triton_dtype(self) -> int | None:
        if self._datatype is not None:
            return self._datatype.config_value
        return numpy_to_triton_type(self._array.dtype)

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        name = _text("from_dlpack()", "name", name)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        if type(capsule).__name__ != "PyCapsule" and not (
                hasattr(capsule, "__dlpack__") and hasattr(capsule, "__dlpack_device__")):
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have "
                "`__dlpack__` and `__dlpack_device__` attributes")
        source = capsule if hasattr(capsule, "__dlpack__") else _Capsule(capsule)
        return Tensor(name, np.from_dlpack(source))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


def get_input_tensor_by_name(inference_request: Any, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor  # type: ignore[no-any-return]
    return None


def get_output_tensor_by_name(inference_response: Any, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor  # type: ignore[no-any-return]
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for item in model_config.get("input", []):
        if item["name"] == name:
            return item  # type: ignore[no-any-return]
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for item in model_config.get("output", []):
        if item["name"] == name:
            return item  # type: ignore[no-any-return]
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy and policy.get("decoupled"))


def _checked_parameters(parameters: Any) -> dict[str, Any]:
    """Request and response ``parameters`` as Triton's stub takes them: a dict (or None) of
    str keys and bool, int or str values; anything else raises with Triton's words."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return dict(parameters)


# -- responses ------------------------------------------------------------------------------


_NO_OUTPUTS: list[Tensor] = []  # the default (never changed: a copy is taken)


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] = _NO_OUTPUTS,
                 error: TritonError | None = None,
                 parameters: dict[str, Any] | str | None = None) -> None:
        self._outputs = _tensors("InferenceResponse()", "output_tensors", output_tensors,
                                 "Output tensor for inference response should not be empty.")
        if error is not None and not isinstance(error, TritonError):
            raise _argument("InferenceResponse()", "error", "a TritonError or None", error)
        self._error = error
        self._parameters = _checked_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    @classmethod
    def _from_nursery(cls, response: _Response) -> InferenceResponse:
        obj = cls([Tensor._wrap(t) for t in response.outputs])
        obj._parameters = dict(response.parameters)  # the target model's, as it sent them
        return obj


# -- requests -------------------------------------------------------------------------------


_REQUIRED: Any = object()  # an argument Triton's InferenceRequest has no default for


class InferenceTrace:
    """The trace of a request the model serves (``request.trace()``). Passed as
    ``InferenceRequest(..., trace=request.trace())``, it makes that BLS request part of the
    served request's trace (a child trace, as Triton's); an untraced request's trace, or one
    made here, traces nothing."""

    def __init__(self) -> None:
        self._of: _Trace | _TraceLink | None = None

    @classmethod
    def _wrap(cls, trace: Any) -> InferenceTrace:
        obj = cls()
        obj._of = trace if isinstance(trace, _Trace | _TraceLink) else None
        return obj

    def get_context(self) -> str | None:
        """The request's OpenTelemetry context as JSON (``{"traceparent": ...}``); None when
        the request is not traced or the server traces in triton mode."""
        if isinstance(self._of, _Trace):
            return self._of.context()
        return self._of.context if self._of is not None else None


class InferenceRequest:
    """A request the model serves (built by the backend), or a BLS request the model builds
    to call another model (``exec`` / ``async_exec``)."""

    def __init__(
        self,
        model_name: str = _REQUIRED,  # type: ignore[assignment]
        inputs: list[Tensor] = _REQUIRED,  # type: ignore[assignment]
        requested_output_names: list[str] = _REQUIRED,  # type: ignore[assignment]
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        parameters: dict[str, Any] | str | None = None,
        trace: InferenceTrace = _REQUIRED,  # type: ignore[assignment]
        **_ignored: Any,  # preferred_memory: no meaning on the CPU-only path
    ) -> None:
        # the arguments as the bindings of Triton's stub check them (None where a value is
        # required, or a wrong type: TypeError; what they pass on and the stub refuses:
        # TritonModelException, with Triton's words)
        where = "InferenceRequest()"
        for name, value in (("model_name", model_name), ("inputs", inputs),
                            ("requested_output_names", requested_output_names)):
            if value is _REQUIRED:
                raise TypeError(f"{where}: missing required argument '{name}'")
        self._model_name = model_name = _text(where, "model_name", model_name)
        self._request_id = request_id = _text(where, "request_id", request_id)
        self._inputs = _tensors(where, "inputs", inputs,
                                f"Input tensor for request with id '{request_id}' and model "
                                f"name '{model_name}' should not be empty.")
        self._requested = [
            _text(where, "requested_output_names", output, "a list of str") for output in _sequence(
                where, "requested_output_names", requested_output_names, "a list of str")]
        for output in self._requested:
            if not output:
                raise TritonModelException(
                    f"Requested output name for request with id '{request_id}' and model "
                    f"name '{model_name}' should not be empty.")
        if correlation_id is None:
            raise _argument(where, "correlation_id", "an int or a str", correlation_id)
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._correlation_id = correlation_id
        self._model_version = _typed(where, "model_version", model_version, int, "int")
        self._flags = _typed(where, "flags", flags, int, "int")
        self._timeout = _typed(where, "timeout", timeout, int, "int")
        self._parameters = _checked_parameters(parameters)
        if trace is _REQUIRED:
            trace = InferenceTrace()
        self._trace = _typed(where, "trace", trace, InferenceTrace, "an InferenceTrace")
        self._sender: ResponseSender | None = None
        # the model client of the instance whose thread builds this request (its BLS route)
        self._client = current_context()

    @classmethod
    def _served(cls, request: _Request, requested: list[str], sender: ResponseSender,
                ) -> InferenceRequest:
        params = request.parameters
        obj = cls(
            model_name=request.model_name,
            inputs=[Tensor._wrap(t) for t in request.inputs.values()],
            requested_output_names=requested,
            request_id=request.id,
            correlation_id=request.sequence_id or params.get("sequence_id", 0),
            flags=(TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
                   if request.sequence_start or params.get("sequence_start") else 0)
            | (TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
               if request.sequence_end or params.get("sequence_end") else 0),
            timeout=request.timeout_us,
        )
        # the client's parameters as they came (a client may send any JSON value)
        obj._parameters = {k: v for k, v in params.items()
                           if k not in ("sequence_id", "sequence_start", "sequence_end",
                                        "priority", "timeout", "binary_data_output")}
        obj._sender = sender
        obj._trace = InferenceTrace._wrap(request.trace)
        return obj

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._requested

    def model_name(self) -> str:
        return self._model_name

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters, default=str)

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> ResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "a response sender is only available for requests the model is serving")
        self._sender.taken = True  # the model may answer through it after execute returns
        return self._sender

    def is_cancelled(self) -> bool:
        return self._sender is not None and self._sender.is_cancelled()

    def set_release_flags(self, flags: int) -> None:
        """How the request is released when execute returns:
        ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` sends it back to the sequence batcher to
        run again (a model with ``sequence_batching { iterative_sequence: true }`` only)."""
        self._release_flags = int(flags)

    def _rescheduled(self) -> bool:
        return bool(getattr(self, "_release_flags", 0) & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)

    # -- BLS ---------------------------------------------------------------------------------

    def _to_nursery(self) -> _Request:
        inputs = {}
        for tensor in self._inputs:
            t = tensor._unwrap()
            inputs[t.name] = t
        return _Request(
            model_name=self._model_name,
            model_version="" if self._model_version in (-1, None) else str(self._model_version),
            inputs=inputs,
            requested_outputs=tuple([RequestedOutput(n) for n in self._requested]),
            id=self._request_id,
            parameters=dict(self._parameters),
            # the correlation ID and the sequence flags, as Triton's BLS sets them on the
            # request for the target's sequence batcher
            sequence_id=self._correlation_id,
            sequence_start=bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
            sequence_end=bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
            timeout_us=self._timeout,
            trace=_child_of(self._trace._of),
        )

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model through that model's scheduler and wait for the
        answer. Errors come back in the response (``has_error()``), never raised. With
        ``decoupled=True``, an iterator over the responses."""
        return self._exec(self._client or current_context(), decoupled)

    def _exec(self, client: Any, decoupled: bool, first: bool = False) -> Any:
        """``exec``; with ``first`` (``async_exec``), a decoupled call returns once its first
        response is in, as Triton's does, so iterating it does not block the event loop
        until the target model answers."""
        try:
            if client is None:
                raise NurseryError(
                    "BLS calls must start on a thread the server runs the model on (its "
                    "execute or initialize): build the InferenceRequest there",
                    ErrorKind.UNAVAILABLE)
            request = self._to_nursery()
            if decoupled:
                responses = ResponseIterator(client.stream_from_thread(request),
                                             self._model_name)
                if first:
                    responses._prefetch()
                return responses
            return InferenceResponse._from_nursery(client.infer_from_thread(request))
        except NurseryError as exc:
            failed = InferenceResponse([], error_from_nursery(_bls_error(self._model_name, exc)))
            return ResponseIterator(iter([failed]), self._model_name) if decoupled else failed

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[Any]:
        """``exec`` for ``async def execute``: an awaitable; other calls proceed meanwhile."""
        client = self._client or current_context()  # the executor's threads have none
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self._exec, client, decoupled, True)


def _bls_error(model: str, error: NurseryError) -> NurseryError:
    """Triton's words when the target model is not there (unknown, or no ready version): the
    core's reason behind the Python backend's prefix, as Triton since its core looks the
    model up first ("Model m - Error when running inference: Request for unknown model: 'm'
    is not found"; Triton 2.51 said "Failed for execute the inference request. Model 'm' is
    not ready.")."""
    if error.kind in (ErrorKind.NOT_FOUND, ErrorKind.UNAVAILABLE) and "unknown model" in (
            error.message):
        return NurseryError(f"Model {model} - Error when running inference: {error.message}",
                            error.kind)
    return error


class ResponseIterator:
    """What ``exec(decoupled=True)`` returns: the responses as the target model sends them
    (an empty final response last when it sent a bare final flag). As Triton's, it keeps
    them: once the last has come and been read, iterating it again (``for``, ``iter()``)
    starts from the first; ``next()`` past the end raises StopIteration. ``cancel()`` cancels
    the request: the target's ``request.is_cancelled()`` turns true and the responses it
    still sends keep coming; after the last response it does nothing."""

    def __init__(self, parts: Iterator[Any], model: str) -> None:
        self._parts = parts
        self._model = model
        self._responses: list[InferenceResponse] = []  # every response so far
        self._index = 0  # the next one to give
        self._finished = False  # the last response has come

    def _take(self) -> None:
        """The next part from the target (waits for it), kept as a response."""
        try:
            part = next(self._parts)
        except StopIteration:
            self._finished = True
            raise
        if isinstance(part, InferenceResponse):
            response = part
        elif part.error is not None:
            response = InferenceResponse(
                [], error_from_nursery(_bls_error(self._model, part.error)))
        elif part.response is not None:
            response = InferenceResponse._from_nursery(part.response)
        else:
            response = InferenceResponse([])  # the empty final response
        self._responses.append(response)
        if getattr(part, "final", True):
            self._finished = True

    def _prefetch(self) -> None:
        """Wait for the first part now (off the event loop, for ``async_exec``)."""
        if not self._responses and not self._finished:
            try:
                self._take()
            except StopIteration:
                pass

    def __iter__(self) -> ResponseIterator:
        if self._finished and self._index >= len(self._responses):
            self._index = 0  # read to the end: iterate again from the first
        return self

    def __next__(self) -> InferenceResponse:
        if self._index >= len(self._responses):
            if self._finished:
                raise StopIteration
            self._take()
        response = self._responses[self._index]
        self._index += 1
        return response

    def cancel(self) -> None:
        cancel = getattr(self._parts, "cancel", None)
        if cancel is not None and not self._finished:
            cancel()


# -- logging --------------------------------------------------------------------------------


class LogLevel(enum.Enum):
    """Triton's ``Logger.LogLevel`` (an enumeration: a plain int is not a level)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_Level = LogLevel  # the type, where Logger's own name LogLevel would shadow it


def _message(where: str, message: Any) -> str:
    if not isinstance(message, str):
        raise _argument(where, "message", "str", message)
    return message


class Logger:
    """Triton's model logger: lines go to the server log."""

    LogLevel = LogLevel
    # ``pb_utils.Logger.INFO`` etc., as Triton's models write them
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    _LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING,
               LogLevel.ERROR: logging.ERROR, LogLevel.VERBOSE: logging.DEBUG}

    @staticmethod
    def log(message: str, level: _Level = _Level.INFO) -> None:
        if not isinstance(level, _Level):
            raise _argument("log()", "level", "a Logger.LogLevel", level)
        _log.log(Logger._LEVELS[level], "%s", _message("log()", message))

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", _message("log_info()", message))

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", _message("log_warn()", message))

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", _message("log_error()", message))

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", _message("log_verbose()", message))


# -- custom metrics -----------------------------------------------------------------------


class _FamilyRef:
    """What a family's metrics hold of it: the registry and the name, and whether the
    model's ``MetricFamily`` object still exists (Triton invalidates the metrics of a family
    object that is deleted before them)."""

    __slots__ = ("metrics", "name", "alive")

    def __init__(self, metrics: Any, name: str) -> None:
        self.metrics, self.name, self.alive = metrics, name, True


def _manage(op: str, name: str, *args: Any) -> Any:
    manage = getattr(current_context(), "manage_from_thread", None)
    if manage is None:
        raise TritonModelException(
            "model management must be called on a thread the server runs the model on")
    try:
        return manage(op, name, *args)
    except NurseryError as exc:
        raise TritonModelException(exc.message) from None


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name`` as the repository extension's load does: ``config``
    a configuration override in Triton's JSON, ``files`` ``{"file:<path>": bytes}`` (then a
    ``config`` is required). The server must run in explicit model-control mode. Raises
    TritonModelException with the server's reason."""
    if not isinstance(model_name, str) or not isinstance(config, str):
        raise TypeError("load_model: model_name and config must be strings")
    if files is not None and not isinstance(files, dict):
        raise TypeError("load_model: files must be a dict of 'file:<path>' to bytes")
    _manage("load", model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (explicit model-control mode); ``unload_dependents``: an
    ensemble's composing models too, as the repository extension's unload. Raises
    TritonModelException."""
    if not isinstance(model_name, str) or not isinstance(unload_dependents, bool):
        raise TypeError("unload_model: model_name must be a string, unload_dependents a bool")
    _manage("unload", model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (``model_version``, or the version the server would pick) is
    ready to serve."""
    if not isinstance(model_name, str) or not isinstance(model_version, str):
        raise TypeError("is_model_ready: model_name and model_version must be strings")
    return bool(_manage("ready", model_name, model_version))


class MetricFamily:
    """A family of metrics the model defines; served on the metrics port beside Triton's."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        metrics = getattr(current_context(), "custom_metrics", None)
        if metrics is None:
            raise TritonModelException(
                "MetricFamily must be created on a thread the server runs the model on "
                "(initialize or execute)")
        self.name = name
        self.kind = kind
        try:
            metrics.family(name, description, kind)
        except NurseryError as exc:
            raise TritonModelException(exc.message) from None
        self._ref = _FamilyRef(metrics, name)

    def __del__(self) -> None:
        ref = getattr(self, "_ref", None)
        if ref is not None:
            ref.alive = False

    def Metric(self, labels: dict[str, str] | None = None,  # noqa: N802 - Triton's name
               buckets: list[float] | None = None) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None and not isinstance(buckets, list):
            raise TritonModelException("Failed to create metric. Buckets must be a list.")
        return Metric(self._ref, labels, buckets)


class Metric:
    """One metric of a family: a set of label values."""

    def __init__(self, family: _FamilyRef, labels: dict[str, str] | None,
                 buckets: list[float] | None) -> None:
        self._family = family  # not the MetricFamily object: the model may delete that
        self._labels = labels_of(labels)
        self._call("metric", None if buckets is None else tuple(buckets))

    def _call(self, op: str, *args: Any) -> Any:
        family = self._family
        if not family.alive:
            raise TritonModelException(
                "Invalid metric operation as the corresponding 'MetricFamily' has been "
                "deleted. The 'MetricFamily' object should be deleted AFTER its corresponding "
                "'Metric' objects have been deleted.")
        try:
            if op == "metric":
                return family.metrics.metric(family.name, self._labels, *args)
            return family.metrics.update(family.name, self._labels, op, *args)
        except NurseryError as exc:
            raise TritonModelException(exc.message) from None

    def increment(self, value: float) -> None:
        self._call("increment", float(value))

    def set(self, value: float) -> None:
        self._call("set", float(value))

    def observe(self, value: float) -> None:
        self._call("observe", float(value))

    def value(self) -> float:
        return float(self._call("value"))


# -- auto-complete --------------------------------------------------------------------------


class ModelConfig:
    """The configuration ``auto_complete_config`` may complete (Triton's rules and messages):
    max_batch_size, inputs, outputs, the dynamic batcher, the transaction policy."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        cfg = json.loads(model_config) if isinstance(model_config, str) else model_config
        cfg.setdefault("max_batch_size", 0)
        cfg.setdefault("input", [])
        cfg.setdefault("output", [])
        self._model_config = cfg

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def get_max_batch_size(self) -> int:
        return int(self._model_config.get("max_batch_size", 0))

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            new = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != new:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name()}', which is already set to '{bool(policy['decoupled'])}'.")
            policy["decoupled"] = new

    def _add(self, what: str, item: dict[str, Any]) -> None:
        # an output has no 'optional' (python_backend's words for each)
        valid = ("name", "data_type", "dims", "optional") if what == "input" else (
            "name", "data_type", "dims")
        label = item.get("name", "")
        for key in item:
            if key not in valid:
                allowed = ("'name', 'data_type', 'dims' and 'optional'" if what == "input"
                           else "'name', 'data_type' and 'dims'")
                raise ValueError(
                    f"{what} '{label}' in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than {allowed}.")
        for key in ("name", "data_type", "dims"):
            if key not in item:
                if key == "name":
                    raise ValueError(f"{what} in auto-complete-config function for model "
                                     f"'{self._name()}' is missing 'name' property.")
                raise ValueError(f"{what} '{label}' in auto-complete-config function for "
                                 f"model '{self._name()}' is missing '{key}' property.")
        for existing in self._model_config[what]:
            if existing["name"] != item["name"]:
                continue
            old_type = existing.get("data_type", "TYPE_INVALID")
            if old_type != "TYPE_INVALID" and old_type != item["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype "
                    f"{old_type} for {what} '{label}', model provides {item['data_type']}")
            old_dims = [int(d) for d in existing.get("dims", [])]
            if old_dims and old_dims != [int(d) for d in item["dims"]]:
                raise ValueError(
                    f"model '{self._name()}', tensor '{label}': the model expects dims "
                    f"{list(item['dims'])} but the model configuration specifies dims {old_dims}")
            existing.update(item)
            return
        self._model_config[what].append(dict(item))

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's signature
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def get_input_by_name(self, name: str) -> dict[str, Any] | None:
        return get_input_config_by_name(self._model_config, name)

    def get_output_by_name(self, name: str) -> dict[str, Any] | None:
        return get_output_config_by_name(self._model_config, name)

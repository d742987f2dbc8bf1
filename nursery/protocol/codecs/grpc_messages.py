"""betterproto gRPC messages <-> the core's request and response types (pure).

Inputs come either all as ``raw_input_contents`` (what tritonclient and perf_analyzer send)
or all as typed ``contents``; responses always carry one ``raw_output_contents`` entry per
output, as Triton does and as the C++ client (perf_analyzer) requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import betterproto
import numpy as np

from nursery.errors import InvalidArgument
from nursery.protocol.codecs.grpc_wire import InferRequest, InputTensor, encode_infer_response
from nursery.schema import inference as pb
from nursery.shm.system import ShmAccess, ShmBinding
from nursery.types import (
    DataType,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
    checked_count,
    input_bytes_tensor,
    serialize_bytes_tensor,
    tensor_to_bytes,
)

# typed contents field per datatype
_CONTENTS_FIELD = {
    DataType.BOOL: "bool_contents",
    DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents",
    DataType.UINT32: "uint_contents",
    DataType.UINT64: "uint64_contents",
    DataType.INT8: "int_contents",
    DataType.INT16: "int_contents",
    DataType.INT32: "int_contents",
    DataType.INT64: "int64_contents",
    DataType.FP32: "fp32_contents",
    DataType.FP64: "fp64_contents",
    DataType.BYTES: "bytes_contents",
}
_ALLOWED_TRITON = {"triton_enable_empty_final_response"}
_RESERVED = {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
             "binary_data_output", "headers"}


def _arms(params: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Parameters as {name: (oneof arm, value)}, from betterproto InferParameters or from the
    hot path's decoder (which already gives that form)."""
    out = {}
    for key, param in params.items():
        if isinstance(param, tuple):
            out[key] = param
        else:
            out[key] = betterproto.which_one_of(param, "parameter_choice")
    return out


def _uint_param(params: dict[str, tuple[str, Any]], key: str) -> int:
    if key not in params:
        return 0
    which, value = params[key]
    if which not in ("int64_param", "uint64_param") or value < 0:
        raise InvalidArgument(
            f"invalid value type for '{key}' parameter, expected int64_param or uint64_param"
        )
    return int(value)


def _sequence_params(params: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    """Triton's ``sequence_id`` (int64_param, uint64_param or string_param),
    ``sequence_start`` and ``sequence_end`` (bool_param) request parameters."""
    out: dict[str, Any] = {}
    if "sequence_id" in params:
        which, value = params["sequence_id"]
        if which in ("int64_param", "uint64_param"):
            out["sequence_id"] = int(value) & 0xFFFF_FFFF_FFFF_FFFF  # Triton reads a uint64
        elif which == "string_param":
            out["sequence_id"] = value
        else:
            raise InvalidArgument("invalid value type for 'sequence_id' parameter, expected "
                                  "int64_param or string_param.")
    for key in ("sequence_start", "sequence_end"):
        if key in params:
            which, value = params[key]
            if which != "bool_param":
                raise InvalidArgument(
                    f"invalid value type for '{key}' parameter, expected bool_param.")
            out[key] = bool(value)
    return out


def shm_binding(params: dict[str, tuple[str, Any]], tensor: str) -> ShmBinding | None:
    """Triton's gRPC ``ParseSharedMemoryParams``: checks and messages."""
    region = None
    if "shared_memory_region" in params:
        which, value = params["shared_memory_region"]
        if which != "string_param":
            raise InvalidArgument(f"invalid value type for 'shared_memory_region' parameter for "
                                  f"tensor '{tensor}', expected string_param.")
        region = value
    sizes = {"shared_memory_offset": 0, "shared_memory_byte_size": None}
    for key in sizes:
        if key not in params:
            continue
        if region is None:
            raise InvalidArgument(f"'{key}' can not be specified without 'shared_memory_region' "
                                  f"parameter for tensor '{tensor}'")
        which, value = params[key]
        if which != "int64_param":
            raise InvalidArgument(f"invalid value type for '{key}' parameter for tensor "
                                  f"'{tensor}', expected int64_param.")
        sizes[key] = int(value)
    if region is None:
        return None
    if sizes["shared_memory_byte_size"] is None:
        raise InvalidArgument(f"'shared_memory_byte_size' must be specified along with "
                              f"'shared_memory_region' parameter for tensor '{tensor}'")
    return ShmBinding(region, int(sizes["shared_memory_offset"] or 0),
                      int(sizes["shared_memory_byte_size"]))


def decode_shm_outputs(message: pb.ModelInferRequest | InferRequest,
                       shm: ShmAccess | None) -> dict[str, ShmBinding]:
    """The requested outputs to be written into shared-memory regions (checked now, before
    the model runs, as Triton does)."""
    out = {}
    for requested in message.outputs:
        binding = shm_binding(_arms(requested.parameters), requested.name)
        if binding is None:
            continue
        if shm is None:
            raise InvalidArgument("shared memory is not available on this endpoint")
        shm.lookup(binding.region, binding.offset, binding.byte_size)
        out[requested.name] = binding
    return out


def decode_request(message: pb.ModelInferRequest | InferRequest,
                   shm: ShmAccess | None = None) -> InferenceRequest:
    """A ModelInferRequest (betterproto's, or the hot path's :class:`InferRequest`) as the
    core's request; ``shm`` resolves inputs given as shared-memory regions."""
    model = message.model_name
    raw: Sequence[bytes | memoryview] = message.raw_input_contents
    params = _arms(message.parameters)
    custom: dict[str, Any] = {}
    for key, (_, value) in params.items():
        if key.startswith("triton_") and key not in _ALLOWED_TRITON:
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                "following keys starting with 'triton_' are allowed: "
                + ", ".join(sorted(_ALLOWED_TRITON))
            )
        if key not in _RESERVED:
            custom[key] = value
    inputs: dict[str, Tensor] = {}
    prefix = f"[request id: {message.id or '<id_unknown>'}] "
    i = 0  # raw_input_contents are given in order for the inputs not in shared memory
    for tensor in message.inputs:
        name = tensor.name
        try:
            datatype = DataType.from_protocol(tensor.datatype)
        except InvalidArgument:
            raise InvalidArgument(
                f"invalid datatype '{tensor.datatype}' for input '{name}' of model '{model}'"
            ) from None
        shape = tuple([int(d) for d in tensor.shape])
        if any(d < 0 for d in shape):
            raise InvalidArgument(
                f"input '{name}' of model '{model}' has a negative dimension in shape "
                f"{list(shape)}"
            )
        count = checked_count(
            shape, datatype, f"{prefix}unexpected shape for input '{name}' for model '{model}'")
        has_contents = tensor.contents is not None and (
            isinstance(tensor, InputTensor) or betterproto.serialized_on_wire(tensor.contents))
        binding = (shm_binding(_arms(tensor.parameters), name)
                   if "shared_memory_region" in tensor.parameters
                   or "shared_memory_byte_size" in tensor.parameters
                   or "shared_memory_offset" in tensor.parameters else None)
        if binding is not None:
            if has_contents:
                raise InvalidArgument(
                    f"unexpected 'content' provided when using shared memory for input tensor "
                    f"'{name}' for model '{model}'")
            if shm is None:
                raise InvalidArgument("shared memory is not available on this endpoint")
            shm.lookup(binding.region, binding.offset, binding.byte_size)
            if datatype is not DataType.BYTES:  # the sizes agree before any byte is copied
                _check_size(binding.byte_size, count, datatype, name, model, prefix)
            block: bytes | memoryview = shm.read(binding.region, binding.offset, binding.byte_size)
            data = _fixed_size(block, datatype, shape, count, name, model, prefix)
        elif raw:
            if has_contents:
                raise InvalidArgument(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{name}' for model '{model}'"
                )
            if i >= len(raw):
                raise InvalidArgument(
                    f"unable to find data for input tensor '{name}' for model '{model}' in "
                    "request."
                )
            block = raw[i]
            i += 1
            data = _fixed_size(block, datatype, shape, count, name, model, prefix)
        else:
            data = _typed_contents(tensor, datatype, shape, count, model, prefix)
        if name in inputs:
            raise InvalidArgument(f"input '{name}' already exists in request")
        inputs[name] = Tensor(name, datatype, shape, data)
    outputs = []
    requested: set[str] = set()
    for out in message.outputs:
        if out.name in requested:  # core's AddOriginalRequestedOutput, as for HTTP
            raise InvalidArgument(f"{prefix}output '{out.name}' already exists in request")
        requested.add(out.name)
        classes = 0
        oparams = _arms(out.parameters)
        if "classification" in oparams:
            which, value = oparams["classification"]
            if which not in ("int64_param", "uint64_param") or value < 0:
                raise InvalidArgument("Unable to set 'classification': expected an int64_param")
            classes = value
        if "shared_memory_region" in oparams and classes:
            raise InvalidArgument(
                "output can't set both 'shared_memory_region' and 'classification'")
        outputs.append(RequestedOutput(out.name, classes))
    return InferenceRequest(
        model_name=model,
        model_version=message.model_version,
        inputs=inputs,
        requested_outputs=tuple(outputs),
        id=message.id,
        parameters=custom,
        priority=_uint_param(params, "priority"),
        timeout_us=_uint_param(params, "timeout"),
        **(_sequence_params(params) if "sequence_id" in params or "sequence_start" in params
           or "sequence_end" in params else {}),
    )


def _check_size(size: int, count: int, datatype: DataType, name: str, model: str,
                prefix: str) -> None:
    expected = count * datatype.itemsize
    if size != expected:
        raise InvalidArgument(
            f"{prefix}input byte size mismatch for input '{name}' for model "
            f"'{model}'. Expected {expected}, got {size}"
        )


def _fixed_size(block: bytes | memoryview, datatype: DataType, shape: tuple[int, ...], count: int,
                name: str, model: str, prefix: str) -> np.ndarray:
    """``block``'s bytes as the tensor; ``count`` is ``shape``'s checked element count, and a
    BYTES block must hold at least 4 bytes per element before its array is made."""
    if datatype is DataType.BYTES:
        return input_bytes_tensor(block, shape, name, model, prefix)
    _check_size(len(block), count, datatype, name, model, prefix)
    return np.frombuffer(block, dtype=datatype.numpy_dtype).reshape(shape)


def _typed_contents(tensor: pb.ModelInferRequestInferInputTensor | InputTensor, datatype: DataType,
                    shape: tuple[int, ...], count: int, model: str, prefix: str) -> np.ndarray:
    """Typed ``contents`` (already parsed: bounded by the message) as the tensor; the count
    must match before an array is made."""
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidArgument(
            f"{datatype.value} input '{tensor.name}' of model '{model}' must be sent in "
            "raw_input_contents (it has no typed contents field)"
        )
    values = getattr(tensor.contents, field) if tensor.contents is not None else []
    if len(values) != count:
        if datatype is DataType.BYTES:  # Triton serializes them, then checks as raw bytes
            where = f"for inference input '{tensor.name}' for model '{model}'"
            if len(values) > count:
                raise InvalidArgument(f"{prefix}unexpected number of string elements "
                                      f"{count + 1} {where}, expecting {count}")
            raise InvalidArgument(
                f"{prefix}expected {count} string elements {where}, got {len(values)}")
        raise InvalidArgument(
            f"{prefix}input byte size mismatch for input '{tensor.name}' for model '{model}'. "
            f"Expected {count * datatype.itemsize}, got {len(values) * datatype.itemsize}"
        )
    if datatype is DataType.BYTES:
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out.reshape(shape)
    try:
        return np.array(values, dtype=datatype.numpy_dtype).reshape(shape)
    except OverflowError as exc:
        raise InvalidArgument(f"input '{tensor.name}': {exc}") from None


def encode_response(response: InferenceResponse,
                    extra: dict[str, pb.InferParameter] | None = None,
                    shm_outputs: dict[str, ShmBinding] | None = None,
                    shm: ShmAccess | None = None) -> bytes:
    """A ModelInferResponse in wire form: one raw_output_contents entry per output (empty for
    an output written into a shared-memory region, as Triton keeps them aligned)."""
    outputs: list[tuple[Any, ...]] = []
    raw: list[bytes | memoryview] = []
    for tensor in response.outputs:
        if tensor.datatype is DataType.BYTES:
            data: bytes | memoryview = serialize_bytes_tensor(tensor.data)
        else:
            data = tensor_to_bytes(tensor.data, tensor.datatype)
        binding = shm_outputs.get(tensor.name) if shm_outputs else None
        if binding is None:
            outputs.append((tensor.name, tensor.datatype.value, tensor.shape))
            raw.append(data)
            continue
        assert shm is not None
        shm.write(binding.region, binding.offset, binding.byte_size, data, tensor.name)
        outputs.append((tensor.name, tensor.datatype.value, tensor.shape))
        raw.append(b"")  # the data is in the region; the empty entry keeps raw[i] = output i
    parameters = {key: to_parameter(value) for key, value in response.parameters.items()}
    if extra:
        parameters.update(extra)
    return encode_infer_response(response.model_name, response.model_version, response.id,
                                 outputs, raw, parameters)


def to_parameter(value: Any) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=str(value))


def model_metadata(meta: dict[str, Any]) -> pb.ModelMetadataResponse:
    def tensors(items: list[dict[str, Any]]) -> list[pb.ModelMetadataResponseTensorMetadata]:
        return [pb.ModelMetadataResponseTensorMetadata(name=t["name"], datatype=t["datatype"],
                                                       shape=list(t["shape"])) for t in items]

    return pb.ModelMetadataResponse(
        name=meta["name"], versions=list(meta["versions"]), platform=meta["platform"],
        inputs=tensors(meta["inputs"]), outputs=tensors(meta["outputs"]),
    )

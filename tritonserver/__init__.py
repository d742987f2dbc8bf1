"""Triton's in-process Python API (``import tritonserver``), served by nursery.

A program written for Triton's ``tritonserver`` package runs unchanged: ``Server(Options)``
starts a ``nursery.Server`` in this process, ``server.model(name).infer(inputs=...)`` and
``async_infer`` iterate its responses, ``Tensor`` exchanges memory with numpy, PyTorch and
CuPy through DLPack, and ``tritonfrontend`` opens its HTTP, gRPC and metrics ports. What it
does not have: the C API binding (``tritonserver._c``) and custom output allocators; see
docs/embedding.md.
"""

from __future__ import annotations

from tritonserver._api import (
    REQUEST_FLAG_SEQUENCE_END,
    REQUEST_FLAG_SEQUENCE_START,
    AsyncResponseIterator,
    InferenceRequest,
    InferenceResponse,
    InstanceGroupKind,
    LogFormat,
    MetricFormat,
    Model,
    ModelBatchFlag,
    ModelControlMode,
    ModelDictionary,
    ModelLoadDeviceLimit,
    ModelTxnPropertyFlag,
    Options,
    RateLimiterResource,
    RateLimitMode,
    ResponseIterator,
    Server,
)
from tritonserver._errors import (
    AlreadyExistsError,
    CancelledError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from tritonserver._metrics import Metric, MetricFamily, MetricKind
from tritonserver._tensor import DataType, DLDeviceType, MemoryBuffer, MemoryType, Tensor

for _error in (AlreadyExistsError, CancelledError, InternalError, InvalidArgumentError,
               NotFoundError, TritonError, UnavailableError, UnknownError, UnsupportedError):
    _error.__module__ = "tritonserver"

__version__ = "2.51.0"

__all__ = [
    "REQUEST_FLAG_SEQUENCE_END", "REQUEST_FLAG_SEQUENCE_START", "AlreadyExistsError",
    "AsyncResponseIterator", "CancelledError", "DLDeviceType", "DataType",
    "InferenceRequest", "InferenceResponse", "InstanceGroupKind", "InternalError",
    "InvalidArgumentError", "LogFormat", "MemoryBuffer", "MemoryType", "Metric",
    "MetricFamily", "MetricFormat", "MetricKind",
    "Model", "ModelBatchFlag", "ModelControlMode", "ModelDictionary", "ModelLoadDeviceLimit",
    "ModelTxnPropertyFlag", "NotFoundError", "Options", "RateLimitMode",
    "RateLimiterResource", "ResponseIterator", "Server", "Tensor", "TritonError",
    "UnavailableError", "UnknownError", "UnsupportedError",
]

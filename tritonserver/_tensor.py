"""Tensors of the ``tritonserver`` API: :class:`Tensor` (a datatype, a shape and a
:class:`MemoryBuffer`), exchanged with numpy, PyTorch, CuPy and any other DLPack library
without copies; BYTES tensors as Triton lays them out (each element a 4-byte little-endian
length, then its bytes)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nursery.types import deserialize_bytes_tensor, serialize_bytes_tensor
from tritonserver._errors import InvalidArgumentError, UnsupportedError


class DataType(enum.IntEnum):
    """TRITONSERVER_DataType."""

    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    BYTES = 13
    BF16 = 14


class MemoryType(enum.IntEnum):
    """TRITONSERVER_MemoryType."""

    CPU = 0
    CPU_PINNED = 1
    GPU = 2


class DLDeviceType(enum.IntEnum):
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3


_NUMPY = {
    DataType.BOOL: np.dtype(np.bool_), DataType.UINT8: np.dtype(np.uint8),
    DataType.UINT16: np.dtype(np.uint16), DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64), DataType.INT8: np.dtype(np.int8),
    DataType.INT16: np.dtype(np.int16), DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64), DataType.FP16: np.dtype(np.float16),
    DataType.FP32: np.dtype(np.float32), DataType.FP64: np.dtype(np.float64),
}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}


def _numpy_dtype(data_type: DataType) -> np.dtype[Any]:
    if data_type is DataType.BYTES:
        return np.dtype(np.uint8)  # the serialized form
    if data_type is DataType.BF16:
        return np.dtype(np.uint16)  # raw bits; numpy has no bfloat16
    try:
        return _NUMPY[data_type]
    except KeyError:
        raise InvalidArgumentError(f"no numpy dtype for {data_type!r}") from None


def parse_device(device: Any) -> tuple[MemoryType, int]:
    """``"cpu"``, ``"gpu"``, ``"gpu:1"``, ``"cuda:1"``, a MemoryType, or a (type, id) pair."""
    if isinstance(device, MemoryType):
        return device, 0
    if isinstance(device, tuple) and len(device) == 2:
        return MemoryType(device[0]), int(device[1])
    if isinstance(device, str):
        kind, _, number = device.lower().partition(":")
        try:
            index = int(number) if number else 0
        except ValueError:
            raise InvalidArgumentError(f"Invalid memory type: {device}") from None
        if kind == "cpu":
            return MemoryType.CPU, index
        if kind == "cpu_pinned":
            return MemoryType.CPU_PINNED, index
        if kind in ("gpu", "cuda"):
            return MemoryType.GPU, index
    raise InvalidArgumentError(f"Invalid memory type: {device}")


@dataclass
class MemoryBuffer:
    """Memory somewhere (``data_ptr``, ``size`` bytes, a memory type and device) kept alive
    by ``owner``."""

    data_ptr: int
    memory_type: MemoryType
    memory_type_id: int
    size: int
    owner: Any

    @staticmethod
    def from_dlpack(owner: Any) -> MemoryBuffer:
        """The memory of a DLPack-capable object (numpy, PyTorch, CuPy, ...), which it keeps
        alive: no copy."""
        cuda = getattr(owner, "__cuda_array_interface__", None)
        if cuda is not None:
            size = int(np.prod(cuda["shape"], dtype=np.int64)) * np.dtype(cuda["typestr"]).itemsize
            device = owner.__dlpack_device__()[1] if hasattr(owner, "__dlpack_device__") else 0
            return MemoryBuffer(int(cuda["data"][0]), MemoryType.GPU, int(device), size, owner)
        array = owner if isinstance(owner, np.ndarray) else _host_view(owner)
        if not array.flags.c_contiguous:
            raise InvalidArgumentError("Only contiguous memory is supported")
        return MemoryBuffer(int(array.__array_interface__["data"][0]), MemoryType.CPU, 0,
                            int(array.nbytes), owner if array is owner else array)


def _host_view(obj: Any) -> np.ndarray:
    if hasattr(obj, "__dlpack__"):
        device = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (1, 0)
        if device[0] not in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost):
            raise UnsupportedError(f"DLPack device {device} is not host memory")
        return np.from_dlpack(obj)
    if hasattr(obj, "__array_interface__"):
        return np.asarray(obj)
    raise InvalidArgumentError(f"Object does not support DLPack protocol: {type(obj).__name__}")


class _View:
    """What numpy sees of a host tensor: its memory as an array interface of the tensor's
    current shape, holding the tensor (so an array made from it keeps the tensor alive)."""

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor
        dtype = _numpy_dtype(tensor.data_type)
        shape = tuple([int(d) for d in tensor.shape])
        if tensor.data_type is DataType.BYTES:
            shape = (tensor.memory_buffer.size,)
        self.__array_interface__ = {
            "data": (tensor.memory_buffer.data_ptr, False), "shape": shape,
            "typestr": dtype.str, "version": 3}


@dataclass
class Tensor:
    """A tensor: its datatype, shape and memory."""

    data_type: DataType
    shape: Sequence[int]
    memory_buffer: MemoryBuffer

    @property
    def data_ptr(self) -> int:
        return self.memory_buffer.data_ptr

    @property
    def memory_type(self) -> MemoryType:
        return self.memory_buffer.memory_type

    @property
    def memory_type_id(self) -> int:
        return self.memory_buffer.memory_type_id

    @property
    def size(self) -> int:
        return self.memory_buffer.size

    # -- DLPack ------------------------------------------------------------------------------

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        if self.data_type is DataType.BYTES:
            raise UnsupportedError("DataType.BYTES tensors are not supported by DLPack; use "
                                   "to_bytes_array() or to_string_array()")
        if self.memory_type is MemoryType.GPU:
            owner = self.memory_buffer.owner
            if hasattr(owner, "__dlpack__") and tuple(getattr(owner, "shape", ())) == tuple(
                    self.shape):
                return owner.__dlpack__(stream=stream)
            raise UnsupportedError("GPU tensors are exchanged through their owner's DLPack")
        array = np.asarray(_View(self))
        options = {k: v for k, v in kwargs.items() if v is not None}
        if stream is not None:
            options["stream"] = stream
        try:
            return array.__dlpack__(**options)
        except TypeError:  # an older numpy: the legacy capsule
            return array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        if self.memory_type is MemoryType.GPU:
            return (int(DLDeviceType.kDLCUDA), self.memory_type_id)
        return (int(DLDeviceType.kDLCPU), 0)

    @staticmethod
    def from_dlpack(obj: Any) -> Tensor:
        """A tensor over the memory of a DLPack-capable object (no copy)."""
        if isinstance(obj, Tensor):
            return obj
        array = obj if isinstance(obj, np.ndarray) else None
        if array is not None and array.dtype == object:
            raise InvalidArgumentError("Object arrays are not supported by DLPack; use "
                                       "Tensor.from_bytes_array or from_string_array")
        buffer = MemoryBuffer.from_dlpack(obj)
        if array is None:
            array = buffer.owner if isinstance(buffer.owner, np.ndarray) else None
        if array is not None:
            dtype = array.dtype
            shape = list(array.shape)
        else:  # a GPU object: its CUDA array interface says what it is
            interface = obj.__cuda_array_interface__
            dtype, shape = np.dtype(interface["typestr"]), list(interface["shape"])
        try:
            data_type = _FROM_NUMPY[np.dtype(dtype)]
        except KeyError:
            raise UnsupportedError(f"unsupported datatype {dtype}") from None
        return Tensor(data_type, shape, buffer)

    @staticmethod
    def _from_numpy(array: np.ndarray) -> Tensor:
        """A response's output (BYTES as object arrays of bytes)."""
        if array.dtype == object or array.dtype.kind in ("S", "U"):
            return Tensor.from_bytes_array(array)
        array = np.ascontiguousarray(array)
        return Tensor(_FROM_NUMPY[array.dtype], list(array.shape),
                      MemoryBuffer.from_dlpack(array))

    # -- BYTES -------------------------------------------------------------------------------

    @staticmethod
    def from_bytes_array(array: Any) -> Tensor:
        """A BYTES tensor from an array (or nested list) of bytes or str."""
        values = np.asarray(array, dtype=object)
        flat = [v.encode() if isinstance(v, str) else bytes(v)
                for v in values.reshape(-1).tolist()]
        data = np.frombuffer(serialize_bytes_tensor(np.array(flat, dtype=object)),
                             dtype=np.uint8)
        return Tensor(DataType.BYTES, list(values.shape), MemoryBuffer.from_dlpack(data))

    from_string_array = from_bytes_array

    def to_bytes_array(self) -> np.ndarray:
        """A BYTES tensor as an object array of bytes, in its shape."""
        if self.data_type is not DataType.BYTES:
            raise InvalidArgumentError(f"Tensor has data type {self.data_type.name} not "
                                       "DataType.BYTES")
        host = self.to_host()
        raw = np.asarray(_View(host)).tobytes()
        count = int(np.prod(host.shape, dtype=np.int64))
        return deserialize_bytes_tensor(raw, count, "tensor").reshape(tuple(host.shape))

    def to_string_array(self) -> np.ndarray:
        """A BYTES tensor as an array of str (UTF-8), in its shape."""
        values = self.to_bytes_array()
        return np.array([v.decode() for v in values.reshape(-1).tolist()],
                        dtype=object).reshape(values.shape).astype(str)

    # -- devices -----------------------------------------------------------------------------

    def to_host(self) -> Tensor:
        return self.to_device("cpu")

    def to_device(self, device: Any) -> Tensor:
        memory_type, device_id = parse_device(device)
        if memory_type is not MemoryType.GPU:
            if self.memory_type is not MemoryType.GPU:
                return self
            import cupy  # a GPU tensor came from cupy; back to the host

            host = cupy.asnumpy(cupy.from_dlpack(self.memory_buffer.owner))
            return Tensor(self.data_type, list(self.shape), MemoryBuffer.from_dlpack(host))
        try:
            import cupy
        except ImportError:
            raise UnsupportedError("GPU memory needs CuPy: pip install "
                                   "'nursery[gpu]'") from None
        with cupy.cuda.Device(device_id):
            gpu = cupy.asarray(np.asarray(_View(self)))  # BYTES: their serialized bytes
        return Tensor(self.data_type, list(self.shape), MemoryBuffer.from_dlpack(gpu))

    def _array(self) -> np.ndarray:
        """The tensor as a numpy array for a request (BYTES: an object array of bytes)."""
        if self.data_type is DataType.BYTES:
            return self.to_bytes_array()
        host = self.to_host()
        return np.asarray(_View(host)).reshape(tuple([int(d) for d in host.shape]))

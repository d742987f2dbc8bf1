"""CUDA shared-memory regions (Triton's ``cuda_shared_memory`` extension), via CuPy.

A client registers device memory it owns by its raw CUDA IPC handle, device id and byte size;
the server opens the handle (``cudaIpcOpenMemHandle``) and keeps the region in the same
:class:`~nursery.shm.system.SharedMemoryRegistry` as system regions (one namespace of names, as in
Triton). Inputs are copied from the region to host memory and outputs from host memory into
it: nursery's core carries host (numpy) tensors, so a CUDA region saves the client its own
copies and the network, not the server's device round trip.

CuPy is imported lazily; :func:`available` says whether this server can open CUDA regions
(CuPy importable and a device present). Written without a GPU to run it on: its tests are
marked ``gpu`` and have not run yet.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import numpy as np

from nursery.errors import InvalidArgument

log = logging.getLogger("nursery.shm")


@cache
def _cupy() -> Any:
    try:
        import cupy
    except ImportError:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # no driver, no device
        return None
    return cupy


def available() -> bool:
    return _cupy() is not None


class CudaRegion:
    kind = "cuda"

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self.users = 0  # requests holding the region (nursery.shm.system.ShmHold)
        self.awaiting_unregister = False  # unregistered while held
        cp = _cupy()
        if cp is None:
            # Triton's GPU build on a machine without a usable device fails to open the
            # handle and answers this (INVALID_ARG); the reason follows Triton's words
            raise InvalidArgument(
                "failed to register shared memory region: invalid args (CUDA shared memory is "
                "not available on this server: it needs CuPy, the 'gpu' extra, and a CUDA "
                "device)")
        if device_id < 0 or device_id >= cp.cuda.runtime.getDeviceCount() or byte_size < 0:
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        self._cp = cp
        try:
            with cp.cuda.Device(device_id):
                flags = getattr(cp.cuda.runtime, "cudaIpcMemLazyEnablePeerAccess", 1)
                self._ptr = cp.cuda.runtime.ipcOpenMemHandle(bytes(raw_handle), flags)
        except Exception as exc:  # CUDA errors: bad handle, wrong device, same process
            log.error("failed to open CUDA IPC handle for region '%s': %s", name, exc)
            raise InvalidArgument(
                "failed to register shared memory region: invalid args") from None
        size = self._allocation_size()
        if size is not None and byte_size > size:
            self.close()
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")

    def _allocation_size(self) -> int | None:
        """The size of the allocation behind the handle (``cuMemGetAddressRange``), if CuPy
        exposes it."""
        get_range = getattr(self._cp.cuda.driver, "memGetAddressRange", None)
        if get_range is None:
            return None
        try:
            with self._cp.cuda.Device(self.device_id):
                _, size = get_range(self._ptr)
            return int(size)
        except Exception:
            return None

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def _check_bounds(self, offset: int, byte_size: int) -> None:
        """The registry checked these already; a device copy out of bounds would corrupt the
        CUDA context for every model on the device, so the region checks again itself."""
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: '{self.name}'")

    def read_to_host(self, offset: int, byte_size: int) -> memoryview:
        self._check_bounds(offset, byte_size)
        host = np.empty(byte_size, dtype=np.uint8)
        if byte_size:
            with self._cp.cuda.Device(self.device_id):
                self._cp.cuda.runtime.memcpy(host.ctypes.data, self._ptr + offset, byte_size,
                                             self._cp.cuda.runtime.memcpyDeviceToHost)
        return host.data

    def write_from_host(self, offset: int, data: bytes | memoryview) -> None:
        host = np.frombuffer(data, dtype=np.uint8)
        self._check_bounds(offset, host.size)
        if host.size:
            with self._cp.cuda.Device(self.device_id):
                self._cp.cuda.runtime.memcpy(self._ptr + offset, host.ctypes.data, host.size,
                                             self._cp.cuda.runtime.memcpyHostToDevice)

    def close(self) -> None:
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr:
            try:
                with self._cp.cuda.Device(self.device_id):
                    self._cp.cuda.runtime.ipcCloseMemHandle(ptr)
            except Exception as exc:
                log.error("failed to close CUDA IPC handle of region '%s': %s", self.name, exc)

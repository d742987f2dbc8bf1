"""The shared-memory registry: regions clients registered, and bounded reads and writes.

One :class:`SharedMemoryRegistry` per server (the :class:`~nursery.core.Core` owns it); the
HTTP and gRPC extensions register, list and unregister regions through it, and the codecs
take inputs from and put outputs into regions through it. Names, checks and messages are
Triton's (``server/src/shared_memory_manager.cc``).

A system region is a POSIX shared-memory object (``shm_open(key)``, which on Linux is the
file ``/dev/shm/<key>``) mapped from ``offset`` for ``byte_size`` bytes. Reads hand out
``memoryview`` slices of the mapping (no copy); every access is checked against the region's
bounds, and against the object itself: a key that its owner truncated or removed (unlinked)
while registered gives a clear error instead of a crash on memory that is no longer there.
CUDA regions (``nursery/cuda_shm.py``) live in the same table, as in Triton: one namespace of
region names.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nursery.errors import AlreadyExists, InternalError, InvalidArgument, NotFound

SHM_DIR = Path("/dev/shm")
RESERVED_PREFIX = "triton_python_backend_shm_region"
_MAX_SIZE = 2**63 - 1


class Region(Protocol):
    name: str
    kind: str  # "system" or "cuda"
    byte_size: int

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class SystemRegion:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    _map: mmap.mmap | None
    _view: memoryview  # exactly the registered bytes
    kind: str = "system"

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}

    def check_alive(self) -> None:
        """The object behind the key must still hold the registered bytes."""
        try:
            st = os.fstat(self.fd)
        except OSError:
            raise InvalidArgument(
                f"shared memory region '{self.name}' is no longer accessible") from None
        if st.st_nlink == 0:
            raise InvalidArgument(
                f"shared memory region '{self.name}': its key '{self.key}' was removed by its "
                "owner; unregister the region")
        if st.st_size < self.offset + self.byte_size:
            raise InvalidArgument(
                f"shared memory region '{self.name}': its key '{self.key}' now holds "
                f"{st.st_size} bytes, fewer than the registered offset {self.offset} + byte "
                f"size {self.byte_size}; unregister the region")

    def view(self) -> memoryview:
        return self._view

    def close(self) -> None:
        try:
            self._view.release()
        except BufferError:
            pass  # a request's array is built on it; it goes with that array
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a request still reads it; the mapping goes when its last view does
            self._map = None
        try:
            os.close(self.fd)
        except OSError:
            pass


def _open_key(name: str, key: str) -> int:
    """``shm_open(key, O_RDWR)`` as glibc does it: the file ``/dev/shm/<key without the
    leading slashes>``; a key naming anything else (a path) cannot be opened."""
    stripped = key.lstrip("/")
    if not stripped or "/" in stripped or stripped in (".", "..") or "\0" in stripped:
        raise InternalError(f"Unable to open shared memory region: '{key}'")
    try:
        return os.open(SHM_DIR / stripped, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise InternalError(f"Unable to open shared memory region: '{key}'") from None


class SharedMemoryRegistry:
    """Registered regions by name. Thread-safe: the frontends call it from the trio thread,
    and nothing else needs to, but a lock costs nothing here."""

    def __init__(self) -> None:
        self._regions: dict[str, Any] = {}
        self._lock = threading.Lock()

    # -- registration ---------------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if key.lstrip("/").startswith(RESERVED_PREFIX):
            raise InvalidArgument(
                f"cannot register shared memory region '{name}' with key '{key}' as the key "
                f"contains the reserved prefix '{RESERVED_PREFIX}'")
        if offset < 0 or byte_size < 0 or offset > _MAX_SIZE or byte_size > _MAX_SIZE:
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"shared memory region '{name}' already in manager")
            fd = _open_key(name, key)
            try:
                size = os.fstat(fd).st_size
                if offset + byte_size > size:
                    raise InvalidArgument(
                        f"failed to register shared memory region '{name}': invalid args")
                start = offset - offset % mmap.ALLOCATIONGRANULARITY
                length = offset - start + byte_size
                mapping = mmap.mmap(fd, length, mmap.MAP_SHARED,
                                    mmap.PROT_READ | mmap.PROT_WRITE, offset=start) if length else None
                view = (memoryview(mapping)[offset - start:] if mapping is not None
                        else memoryview(b""))
            except InvalidArgument:
                os.close(fd)
                raise
            except (OSError, ValueError) as exc:
                os.close(fd)
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': unable to process "
                    f"address space: {exc}") from None
            self._regions[name] = SystemRegion(name, key, offset, byte_size, fd, mapping, view)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        from nursery.cuda_shm import CudaRegion  # CuPy only when CUDA regions are used

        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"shared memory region '{name}' already in manager")
        self.add(CudaRegion(name, raw_handle, device_id, byte_size))

    def add(self, region: Any) -> None:
        """Register a region built elsewhere (CUDA regions)."""
        with self._lock:
            if region.name in self._regions:
                region.close()
                raise AlreadyExists(f"shared memory region '{region.name}' already in manager")
            self._regions[region.name] = region

    def unregister(self, name: str, kind: str = "system") -> None:
        """Unregistering a name that is not registered (as this kind) succeeds, as in Triton;
        no name unregisters every region of this kind (as ``status`` lists them all)."""
        if not name:
            self.unregister_all(kind)
            return
        with self._lock:
            region = self._regions.get(name)
            if region is None or region.kind != kind:
                return
            del self._regions[name]
        region.close()

    def unregister_all(self, kind: str = "system") -> None:
        with self._lock:
            names = [n for n, r in self._regions.items() if r.kind == kind]
            regions = [self._regions.pop(n) for n in names]
        for region in regions:
            region.close()

    def status(self, name: str = "", kind: str = "system") -> list[dict[str, Any]]:
        label = "system" if kind == "system" else "cuda"
        with self._lock:
            if not name:
                return [r.status() for r in self._regions.values() if r.kind == kind]
            region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find {label} shared memory region: '{name}'")
        if region.kind != kind:
            other = "CUDA" if region.kind == "cuda" else "system"
            mine = "system" if kind == "system" else "CUDA"
            raise NotFound(f"The region named '{name}' is registered as {other} shared memory, "
                           f"not {mine} shared memory")
        return [region.status()]

    def close(self) -> None:
        with self._lock:
            regions = list(self._regions.values())
            self._regions.clear()
        for region in regions:
            region.close()

    # -- access ---------------------------------------------------------------------------

    def lookup(self, name: str, offset: int, byte_size: int) -> Any:
        """The region ``name`` after Triton's bounds checks for ``[offset, offset+byte_size)``."""
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        if offset < 0 or offset >= region.byte_size:
            raise InvalidArgument(f"Invalid offset for shared memory region: '{name}'")
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: '{name}'")
        return region

    def read(self, name: str, offset: int, byte_size: int) -> memoryview:
        """A view of ``byte_size`` bytes at ``offset`` in a system region (no copy)."""
        region = self.lookup(name, offset, byte_size)
        if region.kind != "system":
            return region.read_to_host(offset, byte_size)  # type: ignore[no-any-return]
        region.check_alive()
        return region.view()[offset : offset + byte_size]  # type: ignore[no-any-return]

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview,
              output: str) -> None:
        """Put an output's bytes at ``offset``; it must fit the ``byte_size`` the request gave."""
        region = self.lookup(name, offset, byte_size)
        if len(data) > byte_size:
            raise InternalError(
                f"shared memory size specified with the request for output '{output}' "
                f"({byte_size} bytes) should be at least {len(data)} bytes to hold the results")
        if region.kind != "system":
            region.write_from_host(offset, data)
            return
        region.check_alive()
        region.view()[offset : offset + len(data)] = memoryview(data).cast("B")


@dataclass(frozen=True, slots=True)
class ShmBinding:
    """Where a request wants one tensor: region, offset, byte size."""

    region: str
    offset: int
    byte_size: int

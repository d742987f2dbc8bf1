"""The shared-memory registry: regions clients registered, and bounded reads and writes.

One :class:`SharedMemoryRegistry` per server (the :class:`~nursery.core.Core` owns it); the
HTTP and gRPC extensions register, list and unregister regions through it, and the codecs
take inputs from and put outputs into regions through it. Names, checks and messages are
Triton's (``server/src/shared_memory_manager.cc``).

A system region is a POSIX shared-memory object (``shm_open(key)``, which on Linux is the
file ``/dev/shm/<key>``) of which ``byte_size`` bytes from ``offset`` are registered. The
registry keeps ONE open file descriptor per region and no mapping: reads copy the bytes with
``os.preadv`` into a fresh buffer, writes put them with ``os.pwritev``. A mapping would save
that copy, but the region belongs to the client, who may shrink it at any moment: touching a
mapped page past the file's new end is a SIGBUS that kills the whole server, and no check
made before the access can close that race (the client may truncate between the check and
the copy). ``preadv`` on a shrunk file is a short read, answered with a clear error; the
copy costs about 65 µs per MiB, where the mapping cost nothing (``bench/shm_read.py``). Every access is
also checked against the region's bounds and against the object (``fstat``): a key that its
owner truncated or removed (unlinked) while registered gives a clear error. Writes to a
shrunk object are refused the same way (``pwritev`` past its end would extend it).
A read's copy is as large as the read, so the object must hold that much memory (``fstat``'s
blocks): a sparse object, truncated large and never written, is refused rather than copied.

Registrations are capped (:data:`MAX_REGIONS` by default), each holding one descriptor, so a
client cannot exhaust the server's file descriptors by registering regions.

A request holds the regions it reads and writes (a :class:`ShmHold`, which the frontends take
for each request and let go once its response is written), as Triton's requests hold a
reference to each region they use: unregistering a held region succeeds at once, but the
region stays registered (listed in the status, usable by new requests, its name taken) until
the last request holding it lets go, and is removed then.
CUDA regions (``nursery/shm/cuda.py``) live in the same table, as in Triton: one namespace of
region names.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from nursery.errors import (
    AlreadyExists,
    InternalError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unsupported,
)
from nursery.shm.cuda import CudaRegion  # imports CuPy only when a CUDA region is opened

SHM_DIR = Path("/dev/shm")
RESERVED_PREFIX = "triton_python_backend_shm_region_"  # Triton's, its trailing underscore too
_MAX_SIZE = 2**63 - 1
_SIZE_MAX = 2**64 - 1  # size_t: an offset plus a byte size beyond it overflows in Triton
MAX_REGIONS = 1024  # registered regions (system and CUDA together) per server, by default

log = logging.getLogger("nursery.shm")


@dataclass(eq=False)
class SystemRegion:
    """One registered system region: its key's open descriptor and the registered window."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    kind: str = "system"
    users: int = 0  # requests holding the region (ShmHold)
    awaiting_unregister: bool = False  # unregistered while held: removed when the last lets go

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}

    def check_alive(self) -> os.stat_result:
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
        return st

    def _smaller(self, got: int, wanted: int) -> InvalidArgument:
        return InvalidArgument(
            f"shared memory region '{self.name}': its key '{self.key}' is smaller than the "
            f"registered offset {self.offset} + byte size {self.byte_size} (read {got} of "
            f"{wanted} bytes); unregister the region")

    def read(self, offset: int, byte_size: int) -> memoryview:
        """A copy of ``byte_size`` bytes at ``offset`` (within the region), taken now.

        The copy is as large as the read, so the object must hold that much memory: a sparse
        object (``ftruncate`` to a terabyte, nothing written) would otherwise have the
        server allocate, and fill with zeros, memory the client never committed."""
        st = self.check_alive()
        if st.st_blocks * 512 < byte_size:
            raise InvalidArgument(
                f"shared memory region '{self.name}': its key '{self.key}' holds "
                f"{st.st_blocks * 512} bytes of memory, fewer than the {byte_size} bytes to read "
                "(an object never written is sparse); write the tensor into the region first")
        out = np.empty(byte_size, dtype=np.uint8)
        view = out.data
        done = 0
        while done < byte_size:
            try:
                n = os.preadv(self.fd, [view[done:]], self.offset + offset + done)
            except OSError as exc:
                raise InvalidArgument(
                    f"shared memory region '{self.name}' could not be read: {exc}") from None
            if n == 0:  # the object shrank after the check above
                raise self._smaller(done, byte_size)
            done += n
        return view

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Put ``data`` at ``offset`` (within the region), once the object still holds the
        region. (A shrink racing this write can only make ``pwritev`` grow the client's object
        back; it cannot hurt the server, as a store into a mapping would.)"""
        self.check_alive()
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            try:
                n = os.pwritev(self.fd, [view[done:]], self.offset + offset + done)
            except OSError as exc:
                raise InvalidArgument(
                    f"shared memory region '{self.name}' could not be written: {exc}") from None
            if n == 0:
                raise self._smaller(done, len(view))
            done += n

    def close(self) -> None:
        """Close the descriptor; a late access then fails cleanly (EBADF) instead of reaching
        whatever file reuses the number."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            os.close(fd)
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


# Triton's words when a client registers or unregisters a region without --allow-client-shm
CLIENT_SHM_DISABLED = ("Client shared memory is disabled. Start the server with "
                       "'--allow-client-shm=true' to enable.")


class SharedMemoryRegistry:
    """Registered regions by name. Thread-safe: the frontends call it from the trio thread,
    and nothing else needs to, but a lock costs nothing here.

    ``allow_client``: whether clients may register and unregister regions. The server passes
    ``--allow-client-shm`` (off by default, as in Triton 2.68); while off, registering and
    unregistering are refused (UNSUPPORTED, Triton's message) and ``status`` still answers.
    A registry built without the flag (tests, embedding) allows them."""

    def __init__(self, max_regions: int = MAX_REGIONS, allow_client: bool = True) -> None:
        self._regions: dict[str, SystemRegion | CudaRegion] = {}
        self._lock = threading.Lock()
        self.max_regions = max_regions
        self.allow_client = allow_client

    def check_client_allowed(self) -> None:
        """Refuse (UNSUPPORTED, Triton's message) unless clients may register regions."""
        if not self.allow_client:
            raise Unsupported(CLIENT_SHM_DISABLED)

    def _check_room(self, name: str) -> None:
        """Called under the lock, before anything is opened for a new region."""
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if len(self._regions) >= self.max_regions:
            raise ResourceExhausted(
                f"failed to register shared memory region '{name}': the server holds "
                f"{len(self._regions)} regions, its limit; unregister some first")

    # -- registration ---------------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_client_allowed()
        if not key.lstrip("/"):  # Triton's ValidateSharedMemoryKey: a key of slashes only
            raise InvalidArgument(
                f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
        if key.lstrip("/").startswith(RESERVED_PREFIX):
            raise InvalidArgument(
                f"cannot register shared memory region '{name}' with key '{key}' as the key "
                f"contains the reserved prefix '{RESERVED_PREFIX}'")
        if offset < 0 or byte_size < 0 or offset > _MAX_SIZE or byte_size > _MAX_SIZE:
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        with self._lock:
            self._check_room(name)
            fd = _open_key(name, key)
            try:
                st = os.fstat(fd)
            except OSError as exc:
                os.close(fd)
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': unable to process "
                    f"address space: {exc}") from None
            if offset + byte_size > st.st_size:
                os.close(fd)
                raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
            self._regions[name] = SystemRegion(name, key, offset, byte_size, fd)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self.check_client_allowed()
        with self._lock:
            self._check_room(name)
        self.add(CudaRegion(name, raw_handle, device_id, byte_size))

    def add(self, region: SystemRegion | CudaRegion) -> None:
        """Register a region built elsewhere (CUDA regions)."""
        with self._lock:
            try:
                self._check_room(region.name)
            except (AlreadyExists, ResourceExhausted):
                region.close()
                raise
            self._regions[region.name] = region

    def unregister(self, name: str, kind: str = "system") -> None:
        """Unregistering a name that is not registered (as this kind) succeeds, as in Triton;
        no name unregisters every region of this kind (as ``status`` lists them all). A region
        that requests hold is only marked: it goes when the last of them lets go."""
        self.check_client_allowed()
        if not name:
            self.unregister_all(kind)
            return
        with self._lock:
            region = self._regions.get(name)
            if region is None or region.kind != kind or not self._drop(region):
                return
        region.close()

    def unregister_all(self, kind: str = "system") -> None:
        with self._lock:
            regions = [r for r in self._regions.values() if r.kind == kind]
            regions = [r for r in regions if self._drop(r)]
        for region in regions:
            region.close()

    def _drop(self, region: SystemRegion | CudaRegion) -> bool:
        """Called under the lock: remove ``region`` now if no request holds it (True: the
        caller closes it), else mark it to go when the last holder lets go."""
        if region.users > 0:
            region.awaiting_unregister = True
            log.debug("Shared memory region '%s' will be unregistered after in-flight "
                      "requests complete.", region.name)
            return False
        del self._regions[region.name]
        return True

    def hold(self) -> ShmHold:
        """A new request's hold on the regions it will use (empty until it uses one)."""
        return ShmHold(self)

    def _acquire(self, name: str, offset: int, byte_size: int) -> SystemRegion | CudaRegion:
        """``lookup``, and the region counts one more holder."""
        with self._lock:
            region = self.lookup(name, offset, byte_size)
            region.users += 1
            return region

    def _release(self, regions: list[SystemRegion | CudaRegion]) -> None:
        """Holders let go of ``regions``; those unregistered meanwhile and now free go."""
        gone = []
        with self._lock:
            for region in regions:
                region.users -= 1
                if (region.users == 0 and region.awaiting_unregister
                        and self._regions.get(region.name) is region):
                    del self._regions[region.name]
                    gone.append(region)
        for region in gone:
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

    def lookup(self, name: str, offset: int, byte_size: int) -> SystemRegion | CudaRegion:
        """The region ``name`` after Triton's bounds checks for ``[offset, offset+byte_size)``."""
        region = self._regions.get(name)  # one dict read: atomic, with or without the lock
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        _check_bounds(region, name, offset, byte_size)
        return region

    def read(self, name: str, offset: int, byte_size: int) -> memoryview:
        """A copy of ``byte_size`` bytes at ``offset`` in a region, taken now: what a queued
        request carries is its own, whatever the region's owner does next."""
        with self._lock:  # an unregister elsewhere must not close (and reuse) the fd mid-read
            return _read(self.lookup(name, offset, byte_size), offset, byte_size)

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview,
              output: str) -> None:
        """Put an output's bytes at ``offset``; it must fit the ``byte_size`` the request gave."""
        with self._lock:
            _write(self.lookup(name, offset, byte_size), offset, byte_size, data, output)


def _check_bounds(region: SystemRegion | CudaRegion, name: str, offset: int,
                  byte_size: int) -> None:
    """Triton's bounds checks for ``[offset, offset+byte_size)`` in a region, in its order."""
    if offset < 0 or offset >= region.byte_size:
        raise InvalidArgument(f"Invalid offset for shared memory region: '{name}'")
    if byte_size > _SIZE_MAX - offset:  # Triton checks this before the bounds
        raise InvalidArgument(
            f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) "
            f"exceeds maximum value ({_SIZE_MAX}) for region '{name}'")
    if byte_size < 0 or offset + byte_size > region.byte_size:
        raise InvalidArgument(
            f"Invalid offset + byte size for shared memory region: '{name}'")


def _read(region: SystemRegion | CudaRegion, offset: int, byte_size: int) -> memoryview:
    if isinstance(region, CudaRegion):
        return region.read_to_host(offset, byte_size)
    return region.read(offset, byte_size)


def _write(region: SystemRegion | CudaRegion, offset: int, byte_size: int,
           data: bytes | memoryview, output: str) -> None:
    if len(data) > byte_size:
        raise InternalError(
            f"shared memory size specified with the request for output '{output}' "
            f"({byte_size} bytes) should be at least {len(data)} bytes to hold the results")
    if isinstance(region, CudaRegion):
        region.write_from_host(offset, data)
        return
    region.write(offset, data)


class ShmAccess(Protocol):
    """What the codecs use to take inputs from and put outputs into regions: the registry
    itself (no hold) or one request's :class:`ShmHold`."""

    def lookup(self, name: str, offset: int, byte_size: int) -> SystemRegion | CudaRegion: ...

    def read(self, name: str, offset: int, byte_size: int) -> memoryview: ...

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview,
              output: str) -> None: ...


class ShmHold:
    """The regions one request reads or writes, held from its parsing until its response is
    written (Triton's requests keep a reference to each region they use, released with the
    request): a region unregistered meanwhile stays registered until every request holding
    it has let go. ``release`` is idempotent; each region is held once per request. Once
    released, the hold holds nothing more: a late access (a request abandoned, then answered)
    is the registry's own, looked up and done under its lock."""

    __slots__ = ("_registry", "_held", "_released")

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self._registry = registry
        self._held: dict[str, SystemRegion | CudaRegion] = {}
        self._released = False

    def lookup(self, name: str, offset: int, byte_size: int) -> SystemRegion | CudaRegion:
        """The region ``name`` after Triton's bounds checks, held from now on."""
        if self._released:
            return self._registry.lookup(name, offset, byte_size)
        region = self._held.get(name)
        if region is None:
            region = self._registry._acquire(name, offset, byte_size)
            self._held[name] = region
        else:
            _check_bounds(region, name, offset, byte_size)
        return region

    def read(self, name: str, offset: int, byte_size: int) -> memoryview:
        if self._released:
            return self._registry.read(name, offset, byte_size)
        region = self.lookup(name, offset, byte_size)
        with self._registry._lock:  # a shutdown's close must not close the fd mid-read
            return _read(region, offset, byte_size)

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview,
              output: str) -> None:
        if self._released:
            self._registry.write(name, offset, byte_size, data, output)
            return
        region = self.lookup(name, offset, byte_size)
        with self._registry._lock:
            _write(region, offset, byte_size, data, output)

    def release(self) -> None:
        """Let go of every region held (the request's response is written, or it failed)."""
        self._released = True
        if self._held:
            regions = list(self._held.values())
            self._held.clear()
            self._registry._release(regions)


@dataclass(frozen=True, slots=True)
class ShmBinding:
    """Where a request wants one tensor: region, offset, byte size."""

    region: str
    offset: int
    byte_size: int
